#!/usr/bin/env python3
"""cluster.slurm (ctest label "slurm"): a two-node Slurm cluster on this host with one
dspkd per node, as docs/cluster.md describes it.

- munged, slurmctld and two slurmd (nodes n1, n2 on 127.0.0.1, each with one GPU gres)
  in a private work folder with free ports, started in the foreground and stopped by PID;
- one dspkd per node, each on its own socket dspkd-<node>.sock; the TaskProlog exports
  DSPK_SOCKET from SLURMD_NODENAME, so a task reaches its node's daemon;
- the packaged prolog and epilog (build/packaging/slurm/) register and end each job; the
  fake GPU of both nodes (Slurm index 0) maps to the UUID of the Vulkan device the
  daemons list (lavapipe) through the prolog's map file;
- a 16-task job array with one GPU each runs over both nodes, each task computing with
  dspk-submit and the Python client (pip-installed into a venv, as tests/python does)
  against numpy (tests/cluster/slurm_task.py);
- a job without a GPU sees the cpu only and gets ENODEV on the GPU;
- a job leaves a process with a connection and a buffer behind: the epilog closes it, and
  afterwards the node's daemon holds nothing of the job (status, metrics);
- a prolog that fails (the GPU map gone) drains the node and requeues the job held
  (launch_failed_requeued_held, as docs/cluster.md says); resume and release run it.

Needs root (Slurm's daemons, munge) and the Debian packages slurmctld, slurmd,
slurm-client, munge (scripts/deps.sh): not root is exit 77 (ctest: not run); a missing
program fails.  Bounded: every wait has a deadline, the whole test TIMEOUT seconds.

    slurm_test.py --dspkd PATH --submit PATH --src DIR --build DIR
"""
import argparse
import json
import os
import pwd
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

TIMEOUT = 240
PROGS = ["slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "munged", "mungekey"]
PATHS = "/usr/sbin:/usr/bin:/sbin:/bin"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def which(p):
    return shutil.which(p, path=PATHS)


class Test:
    def __init__(self, a):
        self.a = a
        self.procs = []  # (name, Popen), stopped in reverse order by PID
        self.deadline = time.monotonic() + TIMEOUT
        self.w = tempfile.mkdtemp(prefix="dspk-slurm-")
        os.chmod(self.w, 0o755)
        self.env = dict(os.environ, SLURM_CONF=os.path.join(self.w, "slurm.conf"),
                        PATH=PATHS + ":" + os.environ.get("PATH", ""))
        for k in list(self.env):
            if k.startswith("SLURM_") and k != "SLURM_CONF" or k in ("DSPK_SOCKET", "DSPK_JOB"):
                del self.env[k]

    def left(self):
        t = self.deadline - time.monotonic()
        check(t > 0, "out of time (%d s)" % TIMEOUT)
        return t

    def path(self, *p):
        return os.path.join(self.w, *p)

    def write(self, name, text, mode=0o644):
        with open(self.path(name), "w") as f:
            f.write(text)
        os.chmod(self.path(name), mode)

    def start(self, name, args, **kw):
        log = open(self.path(name + ".log"), "w")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env, **kw)
        self.procs.append((name, p))
        return p

    def run(self, args, timeout=None, ok=True):
        p = subprocess.run(args, capture_output=True, text=True, env=self.env,
                           timeout=min(timeout or 60, self.left()))
        if ok:
            check(p.returncode == 0, "%s: %d\n%s%s" % (" ".join(args), p.returncode, p.stdout,
                                                       p.stderr))
        return p

    def stop_all(self):
        """SIGTERM to every process this test started, by PID, then wait; SIGKILL what is
        still there after 20 s.  The holder of slurm_task.py (outside Slurm's process
        tracking on purpose) is killed by its PID if a failure left it running."""
        try:
            with open(self.path("holder.pid")) as f:
                os.kill(int(f.read()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 20
        for name, p in reversed(self.procs):
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                print("%s (pid %d) did not stop on SIGTERM: killed" % (name, p.pid))
                p.kill()
                p.wait()

    def dump_logs(self):
        for f in sorted(os.listdir(self.w)):
            if f.endswith(".log") or f.endswith(".out"):
                with open(self.path(f), errors="replace") as fh:
                    text = fh.read()
                sys.stderr.write("---- %s ----\n%s\n" % (f, text[-4000:]))
        out = self.path("out")
        for f in sorted(os.listdir(out)) if os.path.isdir(out) else []:
            with open(os.path.join(out, f), errors="replace") as fh:
                sys.stderr.write("---- out/%s ----\n%s\n" % (f, fh.read()[-3000:]))


def free_ports():
    """A free port for slurmctld and two consecutive free ones for the slurmds."""
    def free(port):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False
        finally:
            s.close()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    ctld = s.getsockname()[1]
    s.close()
    for base in range(20000 + os.getpid() % 20000, 60000, 7):
        if base != ctld and free(base) and free(base + 1) and base + 1 != ctld:
            return ctld, base
    raise AssertionError("no two consecutive free ports")


def daemon(t, node):
    sock = t.path("dspkd-%s.sock" % node)
    r, w = os.pipe()
    args = [t.a.dspkd, "--foreground", "--socket", sock, "--ready-fd", str(w), "--no-cache",
            "--backends", "cpu,vulkan", "--log-level", "debug"]
    log = open(t.path("dspkd-%s.log" % node), "w")
    p = subprocess.Popen(args, pass_fds=[w], stdout=log, stderr=subprocess.STDOUT, env=t.env)
    t.procs.append(("dspkd-" + node, p))
    os.close(w)
    ready, _, _ = select.select([r], [], [], min(60, t.left()))
    data = os.read(r, 16) if ready else b""
    os.close(r)
    check(data == b"READY\n", "dspkd of %s did not become ready" % node)
    return sock


def submit_json(t, sock, *args):
    return json.loads(t.run([t.a.submit, "--socket", sock] + list(args) + ["--json"]).stdout)


def sbatch(t, args, mode, timeout):
    """Submits the batch script for mode and waits for the job (sbatch --wait); returns the
    job id."""
    p = t.run(["sbatch", "--parsable", "--wait", "-o", t.path("out", "%x-%A_%a.out"),
               "-J", mode] + args + [t.path("job.sh"), mode], timeout=timeout, ok=False)
    check(p.returncode == 0, "sbatch %s: %d\n%s%s" % (mode, p.returncode, p.stdout, p.stderr))
    return int(p.stdout.strip().split(";")[0])


def gone(t, job):
    """Waits (bounded) until the job has left squeue: its epilogs have run."""
    while True:
        p = t.run(["squeue", "-h", "-j", str(job), "-o", "%T"], ok=False)
        if p.returncode != 0 or not p.stdout.strip():
            return
        t.left()
        time.sleep(0.1)


def main_test(t):
    a = t.a
    for p in PROGS:
        check(which(p), "%s is missing (scripts/deps.sh installs slurmctld, slurmd, "
              "slurm-client and munge)" % p)
    prolog = os.path.join(a.build, "packaging", "slurm", "prolog")
    epilog = os.path.join(a.build, "packaging", "slurm", "epilog")
    check(os.access(prolog, os.X_OK) and os.access(epilog, os.X_OK),
          "the packaged prolog and epilog in the build tree")
    os.makedirs(t.path("out"))
    os.chmod(t.path("out"), 0o777)

    # munge, on a private socket and key.
    mu = pwd.getpwnam("munge")
    os.makedirs(t.path("munge"))
    t.run(["mungekey", "--create", "--keyfile", t.path("munge", "munge.key")])
    for f in ("munge", os.path.join("munge", "munge.key")):
        os.chown(t.path(f), mu.pw_uid, mu.pw_gid)
    os.chmod(t.path("munge"), 0o700)
    os.chmod(t.path("munge", "munge.key"), 0o400)
    msock = t.path("munge", "munge.sock")

    def as_munge():
        os.setgroups([])
        os.setgid(mu.pw_gid)
        os.setuid(mu.pw_uid)
    t.start("munged", [which("munged"), "--foreground", "--force", "--socket", msock,
                       "--key-file", t.path("munge", "munge.key"),
                       "--pid-file", t.path("munge", "munged.pid"),
                       "--seed-file", t.path("munge", "munged.seed"),
                       "--log-file", t.path("munge", "munged.log")], preexec_fn=as_munge)

    # One dspkd per node; the fake GPU of each node is the Vulkan device they list.
    socks = {n: daemon(t, n) for n in ("n1", "n2")}
    devs = submit_json(t, socks["n1"], "devices")["devices"]
    vk = [d for d in devs if d["backend"] == "vulkan" and d["uuid"]]
    check(vk, "the test needs a Vulkan device with a UUID (lavapipe: mesa-vulkan-drivers); "
          "the daemon lists %r" % [d["id"] for d in devs])
    gpu = vk[0]
    t.write("gpus", "# Slurm GPU index -> device UUID (the prolog's map file)\n0 %s\n"
            % gpu["uuid"])

    # Python client: pip-installed into a venv, as tests/python/run.sh does.
    shutil.copytree(os.path.join(a.src, "python"), t.path("pysrc"))
    t.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
           t.path("venv")])
    t.run([t.path("venv", "bin", "python"), "-m", "pip", "install", "-q",
           "--no-build-isolation", "--no-index", t.path("pysrc")], timeout=120)

    # Slurm: configuration, prolog/epilog wrappers, TaskProlog, the batch script.
    ctld_port, node_port = free_ports()
    host = socket.gethostname().split(".")[0]
    w = t.w
    t.write("slurm.conf", "\n".join([
        "ClusterName=dspktest%d" % os.getpid(),
        "SlurmctldHost=%s" % host,
        "SlurmctldPort=%d" % ctld_port,
        "SlurmUser=root",
        "AuthType=auth/munge",
        "AuthInfo=socket=%s" % msock,
        "CredType=cred/munge",
        "StateSaveLocation=%s/state" % w,
        "SlurmdSpoolDir=%s/spool/%%n" % w,
        "SlurmctldPidFile=%s/slurmctld.pid" % w,
        "SlurmdPidFile=%s/slurmd-%%n.pid" % w,
        "SlurmctldLogFile=%s/slurmctld.log" % w,
        "SlurmdLogFile=%s/slurmd-%%n.log" % w,
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerParameters=batch_sched_delay=0",
        "MailProg=/bin/true",
        "ReturnToService=2",
        "GresTypes=gpu",
        "Prolog=%s/prolog.sh" % w,
        "Epilog=%s/epilog.sh" % w,
        "TaskProlog=%s/taskprolog.sh" % w,
        "NodeName=n[1-2] NodeHostname=%s NodeAddr=127.0.0.1 Port=[%d-%d] CPUs=1 "
        "RealMemory=500 Gres=gpu:1 State=UNKNOWN" % (host, node_port, node_port + 1),
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
    t.write("gres.conf", "NodeName=n1 Name=gpu File=/dev/null\n"
            "NodeName=n2 Name=gpu File=/dev/zero\n")
    # slurmd runs the prolog and epilog as root with Slurm's variables only: the wrapper
    # names this node's daemon (the socket by SLURMD_NODENAME) and the map file.
    common = ('export DSPK_SOCKET="%s/dspkd-$SLURMD_NODENAME.sock" DSPK_GPU_MAP="%s/gpus" '
              'DSPK_SUBMIT="%s"\n' % (w, w, a.submit))
    t.write("prolog.sh", "#!/bin/sh\n" + common +
            'env | grep -E "^(SLURM|CUDA)" | sort > "%s/out/prolog-env-$SLURM_JOB_ID"\n'
            'exec "%s" >> "%s/prolog-$SLURMD_NODENAME.log" 2>&1\n' % (w, prolog, w), 0o755)
    t.write("epilog.sh", "#!/bin/sh\n" + common +
            'echo "job $SLURM_JOB_ID: $("%s" 2>&1)" >> "%s/epilog-$SLURMD_NODENAME.log"\n'
            % (epilog, w), 0o755)
    t.write("taskprolog.sh", '#!/bin/sh\necho "export DSPK_SOCKET=%s/dspkd-$SLURMD_NODENAME'
            '.sock"\n' % w, 0o755)
    t.write("job.sh", "#!/bin/sh\nexport DSPK_TEST_WORK=%s DSPK_TEST_OUT=%s/out "
            "DSPK_TEST_SUBMIT=%s DSPK_TEST_GPU=%s DSPK_TEST_GPU_ID=%s\n"
            'exec "%s" "%s" "$1"\n' % (w, w, a.submit, gpu["uuid"], gpu["id"],
                                      t.path("venv", "bin", "python"),
                                      os.path.join(a.src, "tests", "cluster", "slurm_task.py")),
            0o755)
    for d in ("state", "spool"):
        os.makedirs(t.path(d))
    t.start("slurmctld-fg", [which("slurmctld"), "-D", "-i", "-f", t.env["SLURM_CONF"]])
    for n in ("n1", "n2"):
        t.start("slurmd-fg-" + n, [which("slurmd"), "-D", "-f", t.env["SLURM_CONF"], "-N", n])

    # 1. The job array: 16 tasks with one GPU each, over both nodes.
    arr = sbatch(t, ["--array=0-15", "--gres=gpu:1"], "array", 180)
    results = []
    for f in os.listdir(t.path("out")):
        if f.startswith("array-") and f.endswith(".json"):
            with open(t.path("out", f)) as fh:
                results.append(json.load(fh))
    check(len(results) == 16 and all(r.get("ok") for r in results),
          "16 array tasks succeeded: %d results" % len(results))
    nodes = sorted({r["node"] for r in results})
    check(nodes == ["n1", "n2"], "the array ran on both nodes: %r" % nodes)
    check(all(sorted(r["devices"]) == sorted(["cpu:0", gpu["id"]]) for r in results),
          "each task saw the cpu and its GPU")
    print("array %d: 16 tasks, %s" % (arr, ", ".join("%s: %d" % (n, sum(r["node"] == n for r in
                                                                      results)) for n in nodes)))

    # 2. A job without a GPU: the cpu only, ENODEV on the GPU.
    ng = sbatch(t, ["-w", "n1"], "nogpu", 60)
    with open(t.path("out", "nogpu-%d.json" % ng)) as fh:
        r = json.load(fh)
    check(r.get("ok") and r["devices"] == ["cpu:0"], "the job without GPU: %r" % r)
    print("job %d without GPU: %s" % (ng, r["submit_error"]))

    # 3. A job that leaves a connection with a buffer behind: the epilog ends it.
    fifo = t.path("holder.fifo")
    os.mkfifo(fifo, 0o666)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    hj = sbatch(t, ["-w", "n2", "--gres=gpu:1"], "holder", 60)
    with open(t.path("out", "holder-%d.json" % hj)) as fh:
        r = json.load(fh)
    before = r["before_end"]
    check(len(before) == 1 and before[0]["buffers"] == 1 and before[0]["connections"] >= 1,
          "before the epilog the daemon held the job's buffer: %r" % before)
    os.set_blocking(rfd, True)
    ready, _, _ = select.select([rfd], [], [], min(60, t.left()))
    check(ready, "the holder's connection was not closed")
    data = b""
    while True:  # "closed\n", then EOF when the holder is gone
        chunk = os.read(rfd, 64)
        if not chunk:
            break
        data += chunk
    os.close(rfd)
    check(data == b"closed\n", "the daemon closed the holder's connection: %r" % data)
    gone(t, hj)
    with open(t.path("epilog-n2.log")) as fh:
        lines = [ln for ln in fh if ln.startswith("job %d:" % hj)]
    check(len(lines) == 1, "one epilog for job %d: %r" % (hj, lines))
    ans = json.loads(lines[0].split(":", 1)[1])
    check(ans["ended"] and ans["connections"] == 1 and ans["buffers"] == 1,
          "the epilog closed one connection with one buffer: %r" % ans)
    for n in ("n1", "n2"):
        st = submit_json(t, socks[n], "status")
        check(not st["jobs"], "%s: no job left after the epilogs: %r" % (n, st["jobs"]))
        check(not [c for c in st["clients"] if c.get("job")], "%s: no client of a job" % n)
        check(sum(c["buffers"] for c in st["clients"]) == 0, "%s: no buffer left" % n)
        m = t.run([a.submit, "--socket", socks[n], "metrics"]).stdout
        check("dspk_slurm_jobs 0" in m and "{job=" not in m, "%s: metrics without jobs" % n)
    print("job %d: the epilog closed its escaped connection and freed its buffer; "
          "no job left on either node" % hj)

    # 4. When the prolog fails (docs/cluster.md, "When the prolog fails"; probe 19 G2):
    # the GPU map missing, the prolog exits 1; Slurm 22.05 drains the node ("Prolog
    # error") and requeues the job held, its reason launch_failed_requeued_held (never
    # JobHeldUser), which stays after the node is resumed; scontrol release then lets it
    # run, with its GPU.
    os.rename(t.path("gpus"), t.path("gpus.away"))
    p = t.run(["sbatch", "--parsable", "-w", "n1", "--gres=gpu:1", "-o",
               t.path("out", "%x-%A.out"), "-J", "array", t.path("job.sh"), "array"])
    hjob = int(p.stdout.strip().split(";")[0])

    def job_field(key):
        # scontrol's words (squeue's %r writes the reason with blanks instead).
        out = t.run(["scontrol", "-o", "show", "job", str(hjob)]).stdout
        return dict(w.split("=", 1) for w in out.split() if "=" in w).get(key)
    until = time.monotonic() + 60
    # (COMPLETING, with that reason already, while its epilog runs; then PENDING.)
    while (job_field("JobState"), job_field("Reason")) != ("PENDING",
                                                           "launch_failed_requeued_held"):
        check(time.monotonic() < until, "job %d not held 60 s after its submission: %s %s"
              % (hjob, job_field("JobState"), job_field("Reason")))
        time.sleep(0.1)
    check(job_field("JobState") == "PENDING" and job_field("Priority") == "0",
          "the held job pends: %s" % job_field("JobState"))
    node = t.run(["sinfo", "-h", "-n", "n1", "-N", "-o", "%T|%E"]).stdout.strip()
    check(node.startswith("drain") and node.endswith("|Prolog error"),
          "n1 after the prolog failed: %r" % node)
    os.rename(t.path("gpus.away"), t.path("gpus"))
    t.run(["scontrol", "update", "nodename=n1", "state=resume"])
    check(job_field("Reason") == "launch_failed_requeued_held",
          "resuming the node leaves the job held: %s" % job_field("Reason"))
    t.run(["scontrol", "release", str(hjob)])
    # A requeued job waits for a begin time Slurm set at the requeue (reason BeginTime);
    # the admin may start it at once.
    t.run(["scontrol", "update", "jobid=%d" % hjob, "starttime=now"])
    gone(t, hjob)
    with open(t.path("out", "array-%d.json" % hjob)) as fh:
        r = json.load(fh)
    check(r.get("ok") and r["node"] == "n1" and sorted(r["devices"]) ==
          sorted(["cpu:0", gpu["id"]]), "the released job ran with its GPU: %r" % r)
    print("job %d: held after its prolog failed (launch_failed_requeued_held), ran once "
          "n1 was resumed and the job released" % hjob)
    return 0


def main():
    ap = argparse.ArgumentParser()
    for k in ("dspkd", "submit", "src", "build"):
        ap.add_argument("--" + k, required=True)
    a = ap.parse_args()
    for k in ("dspkd", "submit", "src", "build"):
        setattr(a, k, os.path.abspath(getattr(a, k)))
    if os.getuid() != 0:
        print("NOT RUN: the Slurm cluster test needs root (slurmd, munge); CI runs as root")
        return 77
    t = Test(a)
    ok = False
    try:
        rc = main_test(t)
        ok = True
    finally:
        t.stop_all()
        bad = [(n, p.returncode) for n, p in t.procs if n.startswith("dspkd") and
               p.returncode != 0]
        if ok and bad:
            ok = False
            print("dspkd exited badly: %r" % bad)
        if not ok:
            t.dump_logs()
        shutil.rmtree(t.w, ignore_errors=True)
    if not ok:
        return 1
    print("slurm: ok")
    return rc


if __name__ == "__main__":
    sys.exit(main())
