#!/usr/bin/env python3
"""Slurm jobs in dspkd without Slurm (docs/protocol.md, "Slurm jobs"): job.register and
job.end (raw, and through `dspk-submit job register|end` as the prolog and epilog call them), a connection's job from its hello claim, from
its uid's only job and from its cgroup, the allocation enforced by device UUID (devices
filtered, ENODEV for the others, buffers included, "any" among the allowed), per-job
memory quota, the job in status, metrics and traces, nothing of a job left after
job.end, and registrations that outlive a restart (the state file, refused when unsafe
or corrupt, EIO when it cannot be written; restart()), an epilog that runs while no
dspkd listens (dspkd --end-job, the state file's lock; down(); on the socket it was given,
through a link too: epilog_socket()), where the state file is (paths()), what keeps the lock
from another daemon's files and what a reload refuses (lock_guard(), reload_guard()), the
cgroup line of Slurm's hierarchy alone (cgroup_case()), the last 256 ended jobs
(ended_list()), and a daemon under a /proc that hides
other users' processes (hidden(): printed as skipped where it cannot run; exit 77 when it is
the case asked for; so is cgroup without writable v1 freezer and pids hierarchies).  The excluded
device is lavapipe (Vulkan), so the test needs a Vulkan device; exit 77 (skipped) without
one.

    jobs_test.py --dspkd PATH --submit DSPK_SUBMIT [--epilog EPILOG]
        [down|paths|hidden|ending|cgroup|usable|ended]
"""
import argparse
import json
import os
import re
import time
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import dspk_daemon  # noqa: E402
from dspk_rpc import Client, RpcError, check  # noqa: E402

TIMEOUT = 60
NOBODY = 65534


class Daemon:
    def __init__(self, exe, tmp, extra=(), env=None):
        self.sock = os.path.join(tmp, "dspkd.sock")
        self.log = open(os.path.join(tmp, "dspkd.log"), "w+", errors="replace")
        args = dspk_daemon.cmdline(exe, self.sock, extra, backends="cpu,vulkan")
        self.proc = dspk_daemon.start(args, TIMEOUT, stderr=self.log,
                                      env=dict(os.environ, **env) if env else None)
        if not self.proc:
            raise AssertionError("dspkd did not become ready:\n" + self.logtext())

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def client(self, job=None):
        c = Client(self.sock, TIMEOUT)
        args = {"version": 1, "client": "jobs-test"}
        if job is not None:
            args["job"] = job
        c.call("hello", args)
        return c

    def stop(self):
        rc = dspk_daemon.stop(self.proc, TIMEOUT)
        check(rc == 0, "dspkd exited with %s:\n%s" % (rc, self.logtext()))


def err_of(c, method, args):
    try:
        c.call(method, args)
    except RpcError as e:
        return e.name, str(e)
    return "ok", ""


def handed_on(d, job):
    """A connection made by a child process that hands it to this one and
    exits before the daemon accepts it (the daemon stopped meanwhile): its
    cgroup cannot be read.  Returns the Client, after its hello claiming job."""
    import msgpack
    import socket
    a, b = socket.socketpair()
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        pid = os.fork()
        if pid == 0:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.sock)  # queued: the daemon accepts once it runs again
            socket.send_fds(b, [b"x"], [s.fileno()])
            os._exit(0)
        _, fds, _, _ = socket.recv_fds(a, 1, 1)
        os.waitpid(pid, 0)  # gone, and reaped: no /proc/PID left
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    a.close()
    b.close()
    c = Client.__new__(Client)
    c.sock = socket.socket(fileno=fds[0])
    c.sock.settimeout(TIMEOUT)
    c.up = msgpack.Unpacker(raw=False, max_buffer_size=1 << 30)
    c.msgid, c.responses, c.notes = 0, {}, []
    c.call("hello", {"version": 1, "job": job})
    return c


def raw_client(sock, job):
    """A Client over an open, connected socket, after its hello claiming job."""
    import msgpack
    c = Client.__new__(Client)
    c.sock = sock
    c.sock.settimeout(TIMEOUT)
    c.up = msgpack.Unpacker(raw=False, max_buffer_size=1 << 30)
    c.msgid, c.responses, c.notes = 0, {}, []
    c.call("hello", {"version": 1, "job": job})
    return c


def proc_state(pid):
    """The state letter of /proc/PID/stat (its thread group leader's)."""
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def exiting_peer(d, job, leader):
    """A connection whose peer (the SO_PEERCRED pid) is not live when the daemon reads
    its cgroup, though it still exists: a child that connected a socket this process
    holds too, then exited and is left unreaped (a zombie; leader False), or whose main
    thread called pthread_exit while another thread lives (leader True).  With cgroup v1
    such a process's cgroup reads as the root, no job.  The daemon is stopped from before
    the connect until the peer is in that state (waitid WNOWAIT: exited, not reaped; or
    its leader shown a zombie), so that it accepts and reads the cgroup then.  Returns
    (the Client after its hello claiming job, a function that lets the child go)."""
    import ctypes
    import threading
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        pid = os.fork()
        if pid == 0:
            try:
                os.close(w)
                s.connect(d.sock)  # queued: the daemon accepts once it runs again
                if leader:
                    threading.Thread(target=lambda: (os.read(r, 1), os._exit(0))).start()
                    ctypes.CDLL(None).pthread_exit(None)
            finally:
                os._exit(0)
        os.close(r)
        if leader:
            # No event says "the leader thread exited" (the process lives on): its state
            # is looked at until it shows it, for at most TIMEOUT.
            for _ in range(TIMEOUT * 1000):
                if proc_state(pid) == "Z":
                    break
                select.select([], [], [], 0.001)
            check(proc_state(pid) == "Z", "the child's main thread exited")
        else:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # exited, still a zombie
            check(proc_state(pid) == "Z", "the child is a zombie")
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)

    def release():
        os.close(w)  # the leader case's thread exits then
        os.waitpid(pid, 0)
    return raw_client(s, job), release


REUSE_COMM = "dspk-reuse"  # the peers the daemon of run() stops for (DSPKD_TEST_PEER_STOP)


def take_pid(target):
    """A child of this process whose pid is target, a pid just freed: ns_last_pid set
    to target - 1 before each fork (root), until a fork gets it (another process of the
    host may take it first: tried again, at most 1000 times).  The child waits; returns
    (its pid, a function that lets it exit and reaps it)."""
    r, w = os.pipe()
    for _ in range(1000):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(target - 1))
        q = os.fork()
        if q == 0:
            if os.getpid() == target:
                os.close(w)
                os.read(r, 1)
            os._exit(0)
        if q == target:
            break
        os.waitpid(q, 0)
    os.close(r)
    check(q == target, "pid %d taken again by a child" % target)

    def release():
        os.close(w)
        os.waitpid(q, 0)
    return q, release


def reused_peer(d, job, before_accept):
    """A connection whose peer (the SO_PEERCRED pid) exited, was reaped, and whose pid
    was taken by another live process (take_pid) before the daemon read its cgroup: a
    child connects a socket this process holds, then exits.  before_accept: the daemon
    is stopped (SIGSTOP) from before the connect until the pid is taken, so that it
    accepts then; else the daemon accepts while the child lives and stops itself
    (DSPKD_TEST_PEER_STOP, the child named REUSE_COMM) after taking the peer's pidfd and
    before the read, which is when the child exits and its pid is taken (waitpid
    WUNTRACED: the daemon is this process's child).  Returns (the Client after its
    hello claiming job, a function that lets the pid's new process go)."""
    import ctypes
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    if before_accept:
        os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        pid = os.fork()
        if pid == 0:
            try:
                os.close(w)
                if not before_accept:
                    ctypes.CDLL(None).prctl(15, REUSE_COMM.encode(), 0, 0, 0)  # PR_SET_NAME
                s.connect(d.sock)
                if not before_accept:
                    os.read(r, 1)  # until the daemon stopped with this pid's pidfd
            finally:
                os._exit(0)
        os.close(r)
        if not before_accept:
            _, st = os.waitpid(d.proc.pid, os.WUNTRACED)
            check(os.WIFSTOPPED(st), "the daemon stopped before reading the peer's cgroup")
        os.close(w)
        os.waitpid(pid, 0)  # exited and reaped: its pid is free
        _, release = take_pid(pid)
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    return raw_client(s, job), release


def opened_until_refused(d, most=64):
    """Connections (kept open) until the daemon refuses one: their count and
    the refusal's notice."""
    held = []
    while len(held) < most:
        c = Client(d.sock, TIMEOUT)
        try:
            c.call("hello", {"version": 1})
        except (EOFError, ConnectionResetError):
            note = [n[2][0] for n in c.notes if n[1] == "protocol.error"]
            for x in held + [c]:
                x.close()
            return len(held), note
        held.append(c)
    for x in held:
        x.close()
    return len(held), None


def ids(c):
    return [d["id"] for d in c.call("devices", {})["devices"]]


def gemm_args(device, n=4):
    import numpy as np
    a = np.arange(n * n, dtype=np.float32).reshape(n, n)
    t = {"dtype": "f32", "shape": [n, n], "data": a.tobytes()}
    return {"op": "gemm", "device": device, "inputs": [t, t]}, a @ a


def metrics(c):
    return c.call("metrics", {})


def small_tmpfs(tmp, what):
    """A 64 KiB tmpfs mounted at tmp/full, for state files that cannot be written (the
    caller unmounts it); None, said, where it cannot be mounted (root without
    CAP_SYS_ADMIN, an unprivileged container): then what did not run."""
    mnt = os.path.join(tmp, "full")
    os.mkdir(mnt)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", mnt],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print("cannot mount a tmpfs (%s): %s did not run" % (p.stderr.strip(), what))
        return None
    return mnt


def status_job(c, job):
    for j in c.call("status", {})["jobs"]:
        if j["job"] == job:
            return j
    return None


def cli(d, submit, gpu, cpu):
    """dspk-submit job register/end, as the prolog and epilog call them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["DSPK_SOCKET"] = d.sock

    def sub(*args, **kw):
        return subprocess.run([submit] + list(args), capture_output=True, text=True,
                              timeout=TIMEOUT, env=dict(env, **kw))
    p = sub("job", "register", "--devices", "GPU-" + gpu["uuid"].upper(), "--json",
            SLURM_JOB_ID="300", SLURM_JOB_UID=str(NOBODY))
    check(p.returncode == 0, "job register: %s" % p.stderr)
    ans = json.loads(p.stdout)
    check(ans["job"] == 300 and ans["uid"] == NOBODY and
          sorted(ans["devices"]) == sorted([cpu["id"], gpu["id"]]), "register: %r" % ans)
    p = sub("job", "register", "--job", "301", "--uid", "0")  # no --devices: the cpu only
    check(p.returncode == 0 and p.stdout == "job 301: registered\n", "301: %r" % p.stdout)
    # Plain `dspk-submit status` in a job (docs/cluster.md, "In a user's batch script";
    # probe 19 G4: only --json showed a job): the connection's job, each client's JOB, the
    # registered jobs, and the job's devices (301: the cpu only).  Outside a job, with the
    # two jobs of uid 0 registered and none named, the job is not decided and says why.
    p = sub("status", SLURM_JOB_ID="301")
    lines = p.stdout.splitlines()
    me = [ln for ln in lines if ln.startswith("this connection: client ")]
    mine = [ln.split() for ln in lines if ln.startswith("  ") and ln.split()[:1] and
            me and ln.split()[0] == me[0].split()[3].rstrip(",")]
    jobs = lines.index("2 Slurm jobs:") if "2 Slurm jobs:" in lines else -1
    devs = lines.index("1 device:") if "1 device:" in lines else -1
    check(p.returncode == 0 and len(me) == 1 and me[0].endswith(", Slurm job 301") and
          len(mine) == 1 and mine[0][6] == "301" and jobs > 0 and
          lines[jobs + 1].split() == ["JOB", "UID", "GPUS", "CONNECTIONS", "INFLIGHT",
                                      "BUFFERS", "STATE"] and
          lines[jobs + 2].split() == ["300", str(NOBODY), "1", "0", "0", "0", "registered"]
          and lines[jobs + 3].split()[:3] == ["301", "0", "0"] and devs > 0 and
          lines[devs + 2].split()[0] == cpu["id"] and len(lines) == devs + 3,
          "status in job 301: %r" % (p,))
    p = sub("job", "register", "--job", "302", "--uid", "0")
    check(p.returncode == 0, "302: %r" % (p,))
    p = sub("status")
    check(p.returncode == 0 and "this connection: client " in p.stdout and
          ", Slurm job not decided (uid 0 has 2 Slurm jobs on this node: name one" in p.stdout
          and "\n3 Slurm jobs:\n" in p.stdout, "status, two jobs, none named: %r" % (p,))
    p = sub("status", "--json", SLURM_JOB_ID="302")
    st = json.loads(p.stdout)
    check([c["job"] for c in st["clients"] if c["self"]] == [302], "--json: %r" % st)
    check(sub("job", "end", "--job", "302").returncode == 0, "302 ended")
    p = sub("job", "register", "--job", "301")
    check(p.returncode == 2 and "--uid" in p.stderr, "register without a uid: %r" % p.stderr)
    p = sub("job", "end")
    check(p.returncode == 2 and "--job" in p.stderr, "end without a job: %r" % p.stderr)
    p = sub("job", "frob", "--job", "1")
    check(p.returncode == 2, "unknown subcommand")
    for job, want in (("300", "ended"), ("301", "ended"), ("300", "not registered on this node")):
        p = sub("job", "end", "--job", job)
        check(p.returncode == 0 and p.stdout == "job %s: %s\n" % (job, want),
              "end %s: %r %r" % (job, p.stdout, p.stderr))


def run(exe, submit, epilog, tmp, case=None):
    import numpy as np
    d = Daemon(exe, tmp, ["--max-job-memory", "1M"], env={"DSPKD_TEST_PEER_STOP": REUSE_COMM})
    try:
        admin = d.client()
        devs = admin.call("devices", {})["devices"]
        vk = [x for x in devs if x["backend"] == "vulkan" and x["uuid"]]
        if not vk:
            print("no Vulkan device with a UUID (lavapipe): the jobs test needs one")
            return 77
        gpu = vk[0]
        cpu = [x for x in devs if x["backend"] == "cpu"][0]
        if case == "down":
            d.stop()
            down(exe, submit, epilog, os.path.join(tmp, "down"), gpu, cpu)
            epilog_socket(exe, submit, epilog, os.path.join(tmp, "socket"))
            return 0
        if case == "hidden":
            d.stop()
            return 0 if hidden(exe, os.path.join(tmp, "hidden"), gpu, cpu) else 77
        if case == "ending":
            d.stop()
            daemon_check(Daemon(exe, tmp), ending)
            daemon_check(Daemon(exe, tmp, env={"DSPKD_TEST_CANCEL_WAIT": "after"}), end_log)
            killed_case(exe, submit, epilog, tmp)
            daemon_check(Daemon(exe, tmp), ending_again)
            return 0
        if case == "ended":
            d.stop()
            ended_list(exe, os.path.join(tmp, "ended"))
            return 0
        if case == "cgroup":
            d.stop()
            return 0 if cgroup_case(exe, os.path.join(tmp, "cgroup"), gpu, cpu) else 77
        if case == "usable":
            d.stop()
            usable_matrix(exe, os.path.join(tmp, "usable"), gpu, cpu)
            return 0
        if case == "paths":
            d.stop()
            paths(exe, submit, os.path.join(tmp, "paths"))
            collide(exe, os.path.join(tmp, "collide"))
            lock_guard(exe, os.path.join(tmp, "lock"))
            reload_guard(exe, os.path.join(tmp, "reload"))
            tmp_guard(exe, os.path.join(tmp, "tmpguard"))
            dir_guard(exe, os.path.join(tmp, "dirguard"))
            return 0
        cli(d, submit, gpu, cpu)

        # The admin methods: EPERM for anyone else (a child as uid 65534).
        os.chmod(tmp, 0o711)
        os.chmod(d.sock, 0o666)
        def as_nobody():
            c = d.client()
            return [err_of(c, "job.register", {"job": 5, "uid": NOBODY, "devices": []})[0],
                    err_of(c, "job.end", {"job": 5})[0]]
        got = dspk_daemon.run_as(NOBODY, NOBODY, as_nobody)
        check(got == ["EPERM", "EPERM"], "job.register/end by a non-admin: %r" % got)

        # Bad arguments.
        for bad in ({"uid": 0}, {"job": 0, "uid": 0}, {"job": 7, "uid": 0, "devices": [""]},
                    {"job": 7, "uid": 0, "devices": "x"}, {"job": 7}):
            check(err_of(admin, "job.register", bad)[0] == "EINVAL", "job.register %r" % bad)

        # Job 100 of uid 0 (this test runs as root) has no GPU: cpu only.
        me = os.getuid()
        ans = admin.call("job.register", {"job": 100, "uid": me, "devices": []})
        check(ans["devices"] == [cpu["id"]], "job 100 matches the cpu only: %r" % ans)
        # Job 101 of uid 0 has the Vulkan device, named as nvidia-smi would (GPU-, dashes,
        # upper case): the UUID is compared by its hex digits.
        u = gpu["uuid"].replace("-", "").upper()
        fancy = "GPU-%s-%s-%s-%s-%s" % (u[:8], u[8:12], u[12:16], u[16:20], u[20:])
        ans = admin.call("job.register", {"job": 101, "uid": me, "devices": [fancy]})
        check(sorted(ans["devices"]) == sorted([cpu["id"], gpu["id"]]),
              "job 101 matches cpu and %s: %r" % (gpu["id"], ans))
        check(err_of(admin, "job.register", {"job": 101, "uid": NOBODY})[0] == "EBUSY",
              "job 101 registered again for another uid")
        # A UUID is hex digits and dashes after an optional GPU- prefix: other
        # characters were dropped silently ("zz" + a UUID matched it), and the message
        # names what is wrong
        for bad, why in (("zz" + u, "byte 1 is not a hex digit"), ("q1", "byte 1"),
                         (fancy + " (mine)", "byte %d is not" % (len(fancy) + 1)),
                         ("GPU-", "no hex digits"), ("-", "no hex digits"),
                         ("a" * 40, "more than 39 hex digits")):
            e = err_of(admin, "job.register", {"job": 104, "uid": me, "devices": [bad]})
            check(e[0] == "EINVAL" and "devices[0]" in e[1] and why in e[1],
                  "job.register %r: %r" % (bad, e))
        # The same GPU in two spellings counts once, in the answer and in status.
        ans = admin.call("job.register", {"job": 104, "uid": me, "devices": [fancy, u.lower()]})
        j104 = status_job(admin, 104)
        check(j104["devices"] == [u.lower()] and
              sorted(ans["devices"]) == sorted([cpu["id"], gpu["id"]]),
              "the same GPU twice: %r %r" % (ans, j104))
        admin.call("job.end", {"job": 104})
        # A UUID that no device here has (a GPU the node lacks): ENODEV, so that the
        # prolog fails, and job 101 keeps its devices.
        e = err_of(admin, "job.register", {"job": 101, "uid": me, "devices": [fancy, "GPU-0badc0de"]})
        check(e[0] == "ENODEV" and "devices[1]" in e[1] and "0badc0de" in e[1],
              "job.register with an unknown UUID: %r" % (e,))
        p = subprocess.run([submit, "job", "register", "--job", "103", "--uid", "0", "--devices",
                            "GPU-0badc0de"], capture_output=True, text=True, timeout=TIMEOUT,
                           env=dict(os.environ, DSPK_SOCKET=d.sock))
        check(p.returncode != 0 and "0badc0de" in p.stderr,
              "dspk-submit job register with an unknown UUID: %r" % (p,))
        check(sorted(j["job"] for j in admin.call("status", {})["jobs"]) == [100, 101],
              "nothing registered by the refused calls")

        # Two jobs of this uid: a connection that names none gets EPERM for devices.
        c = d.client()
        e = err_of(c, "devices", {})
        check(e[0] == "EPERM" and "2 Slurm jobs" in e[1], "no claim with two jobs: %r" % (e,))
        check(err_of(c, "task.run", gemm_args("cpu:0")[0])[0] == "EPERM", "task.run unclaimed")
        # A connection made by a process that exited before the daemon read its cgroup
        # (it handed the socket on): its job cannot be decided from its cgroup, so its
        # claim is not believed while the uid has jobs here (it was: a process of job B
        # handing a socket to a claim of job A got A's GPU)
        ch = handed_on(d, 101)
        e = err_of(ch, "devices", {})
        check(e[0] == "EPERM" and "had exited before its cgroup could be read" in e[1],
              "a handed-on connection's claim: %r" % (e,))
        ch.close()
        # Nor when that process still exists but was exiting when its cgroup was read: a
        # zombie (a child that connected and was left unreaped), or a process whose main
        # thread had exited.  Its cgroup read as the root (no job) and the claim was
        # believed: a process of one job got its uid's other job's GPU (outside probe 15
        # F1).  The reaped one above stays "had exited".
        for leader in (False, True):
            ch, release = exiting_peer(d, 101, leader)
            try:
                e = err_of(ch, "devices", {})
                check(e[0] == "EPERM" and "was exiting, a zombie, or its main thread had "
                      "exited when its cgroup was read" in e[1],
                      "a claim from an exiting peer (%s): %r"
                      % ("main thread gone" if leader else "zombie", e))
                e = err_of(ch, "buffer.create", {"device": gpu["id"], "size": 64})
                check(e[0] == "EPERM", "a buffer from an exiting peer: %r" % (e,))
            finally:
                ch.close()
                release()
        # Nor when its pid had been taken by another live process (of the uid's other
        # job) when the daemon read its cgroup, before the accept or after it: that
        # process's cgroup was read and believed, with the claim (outside probe 16 F2).
        # Caught through the peer's pidfd (SO_PEERPIDFD, Linux 6.5).
        for before in (True, False):
            ch, release = reused_peer(d, 101, before)
            try:
                e = err_of(ch, "devices", {})
                check(e[0] == "EPERM" and "had exited before its cgroup could be read" in e[1],
                      "a claim from a peer whose pid was reused (%s the accept): %r"
                      % ("before" if before else "after", e))
            finally:
                ch.close()
                release()
        # ... and names one that is not registered here: EPERM.
        c9 = d.client(job=999)
        e = err_of(c9, "devices", {})
        check(e[0] == "EPERM" and "not registered" in e[1], "claim of job 999: %r" % (e,))

        # Job 100: the cpu only.  The Vulkan device is filtered and ENODEV, "any" is cpu.
        c100 = d.client(job=100)
        check(ids(c100) == [cpu["id"]], "job 100 devices: %r" % ids(c100))
        e = err_of(c100, "buffer.create", {"device": gpu["id"], "size": 64})
        check(e[0] == "ENODEV" and "job 100" in e[1], "buffer on the excluded device: %r" % (e,))
        args, want = gemm_args(gpu["id"])
        check(err_of(c100, "task.run", args)[0] == "ENODEV", "task on the excluded device")
        args, want = gemm_args("any")
        res = c100.call("task.run", args)
        check(res["device"] == cpu["id"], "any picks the cpu for job 100: %r" % res["device"])
        got = np.frombuffer(res["outputs"][0]["data"], dtype=np.float32).reshape(4, 4)
        check(np.allclose(got, want), "gemm of job 100")
        st = c100.call("status", {})
        check([x["id"] for x in st["devices"]] == [cpu["id"]], "job 100's status: cpu only")

        # Job 101: its GPU works, by name and through a buffer.
        c101 = d.client(job=101)
        check(sorted(ids(c101)) == sorted([cpu["id"], gpu["id"]]), "job 101 devices")
        b = c101.call("buffer.create", {"device": gpu["id"], "size": 1000})["buffer"]
        c101.call("buffer.write", {"buffer": b, "data": b"\1" * 1000})
        args, want = gemm_args(gpu["id"])
        res = c101.call("task.run", args)
        got = np.frombuffer(res["outputs"][0]["data"], dtype=np.float32).reshape(4, 4)
        check(np.allclose(got, want), "gemm of job 101 on %s" % gpu["id"])

        # A claim of another uid's job is EPERM.
        admin.call("job.register", {"job": 102, "uid": NOBODY, "devices": []})
        e = err_of(d.client(job=102), "devices", {})
        check(e[0] == "EPERM" and "another user" in e[1], "claim of nobody's job: %r" % (e,))

        # Per-job memory (--max-job-memory 1M): a second connection of job 101 cannot
        # pass the job's total on the device.
        c101b = d.client(job=101)
        e = err_of(c101b, "buffer.create", {"device": cpu["id"], "size": 600 << 10})
        check(e[0] == "ok", "first 600K of job 101 on the cpu")
        e = err_of(c101, "buffer.create", {"device": cpu["id"], "size": 600 << 10})
        check(e[0] == "ELIMIT" and "max_job_memory" in e[1], "job quota: %r" % (e,))
        # hello's and status' cpu_memory_quota include the job's quota (it said the
        # least of the connection's and the user's: 50% of the host), before the job is
        # decided too; a connection without one (the uid has two jobs) is not bound by it
        cq = d.client(job=101)
        cq_id = cq.call("hello", {"job": 101})["client_id"]
        for who in (c101, cq):
            q = [who.call("hello", {"job": 101})["limits"]["cpu_memory_quota"],
                 who.call("status", {})["daemon"]["limits"]["cpu_memory_quota"]]
            check(q == [1 << 20] * 2, "cpu_memory_quota of a job's connection: %r" % q)
        cq.close()  # gone before job.end below counts the job's connections
        while [x for x in admin.call("status", {})["clients"] if x["id"] == cq_id]:
            pass
        q = d.client().call("hello", {})["limits"]["cpu_memory_quota"]
        check(q > 1 << 20, "cpu_memory_quota without a job: %r" % q)

        # The cgroup names the job even without a claim (Slurm's cgroup plugins: a path
        # with /job_<id>/).  Needs a writable cgroup v1 hierarchy; said when it is not.
        cg_root = "/sys/fs/cgroup/freezer"
        cg = os.path.join(cg_root, "dspk-jobs-test-%d" % os.getpid(), "job_100")
        try:
            os.makedirs(cg)
        except OSError as e:
            print("note: the cgroup case did not run (%s)" % e)
            cg = None
        if cg:
            try:
                with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
                ccg = d.client()  # no claim; the uid has two jobs
                check(ids(ccg) == [cpu["id"]], "job 100 from the cgroup")
                ccg.close()
            finally:
                with open(os.path.join(cg_root, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
                os.rmdir(cg)
                os.rmdir(os.path.dirname(cg))

        # status, metrics, traces show the job.
        st = admin.call("status", {})
        mine = [x for x in st["clients"] if x["job"] == 101]
        check(len(mine) == 2, "status: two clients of job 101: %r" % st["clients"])
        j = status_job(admin, 101)
        check(j and j["connections"] == 2 and j["buffers"] == 2 and not j["ended"],
              "status: job 101: %r" % j)
        m = metrics(admin)
        check('dspk_slurm_job_buffers{job="101"} 2' in m, "metrics: job 101's buffers")
        check('dspk_slurm_job_connections{job="100"} 1' in m, "metrics: job 100")
        tr = c101.send("trace", {"seconds": 1.0})
        c101.call("task.run", gemm_args(gpu["id"])[0])
        jobs = [x.get("job") for x in c101.wait(tr)["jobs"]]
        check(101 in jobs, "trace: the task of job 101: %r" % jobs)

        # job.end 101 (the epilog): its connections are closed, buffers freed, work
        # canceled; the answer comes once they are gone.
        c101.send("task.run", gemm_args(gpu["id"], 64)[0])  # in flight at the end
        # A connection of job 101 that asked for no device yet (its job undecided) is
        # the job's too: closed and counted (it outlived the job)
        cz = d.client(job=101)
        cz.call("ping", {})
        ans = admin.call("job.end", {"job": 101})
        check(ans["ended"] and ans["connections"] == 3 and ans["buffers"] == 2,
              "job.end 101: %r" % ans)
        c101.expect_eof()
        c101b.expect_eof()
        cz.expect_eof()
        # c101b owed nothing: it read why it was closed (the end of its job, not a
        # daemon that died)
        pe = [n[2][0] for n in c101b.notes if n[1] == "protocol.error"]
        check(len(pe) == 1 and pe[0]["name"] == "EPERM" and
              pe[0]["message"] == "Slurm job 101 ended on this node",
              "job.end's notice: %r" % c101b.notes)
        check(status_job(admin, 101) is None, "status: job 101 gone")
        st = admin.call("status", {})
        check(not [x for x in st["clients"] if x["job"] == 101], "no client of job 101 left")
        check("101" not in "".join(x for x in metrics(admin).splitlines()
                                   if x.startswith("dspk_slurm_job")), "metrics: 101 gone")
        # A claim of the ended job is EPERM, and ending it again finds nothing.
        e = err_of(d.client(job=101), "devices", {})
        check(e[0] == "EPERM" and "ended" in e[1], "claim of an ended job: %r" % (e,))
        check(admin.call("job.end", {"job": 101})["ended"] is False, "job.end twice")

        # Now the uid has one job (100): a connection without a claim is bound to it.
        c1 = d.client()
        check(ids(c1) == [cpu["id"]], "the uid's only job binds an unclaimed connection")
        # A connection of a job cannot end it.
        e = err_of(c1, "job.end", {"job": 100})
        check(e[0] == "EINVAL", "job.end from the job's own connection: %r" % (e,))
        for x in (c, c9, c100, c1):
            x.close()
        admin.call("job.end", {"job": 100})
        admin.call("job.end", {"job": 102})
        check(admin.call("status", {})["jobs"] == [], "no job left")
        # Without registered jobs: every device again.
        check(gpu["id"] in ids(d.client()), "no job: every device")
        d.stop()
    except BaseException:
        sys.stderr.write(d.logtext()[-6000:])
        d.proc.kill()
        raise
    # --job-required: a connection without a registered job gets the cpu only.
    os.unlink(os.path.join(tmp, "dspkd.log"))
    d = Daemon(exe, tmp, ["--job-required"])
    try:
        c = d.client()
        check(ids(c) == [cpu["id"]], "job_required, no job: the cpu only")
        e = err_of(c, "buffer.create", {"device": gpu["id"], "size": 64})
        check(e[0] == "ENODEV" and "job_required" in e[1], "job_required: %r" % (e,))
        # An admin's devices --all lists every device with its UUID whatever its job
        # (how the node's GPU map is written; it listed the cpu only), and decides nothing
        every = c.call("devices", {"all": True})["devices"]
        check(sorted(x["id"] for x in every) == sorted([cpu["id"], gpu["id"]]) and
              [x["uuid"] for x in every if x["id"] == gpu["id"]] == [gpu["uuid"]],
              "job_required: an admin's devices --all: %r" % every)
        check(ids(c) == [cpu["id"]], "job_required: devices after --all")
        c.call("job.register", {"job": 5, "uid": os.getuid(), "devices": [gpu["uuid"]]})
        check(sorted(ids(d.client())) == sorted([cpu["id"], gpu["id"]]), "with a job: its GPU")
        # Ended, so that the daemons after this one (the same state file) start without
        # it: ending_again counts the registered jobs.
        c.call("job.end", {"job": 5})
        c.close()
        d.stop()
    except BaseException:
        sys.stderr.write(d.logtext()[-6000:])
        d.proc.kill()
        raise
    # An admin (root) may open 8 connections beyond max_clients and max_user_clients
    # (a prolog or epilog must not be refused when users fill the daemon); others not.
    os.unlink(os.path.join(tmp, "dspkd.log"))
    d = Daemon(exe, tmp, ["--max-clients", "2"])
    try:
        os.chmod(d.sock, 0o666)
        n, note = opened_until_refused(d)
        # The refusal gives the real numbers: the admin's 8 more included.
        check(n == 1 + 8 and note and note[0]["name"] == "ELIMIT" and note[0]["message"] ==
              "this user has 9 connections already (max_user_clients 1 and 8 more for admins)",
              "an admin's connections: %d %r" % (n, note))
        n, note = dspk_daemon.run_as(NOBODY, NOBODY, lambda: opened_until_refused(d))
        check(n == 1 and note and note[0]["message"] ==
              "this user has 1 connection already (max_user_clients 1)",
              "a user's connections: %d %r" % (n, note))
        d.stop()
        # max_clients: the same, for an admin and for a user.
        os.unlink(os.path.join(tmp, "dspkd.log"))
        d = Daemon(exe, tmp, ["--max-clients", "2", "--max-user-clients", "64"])
        os.chmod(d.sock, 0o666)
        n, note = opened_until_refused(d)
        check(n == 2 + 8 and note and note[0]["name"] == "ELIMIT" and note[0]["message"] ==
              "more than 10 connections (max_clients 2 and 8 more for admins)",
              "an admin's connections beyond max_clients: %d %r" % (n, note))
        n, note = dspk_daemon.run_as(NOBODY, NOBODY, lambda: opened_until_refused(d))
        check(n == 2 and note and note[0]["message"] == "more than 2 connections (max_clients)",
              "a user's connections beyond max_clients: %d %r" % (n, note))
        d.stop()
    except BaseException:
        sys.stderr.write(d.logtext()[-6000:])
        d.proc.kill()
        raise
    restart(exe, submit, os.path.join(tmp, "restart"), gpu, cpu)
    os.unlink(os.path.join(tmp, "dspkd.log"))
    daemon_check(Daemon(exe, tmp), ending)
    daemon_check(Daemon(exe, tmp, env={"DSPKD_TEST_CANCEL_WAIT": "after"}), end_log)
    killed_case(exe, submit, epilog, tmp)
    daemon_check(Daemon(exe, tmp), ending_again)
    os.unlink(os.path.join(tmp, "dspkd.log"))
    d = Daemon(exe, tmp)
    try:
        ending_stop(d)
    except BaseException:
        sys.stderr.write(d.logtext()[-6000:])
        d.proc.kill()
        raise
    ended_list(exe, os.path.join(tmp, "ended"))
    down(exe, submit, epilog, os.path.join(tmp, "down"), gpu, cpu)
    epilog_socket(exe, submit, epilog, os.path.join(tmp, "socket"))
    paths(exe, submit, os.path.join(tmp, "paths"))
    collide(exe, os.path.join(tmp, "collide"))
    lock_guard(exe, os.path.join(tmp, "lock"))
    usable_matrix(exe, os.path.join(tmp, "usable"), gpu, cpu)
    reload_guard(exe, os.path.join(tmp, "reload"))
    dir_guard(exe, os.path.join(tmp, "dirguard"))
    hidden(exe, os.path.join(tmp, "hidden"), gpu, cpu)
    cgroup_case(exe, os.path.join(tmp, "cgroup"), gpu, cpu)
    return 0


def ending_job(d, admin, job, n=1536, held=False):
    """Registers job for this uid with the Vulkan device, starts a gemm there from a
    connection of the job (lavapipe: it runs for a while, and a cancel does not stop a
    dispatch), ends the job from a second admin connection and waits until status shows
    it ending with its connection still there.  held: the gemm's A is a buffer of the
    job's connection (held by the running gemm after the close).  The job's connection,
    and the job.end's connection and msgid."""
    gpu = [x for x in admin.call("devices", {})["devices"] if x["backend"] == "vulkan"][0]
    admin.call("job.register", {"job": job, "uid": os.getuid(), "devices": [gpu["uuid"]]})
    cj = d.client(job=job)
    args = gemm_args(gpu["id"], n)[0]
    if held:
        a = args["inputs"][0]
        b = cj.call("buffer.create", {"device": gpu["id"], "size": len(a["data"])})["buffer"]
        cj.call("buffer.write", {"buffer": b, "data": a["data"]})
        args["inputs"][0] = {"buffer": b, "dtype": "f32", "shape": a["shape"]}
    cj.send("task.run", args)
    # Both waits are bounded: a gemm that ended before status showed the job
    # ending would otherwise leave them spinning for good (seen once on a
    # loaded machine).
    # Running, not only in flight: a gemm still queued when job.end comes is
    # canceled at once, and the job ends before status shows it ending (seen
    # under a loaded ctest -j2: "status: None").
    deadline = time.monotonic() + 120

    def running():
        st = admin.call("status", {})
        dev = [x for x in st["devices"] if x["id"] == gpu["id"]][0]
        return dev["running"] >= 1 and any(j["job"] == job and j["inflight"]
                                           for j in st["jobs"])
    while not running():
        check(time.monotonic() < deadline, "job %d: its gemm never showed running" % job)
    ender = d.client()
    first = ender.send("job.end", {"job": job})
    while True:
        j = status_job(admin, job)
        if j and j["ended"]:
            break
        check(j is not None and time.monotonic() < deadline,
              "job %d: not seen ending with its gemm in flight (status: %r)" % (job, j))
    check(j["connections"] == 1 and j["inflight"] == 1,
          "job %d ending with its task: %r" % (job, j))
    return cj, ender, first


def ending(d):
    """A second job.end of a job still ending (an epilog run again) waits with the first
    and gets the same answer (it answered {ended: false} at once, while the job's work
    still ran)."""
    admin = d.client()
    n = 2048
    cj, ender, first = ending_job(d, admin, 91, n, held=True)
    # Its buffer stays allocated under the running gemm: status, the per-job metrics
    # and the client row count it until it is freed, as the job.end answer does (they
    # said 0 while the answer said 1: probe 14 A5)
    j = status_job(admin, 91)
    st = [x for x in admin.call("status", {})["clients"] if x["job"] == 91]
    got = dict(x.rsplit(" ", 1) for x in metrics(admin).splitlines()
               if x.startswith("dspk_slurm_job_buffer"))
    check((j["buffers"], j["buffer_bytes"]) == (1, 4 * n * n) and
          [(x["buffers"], x["buffer_bytes"]) for x in st] == [(1, 4 * n * n)] and
          got == {'dspk_slurm_job_buffers{job="91"}': "1",
                  'dspk_slurm_job_buffer_bytes{job="91"}': str(4 * n * n)},
          "job 91 ending holds its buffer: %r %r %r" % (j, st, got))
    a2 = admin.call("job.end", {"job": 91})
    a1 = ender.wait(first)
    check(a1["ended"] and a1 == a2 and a1["connections"] == 1 and a1["inflight"] == 1 and
          a1["buffers"] == 1, "job.end twice: %r %r" % (a1, a2))
    # The log says the gemm was in flight, not that it was canceled (probe 17 F8);
    # end_log checks what it says became of such work.
    log = [x for x in d.logtext().splitlines() if "Slurm job 91" in x]
    check(any(x.endswith("Slurm job 91 ended: 1 connection(s) closed, 1 request(s) in flight, "
                         "1 buffer(s) freed") for x in log),
          "job 91's end in the log: %r" % (log,))
    cj.expect_eof()
    check(admin.call("job.end", {"job": 91})["ended"] is False, "job.end once it has ended")


def end_log(d):
    """The daemon's log says what became of the requests a job.end found in flight: it
    said "N request(s) in flight canceled" of work that a cancel does not stop and ran to
    its end (probe 17 F8).  DSPKD_TEST_CANCEL_WAIT=after holds the cpu runner after its
    gemm ran, until the cancel comes (as a dispatch that cannot be stopped); a second
    gemm waits in the queue behind it and is dropped."""
    admin = d.client()
    admin.call("job.register", {"job": 92, "uid": os.getuid(), "devices": []})
    cj = d.client(job=92)
    args = gemm_args("cpu:0", 320)[0]  # not quick (cpu.c): a runner, not the loop
    cj.send("task.run", args)
    cj.send("task.run", args)
    # Both in flight, and the first held by the hook after it ran (its log line): the
    # runner took it, so that the end finds it running, not queued.
    deadline = time.monotonic() + TIMEOUT
    while ((status_job(admin, 92) or {}).get("inflight") != 2 or
           "the runner waits for the task's cancel after it runs" not in d.logtext()):
        check(time.monotonic() < deadline, "job 92: its gemms never showed in flight")
    a = admin.call("job.end", {"job": 92})
    check(a["ended"] and a["inflight"] == 2, "job 92 ended: %r" % (a,))
    cj.expect_eof()
    log = [x for x in d.logtext().splitlines() if "Slurm job 92" in x]
    check(any(x.endswith("Slurm job 92 ended: 1 connection(s) closed, 2 request(s) in flight, "
                         "0 buffer(s) freed") for x in log) and
          any(x.endswith("Slurm job 92: its end is done: 1 request(s) canceled, 1 ran to "
                         "their end (work a cancel does not stop)") for x in log),
          "job 92's end in the log: %r" % (log,))


def killed_client(d, epilog, submit, release):
    """A job whose client was killed while its task runs (under Slurm, slurmstepd kills
    the job's processes before the epilog runs): the connection is closed from the peer's
    side, yet it stays the job's until its task ends, and the epilog's job.end, its log line
    and status count it, its request in flight and the buffer that request holds (they said
    0 connections, 0 requests, 0 buffers while status showed the job with both, and the
    later line "1 ran to their end": probe 18 F1).  DSPKD_TEST_CANCEL_WAIT=after:RELEASE
    holds the cpu runner after its gemm ran, past the cancel that the hang-up brings, until
    the file RELEASE exists: a task that a cancel does not stop (a raw kernel, a vulkan
    gemm), for exactly as long as the test wants."""
    admin = d.client()
    job, n = 98, 320  # not quick (cpu.c): a runner, not the loop
    admin.call("job.register", {"job": job, "uid": os.getuid(), "devices": []})
    args = gemm_args("cpu:0", n)[0]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the job's process: its client, killed mid-task
        try:
            os.close(r)
            c = d.client(job=job)
            a = args["inputs"][0]
            b = c.call("buffer.create", {"device": "cpu:0", "size": len(a["data"])})["buffer"]
            c.call("buffer.write", {"buffer": b, "data": a["data"]})
            args["inputs"][0] = {"buffer": b, "dtype": "f32", "shape": a["shape"]}
            c.send("task.run", args)
            os.write(w, b"sent")
            while True:
                signal.pause()
        finally:
            os._exit(1)
    os.close(w)
    check(os.read(r, 4) == b"sent", "the job's client did not send its task")
    deadline = time.monotonic() + TIMEOUT
    held = "then for the file %s (DSPKD_TEST_CANCEL_WAIT=" % release
    while held not in d.logtext():
        check(time.monotonic() < deadline, "job %d: its gemm never ran" % job)
    cid = [x["id"] for x in admin.call("status", {})["clients"] if x["job"] == job]
    check(len(cid) == 1, "job %d: one connection: %r" % (job, cid))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(r)
    # The daemon saw the hang-up (its debug line) and canceled the task, which runs on.
    gone = "client %d: closing: " % cid[0]
    while gone not in d.logtext() or "the runner saw the task's cancel" not in d.logtext():
        check(time.monotonic() < deadline, "job %d: its client's hang-up not seen" % job)
    j = status_job(admin, job)
    check((j["connections"], j["inflight"], j["buffers"], j["buffer_bytes"], j["ended"]) ==
          (1, 1, 1, 4 * n * n, False), "job %d after its client was killed: %r" % (job, j))
    # The epilog, as slurmd runs it: it waits for the task (held) and answers after it.
    ep = subprocess.Popen([epilog], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=epilog_env(d.sock, job, DSPK_SUBMIT=submit))
    try:
        line = "Slurm job %d ended: " % job
        while line not in d.logtext():
            check(time.monotonic() < deadline and ep.poll() is None,
                  "job %d: no end in the log (epilog: %r)" % (job, ep.poll()))
        log = [x for x in d.logtext().splitlines() if line in x]
        check(len(log) == 1 and log[0].endswith(
            line + "1 connection(s) closed, 1 request(s) in flight, 1 buffer(s) freed"),
            "job %d's end in the log: %r" % (job, log))
        # status agrees with the end while the task still runs
        j = status_job(admin, job)
        check((j["connections"], j["inflight"], j["buffers"], j["ended"]) == (1, 1, 1, True),
              "job %d ending: %r" % (job, j))
    finally:
        open(release, "w").close()
    out, err = ep.communicate(timeout=TIMEOUT)
    check(ep.returncode == 0 and err == "" and json.loads(out) ==
          {"job": job, "ended": True, "connections": 1, "inflight": 1, "buffers": 1},
          "the epilog of job %d: %r %r %r" % (job, ep.returncode, out, err))
    log = [x for x in d.logtext().splitlines() if "Slurm job %d: its end" % job in x]
    check(len(log) == 1 and log[0].endswith(
        "Slurm job %d: its end is done: 0 request(s) canceled, 1 ran to their end (work a "
        "cancel does not stop)" % job), "job %d's end's end in the log: %r" % (job, log))
    check(status_job(admin, job) is None, "job %d left after its end" % job)


def killed_case(exe, submit, epilog, tmp):
    """killed_client on a daemon whose cpu runner holds its task until the file exists."""
    release = os.path.join(tmp, "release-98")
    d = Daemon(exe, tmp, env={"DSPKD_TEST_CANCEL_WAIT": "after:" + release})
    daemon_check(d, lambda d: killed_client(d, epilog, submit, release))
    os.unlink(release)


def ending_again(d):
    """A job registered again while it ends (a requeued job's prolog before its old
    epilog's job.end is answered): status lists both registrations, metrics one series
    per job id, the sum of both (two series with one label set made the whole scrape
    invalid Prometheus text, and dspk_slurm_jobs counted the job twice)."""
    admin = d.client()
    # A longer gemm: the end must still wait for it after the status look and the
    # register (1536^2 ended in between now and then on a loaded machine; 2560^2
    # f32 is two 26 MB operands, within max_message).
    cj, ender, first = ending_job(d, admin, 93, 2560)
    admin.call("job.register", {"job": 93, "uid": os.getuid(), "devices": []})
    # In the order of registration, as protocol.md says: the ending one, then the new
    # one (the new one was listed first: outside probe 16 F4).
    regs = [(j["ended"], j["connections"]) for j in admin.call("status", {})["jobs"]
            if j["job"] == 93]
    check(regs == [(True, 1), (False, 0)], "job 93 ending and registered again: %r" % regs)
    samples = [x.rsplit(" ", 1) for x in metrics(admin).splitlines()
               if x and not x.startswith("#")]
    names = [n for n, _ in samples]
    dups = sorted({n for n in names if names.count(n) > 1})
    check(not dups, "metrics: series given twice: %r" % dups)
    got = dict(samples)
    check(got.get('dspk_slurm_job_connections{job="93"}') == "1" and
          got.get("dspk_slurm_jobs") == "1",
          "metrics of job 93 ending and registered again: %r" %
          {k: v for k, v in got.items() if "slurm_job" in k})
    a = ender.wait(first)
    check(a["ended"] and a["connections"] == 1, "job.end: %r" % a)
    cj.expect_eof()
    check([j["ended"] for j in admin.call("status", {})["jobs"] if j["job"] == 93] == [False],
          "job 93 registered again after its end")
    # Series in increasing order of job id, whatever the order of registration (the
    # families are built from sorted rows: a scrape of many jobs was quadratic in them)
    for job in (97, 94, 95):
        admin.call("job.register", {"job": job, "uid": os.getuid(), "devices": []})
    c95 = d.client(job=95)
    c95.call("devices", {})
    for fam in ("connections", "inflight", "buffers", "buffer_bytes"):
        series = [x.rsplit(" ", 1) for x in metrics(admin).splitlines()
                  if x.startswith("dspk_slurm_job_%s{" % fam)]
        check([n for n, _ in series] == ['dspk_slurm_job_%s{job="%d"}' % (fam, j)
                                         for j in (93, 94, 95, 97)],
              "metrics: %s in increasing order of job id: %r" % (fam, series))
        if fam == "connections":
            check([v for _, v in series] == ["0", "0", "1", "0"],
                  "metrics: connections of 93, 94, 95, 97: %r" % series)
    check("dspk_slurm_jobs 4" in metrics(admin).splitlines(), "metrics: four jobs")
    c95.close()
    for job in (97, 94, 95):
        admin.call("job.end", {"job": job})
    # Ended, so that the next daemon on this state file does not give the admin's uid
    # this job's devices (the cpu only) in ending_stop.
    admin.call("job.end", {"job": 93})


def ending_stop(d):
    """A job.end waiting for its job's connections when the daemon stops is answered
    before its connection closes (the stop closed it unanswered)."""
    admin = d.client()
    cj, ender, first = ending_job(d, admin, 92)
    check(admin.call("daemon.stop", {})["stopping"], "daemon.stop")
    a = ender.wait(first)
    check(a["ended"] and a["connections"] == 1, "job.end at the stop: %r" % a)
    ender.expect_eof()
    cj.expect_eof()
    rc = d.proc.wait(TIMEOUT)
    check(rc == 0, "dspkd exited with %s:\n%s" % (rc, d.logtext()))


def cgroup_case(exe, tmp, gpu, cpu):
    """The cgroup source reads the line of Slurm's hierarchy alone (docs/cluster.md): cgroup
    v1's freezer (proctrack/cgroup), else v2's "0::".  A process that moves itself under a
    job_<other> directory of another hierarchy (one systemd delegates to the user, pids
    here, listed before freezer; or the unified one beside v1) is not taken for that job,
    and a freezer path that names two jobs names none that is believed.  Needs writable
    v1 freezer and pids hierarchies; False (skipped) without them."""
    roots = {h: "/sys/fs/cgroup/" + h for h in ("freezer", "pids", "unified")}
    base = "dspk-cg-test-%d" % os.getpid()
    made = []
    try:
        for h, r in roots.items():
            os.makedirs(os.path.join(r, base, "job_100", "job_101"))
            made.append(h)
            for sub in ("job_101", "job_0100", "job_0"):
                os.makedirs(os.path.join(r, base, sub))
    except OSError as e:
        print("note: the cgroup case did not run (%s)" % e)
        for h in made:
            for sub in ("job_100/job_101", "job_100", "job_101", "job_0100", "job_0", ""):
                try:
                    os.rmdir(os.path.join(roots[h], base, sub))
                except OSError:
                    pass
        return False
    me = str(os.getpid())

    def put(where):
        for h, r in roots.items():
            sub = where.get(h)
            with open(os.path.join(r, base, sub, "cgroup.procs") if sub
                      else os.path.join(r, "cgroup.procs"), "w") as f:
                f.write(me)

    def check_cases(d):
        admin = d.client()
        uid = os.getuid()
        admin.call("job.register", {"job": 100, "uid": uid, "devices": []})
        admin.call("job.register", {"job": 101, "uid": uid, "devices": [gpu["uuid"]]})
        for where, want, name in (
                ({"freezer": "job_100"}, [cpu["id"]], "freezer job_100"),
                ({"freezer": "job_100", "pids": "job_101"}, [cpu["id"]],
                 "freezer job_100, pids job_101 (listed first)"),
                ({"pids": "job_101"}, "has 2 Slurm jobs", "pids job_101 alone"),
                ({"unified": "job_101"}, "has 2 Slurm jobs", "the unified job_101 beside v1"),
                ({"freezer": "job_100/job_101"}, "names two Slurm jobs",
                 "freezer job_100/job_101"),
                # A leading zero (or job 0) is no job id, as everywhere else: not job 100
                # (probe 17 F9); the uid's two jobs then leave it none.
                ({"freezer": "job_0100"}, "has 2 Slurm jobs", "freezer job_0100"),
                ({"freezer": "job_0"}, "has 2 Slurm jobs", "freezer job_0")):
            try:
                put(where)
                c = d.client()  # no claim; the uid has two jobs
            finally:
                put({})
            got = ids(c) if isinstance(want, list) else err_of(c, "devices", {})
            ok = got == want if isinstance(want, list) else (got[0] == "EPERM" and
                                                             want in got[1])
            check(ok, "cgroup %s: %r" % (name, got))
            c.close()
        # A claim does not beat a cgroup that names two jobs.
        try:
            put({"freezer": "job_100/job_101"})
            c = d.client(job=101)
        finally:
            put({})
        e = err_of(c, "devices", {})
        check(e[0] == "EPERM" and "names two Slurm jobs" in e[1], "two jobs and a claim: %r"
              % (e,))
        c.close()
    try:
        os.mkdir(tmp)
        daemon_check(Daemon(exe, tmp), check_cases)
    finally:
        put({})
        for r in roots.values():
            for sub in ("job_100/job_101", "job_100", "job_101", "job_0100", "job_0", ""):
                os.rmdir(os.path.join(r, base, sub))
    return True


def usable_matrix(exe, tmp, gpu, cpu):
    """status' devices are "the devices the caller may use" (docs/protocol.md, status) for
    every kind of caller: what `devices` lists and what buffer.create accepts, for an admin
    (root) and a non-admin (uid 65534), outside any job, in a job with the GPU, in a job
    without it, and undecided (two jobs of its uid, none named), under job_required = no
    and yes (probe 19 G3: an admin outside a job was shown the GPU that job_required kept
    from it).  The expected sets come from the rule of "Slurm jobs", not from the daemon.
    status is asked first (it decides nothing), then devices, then a buffer on each."""
    os.chmod(os.path.dirname(tmp), 0o711)
    os.makedirs(tmp, exist_ok=True)
    os.chmod(tmp, 0o711)
    every, only_cpu = sorted([cpu["id"], gpu["id"]]), [cpu["id"]]

    def look(sock, job):
        c = Client(sock, TIMEOUT)
        args = {"version": 1, "client": "usable"}
        if job is not None:
            args["job"] = job
        c.call("hello", args)
        shown = sorted(x["id"] for x in c.call("status", {})["devices"])
        try:
            listed = sorted(x["id"] for x in c.call("devices", {})["devices"])
        except RpcError as e:
            listed = e.name
        made = {}
        for dev in (cpu["id"], gpu["id"]):
            try:
                b = c.call("buffer.create", {"device": dev, "size": 64})["buffer"]
                c.call("buffer.free", {"buffer": b})
                made[dev] = "ok"
            except RpcError as e:
                made[dev] = e.name
        c.close()
        return [shown, listed, sorted(k for k, v in made.items() if v == "ok"),
                sorted(set(made.values()) - {"ok"})]

    for required in (False, True):
        d = Daemon(exe, tmp, ["--job-required"] if required else [])
        try:
            os.chmod(d.sock, 0o666)
            admin = d.client()
            outside = only_cpu if required else every
            for uid, base in ((0, 500), (NOBODY, 600)):
                # base: in a job with the GPU; base+1: in a job without it.
                admin.call("job.register", {"job": base, "uid": uid, "devices": [gpu["uuid"]]})
                admin.call("job.register", {"job": base + 1, "uid": uid, "devices": []})
            # (who, claim, expected status = devices = buffers, devices' error)
            cases = [("a job with the GPU", 500, every, None),
                     ("a job without it", 501, only_cpu, None),
                     ("undecided (two jobs, none named)", None, only_cpu, "EPERM")]
            for uid, base in ((0, 500), (NOBODY, 600)):
                who = "admin" if uid == 0 else "uid %d" % uid
                for what, claim, want, err in cases:
                    job = None if claim is None else claim - 500 + base
                    if uid == 0:
                        got = look(d.sock, job)
                    else:
                        got = dspk_daemon.run_as(NOBODY, NOBODY,
                                                 lambda job=job: look(d.sock, job))
                    expect = [want, err or want, [] if err else want, [err] if err else
                              (["ENODEV"] if want == only_cpu else [])]
                    check(got == expect, "job_required=%s, %s, %s: status, devices, buffers, "
                          "errors %r, expected %r" % (required, who, what, got, expect))
                # Outside any job: the uid's jobs ended.
                admin.call("job.end", {"job": base})
                admin.call("job.end", {"job": base + 1})
                if uid == 0:
                    got = look(d.sock, None)
                else:
                    got = dspk_daemon.run_as(NOBODY, NOBODY, lambda: look(d.sock, None))
                expect = [outside, outside, outside, ["ENODEV"] if required else []]
                check(got == expect, "job_required=%s, %s outside any job: status, devices, "
                      "buffers, errors %r, expected %r" % (required, who, got, expect))
            admin.close()
        finally:
            d.stop()


def job_ids(c):
    return sorted(j["job"] for j in c.call("status", {})["jobs"])


def daemon_check(d, fn):
    """Runs fn(d), then stops d; on an error writes d's log and kills it."""
    try:
        fn(d)
        d.stop()
    except BaseException:
        sys.stderr.write(d.logtext()[-6000:])
        d.proc.kill()
        d.proc.wait()  # gone, so that a tmpfs it wrote to can be unmounted
        raise


def restart(exe, submit, tmp, gpu, cpu):
    """Registrations outlive a restart (docs/protocol.md, "Slurm jobs"): the jobs and the
    ended ones are in dspkd.jobs beside the socket (dspkd.sock); an unsafe or corrupt file
    is refused and the daemon fails closed; a state file that cannot be written fails
    job.register and job.end with EIO and changes nothing."""
    os.mkdir(tmp)
    os.chmod(tmp, 0o711)
    state = os.path.join(tmp, "dspkd.jobs")
    me = os.getuid()

    def before(d):
        admin = d.client()
        admin.call("job.register", {"job": 10, "uid": me, "devices": [gpu["uuid"]]})
        admin.call("job.register", {"job": 11, "uid": me, "devices": []})
        admin.call("job.register", {"job": 12, "uid": NOBODY, "devices": [gpu["uuid"]]})
        admin.call("job.end", {"job": 12})
        st = os.lstat(state)
        check(st.st_mode & 0o7777 == 0o600 and st.st_uid == os.geteuid(),
              "dspkd.jobs mode %o uid %d" % (st.st_mode, st.st_uid))
    daemon_check(Daemon(exe, tmp), before)
    good = open(state).read()

    def after(d):
        admin = d.client()
        jobs = {j["job"]: j for j in admin.call("status", {})["jobs"]}
        check(sorted(jobs) == [10, 11] and jobs[10]["devices"] == [gpu["uuid"]] and
              jobs[11]["devices"] == [] and jobs[10]["uid"] == me,
              "jobs after the restart: %r" % jobs)
        check("2 job(s) registered again, 1 ended job(s) remembered" in d.logtext(), "log")
        # A claim of the job that ended before the restart is still EPERM.
        os.chmod(d.sock, 0o666)
        e = dspk_daemon.run_as(NOBODY, NOBODY, lambda: err_of(d.client(job=12), "devices", {}))
        check(e[0] == "EPERM" and "ended" in e[1], "claim of ended job 12: %r" % (e,))
        # Each job's connection sees its own devices only.
        check(ids(d.client(job=11)) == [cpu["id"]], "job 11: the cpu only")
        c10 = d.client(job=10)
        check(sorted(ids(c10)) == sorted([cpu["id"], gpu["id"]]), "job 10: cpu and its GPU")
        # The epilog of a job registered before the restart ends it (and its connection).
        p = subprocess.run([submit, "job", "end", "--job", "10"], capture_output=True,
                           text=True, timeout=TIMEOUT, env=dict(os.environ, DSPK_SOCKET=d.sock))
        check(p.returncode == 0 and p.stdout == "job 10: ended\n", "epilog: %r" % (p,))
        try:
            c10.call("devices", {})
            check(False, "job 10's connection was not closed")
        except (RpcError, OSError, EOFError):
            pass
        check(job_ids(admin) == [11], "job 11 left")
    daemon_check(Daemon(exe, tmp), after)

    # A GPU gone at start (a daemon without vulkan): the job stays registered with what
    # is found, and the log names the job and the UUID.
    admin_reg = {"job": 13, "uid": me, "devices": [gpu["uuid"]]}
    daemon_check(Daemon(exe, tmp), lambda d: d.client().call("job.register", admin_reg))

    def gone(d):
        check(job_ids(d.client()) == [11, 13], "both kept")
        check(ids(d.client(job=13)) == [cpu["id"]], "job 13 without its GPU: the cpu only")
        check("Slurm job 13 (uid %d): no device of this daemon has its GPU %s" % (me, gpu["uuid"])
              in d.logtext(), "the missing GPU is logged")
        d.client().call("job.end", {"job": 13})
    daemon_check(Daemon(exe, tmp, ["--backends", "cpu"]), gone)

    # Unsafe or corrupt files: refused (an error naming the file and why), no job, and
    # a connection without a job gets the cpu only (fail closed).
    good = open(state).read()
    lines = good.splitlines(True)

    def plain(text, mode=0o600, uid=0):
        def make():
            with open(state, "w") as f:
                f.write(text)
            os.chmod(state, mode)
            os.chown(state, uid, -1)
        return make

    def link():
        plain(good)()
        os.rename(state, state + ".real")
        os.symlink(state + ".real", state)
    cases = [(plain(good, uid=NOBODY), "owned by uid %d" % NOBODY),
             (plain(good, mode=0o666), "writable by group or others (mode 0666"),
             (link, "symbolic link"),
             (plain("".join(lines[:-1])), "no \"end\" line"),
             (plain(good[:-3]), "cut short"),
             (plain(good.replace("job 11 0", "job 11 x")),
              "line 2: job: UID \"x\" is not a decimal number"),
             (plain("garbage\n"), "line 1: not \"dspkd-jobs 1\""),
             (plain(good.replace(lines[-1], "end 99\n")), "\"end 99\" but 4 records"),
             # not what the daemon writes, though each line could be read
             (plain(good.replace("job 11 0", "job 011 0")),
              "line 2: job: ID 011 has a leading zero (dspkd writes none)"),
             (plain(good.replace("job 11 0", "job 11 0 abcd abcd")),
              "line 2: job 11: UUID abcd listed twice"),
             (plain(good.replace("ended 10 0", "ended 11 0")),
              "line 4: job 11 both registered and ended"),
             (plain("dspkd-jobs 1\nended 11 0\njob 11 0\nend 2\n"),
              "line 3: job 11 both ended and registered"),
             (plain(good.replace("ended 10 0", "ended 13 0")), "line 5: job 13 ended twice")]
    check(good == "dspkd-jobs 1\njob 11 0\nended 12 %d\nended 10 0\nended 13 0\nend 4\n"
          % NOBODY, "state file: %r" % good)
    for make, why in cases:
        for f in (state, state + ".real"):
            if os.path.lexists(f):
                os.unlink(f)
        make()

        def refused(d):
            log = d.logtext()
            check("refusing the state file %s: " % state in log and why in log,
                  "%s: %s" % (why, log[-3000:]))
            check(job_ids(d.client()) == [], "%s: no job" % why)
            check(ids(d.client()) == [cpu["id"]], "%s: fail closed, the cpu only" % why)
            e = err_of(d.client(), "buffer.create", {"device": gpu["id"], "size": 64})
            check(e[0] == "ENODEV" and "state file was refused" in e[1], "%s: %r" % (why, e))
        daemon_check(Daemon(exe, tmp), refused)
    os.unlink(state)
    if os.path.lexists(state + ".real"):
        os.unlink(state + ".real")

    # A state file that cannot be written (a full tmpfs): job.register and job.end
    # fail with EIO naming it, and nothing changes.
    mnt = small_tmpfs(tmp, "the full-disk check")
    if mnt is None:
        return
    try:
        fstate = os.path.join(mnt, "jobs.state")

        def fill():
            fd = os.open(os.path.join(mnt, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                while True:
                    os.write(fd, b"x" * 4096)
            except OSError:
                pass
            os.close(fd)

        def full(d):
            admin = d.client()
            admin.call("job.register", {"job": 20, "uid": me, "devices": []})
            fill()
            for method, args in (("job.register", {"job": 21, "uid": me, "devices": []}),
                                 ("job.register", {"job": 20, "uid": me,
                                                   "devices": [gpu["uuid"]]}),
                                 ("job.end", {"job": 20})):
                e = err_of(admin, method, args)
                # the file a step failed on is named: the temporary one
                again = method == "job.register" and args["job"] == 20
                check(e[0] == "EIO" and fstate + ".tmp:" in e[1] and
                      ("keeps its registration" if again else "nothing changed") in e[1],
                      "%s %r on a full disk: %r" % (method, args, e))
            jobs = admin.call("status", {})["jobs"]
            check([(j["job"], j["devices"]) for j in jobs] == [(20, [])],
                  "nothing changed: %r" % jobs)
            check(ids(d.client(job=20)) == [cpu["id"]], "job 20 still registered, no GPU")
            os.unlink(os.path.join(mnt, "filler"))
            admin.call("job.end", {"job": 20})
            check(job_ids(admin) == [], "job 20 ended once the disk has room")
            check(not os.path.exists(fstate + ".tmp"), "no temporary file left")
        daemon_check(Daemon(exe, tmp, ["--job-state", fstate]), full)
    finally:
        subprocess.run(["umount", mnt], check=True)


def ended_list(exe, tmp):
    """The ended jobs dspkd knows are the last 256 ended on the node, and a job registered
    again (a requeued one) leaves that list (docs/cluster.md, "How a job is limited to its
    GPUs"): after each step the state file's ended lines are those of a model of that rule
    (a Python list), through job.end and job.register, a reload, a restart, dspkd --end-job,
    a state file of 256 ended jobs written by hand (one of 257 is refused), and the undo of
    a job.register or job.end that could not be written; a claim of the oldest remembered
    job is EPERM and one of the job just forgotten is not.  (Probe 21 F1: once the list was
    full, each job registered again and ended again dropped one more: 255 after one
    requeue, 128 after 260, and a forgotten job's claim got every device.)"""
    os.chmod(os.path.dirname(tmp), 0o711)
    os.mkdir(tmp)
    os.chmod(tmp, 0o711)
    state = os.path.join(tmp, "dspkd.jobs")
    model = []  # [(id, uid or None)], oldest first

    def end(jid, uid=None):
        if jid not in [e[0] for e in model]:
            model.append((jid, uid))
            del model[:-256]

    def forget(jid):
        model[:] = [e for e in model if e[0] != jid]

    def ended_in(path):
        got = []
        for line in open(path).read().splitlines():
            w = line.split(" ")
            if w[0] == "ended":
                got.append((int(w[1]), None if w[2] == "-" else int(w[2])))
        return got

    def same(what, path=state):
        got = ended_in(path)
        check(got == model, "%s: %d ended in the file, the model has %d; first difference "
              "at %r" % (what, len(got), len(model),
                         next((i for i, (a, b) in enumerate(zip(got, model)) if a != b),
                              min(len(got), len(model)))))

    def claims(d, what):
        # The oldest remembered job of uid 65534 is EPERM "has ended"; the youngest of
        # its jobs older than those 256 is forgotten (uid 65534 has no job here, and
        # job_required is no: no error).
        mine = [e[0] for e in model if e[1] == NOBODY]
        gone = max(j for j in every_nobody if j not in [e[0] for e in model])
        got = dspk_daemon.run_as(NOBODY, NOBODY, lambda: [
            err_of(d.client(job=mine[0]), "devices", {}),
            err_of(d.client(job=gone), "devices", {})])
        check(got[0][0] == "EPERM" and "Slurm job %d (claimed) has ended" % mine[0] in got[0][1],
              "%s: a claim of job %d, remembered: %r" % (what, mine[0], got[0]))
        check(got[1] == ["ok", ""], "%s: a claim of job %d, forgotten: %r" % (what, gone, got[1]))

    every_nobody = set()

    def reg(admin, jid, uid=NOBODY):
        admin.call("job.register", {"job": jid, "uid": uid, "devices": []})
        forget(jid)
        if uid == NOBODY:
            every_nobody.add(jid)

    def fin(admin, jid, uid=None):
        admin.call("job.end", {"job": jid})
        end(jid, uid)

    def live(d):
        admin = d.client()
        os.chmod(d.sock, 0o666)
        for i in range(1, 257):
            fin(admin, i)
        same("256 ends")
        reg(admin, 300)
        fin(admin, 300, NOBODY)
        same("300 registered and ended")
        reg(admin, 300)
        same("300 registered again (requeued)")
        check(len(model) == 255, "the model: 255")
        fin(admin, 300, NOBODY)
        same("300 ended again")
        check(len(model) == 256 and model[0] == (2, None), "the model: 2..256, 300")
        fin(admin, 301)
        same("301 ended")
        # 260 jobs each registered, ended, registered again and ended again.
        for jid in range(400, 660):
            for _ in range(2):
                reg(admin, jid)
                fin(admin, jid, NOBODY)
        same("260 requeued jobs")
        check(len(model) == 256, "the model: 256")
        claims(d, "260 requeued jobs")
        # A job in the middle of the list registered again: the younger ones move down,
        # the next end fills the list without dropping the oldest.
        mid = model[100][0]
        reg(admin, mid)
        same("job %d of the middle registered again" % mid)
        fin(admin, 700)
        same("700 ended")
        fin(admin, model[5][0])  # ended again: nothing changes
        same("an ended job ended again")
        # The oldest registered again, and ended again: the youngest.
        oldest = model[0][0]
        reg(admin, oldest)
        same("the oldest registered again")
        fin(admin, oldest, NOBODY)
        same("the oldest ended again")
        fin(admin, mid, NOBODY)
        same("job %d ended again" % mid)
        claims(d, "after the middle")
        admin.call("daemon.reload", {})
        fin(admin, 701)
        same("a reload, then 701 ended")
        claims(d, "after a reload")
        reg(admin, 702, 4242)  # registered, ended by --end-job below
    daemon_check(Daemon(exe, tmp), live)
    same("the stopped daemon's file")

    def restarted(d):
        check("1 job(s) registered again, 256 ended job(s) remembered" in d.logtext(),
              "the restart's count: %s" % d.logtext()[-2000:])
        os.chmod(d.sock, 0o666)
        claims(d, "after a restart")
        admin = d.client()
        oldest = model[0][0]
        reg(admin, oldest)
        same("after a restart, the oldest registered again")
        fin(admin, 703)
        same("after a restart, 703 ended")
        fin(admin, oldest, NOBODY)
        same("after a restart, the oldest ended again")
    daemon_check(Daemon(exe, tmp), restarted)

    def end_job(jid):
        p = subprocess.run([exe, "--socket", os.path.join(tmp, "dspkd.sock"), "--end-job",
                            str(jid)], capture_output=True, text=True, timeout=TIMEOUT)
        check(p.returncode == 0, "--end-job %d: %r" % (jid, p))
        return p.stdout + p.stderr
    end_job(704)
    end(704)
    same("--end-job of a job not registered")
    said = end_job(702)
    end(702, 4242)
    same("--end-job of registered job 702")
    said = end_job(model[3][0])
    check("had ended already" in said, "--end-job of an ended job: %r" % said)
    same("--end-job of an ended job")

    # A file of 256 ended jobs written by hand, youngest ids first: taken in its order.
    model[:] = [(1000 - i, None if i % 3 else NOBODY) for i in range(256)]
    every_nobody.update(e[0] for e in model if e[1] == NOBODY)
    with open(state, "w") as f:
        f.write("dspkd-jobs 1\n" + "".join(
            "ended %d %s\n" % (j, "-" if u is None else u) for j, u in model) + "end 256\n")
    os.chmod(state, 0o600)

    def handmade(d):
        check("0 job(s) registered again, 256 ended job(s) remembered" in d.logtext(),
              "the hand-made file's count")
        admin = d.client()
        fin(admin, 1001)
        same("the hand-made file, then 1001 ended")
        reg(admin, model[-2][0])
        fin(admin, 1002)
        same("the hand-made file, a requeue and 1002 ended")
    daemon_check(Daemon(exe, tmp), handmade)
    with open(state, "w") as f:
        f.write("dspkd-jobs 1\n" + "".join("ended %d -\n" % j for j in range(1, 258)) +
                "end 257\n")

    def refused(d):
        check("refusing the state file %s: line 258: more than 256 ended jobs" % state
              in d.logtext(), "257 ended jobs: %s" % d.logtext()[-2000:])
    daemon_check(Daemon(exe, tmp), refused)
    os.unlink(state)

    # A job.end or job.register that cannot be written changes nothing of the list: the
    # oldest dropped for an end comes back, a requeued job goes back to its place.
    mnt = small_tmpfs(tmp, "the undo check")
    if mnt is None:
        return
    try:
        fstate = os.path.join(mnt, "jobs.state")

        def full(d):
            admin = d.client()
            model[:] = []
            for i in range(1, 257):
                fin(admin, i)
            fd = os.open(os.path.join(mnt, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                while True:
                    os.write(fd, b"x" * 4096)
            except OSError:
                pass
            os.close(fd)
            for method, jid in (("job.end", 2000), ("job.register", 100),
                                ("job.register", 1)):
                args = {"job": jid} if method == "job.end" else \
                    {"job": jid, "uid": NOBODY, "devices": []}
                e = err_of(admin, method, args)
                check(e[0] == "EIO", "%s %d on a full disk: %r" % (method, jid, e))
            os.unlink(os.path.join(mnt, "filler"))
            fin(admin, 2001)
            same("after three failed writes, 2001 ended", fstate)
        daemon_check(Daemon(exe, tmp, ["--job-state", fstate]), full)
    finally:
        subprocess.run(["umount", mnt], check=True)


def epilog_env(sock, job, **more):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DSPK_"))}
    e.update(DSPK_SOCKET=sock, SLURM_JOB_ID=str(job), SLURM_JOB_UID="0", **more)
    return e


def epilog_socket(exe, submit, epilog, tmp):
    """The epilog without a daemon ends the job in the file of the daemon whose socket
    DSPK_SOCKET names (docs/cluster.md), whatever socket the configuration file of
    DSPK_DSPKD_OPTIONS names (it gives --end-job --socket, which beats the file), and
    through a symbolic link to the socket (the default state file is the one of the socket
    the link leads to).  DSPK_DSPKD_OPTIONS with --socket: exit 2, one line."""
    os.mkdir(tmp)
    os.chmod(tmp, 0o711)
    conf = os.path.join(tmp, "dspkd.conf")
    other = os.path.join(tmp, "other.jobs")
    with open(conf, "w") as f:
        f.write("[daemon]\nsocket = %s\n" % os.path.join(tmp, "other.sock"))
    # The node's other daemon's file (stopped): never written by this epilog.
    other_text = "dspkd-jobs 1\njob 42 %d\nend 1\n" % NOBODY
    with open(other, "w") as f:
        f.write(other_text)
    os.chmod(other, 0o600)
    extra = ["--config", conf, "--job-required"]
    state = os.path.join(tmp, "dspkd.jobs")
    os.symlink("dspkd.sock", os.path.join(tmp, "link.sock"))
    env = dict(DSPK_SUBMIT=submit, DSPK_DSPKD=exe, DSPK_DSPKD_OPTIONS="--config " + conf)
    for job, sock in ((9001, os.path.join(tmp, "dspkd.sock")),
                      (9002, os.path.join(tmp, "link.sock"))):
        d = Daemon(exe, tmp, extra)
        daemon_check(d, lambda d: d.client().call("job.register",
                                                  {"job": job, "uid": NOBODY, "devices": []}))
        check("job %d %d" % (job, NOBODY) in open(state).read(), "job %d in %s" % (job, state))
        p = subprocess.run([epilog], capture_output=True, text=True, timeout=TIMEOUT,
                           env=epilog_env(sock, job, **env))
        check(p.returncode == 0 and len(p.stderr.splitlines()) == 1 and
              p.stderr.endswith("; dspkd --end-job: Slurm job %d (uid %d): ended in %s\n"
                                % (job, NOBODY, state)) and
              "job %d " % job not in open(state).read() and open(other).read() == other_text,
              "the epilog on %s, the file naming another socket: %r" % (sock, p))
    for opts in ("--socket " + os.path.join(tmp, "x.sock"), "--config=%s --sock=x" % conf):
        p = subprocess.run([epilog], capture_output=True, text=True, timeout=TIMEOUT,
                           env=epilog_env(os.path.join(tmp, "dspkd.sock"), 9003,
                                          **dict(env, DSPK_DSPKD_OPTIONS=opts)))
        check(p.returncode == 2 and len(p.stderr.splitlines()) == 1 and
              "DSPK_DSPKD_OPTIONS names --so" in p.stderr, "--socket in the options: %r" % (p,))


def down(exe, submit, epilog, tmp, gpu, cpu):
    """An epilog that runs while no dspkd listens (docs/cluster.md, "Prolog and
    epilog"): the job is ended in the state file (dspkd --end-job), so that the next
    start does not register it again, and its uid, without a job, gets the cpu only under
    job_required.  dspkd holds PATH.lock for its life: --end-job under a running daemon
    exits 3, and a second daemon on the same state file does not start (exit 2).  What
    --end-job refuses: a state file that is not a regular file (exit 1, the start's
    reason), a bad job id (exit 2); with --job-state it needs no socket."""
    os.chmod(os.path.dirname(tmp), 0o711)
    os.mkdir(tmp)
    os.chmod(tmp, 0o711)
    state = os.path.join(tmp, "dspkd.jobs")
    env = dict(DSPK_SUBMIT=submit, DSPK_DSPKD=exe, DSPK_DSPKD_OPTIONS="--config=")
    extra = ["--config", "", "--job-required"]

    def end_job(*args):
        return subprocess.run([exe, "--config", ""] + list(args), capture_output=True,
                              text=True, timeout=TIMEOUT)

    # A running daemon: --end-job is refused with exit 3 (end the job through the
    # daemon); a second daemon on the same state file (another socket) exits 2.
    def held(d):
        d.client().call("job.register", {"job": 30, "uid": NOBODY, "devices": [gpu["uuid"]]})
        p = end_job("--socket", d.sock, "--end-job", "30")
        check(p.returncode == 3 and "a running dspkd holds %s.lock" % state in p.stderr and
              "dspk-submit job end --job 30" in p.stderr, "--end-job under a daemon: %r" % (p,))
        other = os.path.join(tmp, "other.sock")
        p = subprocess.run(dspk_daemon.cmdline(exe, other, extra + ["--job-state", state]),
                           capture_output=True, text=True, timeout=TIMEOUT)
        check(p.returncode == 2 and len(p.stderr.splitlines()) == 1 and
              "another dspkd uses the state file %s" % state in p.stderr and
              not os.path.exists(other), "a second daemon on one state file: %r" % (p,))
        check(job_ids(d.client()) == [30], "job 30 still registered")
    daemon_check(Daemon(exe, tmp, extra), held)

    # Job 30 (uid 65534, the GPU) ends while dspkd is down: killed (SIGKILL: a stale
    # socket, connection refused), or stopped (SIGTERM: no socket file).
    for how in ("kill", "stop"):
        d = Daemon(exe, tmp, extra)
        if how == "kill":
            d.client().call("job.register", {"job": 31, "uid": NOBODY, "devices": []})
            d.proc.kill()
            d.proc.wait()
            check(os.path.exists(d.sock), "the killed daemon left its socket")
            gone = "connection refused"
        else:
            d.stop()
            gone = "no socket file"
        check("job 30 %d" % NOBODY in open(state).read(), "job 30 in the state file")
        p = subprocess.run([epilog], capture_output=True, text=True, timeout=TIMEOUT,
                           env=epilog_env(d.sock, 30, **env))
        check(p.returncode == 0 and p.stdout == "" and len(p.stderr.splitlines()) == 1 and
              ("no dspkd listens on %s (%s" % (d.sock, gone)) in p.stderr and
              p.stderr.endswith("; dspkd --end-job: Slurm job 30 (uid %d): ended in %s\n"
                                % (NOBODY, state)), "%s: the epilog: %r" % (how, p))
        st = os.stat(state)
        check(st.st_mode & 0o7777 == 0o600 and st.st_uid == 0, "%s: mode, owner" % how)

        def after(d):
            check(job_ids(d.client()) == ([31] if how == "kill" else []),
                  "%s: job 30 is not registered again" % how)
            os.chmod(d.sock, 0o666)
            got = dspk_daemon.run_as(NOBODY, NOBODY, lambda: ids(d.client()))
            check(got == [cpu["id"]], "%s: uid %d without a job: the cpu only: %r"
                  % (how, NOBODY, got))
            e = dspk_daemon.run_as(NOBODY, NOBODY, lambda: err_of(d.client(job=30), "devices",
                                                                   {}))
            check(e[0] == "EPERM" and "ended" in e[1], "%s: a claim of job 30: %r" % (how, e))
            if how == "kill":
                d.client().call("job.end", {"job": 31})
            d.client().call("job.register", {"job": 30, "uid": NOBODY,
                                             "devices": [gpu["uuid"]]})
        daemon_check(Daemon(exe, tmp, extra), after)

    # Root ends a job in the file of a daemon of another user (User=dspk): the file
    # keeps its owner, group and mode; a daemon that starts meanwhile holds the lock.
    os.chown(state, NOBODY, NOBODY)
    os.chmod(state, 0o640)
    os.chown(state + ".lock", NOBODY, NOBODY)
    sock = os.path.join(tmp, "dspkd.sock")
    p = end_job("--socket", sock, "--end-job", "30")
    st = os.stat(state)
    check(p.returncode == 0 and p.stdout == "Slurm job 30 (uid %d): ended in %s\n"
          % (NOBODY, state) and p.stderr == "" and (st.st_uid, st.st_gid, st.st_mode & 0o7777) ==
          (NOBODY, NOBODY, 0o640) and open(state).read() ==
          "dspkd-jobs 1\nended 31 %d\nended 30 %d\nend 2\n" % (NOBODY, NOBODY),
          "--end-job as root on uid %d's file: %r %o" % (NOBODY, p, st.st_mode))
    p = end_job("--socket", sock, "--end-job", "30")
    check(p.returncode == 0 and p.stdout == "Slurm job 30: had ended already in %s\n" % state,
          "again: %r" % (p,))
    p = end_job("--socket", sock, "--end-job", "34")
    check(p.returncode == 0 and p.stdout == "Slurm job 34: not registered in %s; recorded there "
          "as ended\n" % state, "a job not registered: %r" % (p,))
    for f in (state, state + ".lock"):
        os.unlink(f)
    # An empty state file (touch, a tmpfiles.d "f" line) has no jobs, as an absent one:
    # --end-job records the job there as ended (it was "cut short after line 0", exit 1:
    # the epilog failed and drained the node; outside probe 14 E6)
    open(state, "w").close()
    os.chmod(state, 0o600)
    p = end_job("--socket", sock, "--end-job", "35")
    check(p.returncode == 0 and p.stdout == "Slurm job 35: not registered in %s; recorded there "
          "as ended\n" % state and open(state).read() == "dspkd-jobs 1\nended 35 -\nend 1\n",
          "--end-job on an empty state file: %r %r" % (p, open(state).read()))
    for f in (state, state + ".lock"):
        os.unlink(f)
    # No state file: exit 4, its own status (the epilog tells it from "ended"), the
    # absolute path named on stdout, also with a log level that hides info.
    p = end_job("--socket", sock, "--log-level", "error", "--end-job", "32")
    check(p.returncode == 4 and p.stderr == "" and p.stdout == "Slurm job 32: no state file %s: "
          "nothing is registered there\n" % state and not os.path.exists(state)
          and not os.path.exists(state + ".lock"), "no state file: nothing to end: %r" % (p,))
    # What is at the state file's path but is not a regular file (a symbolic link to a
    # state file or to nothing, a directory, a FIFO, a socket, a device) is refused as
    # the start refuses it: exit 1, one line with the start's reason, nothing changed
    # and no lock made; never "no state file" (it said so, and the epilog took the job
    # for ended, while the start refused the file and failed closed).  So again once
    # a daemon has run on it (the lock is there then).
    real = os.path.join(tmp, "real.jobs")
    with open(real, "w") as f:
        f.write("dspkd-jobs 1\njob 36 %d\nend 1\n" % NOBODY)
    os.chmod(real, 0o600)

    def chardev(path):
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's

    def unixsock(path):
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
    kinds = ((lambda p: os.symlink(real, p), "it is a symbolic link"),
             (lambda p: os.symlink(os.path.join(tmp, "nothing"), p), "it is a symbolic link"),
             (os.mkdir, "not a regular file (a directory)"),
             (os.mkfifo, "not a regular file (a FIFO)"),
             (unixsock, "not a regular file (a socket)"),
             (chardev, "not a regular file (a character device)"))
    for make, why in kinds:
        try:
            make(state)
        except PermissionError as e:  # mknod without CAP_MKNOD (a container)
            print("down: %s: not checked: %s" % (why, e))
            continue
        for when in ("no lock", "after a start"):
            p = end_job("--socket", sock, "--end-job", "36")
            check(p.returncode == 1 and p.stdout == "" and len(p.stderr.splitlines()) == 1 and
                  ("--end-job 36: refusing the state file %s: %s; the job is not ended"
                   % (state, why)) in p.stderr and "job 36" in open(real).read() and
                  os.path.exists(state + ".lock") == (when != "no lock"),
                  "--end-job on a state file that is %s, %s: %r" % (why, when, p))
            if when == "no lock":
                def refused(d):
                    check(("refusing the state file %s: %s; starting without" % (state, why))
                          in d.logtext(), "the start on %s: %s" % (why, d.logtext()))
                daemon_check(Daemon(exe, tmp, extra), refused)
        if stat.S_ISDIR(os.lstat(state).st_mode):
            os.rmdir(state)
        else:
            os.unlink(state)
        os.unlink(state + ".lock")
    # A lock file that is not a regular file is refused for what it is (a socket's open
    # said only "No such device or address").
    os.rename(real, state)
    unixsock(state + ".lock")
    p = end_job("--socket", sock, "--end-job", "36")
    check(p.returncode == 1 and "cannot lock %s.lock: not a regular file (a socket)" % state
          in p.stderr and "job 36" in open(state).read(), "a lock that is a socket: %r" % (p,))
    os.unlink(state + ".lock")
    # With --job-state the socket is not needed: a user without $XDG_RUNTIME_DIR (the
    # daemon's own user, dspk, running the epilog) ends a job in its file (it exited 2,
    # "XDG_RUNTIME_DIR is not set"); without --job-state the file is the socket's, and
    # the socket is still asked for.
    mine = os.path.join(tmp, "nobody")
    os.mkdir(mine, 0o700)
    os.chown(mine, NOBODY, NOBODY)
    os.rename(state, os.path.join(mine, "n.jobs"))
    os.chown(os.path.join(mine, "n.jobs"), NOBODY, NOBODY)
    bare = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "DSPK_SOCKET")}
    for args, rc, said in ((["--job-state", os.path.join(mine, "n.jobs")], 0,
                            "Slurm job 36 (uid %d): ended in %s/n.jobs\n" % (NOBODY, mine)),
                           (["--job-state", os.path.join(mine, "none.jobs")], 4,
                            "Slurm job 36: no state file %s/none.jobs: nothing is registered "
                            "there\n" % mine),
                           ([], 2, "")):
        p = subprocess.run([exe, "--config", "", "--end-job", "36"] + args,
                           capture_output=True, text=True, timeout=TIMEOUT, env=bare,
                           user=NOBODY, group=NOBODY, extra_groups=[])
        check(p.returncode == rc and p.stdout == said and
              (p.stderr == "" if rc != 2 else "XDG_RUNTIME_DIR is not set" in p.stderr),
              "--end-job as uid %d without XDG_RUNTIME_DIR, %r: %r" % (NOBODY, args, p))
    shutil.rmtree(mine)
    # A job id as $SLURM_JOB_ID and the state file have it: digits from 1, no leading
    # zero ("05" was taken as job 5), no sign, no blank; a bad one is exit 2.
    for bad in ("05", "007", "0", "abc", "+9", " 8", "18446744073709551616"):
        p = end_job("--socket", sock, "--end-job", bad)
        check(p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1 and
              "--end-job: expected " in p.stderr and not os.path.exists(state + ".lock"),
              "--end-job %r: %r" % (bad, p))
    check("without a leading zero" in end_job("--end-job", "05").stderr, "05: why")
    # --help lists every exit status of --end-job, as dspkd(8) does.
    h = " ".join(subprocess.run([exe, "--help"], capture_output=True, text=True,
                                timeout=TIMEOUT).stdout.split())
    for status in ("exit 0 (ended in the file", ", 4 (no state file", ", 3 when a running",
                   ", 1 when the file is refused", ", 2 for a bad ID",
                   "its directory cannot be looked at (dspkd(8)) --ready-fd"):
        check(status in h, "--help's --end-job names %r: %s" % (status, h))
    # A job line with more UUIDs than a job may have GPUs is refused for that reason
    # (as the start refuses it); 64 are taken.
    for n, rc, said in ((65, 1, "line 2: job 5: more than 64 UUIDs"),
                        (64, 0, "Slurm job 5 (uid 1): ended in %s" % state)):
        with open(state, "w") as f:
            f.write("dspkd-jobs 1\njob 5 1 %s\nend 1\n"
                    % " ".join("%x" % i for i in range(1, n + 1)))
        os.chmod(state, 0o600)
        p = end_job("--socket", sock, "--end-job", "5")
        check(p.returncode == rc and said in p.stderr + p.stdout,
              "a job of %d UUIDs: %r" % (n, p))
    # What is wrong is said: the separator (one space), a UUID's length (at most 39 hex
    # digits, a quote cut at 40 marked "..."), not "expected job, ended or end" nor "not
    # a UUID (lower-case hex digits)".  The start reads with the same reader.
    sep = " (fields are separated by one space)"
    for text, said in (
            ("job 5 1 \n", "line 2: a blank at the end of the line" + sep),
            ("job  5 1\n", "line 2: two blanks in a row" + sep),
            (" job 5 1\n", "line 2: a blank at the start of the line" + sep),
            ("job\t5 1\n", "line 2: a tab at byte 4" + sep),
            ("ended 5 1 \n", "line 2: a blank at the end of the line" + sep),
            ("ended 5\t1\n", "line 2: a tab at byte 8" + sep),
            ("job 5 1\r\n", "line 2: a control byte 0x0d at byte 8 (a carriage return"),
            ("\n", "line 2: an empty line"),
            ("job 5 1 %s\n" % ("0" * 39 + "1"),
             "line 2: job 5: UUID \"%s\" has 40 hex digits, more than 39" % ("0" * 39 + "1")),
            ("job 5 1 %s\n" % ("a" * 45),
             "line 2: job 5: UUID \"%s...\" has 45 hex digits, more than 39" % ("a" * 40)),
            ("job 5 1 %s\n" % ("g" * 45),
             "line 2: job 5: \"%s...\" is not a UUID (lower-case hex digits)" % ("g" * 40)),
            # each number's fault named, not "expected job ID UID ..." (outside probe 15 A3)
            ("job 01 0\n", "line 2: job: ID 01 has a leading zero (dspkd writes none)"),
            ("job 0 0\n", "line 2: job: ID 0 is out of range (1 to 18446744073709551615: 0 "
             "is no Slurm job)"),
            # the note only for the value it explains (probe 16 A nit)
            ("job 18446744073709551616 0\n", "line 2: job: ID 18446744073709551616 is out "
             "of range (1 to 18446744073709551615);"),
            ("job 1 4294967296\n", "line 2: job: UID 4294967296 is out of range (0 to "
             "4294967294);"),
            ("job 1 4294967295\n", "line 2: job: UID 4294967295 is out of range (0 to "
             "4294967294: 4294967295 is no uid)"),
            ("job 1 00\n", "line 2: job: UID 00 has a leading zero"),
            ("job 1 -1\n", "line 2: job: UID \"-1\" is not a decimal number"),
            ("ended 0 1\n", "line 2: ended: ID 0 is out of range"),
            ("ended 7 007\n", "line 2: ended: UID (or -) 007 has a leading zero"),
            ("ended 7 4294967295\n", "line 2: ended: UID (or -) 4294967295 is out of range"),
            ("job 5\n", "line 2: expected job ID UID and at most 64 UUIDs")):
        with open(state, "w") as f:
            f.write("dspkd-jobs 1\n%send 1\n" % text)
        os.chmod(state, 0o600)
        p = end_job("--socket", sock, "--end-job", "5")
        check(p.returncode == 1 and ("refusing the state file %s: %s" % (state, said))
              in p.stderr, "state file line %r: %r" % (text, p))
    # A file converted to DOS line ends whole: its first line, "dspkd-jobs 1\r", is said
    # to end in a carriage return, as the other lines are, not taken for another
    # program's file; another version's file is still said to be one.
    for text, said in (("dspkd-jobs 1\r\njob 5 1\r\nend 1\r\n",
                        "line 1: a control byte 0x0d at byte 13 (a carriage return: DOS line "
                        "ends?)"),
                       ("dspkd-jobs 2\nend 0\n", "line 1: not \"dspkd-jobs 1\" (another "
                        "version's dspkd job state file)"),
                       ("dspkd-jobs  1\nend 0\n", "line 1: two blanks in a row")):
        with open(state, "w") as f:
            f.write(text)
        os.chmod(state, 0o600)
        p = end_job("--socket", sock, "--end-job", "5")
        check(p.returncode == 1 and ("refusing the state file %s: %s" % (state, said))
              in p.stderr, "state file %r: %r" % (text, p))
    os.unlink(state)
    # No directory for it either (/run/dspk on a node just rebooted): nothing to end,
    # exit 4 as for no file (it exited 2); the epilog says so truthfully, exit 0 (no
    # drain); so is a path through a file (below).
    gone = os.path.join(tmp, "gone")
    p = end_job("--socket", os.path.join(gone, "dspkd.sock"), "--end-job", "32")
    check(p.returncode == 4 and p.stderr == "" and p.stdout == "Slurm job 32: no state file "
          "%s/dspkd.jobs (no directory %s): nothing is registered there\n" % (gone, gone)
          and not os.path.exists(gone), "no state file's directory: nothing to end: %r" % (p,))
    p = subprocess.run([epilog], capture_output=True, text=True, timeout=TIMEOUT,
                       env=epilog_env(os.path.join(gone, "dspkd.sock"), 32, **env))
    check(p.returncode == 0 and p.stderr == "dspk epilog: job 32: no dspkd listens on "
          "%s/dspkd.sock (no socket file); dspkd --end-job: Slurm job 32: no state file "
          "%s/dspkd.jobs (no directory %s): nothing is registered there; if dspkd keeps its "
          "state elsewhere, DSPK_DSPKD_OPTIONS must name it (--config FILE or --job-state "
          "FILE, as dspkd has them)\n" % (gone, gone, gone) and not os.path.exists(gone),
          "the epilog, no directory: %r" % (p,))
    # A daemon whose state file is not the one the epilog's --end-job works out (started
    # with --job-state, DSPK_DSPKD_OPTIONS without it): the epilog does not claim the job
    # ended; it names the file it looked at and the variable to set, exit 0.
    elsewhere = os.path.join(tmp, "elsewhere.jobs")
    d = Daemon(exe, tmp, extra + ["--job-state", elsewhere])
    d.client().call("job.register", {"job": 35, "uid": NOBODY, "devices": []})
    d.stop()
    p = subprocess.run([epilog], capture_output=True, text=True, timeout=TIMEOUT,
                       env=epilog_env(d.sock, 35, **env))
    check(p.returncode == 0 and p.stderr.endswith(
        "; dspkd --end-job: Slurm job 35: no state file %s: nothing is registered there; if "
        "dspkd keeps its state elsewhere, DSPK_DSPKD_OPTIONS must name it (--config FILE or "
        "--job-state FILE, as dspkd has them)\n" % state) and "ended in" not in p.stderr and
        "job 35 %d" % NOBODY in open(elsewhere).read(), "state file elsewhere: %r" % (p,))
    p = subprocess.run([epilog], capture_output=True, text=True, timeout=TIMEOUT,
                       env=epilog_env(d.sock, 35, **dict(
                           env, DSPK_DSPKD_OPTIONS="--config= --job-state " + elsewhere)))
    check(p.returncode == 0 and p.stderr.endswith(
        "; dspkd --end-job: Slurm job 35 (uid %d): ended in %s\n" % (NOBODY, elsewhere)) and
        "job 35" not in open(elsewhere).read(), "state file named: %r" % (p,))
    for f in (elsewhere, elsewhere + ".lock", os.path.join(tmp, "dspkd.log")):
        os.unlink(f)
    # A file where the state file's directory should be (the socket's path under a
    # file): no state file can be there, exit 4 as for no directory (it was exit 2 with
    # the start's "cannot be written ... (set job_state)"), deeper too.
    afile = os.path.join(tmp, "afile")
    open(afile, "w").close()
    for under in ("x.jobs", "sub/x.jobs"):
        state_at = os.path.join(afile, under)
        p = end_job("--job-state", state_at, "--socket", sock, "--end-job", "32")
        check(p.returncode == 4 and p.stderr == "" and p.stdout == "Slurm job 32: no state "
              "file %s (%s is not a directory): nothing is registered there\n"
              % (state_at, afile), "a state file's directory that is a file: %r" % (p,))
    p = subprocess.run([epilog], capture_output=True, text=True, timeout=TIMEOUT,
                       env=epilog_env(os.path.join(afile, "s.sock"), 32, **env))
    check(p.returncode == 0 and p.stderr.splitlines()[-1].endswith(
        "dspkd --end-job: Slurm job 32: no state file %s/s.jobs (%s is not a directory): "
        "nothing is registered there; if dspkd keeps its state elsewhere, DSPK_DSPKD_OPTIONS "
        "must name it (--config FILE or --job-state FILE, as dspkd has them)" % (afile, afile))
        and "stays registered" not in p.stderr, "the epilog, a socket under a file: %r" % (p,))
    os.unlink(afile)

    # A daemon that holds the lock but does not listen yet (its start paused): the
    # epilog ends the job through it once it listens, trying once a second until its
    # timeout, and fails (exit 1, the node drains) when it never does.
    log = open(os.path.join(tmp, "paused.log"), "w+")
    proc = subprocess.Popen(dspk_daemon.cmdline(exe, sock, extra, backends="cpu"),
                            stderr=log, env=dict(os.environ, DSPKD_TEST_START_PAUSE="jobs"))
    try:
        while "start paused at jobs" not in open(log.name).read():
            check(proc.poll() is None, "the paused daemon exited")
            select.select([], [], [], 0.05)
        p = subprocess.run([epilog], capture_output=True, text=True, timeout=TIMEOUT,
                           env=epilog_env(sock, 33, DSPK_EPILOG_TIMEOUT="1", **env))
        check(p.returncode == 1 and p.stdout == "" and "a running dspkd holds" in p.stderr and
              "could not end the job in its state file (exit 3" in p.stderr and
              "dspkd --socket %s --end-job 33" % sock in p.stderr,
              "a daemon that holds the lock, silent: %r" % (p,))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(TIMEOUT)


def paths(exe, submit, tmp):
    """Where the state file is (dspkd(8), --job-state): a relative job_state is the start
    directory's, also for a daemon that detaches (and leaves for /), and the log names it
    absolute; a state file whose directory is missing or not a directory refuses the
    start (exit 2, one line)."""
    os.mkdir(tmp)
    base = ["--config", "", "--backends", "cpu", "--no-cache"]
    for where, args, conf in (("option", ["--job-state", "rel.jobs"], None),
                              ("file", [], "[daemon]\nsocket = %s\n")):
        start = os.path.join(tmp, where)
        os.mkdir(start)
        if conf:  # the file's paths are absolute (below)
            conf %= os.path.join(start, "rel.sock")
        log = os.path.join(start, "dspkd.log")
        cmd = [exe] + (["--socket", "rel.sock"] if not conf else []) + base + args
        if conf:
            with open(os.path.join(start, "d.conf"), "w") as f:
                f.write(conf)
            cmd[cmd.index("--config") + 1] = "d.conf"
        with open(log, "w") as err:
            p = subprocess.run(cmd, cwd=start, stderr=err, timeout=TIMEOUT)  # detaches
        text = open(log).read()
        check(p.returncode == 0, "%s: the detached start: %s" % (where, text))
        # The detached daemon's pid: its line "listening on" (the first are the
        # starter's, before the fork).
        line = [x for x in text.splitlines() if "listening on" in x][0]
        pid = int(line.split("dspkd[", 1)[1].split("]", 1)[0])
        pidfd = os.pidfd_open(pid)
        try:
            sock = os.path.join(start, "rel.sock")
            r = subprocess.run([submit, "--socket", sock, "job", "register", "--job", "40",
                                "--uid", "0"], capture_output=True, text=True, timeout=TIMEOUT)
            check(r.returncode == 0, "%s: job 40 registered: %r" % (where, r))
            state = os.path.join(start, "rel.jobs")
            check(os.path.exists(state) and not os.path.exists("/rel.jobs"),
                  "%s: the state file in the start directory, not in /" % where)
            check(("Slurm jobs: %s does not exist" % state) in open(log).read(),
                  "%s: the log names the absolute path: %s" % (where, open(log).read()))
            # A reload reads the relative path from the start directory too, not
            # from / where the daemon now is: the same file, no change to report.
            rc = Client(sock, TIMEOUT)
            rc.call("daemon.reload", {})
            rc.close()
            check("takes effect at the next start" not in open(log).read(),
                  "%s: a reload of the same relative paths: %s" % (where, open(log).read()))
            if conf:
                # A relative job_state in the file is refused at a reload too (an
                # invalid file: the running configuration stays).
                with open(os.path.join(start, "d.conf"), "a") as f:
                    f.write("job_state = rel.jobs\n")
                rc = Client(sock, TIMEOUT)
                try:
                    rc.call("daemon.reload", {})
                    check(False, "a reload of a relative job_state was taken")
                except RpcError as e:
                    check("job_state: expected an absolute path" in str(e), "reload: %s" % e)
                rc.close()
                check("job_state: expected an absolute path, got \"rel.jobs\"" in
                      open(log).read() and "keeping the running configuration" in
                      open(log).read(), "reload of a relative job_state: the log")
        finally:
            os.kill(pid, signal.SIGTERM)
            select.select([pidfd], [], [], TIMEOUT)
            os.close(pidfd)
    # A relative job_state in a configuration file is refused (exit 2, file:line), at
    # start and by --end-job: the epilog's --end-job, in slurmd's directory, could not
    # tell the start directory it is relative to.
    cfg = os.path.join(tmp, "rel.conf")
    with open(cfg, "w") as f:
        f.write("[daemon]\njob_state = rel.jobs\n")
    sock = os.path.join(tmp, "r.sock")
    for args in (["--foreground", "--socket", sock], ["--socket", sock, "--end-job", "5"]):
        p = subprocess.run([exe, "--config", cfg] + args, capture_output=True, text=True,
                           timeout=TIMEOUT, cwd=tmp)
        check(p.returncode == 2 and len(p.stderr.splitlines()) == 1 and
              ("%s:2: job_state: expected an absolute path, got \"rel.jobs\"" % cfg) in p.stderr
              and not os.path.exists(sock) and not os.path.exists(os.path.join(tmp, "rel.jobs")),
              "a relative job_state in the file, %r: %r" % (args, p))
    # So is a relative socket or cache in the file (every path of the file is absolute,
    # dspk.conf(5)), at start and by --end-job (it was taken from the start directory,
    # and --end-job refused the file for want of the state file's directory).
    for key, rel in (("socket", "rel.sock"), ("cache", "rel.db")):
        with open(cfg, "w") as f:
            f.write("[daemon]\n%s = %s\n" % (key, rel))
        for args in (["--foreground", "--socket", sock], ["--end-job", "5"]):
            p = subprocess.run([exe, "--config", cfg] + args, capture_output=True, text=True,
                               timeout=TIMEOUT, cwd=tmp)
            check(p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1 and
                  ("%s:2: %s: expected an absolute path" % (cfg, key)) in p.stderr and
                  ('got "%s" (a relative path would be the directory dspkd started in)' % rel)
                  in p.stderr and not os.path.exists(sock) and
                  not os.path.exists(os.path.join(tmp, rel)),
                  "a relative %s in the file, %r: %r" % (key, args, p))
    notdir = os.path.join(tmp, "plain")
    open(notdir, "w").close()
    for state, why in ((os.path.join(tmp, "typo", "d.jobs"), "directory %s: No such file or "
                        "directory" % os.path.join(tmp, "typo")),
                       (os.path.join(notdir, "d.jobs"), "%s is not a directory" % notdir)):
        for args, conf in ((["--job-state", state], None),
                           ([], "[daemon]\njob_state = %s\n" % state)):
            cfg = os.path.join(tmp, "d.conf")
            with open(cfg, "w") as f:
                f.write(conf or "")
            sock = os.path.join(tmp, "d.sock")
            p = subprocess.run(dspk_daemon.cmdline(exe, sock, ["--config", cfg] + args),
                               capture_output=True, text=True, timeout=TIMEOUT)
            lines = p.stderr.splitlines()
            check(p.returncode == 2 and len(lines) == 1 and
                  ("the state file %s cannot be written" % state) in lines[0] and why in
                  lines[0] and not os.path.exists(sock), "%s %r: %r" % (state, args, p))
    # The default (the socket's path with .jobs) in the socket's directory: there when
    # the socket can be; a missing socket directory is still the socket's error (exit 1).
    p = subprocess.run(dspk_daemon.cmdline(exe, os.path.join(tmp, "typo", "d.sock"),
                                           ["--config", ""]),
                       capture_output=True, text=True, timeout=TIMEOUT)
    typo = os.path.join(tmp, "typo")
    check(p.returncode == 1 and "cannot listen on %s/d.sock: directory %s: No such file" %
          (typo, typo) in p.stderr and len(p.stderr.splitlines()) == 1, "socket in a missing directory: %r"
          % (p,))


def guard_runs(exe, sock):
    """start(*args), end_job(*args): dspkd started on sock (--config ""), and
    dspkd --end-job style runs, each run to its end with its output."""
    def start(*args):
        return subprocess.run(dspk_daemon.cmdline(exe, sock, ["--config", ""] + list(args)),
                              capture_output=True, text=True, timeout=TIMEOUT)

    def end_job(*args):
        return subprocess.run([exe, "--config", "", "--socket", sock] + list(args),
                              capture_output=True, text=True, timeout=TIMEOUT)
    return start, end_job


def lock_guard(exe, tmp):
    """The state file's lock cannot be defeated by another daemon's files (dspkd(8),
    --job-state): a job_state whose name ends in .lock or .tmp (another state file's lock
    or temporary file) is refused at start and by --end-job (exit 2, one line); so is, at
    start, a file another process holds an flock on (exit 2; --end-job: exit 1); a lock
    file that is not empty (another daemon's state file at worst) cannot be locked (exit
    2; --end-job: exit 1); and a daemon whose lock file was replaced under it fails
    job.register with EIO, the file unchanged, rather than write a file that --end-job or
    another daemon may change meanwhile."""
    import fcntl
    os.mkdir(tmp)
    os.chmod(tmp, 0o711)
    state = os.path.join(tmp, "dspkd.jobs")
    other = os.path.join(tmp, "other.sock")

    start, end_job = guard_runs(exe, other)

    def running(d):
        d.client().call("job.register", {"job": 101, "uid": NOBODY, "devices": []})
        for name, sfx in ((state + ".lock", ".lock"), (state + ".tmp", ".tmp"),
                          (os.path.join(tmp, "x.lock"), ".lock")):
            for p in (start("--job-state", name),
                      end_job("--job-state", name, "--end-job", "5")):
                check(p.returncode == 2 and len(p.stderr.splitlines()) == 1 and
                      ("--job-state %s ends in %s" % (name, sfx)) in p.stderr and
                      not os.path.exists(other), "job_state %s: %r" % (name, p))
        check(open(state + ".lock").read() == "" and job_ids(d.client()) == [101],
              "the daemon's lock untouched")
        # Any file another process holds an flock on is a lock file, not a state file.
        held = os.path.join(tmp, "held")
        with open(held, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            p = start("--job-state", held)
            check(p.returncode == 2 and len(p.stderr.splitlines()) == 1 and
                  "refusing the state file %s: another process holds an flock(2) on it" % held
                  in p.stderr, "a locked job_state: %r" % (p,))
            p = end_job("--job-state", held, "--end-job", "5")
            check(p.returncode == 1 and "another process holds an flock(2) on it" in p.stderr
                  and open(held).read() == "", "--end-job on a locked file: %r" % (p,))
        # A lock file that is another daemon's state file (job_state v, whose v.lock is a
        # state file): never taken for the lock.
        v = os.path.join(tmp, "v")
        with open(v + ".lock", "w") as f:
            f.write("dspkd-jobs 1\nend 0\n")
        os.chmod(v + ".lock", 0o600)
        p = start("--job-state", v)
        check(p.returncode == 2 and len(p.stderr.splitlines()) == 1 and
              "cannot lock %s.lock: not empty (a dspkd state file" % v in p.stderr,
              "a lock that is a state file: %r" % (p,))
        p = end_job("--job-state", v, "--end-job", "5")
        check(p.returncode == 1 and "cannot lock %s.lock: not empty" % v in p.stderr and
              not os.path.exists(v), "--end-job, a lock that is a state file: %r" % (p,))
        # The lock replaced under the running daemon: job.register fails with EIO, the file
        # unchanged.
        before = open(state).read()
        with open(state + ".lock.new", "w") as f:
            pass
        os.chmod(state + ".lock.new", 0o600)
        os.rename(state + ".lock.new", state + ".lock")
        e = err_of(d.client(), "job.register", {"job": 102, "uid": NOBODY, "devices": []})
        check(e[0] == "EIO" and "its lock file %s.lock is no longer the file dspkd locked"
              % state in e[1] and open(state).read() == before,
              "job.register after the lock was replaced: %r" % (e,))
        check("no longer the file dspkd locked" in d.logtext(), "the log says so")
        # job.end too; each failure is its one err line, which no generic
        # "client N: METHOD #ID: EIO" line repeats (probe 19 E2).
        e = err_of(d.client(), "job.end", {"job": 101})
        check(e[0] == "EIO" and "is not ended (nothing changed)" in e[1],
              "job.end after the lock was replaced: %r" % (e,))
        log = d.logtext()
        for method, job in (("job.register", 102), ("job.end", 101)):
            check(len(re.findall(r"error: client \d+ \(pid \d+ uid \d+ gid \d+\): %s of Slurm "
                                 r"job %d failed: " % (method, job), log)) == 1 and
                  not re.search(r"client \d+: %s #\d+: EIO" % method, log),
                  "%s's failure logged once:\n%s" % (method, log))
    daemon_check(Daemon(exe, tmp, ["--config", ""]), running)


def reload_guard(exe, tmp):
    """A reload refuses a job_state the next start would refuse (dspk.conf(5)): the
    configuration file itself, the socket, a name ending in .lock, a missing directory or
    one that is a file, another running daemon's state file (its lock held) or a hard
    link to it; the running configuration stays, and the log names the reason.  The
    hard link is refused at start and by --end-job too."""
    os.mkdir(tmp)
    os.chmod(tmp, 0o711)
    conf = os.path.join(tmp, "d.conf")
    with open(conf, "w") as f:
        f.write("[daemon]\n")

    def reloads(d):
        for value, why in ((conf, "is the configuration file"), (d.sock, "is the socket"),
                           (os.path.join(tmp, "j.lock"), "ends in .lock")):
            with open(conf, "w") as f:
                f.write("[daemon]\njob_state = %s\n" % value)
            e = err_of(d.client(), "daemon.reload", {})
            check(e[0] == "EINVAL" and why in e[1] and
                  "keeping the running configuration" in e[1],
                  "reload, job_state %s: %r" % (value, e))
            log = d.logtext()
            check(("reload: %s: job_state %s %s" % (conf, value, why)) in log and
                  "takes effect at the next start" not in log and
                  "configuration reloaded" not in log, "reload, job_state %s: the log:\n%s"
                  % (value, log[-3000:]))
        # What the next start refuses for the file's directory, its lock or its links is
        # refused too (outside probe 15 F4, F5: "takes effect at the next start", and an
        # epilog meanwhile ended jobs in a file no daemon used): no directory, a directory
        # that is a file, another running daemon's state file, a hard link to it.
        with open(os.path.join(tmp, "file"), "w"):
            pass
        other = os.path.join(tmp, "o")
        os.mkdir(other)
        o = Daemon.__new__(Daemon)
        o.sock = os.path.join(other, "o.sock")
        o.log = open(os.path.join(other, "o.log"), "w+")
        o.proc = dspk_daemon.start(dspk_daemon.cmdline(exe, o.sock, ["--config", ""],
                                                       backends="cpu"), TIMEOUT, stderr=o.log)
        check(o.proc is not None, "the other daemon started")
        try:
            o.client().call("job.register", {"job": 7, "uid": NOBODY, "devices": []})
            os.link(os.path.join(other, "o.jobs"), os.path.join(tmp, "hard.jobs"))
            for value, why in (
                    (os.path.join(tmp, "nodir", "x.jobs"),
                     "the state file %s cannot be written: its directory %s: No such file"
                     % (os.path.join(tmp, "nodir", "x.jobs"), os.path.join(tmp, "nodir"))),
                    (os.path.join(tmp, "file", "x.jobs"),
                     "the state file %s cannot be written: %s is not a directory"
                     % (os.path.join(tmp, "file", "x.jobs"), os.path.join(tmp, "file"))),
                    (os.path.join(other, "o.jobs"),
                     "another process holds %s.lock: another dspkd uses the state file"
                     % os.path.join(other, "o.jobs")),
                    (os.path.join(tmp, "hard.jobs"),
                     "job_state %s: it has 2 hard links" % os.path.join(tmp, "hard.jobs"))):
                with open(conf, "w") as f:
                    f.write("[daemon]\njob_state = %s\n" % value)
                e = err_of(d.client(), "daemon.reload", {})
                check(e[0] == "EINVAL" and why in e[1] and
                      "keeping the running configuration" in e[1],
                      "reload, job_state %s: %r" % (value, e))
                log = d.logtext()
                check(("reload: Slurm jobs: %s" % why) in log and
                      "takes effect at the next start" not in log and
                      "configuration reloaded" not in log,
                      "reload, job_state %s: the log:\n%s" % (value, log[-3000:]))
            check(not os.path.exists(os.path.join(tmp, "hard.jobs.lock")),
                  "no lock made by the reload's look")
            # The other daemon's lock was let go by the look at the hard link: it still
            # registers.
            o.client().call("job.register", {"job": 8, "uid": NOBODY, "devices": []})
            # The same refusal at the next start (exit 2, one line) and by --end-job
            # (exit 1), the other daemon's file unchanged.
            before = open(os.path.join(other, "o.jobs")).read()
            os.unlink(os.path.join(tmp, "hard.jobs"))
            os.link(os.path.join(other, "o.jobs"), os.path.join(tmp, "hard.jobs"))
            hard = os.path.join(tmp, "hard.jobs")
            p = subprocess.run(dspk_daemon.cmdline(exe, os.path.join(tmp, "h.sock"),
                                                   ["--config", "", "--job-state", hard],
                                                   backends="cpu"),
                               capture_output=True, text=True, timeout=TIMEOUT)
            check(p.returncode == 2 and len(p.stderr.splitlines()) == 1 and
                  "refusing the state file %s: it has 2 hard links" % hard in p.stderr,
                  "a start on a hard link to a running daemon's state file: %r" % (p,))
            p = subprocess.run([exe, "--config", "", "--job-state", hard, "--end-job", "8"],
                               capture_output=True, text=True, timeout=TIMEOUT)
            check(p.returncode == 1 and "it has 2 hard links" in p.stderr and
                  open(hard).read() == before and
                  open(os.path.join(other, "o.jobs")).read() == before,
                  "--end-job on a hard link: %r" % (p,))
            o.stop()
        except BaseException:
            sys.stderr.write(o.logtext()[-3000:])
            o.proc.kill()
            raise
        # A good one is still taken (said as a change for the next start).
        with open(conf, "w") as f:
            f.write("[daemon]\njob_state = %s\n" % os.path.join(tmp, "next.jobs"))
        d.client().call("daemon.reload", {})
        check("job_state changed; it takes effect at the next start" in d.logtext(),
              "a good job_state at a reload")
    daemon_check(Daemon(exe, tmp, ["--config", conf]), reloads)


def tmp_guard(exe, tmp):
    """The state file's PATH.tmp is removed before a write only when it is dspkd's (a
    regular file of its user, left by a write cut short); another user's file there (a
    sticky directory) or a symbolic link is left alone with its contents, and the write
    fails with EIO naming it (probe 20 E1: each write unlinked PATH.tmp whatever it
    was)."""
    os.mkdir(tmp)
    os.chmod(tmp, 0o1777)
    state = os.path.join(tmp, "t.jobs")
    notes = "another user's notes\n"

    def guarded(d):
        admin = d.client()
        with open(state + ".tmp", "w") as f:  # dspkd's own leftover: removed
            f.write("half a state file")
        admin.call("job.register", {"job": 50, "uid": 0, "devices": []})
        check(not os.path.exists(state + ".tmp") and
              open(state).read().startswith("dspkd-jobs "), "root's own PATH.tmp replaced")
        for kind in ("file", "link"):
            if kind == "file":
                with open(state + ".tmp", "w") as f:
                    f.write(notes)
                os.chown(state + ".tmp", NOBODY, NOBODY)
            else:
                os.symlink("/etc/hostname", state + ".tmp")
            before = open(state).read()
            e = err_of(admin, "job.register", {"job": 51, "uid": 0, "devices": []})
            check(e[0] == "EIO" and ("%s.tmp, the name of its temporary file, is a file "
                                     "dspkd did not make" % state) in e[1],
                  "%s at PATH.tmp: %r" % (kind, e))
            st = os.lstat(state + ".tmp")
            if kind == "file":
                check(st.st_uid == NOBODY and open(state + ".tmp").read() == notes,
                      "another user's PATH.tmp kept with its contents")
            else:
                check(stat.S_ISLNK(st.st_mode), "the link at PATH.tmp kept")
            check(open(state).read() == before, "%s: the state file unchanged" % kind)
            os.unlink(state + ".tmp")
        admin.call("job.register", {"job": 51, "uid": 0, "devices": []})
        check(sorted(job_ids(admin)) == [50, 51], "written once PATH.tmp is gone")
    daemon_check(Daemon(exe, tmp, ["--job-state", state]), guarded)


def dir_guard(exe, tmp):
    """The state file's directory follows the rule of every file dspkd trusts
    (docs/security.md): owned by root or dspkd's user, not writable by group or others
    unless sticky. Another user who owns it could move the file aside, wait for job.end
    and move it back, and the next start registered the ended job again (probe 22 E2): such
    a directory refuses the start (exit 2, one line naming it, its owner or mode and the
    fix) and --end-job (exit 1), nothing made there; a sticky one is used; a directory
    made unsafe under a running daemon fails job.register with EIO, the file unchanged."""
    os.mkdir(tmp)
    os.chmod(tmp, 0o755)
    other = os.path.join(tmp, "other.sock")

    start, end_job = guard_runs(exe, other)

    for name, mode, owner, why in (
            ("theirs", 0o755, NOBODY, "is owned by uid %d, not by dspkd's uid 0"
             % NOBODY),
            ("open", 0o777, 0, "is a directory writable by group or others without the "
             "sticky bit (mode 0777"),
            ("group", 0o775, 0, "is a directory writable by group or others without the "
             "sticky bit (mode 0775")):
        sub = os.path.join(tmp, name)
        os.mkdir(sub)
        os.chown(sub, owner, owner)
        os.chmod(sub, mode)
        state = os.path.join(sub, "j")
        want = "refusing the state file %s: its directory %s %s" % (state, sub, why)
        p = start("--job-state", state)
        check(p.returncode == 2 and len(p.stderr.splitlines()) == 1 and want in p.stderr and
              "chmod go-w" in p.stderr and not os.path.exists(other),
              "start, directory %s: %r" % (name, p))
        p = end_job("--job-state", state, "--end-job", "5")
        check(p.returncode == 1 and want in p.stderr and p.stdout == "",
              "--end-job, directory %s: %r" % (name, p))
        check(os.listdir(sub) == [], "nothing made in %s: %r" % (name, os.listdir(sub)))
        # A state file already there (another user put back an old one) is refused alike.
        with open(state, "w") as f:
            f.write("dspkd-jobs 1\njob 8 %d\nend 1\n" % NOBODY)
        os.chmod(state, 0o600)
        p = end_job("--job-state", state, "--end-job", "8")
        check(p.returncode == 1 and want in p.stderr and
              open(state).read() == "dspkd-jobs 1\njob 8 %d\nend 1\n" % NOBODY and
              sorted(os.listdir(sub)) == ["j"], "--end-job, a file in %s: %r" % (name, p))
    sticky = os.path.join(tmp, "sticky")
    os.mkdir(sticky)
    os.chmod(sticky, 0o1777)
    open(os.path.join(sticky, "j"), "w").close()
    os.chmod(os.path.join(sticky, "j"), 0o600)
    p = end_job("--job-state", os.path.join(sticky, "j"), "--end-job", "5")
    check(p.returncode == 0 and "recorded there as ended" in p.stdout,
          "--end-job, a sticky directory: %r" % (p,))
    own = os.path.join(tmp, "own")
    os.mkdir(own)
    os.chmod(own, 0o755)
    state = os.path.join(own, "j")

    def unsafe_later(d):
        admin = d.client()
        admin.call("job.register", {"job": 60, "uid": 0, "devices": []})
        before = open(state).read()
        for mode in (0o777, 0o757):
            os.chmod(own, mode)
            e = err_of(admin, "job.register", {"job": 61, "uid": 0, "devices": []})
            check(e[0] == "EIO" and ("cannot write the Slurm jobs' state file %s: its "
                                     "directory %s is a directory writable by group or "
                                     "others" % (state, own)) in e[1] and
                  open(state).read() == before and not os.path.exists(state + ".tmp"),
                  "job.register, the directory made %04o: %r" % (mode, e))
        os.chown(own, NOBODY, NOBODY)
        os.chmod(own, 0o755)
        e = err_of(admin, "job.end", {"job": 60})
        check(e[0] == "EIO" and "is owned by uid %d" % NOBODY in e[1] and
              open(state).read() == before, "job.end, the directory given away: %r" % (e,))
        os.chown(own, 0, 0)
        admin.call("job.register", {"job": 61, "uid": 0, "devices": []})
        check(sorted(job_ids(admin)) == [60, 61] and " 61 " in open(state).read(),
              "written once the directory is safe again")
    daemon_check(Daemon(exe, own, ["--job-state", state]), unsafe_later)


def collide(exe, tmp):
    """Sockets q and q.sock of one directory would share q.jobs: the second daemon is
    refused at start (the lock), not left to overwrite the first's registrations; the
    state file is never written over what is not a regular file (another daemon's
    socket named like it); a state file, its PATH.tmp or its PATH.lock that is the
    configuration file, the socket or the cache is refused (exit 2)."""
    os.mkdir(tmp)
    q = os.path.join(tmp, "q")
    d1 = dspk_daemon.start(dspk_daemon.cmdline(exe, q, ["--config", ""]), TIMEOUT,
                           stderr=subprocess.DEVNULL)
    check(d1, "the daemon on q did not start")
    try:
        p = subprocess.run(dspk_daemon.cmdline(exe, q + ".sock", ["--config", ""]),
                           capture_output=True, text=True, timeout=TIMEOUT)
        check(p.returncode == 2 and (q + ".jobs") in p.stderr, "q.sock beside q: %r" % (p,))
    finally:
        check(dspk_daemon.stop(d1, TIMEOUT) == 0, "the daemon on q stopped")
    state = os.path.join(tmp, "s.jobs")
    d = Daemon(exe, tmp, ["--job-state", state])

    def over_socket(d):
        other = socket.socket(socket.AF_UNIX)
        other.bind(state)  # appeared after the start
        try:
            e = err_of(d.client(), "job.register", {"job": 50, "uid": 0})
            check(e[0] == "EIO" and "not a regular one" in e[1] and "nothing changed" in e[1],
                  "job.register over a socket: %r" % (e,))
            check(stat.S_ISSOCK(os.lstat(state).st_mode), "the socket is still there")
        finally:
            other.close()
            os.unlink(state)
    daemon_check(d, over_socket)

    # job_state naming the configuration file, by any spelling or link (or with the
    # configuration as its PATH.tmp): refused at start (exit 2, one line), the file kept.
    conf = os.path.join(tmp, "d.conf")
    text = "[policy]\njob_required = yes\n"
    with open(conf, "w") as f:
        f.write(text)
    os.symlink(conf, os.path.join(tmp, "conf.link"))
    os.mkdir(os.path.join(tmp, "sub"))
    sock = os.path.join(tmp, "c.sock")
    for state, why in ((conf, "is the configuration file ("),
                       (os.path.join(tmp, "sub", "..", "d.conf"), "is the configuration file"),
                       (os.path.join(tmp, "conf.link"), "is the configuration file")):
        for cfg in (conf, os.path.join(tmp, "conf.link")):
            p = subprocess.run(dspk_daemon.cmdline(exe, sock, ["--config", cfg, "--job-state",
                                                               state]),
                               capture_output=True, text=True, timeout=TIMEOUT)
            check(p.returncode == 2 and len(p.stderr.splitlines()) == 1 and why in p.stderr
                  and not os.path.exists(sock) and open(conf).read() == text,
                  "job_state %s, --config %s: %r" % (state, cfg, p))
    tconf = os.path.join(tmp, "t.jobs.tmp")
    shutil.copy(conf, tconf)
    p = subprocess.run(dspk_daemon.cmdline(exe, sock, ["--config", tconf, "--job-state",
                                                       tconf[:-4]]),
                       capture_output=True, text=True, timeout=TIMEOUT)
    check(p.returncode == 2 and "its temporary file %s is the configuration file" % tconf
          in p.stderr and open(tconf).read() == text, "PATH.tmp the configuration: %r" % (p,))

    # The lock file PATH.lock is checked as PATH.tmp is: the socket, the cache or the
    # configuration file there is refused at start and by --end-job (exit 2, one line
    # naming the collision), before anything is made.  The daemon made the lock at the
    # socket's path, then failed to bind (exit 1, "exists and is not a socket") and left
    # it, failing every later start; under socket activation it said only "cannot lock
    # ...: No such device or address"; the cache doubled as the lock file.
    def no_start(cmd, fds=()):
        """Runs dspkd's command line cmd; a start that listens is stopped (not waited
        for until a timeout), and its READY is in the stdout returned."""
        r, w = os.pipe()
        proc = subprocess.Popen(cmd + ["--ready-fd", str(w)], pass_fds=[w] + list(fds),
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        os.close(w)
        ready = os.read(r, 16).decode()  # READY, or end-of-file: it exited
        os.close(r)
        if ready:
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT)
        return subprocess.CompletedProcess(cmd, proc.returncode, ready + out, err)

    lk = os.path.join(tmp, "lk")
    lconf = os.path.join(tmp, "l.jobs.lock")
    shutil.copy(conf, lconf)
    for args, state, is_ in ((["--socket", lk + ".lock", "--no-cache"], lk, "the socket"),
                             (["--socket", sock, "--cache", lk + ".lock"], lk, "the cache"),
                             (["--socket", sock, "--no-cache", "--config", lconf],
                              lconf[:-5], "the configuration file")):
        conf_args = [] if "--config" in args else ["--config", ""]
        for end in ([], ["--end-job", "5"]):
            for attempt in (1, 2):
                cmd = [exe] + conf_args + args + ["--job-state", state] + \
                    (end or ["--foreground", "--backends", "cpu"])
                p = no_start(cmd) if not end else \
                    subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
                check(p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1
                      and ("--job-state %s: its lock file %s.lock is %s (" % (state, state, is_))
                      in p.stderr and not os.path.exists(state) and
                      (os.path.exists(state + ".lock") == (state == lconf[:-5])) and
                      not os.path.exists(sock), "PATH.lock %s, %r (%d): %r" % (is_, end,
                                                                              attempt, p))
    check(open(lconf).read() == text, "the configuration file kept")
    # Socket activation (LISTEN_FDS): the passed socket's path is PATH.lock.
    act = socket.socket(socket.AF_UNIX)
    act.bind(lk + ".lock")
    act.listen(1)
    code = ("import os,sys; os.dup2(int(sys.argv[1]), 3); os.environ['LISTEN_PID']="
            "str(os.getpid()); os.environ['LISTEN_FDS']='1'; os.execv(sys.argv[2], "
            "sys.argv[2:])")
    try:
        p = no_start([sys.executable, "-c", code, str(act.fileno()), exe, "--foreground",
                      "--config", "", "--backends", "cpu", "--no-cache", "--job-state", lk],
                     fds=[act.fileno()])
    finally:
        act.close()
    lines = [x for x in p.stderr.splitlines() if "error" in x]
    check(p.returncode == 2 and len(lines) == 1 and
          "its lock file %s.lock is the socket (" % lk in lines[0] and
          stat.S_ISSOCK(os.lstat(lk + ".lock").st_mode), "activated PATH.lock: %r" % (p,))
    os.unlink(lk + ".lock")
    # Told the default socket ($DSPK_SOCKET) by --end-job with --job-state alone.
    p = subprocess.run([exe, "--config", "", "--job-state", lk, "--end-job", "5"],
                       capture_output=True, text=True, timeout=TIMEOUT,
                       env=dict(os.environ, DSPK_SOCKET=lk + ".lock"))
    check(p.returncode == 2 and "its lock file %s.lock is the socket (" % lk in p.stderr and
          not os.path.exists(lk + ".lock"), "--end-job, the default socket: %r" % (p,))

    # A file that is not a dspkd state file (its first line is not "dspkd-jobs ..."):
    # refused at start (fail closed) and never replaced: job.register and job.end are
    # EIO naming it.  An empty file and another version's state file are replaced.
    other = os.path.join(tmp, "other.txt")
    with open(other, "w") as f:
        f.write(text)
    os.chmod(other, 0o600)

    def not_state(d):
        check("refusing the state file %s" % other in d.logtext() and
              "fail with EIO while it is there" in d.logtext(), "the start's log")
        for method, args in (("job.register", {"job": 51, "uid": 0}), ("job.end", {"job": 51})):
            e = err_of(d.client(), method, args)
            check(e[0] == "EIO" and ("state file %s: the file there is not a dspkd state file"
                                     % other) in e[1] and "nothing changed" in e[1],
                  "%s over a file of another program: %r" % (method, e))
        check(open(other).read() == text and not os.path.exists(other + ".tmp"),
              "the file is kept")
    daemon_check(Daemon(exe, tmp, ["--job-state", other]), not_state)
    for before in ("", "dspkd-jobs 2\nwhatever\n"):
        with open(other, "w") as f:
            f.write(before)
        os.chmod(other, 0o600)

        def replaced(d):
            d.client().call("job.register", {"job": 52, "uid": 0})
            check(open(other).read() == "dspkd-jobs 1\njob 52 0\nend 1\n", "%r replaced"
                  % before)
        daemon_check(Daemon(exe, tmp, ["--job-state", other]), replaced)
    os.unlink(other)


HIDDEN_UID = 64031  # the daemon's user in hidden(): no capabilities, not root, not 65534


def hidden(exe, tmp, gpu, cpu):
    """dspkd as the packaged unit runs it: an unprivileged user, and /proc mounted
    hidepid=invisible (ProtectProc=invisible), where other users' processes are absent
    from /proc.  A live but hidden peer's cgroup "cannot be read: passed by" (its claim
    and its uid decide); only a peer that no longer exists is "gone" (EPERM while its uid
    has jobs).  Needs root, unshare(1), setpriv(1) and a proc mount: without them it says
    so and returns False (a skip, not a pass)."""
    os.chmod(os.path.dirname(tmp), 0o711)
    os.mkdir(tmp)
    os.chmod(tmp, 0o711)
    os.chown(tmp, HIDDEN_UID, HIDDEN_UID)
    wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t proc -o hidepid=invisible proc /proc && exec setpriv --reuid=%d '
            '--regid=%d --clear-groups "$@"' % (HIDDEN_UID, HIDDEN_UID), "sh"]
    # The probe: in such a namespace, as that user, root's pid 1 is not in /proc.
    try:
        p = subprocess.run(wrap + ["sh", "-c", "test -d /proc/self && ! test -e /proc/1"],
                           capture_output=True, text=True, timeout=TIMEOUT)
    except OSError as e:
        p = subprocess.CompletedProcess(wrap, 127, "", str(e))
    if p.returncode != 0:
        print("hidden: skipped: cannot run a daemon under a /proc mounted hidepid=invisible "
              "(unshare, mount or setpriv: %r)" % p.stderr.strip())
        return False
    sock = os.path.join(tmp, "dspkd.sock")
    log = open(os.path.join(tmp, "dspkd.log"), "w+")
    proc = dspk_daemon.start(wrap + dspk_daemon.cmdline(exe, sock, ["--config", "",
                                                                    "--job-required"],
                                                        backends="cpu,vulkan"),
                             TIMEOUT, stderr=log)
    check(proc is not None, "the hidden daemon started: %s" % open(log.name).read())
    d = Daemon.__new__(Daemon)
    d.sock, d.log, d.proc = sock, log, proc

    def check_hidden(d):
        os.chmod(d.sock, 0o666)
        admin = d.client()
        admin.call("job.register", {"job": 50, "uid": NOBODY, "devices": [gpu["uuid"]]})
        admin.call("job.register", {"job": 51, "uid": os.getuid(), "devices": []})
        # A live process of the job, hidden from the daemon: its claim decides.
        got = dspk_daemon.run_as(NOBODY, NOBODY, lambda: err_of(d.client(job=50), "devices",
                                                                 {}))
        check(got[0] == "ok", "a hidden live peer of job 50: %r" % (got,))
        got = dspk_daemon.run_as(NOBODY, NOBODY, lambda: sorted(ids(d.client(job=50))))
        check(got == sorted([cpu["id"], gpu["id"]]), "job 50's devices: %r" % (got,))
        check("its cgroup cannot be read (the process is hidden): passed by" in d.logtext(),
              "the log says the hidden cgroup was passed by")
        # A peer gone before the daemon accepted: still EPERM while its uid has jobs.
        e = err_of(handed_on(d, 51), "devices", {})
        check(e[0] == "EPERM" and "had exited before its cgroup could be read" in e[1],
              "a gone peer under hidepid: %r" % (e,))
    daemon_check(d, check_hidden)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspkd", required=True)
    ap.add_argument("--submit", required=True)
    ap.add_argument("--epilog", help="the packaged epilog (default: DSPKD's build tree's)")
    ap.add_argument("case", nargs="?", choices=["down", "paths", "hidden", "ending", "cgroup",
                                               "usable", "ended"],
                    help="run only this case (needs a Vulkan device all the same)")
    a = ap.parse_args()
    if os.getuid() != 0:
        print("not root: the jobs test switches a child to uid 65534 (needs root)")
        return 77
    tmp = tempfile.mkdtemp(prefix="dspk-jobs-")
    exe, submit = os.path.abspath(a.dspkd), os.path.abspath(a.submit)
    epilog = os.path.abspath(a.epilog or os.path.join(os.path.dirname(exe), "..", "packaging",
                                                      "slurm", "epilog"))
    try:
        rc = run(exe, submit, epilog, tmp, a.case)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if rc == 0:
        print("jobs: ok")
    return rc


if __name__ == "__main__":
    sys.exit(main())
