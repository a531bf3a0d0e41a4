#!/usr/bin/python3
"""Lifecycle tests of dspkd: signals, systemd notify, socket activation,
configuration file and reload, every exit path, start/stop cycles.

No systemd PID 1 is needed: the notify protocol is read from a datagram
socket the test binds ($NOTIFY_SOCKET), socket activation comes from
systemd-socket-activate.  Every wait is on an event (the --ready-fd pipe, a
notify datagram, a response, waitpid), bounded by TIMEOUT as a failure, never
a sleep.

    lifecycle_test.py --dspkd PATH GROUP     GROUP: see GROUPS at the bottom
"""
import argparse
import errno
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import msgpack

TIMEOUT = 30.0
DAEMONS = []


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from dspk_rpc import Client, RpcError, check  # noqa: E402
import dspk_daemon  # noqa: E402


class Notify:
    """The systemd side of sd_notify(3): a datagram socket the daemon sends to."""

    def __init__(self, tmp):
        self.path = os.path.join(tmp, "notify-%d.sock" % len(DAEMONS))
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(TIMEOUT)
        self.seen = []

    def next(self):
        data = self.sock.recv(4096).decode()
        msg = dict(l.split("=", 1) for l in data.split("\n") if "=" in l)
        self.seen.append(msg)
        return msg

    def until(self, pred, what):
        while True:
            try:
                m = self.next()
            except socket.timeout:
                raise AssertionError("no notification %s; saw %r" % (what, self.seen))
            if pred(m):
                return m

    def close(self):
        self.sock.close()


class Daemon:
    def __init__(self, exe, tmp, extra=(), env=None, notify=False, ready=True, sock=None,
                 backends="cpu", preexec_fn=None, config="", socket_flag=True,
                 log_level="debug", cwd=None):
        """config: --config's value, None for no --config (the default file);
        socket_flag False: no --socket (the file names self.sock)."""
        self.tmp = tmp
        self.sock = sock or os.path.join(tmp, "dspkd-%d.sock" % len(DAEMONS))
        self.logpath = os.path.join(tmp, "dspkd-%d.log" % len(DAEMONS))
        self.log = open(self.logpath, "w+")
        self.notify = Notify(tmp) if notify else None
        e = dict(os.environ)
        e.pop("NOTIFY_SOCKET", None)
        e.pop("DSPKD_TEST_EXIT", None)
        if self.notify:
            e["NOTIFY_SOCKET"] = self.notify.path
        e.pop("CACHE_DIRECTORY", None)
        e["XDG_CACHE_HOME"] = tmp  # a file's default cache stays in the test's directory
        e.update(env or {})
        r, w = os.pipe()
        args = [exe, "--foreground", "--ready-fd", str(w)]
        # dspkd refuses an option given twice: extra's win over these.
        if log_level and "--log-level" not in extra:
            args += ["--log-level", log_level]
        if socket_flag and "--socket" not in extra:
            args += ["--socket", self.sock]
        if config is not None and "--config" not in extra:
            args += ["--config", config]
        if backends and "--backends" not in extra:
            args += ["--backends", backends]
        if not {"--cache", "--no-cache", "--config"} & set(extra):
            args += ["--no-cache"]
        self.proc = subprocess.Popen(args + list(extra), pass_fds=[w], stderr=self.log, env=e,
                                     preexec_fn=preexec_fn, cwd=cwd)
        DAEMONS.append(self)
        os.close(w)
        if not ready:
            os.close(r)
            return
        got, _, _ = select.select([r], [], [], TIMEOUT)
        data = os.read(r, 16) if got else b""
        os.close(r)
        if data != b"READY\n":
            self.kill()
            raise AssertionError("dspkd did not become ready:\n" + self.logtext())

    def logtext(self):
        self.log.flush()
        with open(self.logpath) as f:
            return f.read()

    def client(self):
        return Client(self.sock, TIMEOUT)

    def wait(self):
        try:
            return self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("dspkd did not exit:\n" + self.logtext())

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, rc=0):
        self.proc.send_signal(signal.SIGTERM)
        got = self.wait()
        check(got == rc, "exit status %d, want %d:\n%s" % (got, rc, self.logtext()))
        self.check_clean_exit()
        # The stop's cause comes first (dspkd(8) LOGGING): the signal is logged
        # before "stopping" and before any device closes.
        log = self.logtext()
        lines = [re.sub(r"^dspkd\[\d+\]: \w+: ", "", l) for l in log.splitlines()]
        first = min((i for i, l in enumerate(lines) if l == "stopping" or
                     l.endswith(": device closed")), default=None)
        check(first is not None and "received SIGTERM" in lines[:first],
              "the signal logged before the stop:\n" + log)

    def check_clean_exit(self):
        log = self.logtext()
        m = re.search(r"threads at exit: (\d+) \(before the devices opened: (\d+)\), "
                      r"runners: (\d+)", log)
        # GPU drivers keep helper threads of their own until the process ends
        # (the CUDA driver's, NVIDIA Vulkan's); runners must all be gone.
        check(m and int(m.group(3)) == 0, "no runner left at the end of main:\n" + log)
        if m and backends_cpu_only(log):
            check(int(m.group(1)) <= int(m.group(2)),
                  "no thread the devices started is left:\n" + log)
        opened = re.findall(r"info: (\S+): .* \(.*\)\n", log)
        opened = [x for x in opened if re.match(r"^[a-z]+:\d+$", x)]
        for dev in opened:
            check("%s: device closed" % dev in log, "%s closed before exit:\n%s" % (dev, log))


def backends_cpu_only(log):
    return not re.search(r"info: (cuda|vulkan|hip):\d+: ", log)


def wait_running(c, dev="cpu:0", owner=None, task=None):
    """Waits (one status reply per step) until a task runs on dev; fails at once
    when owner's task was already answered (it failed instead of running)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        if owner is not None:
            while select.select([owner.sock], [], [], 0)[0]:
                owner.pump()
            check(task not in owner.responses, "the long task was answered: %r"
                  % (owner.responses.get(task),))
        st = c.call("status")
        d = [x for x in st["devices"] if x["id"] == dev][0]
        if d["running"] >= 1:
            return
        check(time.monotonic() < deadline, "a task started running: %r" % d)


def long_task(c, big=True):
    """Queues a batched gemm that takes seconds on cpu:0 and checks its cancel
    flag between batches; returns its msgid."""
    r, m, k = (64, 64, 2048) if big else (8, 64, 512)
    n = r * m * k * 4
    a = c.call("buffer.create", {"size": n, "device": "cpu:0"})["buffer"]
    o = c.call("buffer.create", {"size": r * r * m * m * 4, "device": "cpu:0"})["buffer"]
    c.call("buffer.write", {"buffer": a, "data": bytes(n)})
    return c.send("task.run", {"op": "gemm", "device": "cpu:0",
                               "inputs": [{"buffer": a, "dtype": "f32", "shape": [r, 1, m, k]},
                                          {"buffer": a, "dtype": "f32", "shape": [1, r, k, m]}],
                               "outputs": [{"buffer": o}]})


def small_task(c):
    return c.send("task.run", {"op": "map", "device": "cpu:0", "options": {"fn": "abs"},
                               "inputs": [{"dtype": "f64", "shape": [3],
                                           "data": b"\x00" * 24}]})


# ---- groups ---------------------------------------------------------------------

def t_notify(exe, tmp):
    d = Daemon(exe, tmp, notify=True, env={"WATCHDOG_USEC": "200000"})
    n = d.notify
    first = n.next()
    check(first.get("READY") == "1", "READY=1 first: %r" % first)
    check("STATUS" in first and "1 device" in first["STATUS"], "STATUS with devices: %r" % first)
    check(first.get("MAINPID") == str(d.proc.pid), "MAINPID: %r" % first)
    # STATUS follows the clients.
    c = d.client()
    c.call("ping", {"data": b"x"})
    n.until(lambda m: "1 client" in m.get("STATUS", ""), "STATUS with 1 client")
    # WATCHDOG=1 from the loop, every WATCHDOG_USEC/2.
    for _ in range(3):
        n.until(lambda m: m.get("WATCHDOG") == "1", "WATCHDOG=1")
    c.close()
    n.until(lambda m: "0 clients" in m.get("STATUS", ""), "STATUS with 0 clients")
    d.proc.send_signal(signal.SIGTERM)
    stop = n.until(lambda m: "STOPPING" in m, "STOPPING=1")
    check(stop["STOPPING"] == "1" and int(stop.get("EXTEND_TIMEOUT_USEC", "0")) > 0,
          "STOPPING=1 with EXTEND_TIMEOUT_USEC: %r" % stop)
    check(d.wait() == 0, "exit 0")
    d.check_clean_exit()
    kinds = [("READY" if "READY" in m else "STOPPING" if "STOPPING" in m else
              "STATUS" if "STATUS" in m else "other") for m in n.seen]
    i_ready, i_stop = kinds.index("READY"), kinds.index("STOPPING")
    check(i_ready == 0 and "STATUS" in kinds[i_ready + 1:i_stop] and
          "READY" not in kinds[i_ready + 1:], "order READY, STATUS, STOPPING: %r" % kinds)
    # Without WATCHDOG_USEC there are no pings; without NOTIFY_SOCKET nothing is sent.
    d2 = Daemon(exe, tmp, notify=True)
    n2 = d2.notify
    n2.until(lambda m: m.get("READY") == "1", "READY=1")
    d2.proc.send_signal(signal.SIGTERM)
    n2.until(lambda m: "STOPPING" in m, "STOPPING=1")
    check(d2.wait() == 0, "exit 0")
    try:
        while True:
            n2.sock.settimeout(0)
            n2.next()
    except (BlockingIOError, socket.timeout):
        pass
    check(not any("WATCHDOG" in m for m in n2.seen), "no watchdog pings unasked: %r" % n2.seen)


def t_activation(exe, tmp):
    sa = shutil.which("systemd-socket-activate") or "/usr/bin/systemd-socket-activate"
    if not os.path.exists(sa):
        print("skip: systemd-socket-activate missing")
        sys.exit(77)
    sock = os.path.join(tmp, "act.sock")
    note = Notify(tmp)
    env = {"NOTIFY_SOCKET": note.path}
    for v in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
        if v in os.environ:
            env[v] = os.environ[v]
    args = [sa, "-l", sock]
    for k, v in env.items():
        args += ["-E", "%s=%s" % (k, v)]
    args += [exe, "--foreground", "--backends", "cpu", "--log-level", "debug", "--config", "",
             "--no-cache"]
    # A --socket under socket activation is not used (dspkd(8)), and the log
    # says so, naming both (it said only "listening on ACT (socket activation)").
    other = os.path.join(tmp, "other.sock")
    p = subprocess.Popen(args + ["--socket", other], stderr=subprocess.PIPE)
    text = ""

    def drain():
        # The activator's stderr becomes dspkd's log after the exec.
        nonlocal text
        text += p.stderr.read().decode()
        return text

    try:
        # systemd-socket-activate binds, says so, and execs dspkd on the first
        # connection.
        got, _, _ = select.select([p.stderr], [], [], TIMEOUT)
        first = p.stderr.readline().decode() if got else ""
        check(first.startswith("Listening on %s" % sock), "activator listens: %r" % first)
        c = Client(sock, TIMEOUT)
        check(c.call("ping", {"data": b"act"})["data"] == b"act", "served on the passed socket")
        ready = note.until(lambda m: m.get("READY") == "1", "READY=1")
        check("STATUS" in ready, "STATUS with READY")
        st = c.call("status")
        check(st["daemon"]["socket"] == sock, "status names the passed socket: %r"
              % st["daemon"]["socket"])
        check(st["daemon"]["pid"] == p.pid, "dspkd replaced the activator (exec)")
        p.send_signal(signal.SIGTERM)
        c.expect_eof()
        rc = p.wait(TIMEOUT)
        drain()
        check(rc == 0, "exit 0 after SIGTERM, got %d:\n%s" % (rc, text))
        check("(socket activation)" in text, "logged the activation:\n" + text)
        check("warn: --socket %s is not used: dspkd listens on the socket that socket "
              "activation passed, %s\n" % (other, sock) in text,
              "the unused --socket logged:\n" + text)
        check(not os.path.exists(other), "nothing at the unused --socket")
        check(os.path.exists(sock), "the activated socket's file is left to its owner")
        check("cpu:0: device closed" in text, "device closed")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # --ready-fd naming the passed socket (fd 3) is refused at start, exit 2 and
    # one line: READY written there and the descriptor closed under the event
    # loop ended the service (an abort at the first connection, no log line).
    sock3 = os.path.join(tmp, "act3.sock")
    p = subprocess.Popen([sa, "-l", sock3] + args[3:] + ["--ready-fd", "3"],
                         stderr=subprocess.PIPE)
    try:
        got, _, _ = select.select([p.stderr], [], [], TIMEOUT)
        first = p.stderr.readline().decode() if got else ""
        check(first.startswith("Listening on %s" % sock3), "activator listens: %r" % first)
        s3 = socket.socket(socket.AF_UNIX)
        s3.connect(sock3)  # execs dspkd
        rc = p.wait(TIMEOUT)
        s3.close()
        err = p.stderr.read().decode()
        lines = [l for l in err.splitlines() if l.startswith("dspkd[")]
        check(rc == 2 and len(lines) == 1 and
              "--ready-fd 3: that is the listening socket passed by socket activation"
              in lines[0], "--ready-fd 3 under activation refused: %d %r" % (rc, err))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # A passed descriptor that is not a listening Unix stream socket is refused.
    r, w = os.pipe()
    code = ("import os,sys; fd=int(sys.argv[1]); os.dup2(fd, 3); fd != 3 and os.close(fd); "
            "os.environ['LISTEN_PID']=str(os.getpid()); "
            "os.environ['LISTEN_FDS']='1'; os.execv(sys.argv[2], sys.argv[2:])")
    q = subprocess.run([sys.executable, "-c", code, str(r), exe, "--foreground", "--backends",
                        "cpu", "--config", "", "--socket", os.path.join(tmp, "x.sock")],
                       pass_fds=[r], stderr=subprocess.PIPE, timeout=TIMEOUT)
    os.close(r)
    os.close(w)
    check(q.returncode != 0 and b"not a listening Unix stream socket" in q.stderr,
          "bad passed fd refused: %r" % q.stderr)


def t_abstract(exe, tmp):
    """A daemon on an activated abstract socket (ListenStream=@name, systemd.md) is
    reached by dspk-submit -S @name and $DSPK_SOCKET=@name, through libdspkclient:
    a leading '@' names the abstract namespace (protocol.md, cli.md).  The log and
    status name the address as @name (they said "(activated socket, fd 3)").  The
    clients took @name for a file (ECONNECT "No such file or directory"; probe 17,
    E 1).  dspkd binds no abstract socket itself: --socket @name without
    activation is refused, exit 2 and one line."""
    submit = os.environ.get("DSPK_SUBMIT") or os.path.join(
        os.path.dirname(os.path.dirname(exe)), "client", "submit", "dspk-submit")
    if not os.access(submit, os.X_OK):
        print("skip: no dspk-submit beside %s (set DSPK_SUBMIT)" % exe)
        sys.exit(77)
    name = "dspk-test-abstract-%d" % os.getpid()
    args = [exe, "--foreground", "--backends", "cpu", "--config", "", "--no-cache",
            "--log-level", "info"]
    p = dspk_daemon.activate(args, "@" + name, TIMEOUT, env={"RUNTIME_DIRECTORY": tmp})
    if p is None:
        print("skip: systemd-socket-activate missing")
        sys.exit(77)

    def run(cmd, env=None):
        e = dict(os.environ)
        e.pop("DSPK_SOCKET", None)
        e.update(env or {})
        q = subprocess.run([submit] + cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=e, timeout=TIMEOUT)
        return q.returncode, q.stdout.decode(), q.stderr.decode()

    try:
        rc, out, err = run(["-S", "@" + name, "ping"])
        check(rc == 0, "ping -S @name: %d %r %r" % (rc, out, err))
        rc, out, err = run(["status", "--json"], {"DSPK_SOCKET": "@" + name})
        check(rc == 0, "status with $DSPK_SOCKET=@name: %d %r" % (rc, err))
        import json
        check(json.loads(out)["daemon"]["socket"] == "@" + name,
              "status names the abstract socket: %r" % out[:300])
        # Nothing on another name: the error names the form.
        rc, out, err = run(["-S", "@%s-none" % name, "ping"])
        check(rc != 0 and ("cannot connect to @%s-none: no daemon listens on this abstract "
                           "name (an abstract socket: a leading '@' names the abstract "
                           "namespace)" % name) in err, "no such abstract name: %r" % err)
        rc, out, err = run(["-S", "@", "ping"])
        check(rc != 0 and "abstract socket name after '@' is empty" in err,
              "a lone @: %d %r" % (rc, err))
    finally:
        rc = dspk_daemon.stop(p, TIMEOUT)
        text = p.stderr.read().decode()
    check(rc == 0, "exit 0 after SIGTERM, got %r:\n%s" % (rc, text))
    check("info: listening on @%s (socket activation)\n" % name in text,
          "the log names the abstract address:\n" + text)
    # Not activated: dspkd does not bind an abstract socket.
    for how in ("--socket", "env"):
        e = dict(os.environ)
        cmd = [exe, "--foreground", "--backends", "cpu", "--config", "", "--no-cache"]
        if how == "env":
            e["DSPK_SOCKET"] = "@" + name
        else:
            cmd += ["--socket", "@" + name]
        q = subprocess.run(cmd, stderr=subprocess.PIPE, env=e, timeout=TIMEOUT)
        err = q.stderr.decode()
        lines = [l for l in err.splitlines() if l.startswith("dspkd[")]
        want = "%s @%s: an abstract socket (@NAME) is served only when socket activation " \
            "passes it" % ("--socket" if how == "--socket" else "$DSPK_SOCKET", name)
        check(q.returncode == 2 and len(lines) == 1 and want in lines[0],
              "%s @name refused: %d %r" % (how, q.returncode, err))


def t_ownfiles(exe, tmp):
    """The Slurm jobs' state file is none of the daemon's other files: a
    job_state that is the socket, the cache, one of SQLite's files beside it
    (by path, by a link to it, by another spelling) or whose PATH.tmp is one
    of those is refused at start, exit 2 and one line, before anything is
    listened on or opened; the default is refused alike.  A daemon with no
    state file at all (an activated socket without a path, no job_state,
    no $RUNTIME_DIRECTORY) refuses to start: it would lose every
    registration at a restart (dspk.conf(5), job_state)."""
    sock = os.path.join(tmp, "own.sock")
    db = os.path.join(tmp, "own.db")
    write(db, "")
    os.symlink(db, os.path.join(tmp, "link.db"))
    os.mkdir(os.path.join(tmp, "sub"))

    def refused(extra, want, env=None):
        e = dict(os.environ)
        e.update(env or {})
        p = subprocess.run([exe, "--foreground", "--config", "", "--backends", "cpu",
                            "--socket", sock] + extra, stderr=subprocess.PIPE, env=e,
                           timeout=TIMEOUT)
        err = p.stderr.decode()
        lines = [l for l in err.splitlines() if l.startswith("dspkd[")]
        check(p.returncode == 2 and len(lines) == 1 and want in lines[0],
              "%r: exit 2 and one line with %r, got %d: %r" % (extra, want, p.returncode, err))
        check(not os.path.exists(sock), "%r: never listened" % extra)

    refused(["--no-cache", "--job-state", sock], "is the socket (%s)" % sock)
    refused(["--no-cache", "--job-state", os.path.join(tmp, "sub", "..", "own.sock")],
            "is the socket (%s)" % sock)
    refused(["--cache", db, "--job-state", db], "is the cache (%s)" % db)
    refused(["--cache", db, "--job-state", os.path.join(tmp, "link.db")],
            "is the cache (%s)" % db)
    for side in ("-wal", "-shm", "-journal"):
        refused(["--cache", db, "--job-state", db + side], "(%s%s)" % (db, side))
    # The cache by its default ($CACHE_DIRECTORY under systemd).
    refused(["--job-state", os.path.join(tmp, "cache.db")], "is the cache",
            env={"CACHE_DIRECTORY": tmp})
    # The temporary file beside the state file is the socket.
    p = subprocess.run([exe, "--foreground", "--config", "", "--backends", "cpu", "--no-cache",
                        "--socket", os.path.join(tmp, "own.tmp"), "--job-state",
                        os.path.join(tmp, "own")], stderr=subprocess.PIPE, timeout=TIMEOUT)
    check(p.returncode == 2 and b"its temporary file" in p.stderr and
          p.stderr.count(b"\n") == 1, "PATH.tmp is the socket: %r" % p.stderr)

    # A refused state file (fail-closed for the daemon's life) shows in
    # STATUS=, which systemctl status shows; a good one does not.
    bad = os.path.join(tmp, "bad.jobs")
    write(bad, "not a jobs file\n")
    for path, refused_ in ((bad, True), (os.path.join(tmp, "none.jobs"), False)):
        d = Daemon(exe, tmp, ["--job-state", path], notify=True)
        ready = d.notify.until(lambda m: m.get("READY") == "1", "READY=1")
        check(("state file refused" in ready.get("STATUS", "")) == refused_,
              "%s: STATUS=%r" % (path, ready.get("STATUS")))
        d.stop()

    # An activated abstract socket: no default state file.
    sa = shutil.which("systemd-socket-activate") or "/usr/bin/systemd-socket-activate"
    if not os.path.exists(sa):
        print("skip: systemd-socket-activate missing (the abstract socket's part)")
        return
    name = "dspk-test-own-%d" % os.getpid()
    for n, (env, extra, want_rc) in enumerate((
            ({}, [], 2),
            ({"RUNTIME_DIRECTORY": tmp}, [], 0),
            ({}, ["--job-state", os.path.join(tmp, "abs.jobs")], 0))):
        args = [sa, "-l", "@%s-%d" % (name, n)]
        for v in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
            if v in os.environ:
                args += ["-E", "%s=%s" % (v, os.environ[v])]
        for k, v in env.items():
            args += ["-E", "%s=%s" % (k, v)]
        e = dict(os.environ)
        e.pop("RUNTIME_DIRECTORY", None)
        p = subprocess.Popen(args + [exe, "--foreground", "--backends", "cpu", "--config", "",
                                     "--no-cache", "--log-level", "debug"] + extra,
                             stderr=subprocess.PIPE, env=e)
        try:
            got, _, _ = select.select([p.stderr], [], [], TIMEOUT)
            first = p.stderr.readline().decode() if got else ""
            check(first.startswith("Listening on"), "activator listens: %r" % first)
            c = socket.socket(socket.AF_UNIX)
            c.connect("\0%s-%d" % (name, n))  # execs dspkd
            if want_rc == 0:
                c.sendall(msgpack.packb([0, 1, "ping", [{"data": b"x"}]]))
                u = msgpack.Unpacker(raw=False)
                while True:
                    data = c.recv(4096)
                    check(data, "%r: served" % env)
                    u.feed(data)
                    got = list(u)
                    if got:
                        break
                check(got[0][2] is None, "%r: ping answered: %r" % (env, got))
                p.send_signal(signal.SIGTERM)
            rc = p.wait(TIMEOUT)
            c.close()
            err = p.stderr.read().decode()
            check(rc == want_rc, "%r %r: exit %d, want %d:\n%s" % (env, extra, rc, want_rc, err))
            if want_rc:
                lines = [l for l in err.splitlines() if l.startswith("dspkd[")]
                check(len(lines) == 1 and "has no path" in lines[0] and
                      "set job_state" in lines[0], "no state file: one line: %r" % err)
            else:
                check("Slurm jobs:" in err and "get the cpu only" not in err,
                      "%r: a state file, not fail-closed:\n%s" % (env, err))
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


def t_cachefiles(exe, tmp):
    """The cache is neither the socket nor the configuration file, and none
    of SQLite's files beside it (-wal, -shm, -journal) is either: by path,
    by a hard or a symbolic link, by another spelling, refused at start
    with exit 2 and one line before any file is made.  (A cache that was
    the configuration file was taken for a corrupt cache, moved aside and
    replaced by a database; one that was the socket made the bind fail and
    stayed, failing every later start.)"""
    sock = os.path.join(tmp, "c.sock")
    conf = os.path.join(tmp, "c.conf")
    text = "[limits]\nmax_clients = 7\n"
    write(conf, text)
    os.link(conf, os.path.join(tmp, "hard.conf"))
    os.symlink(conf, os.path.join(tmp, "sym.conf"))
    os.mkdir(os.path.join(tmp, "sub"))

    def refused(cache, want, config=conf):
        before = sorted(os.listdir(tmp))
        p = subprocess.run([exe, "--foreground", "--config", config, "--backends", "cpu",
                            "--socket", sock, "--cache", cache,
                            "--job-state", os.path.join(tmp, "c.jobs")],
                           stderr=subprocess.PIPE, cwd=tmp, timeout=TIMEOUT)
        err = p.stderr.decode()
        lines = [l for l in err.splitlines() if l.startswith("dspkd[")]
        check(p.returncode == 2 and len(lines) == 1 and want in lines[0],
              "--cache %s: exit 2 and one line with %r, got %d: %r"
              % (cache, want, p.returncode, err))
        check(sorted(os.listdir(tmp)) == before, "--cache %s: no file made: %r -> %r"
              % (cache, before, sorted(os.listdir(tmp))))
        with open(conf) as f:
            check(f.read() == text, "--cache %s: the configuration file kept" % cache)

    for spelling in (conf, "c.conf", "./c.conf", os.path.join(tmp, "sub", "..", "c.conf"),
                     os.path.join(tmp, "hard.conf"), os.path.join(tmp, "sym.conf")):
        refused(spelling, "is the configuration file (%s)" % conf)
    refused(sock, "is the socket (%s)" % sock)
    refused(os.path.join(tmp, "sub", "..", "c.sock"), "is the socket (%s)" % sock)
    # A socket left by a daemon killed (removed as stale first): the same.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(sock)
    s.close()
    p = subprocess.run([exe, "--foreground", "--config", "", "--backends", "cpu", "--socket",
                        sock, "--cache", sock], stderr=subprocess.PIPE, timeout=TIMEOUT)
    check(p.returncode == 2 and b"is the socket (%s)" % sock.encode() in p.stderr and
          not os.path.exists(sock), "a stale socket as the cache: %r" % p.stderr)
    # SQLite's files beside the cache.
    for side in ("-wal", "-shm", "-journal"):
        other = os.path.join(tmp, "x.db")
        s_path = other + side
        p = subprocess.run([exe, "--foreground", "--config", "", "--backends", "cpu",
                            "--socket", s_path, "--cache", other,
                            "--job-state", os.path.join(tmp, "c.jobs")],
                           stderr=subprocess.PIPE, timeout=TIMEOUT)
        err = p.stderr.decode()
        check(p.returncode == 2 and err.count("\n") == 1 and
              "its file %s (SQLite's, beside it) is the socket" % s_path in err,
              "%s is the socket: %r" % (side, err))
        check(not os.path.exists(other) and not os.path.exists(s_path),
              "%s: nothing made" % side)
        write(other + side, text)
        refused(other, "its file %s (SQLite's, beside it) is the configuration file"
                % (other + side), config=other + side)
        os.unlink(other + side)
    # The configuration file set by the file itself, and the default cache
    # ($CACHE_DIRECTORY/cache.db) that is the socket.
    write(conf, text + "[daemon]\ncache = %s\n" % conf)
    p = subprocess.run([exe, "--foreground", "--config", conf, "--backends", "cpu",
                        "--socket", sock, "--job-state", os.path.join(tmp, "c.jobs")],
                       stderr=subprocess.PIPE, timeout=TIMEOUT)
    check(p.returncode == 2 and b"%s: cache %s is the configuration file" %
          (conf.encode(), conf.encode()) in p.stderr, "the file's cache: %r" % p.stderr)
    check(open(conf).read().startswith(text), "the file kept")
    e = dict(os.environ, CACHE_DIRECTORY=tmp)
    p = subprocess.run([exe, "--foreground", "--config", "", "--backends", "cpu",
                        "--socket", os.path.join(tmp, "cache.db"),
                        "--job-state", os.path.join(tmp, "c.jobs")],
                       stderr=subprocess.PIPE, env=e, timeout=TIMEOUT)
    check(p.returncode == 2 and b"is the socket" in p.stderr, "default cache: %r" % p.stderr)
    check(not os.path.exists(os.path.join(tmp, "cache.db")), "default cache: nothing made")
    # dspkd --end-job checks the files a start with its arguments would use.
    p = subprocess.run([exe, "--config", "", "--socket", sock, "--cache", sock, "--end-job", "5"],
                       stderr=subprocess.PIPE, stdout=subprocess.PIPE, timeout=TIMEOUT)
    check(p.returncode == 2 and b"is the socket" in p.stderr and not os.path.exists(sock) and
          not os.path.exists(os.path.join(tmp, "c.jobs")), "--end-job: %r" % p.stderr)
    # Another running daemon's files (outside probe 15 E1): its state file
    # (it was taken for a corrupt cache, moved aside and replaced by a
    # database), its flocked PATH.lock (SQLite wrote a database into it)
    # and its cache's -wal (moved aside: the daemon's cache lost its
    # entries).  Refused at start and by --end-job, nothing changed.
    a_jobs, a_db = os.path.join(tmp, "a.jobs"), os.path.join(tmp, "a.db")
    write(conf, text)
    a = Daemon(exe, tmp, ["--job-state", a_jobs, "--cache", a_db])
    ac = a.client()
    # Its state file before the first job.register, which makes it.
    refused(a_jobs, "is the state file of another running dspkd")
    ac.call("job.register", {"job": 7, "uid": 1000})
    state = open(a_jobs, "rb").read()
    check(state.startswith(b"dspkd-jobs ") and os.path.exists(a_db + "-wal"),
          "a's files: %r %r" % (state, os.listdir(tmp)))
    refused(a_jobs, "is a dspkd state file")
    refused(a_jobs + ".lock", "another process holds an flock(2) on")
    refused(a_db + "-wal", "is a file SQLite keeps beside the database %s" % a_db)
    p = subprocess.run([exe, "--config", "", "--job-state", os.path.join(tmp, "e.jobs"),
                        "--cache", a_jobs, "--end-job", "5"],
                       stderr=subprocess.PIPE, stdout=subprocess.PIPE, timeout=TIMEOUT)
    check(p.returncode == 2 and b"is a dspkd state file" in p.stderr and
          not os.path.exists(os.path.join(tmp, "e.jobs")), "--end-job: %r" % p.stderr)
    check(open(a_jobs, "rb").read() == state and os.path.getsize(a_jobs + ".lock") == 0,
          "a's state and lock files unchanged")
    ac.call("job.register", {"job": 8, "uid": 1000})
    # A reload (outside probe 15 E2): a cache that the next start refuses
    # is refused, the running configuration kept, as a job_state is.
    rconf = os.path.join(tmp, "r.conf")
    write(rconf, "[daemon]\ncache = %s\n" % os.path.join(tmp, "r.db"))
    r = Daemon(exe, tmp, ["--config", rconf, "--job-state", os.path.join(tmp, "r.jobs")])
    rc = r.client()
    for cache, want in ((rconf, "is the configuration file (%s)" % rconf),
                        (r.sock, "is the socket (%s)" % r.sock),
                        (a_jobs, "is a dspkd state file"),
                        (a_jobs + ".lock", "holds an flock(2) on")):
        write(rconf, "[daemon]\ncache = %s\n" % cache)
        try:
            rc.call("daemon.reload")
            raise AssertionError("reload took cache = %s:\n%s" % (cache, r.logtext()))
        except RpcError as e:
            check(e.name == "EINVAL" and want in e.err.get("message", ""),
                  "cache = %s: %r" % (cache, e.err))
        log = r.logtext()
        check("error: reload: %s: cache %s" % (rconf, cache) in log and want in log and
              "keeping the running configuration" in log, "logged: %s" % log)
    check(open(a_jobs, "rb").read().startswith(b"dspkd-jobs ") and
          os.path.getsize(a_jobs + ".lock") == 0, "nothing changed by the refused reloads")
    write(rconf, "[daemon]\ncache = %s\n" % os.path.join(tmp, "r2.db"))
    check(rc.call("daemon.reload")["reloaded"], "another cache: reloaded")
    check("%s: cache changed; it takes effect at the next start" % rconf in r.logtext(),
          "said as a change: " + r.logtext())
    rc.close()
    r.proc.send_signal(signal.SIGTERM)
    check(r.wait() == 0, "r exits 0:\n" + r.logtext())
    ac.close()
    a.proc.send_signal(signal.SIGTERM)
    check(a.wait() == 0, "a exits 0:\n" + a.logtext())


def t_sockreplaced(exe, tmp):
    """A daemon's socket file removed while it runs and replaced (by another
    daemon's socket, or any file) is left in place at its stop: it removed
    whatever the path named, so the new daemon ran on unreachable."""
    path = os.path.join(tmp, "shared.sock")
    a = Daemon(exe, tmp, sock=path)
    os.unlink(path)
    # The path is free: b listens there (with a state file of its own: a running
    # daemon holds its state file's lock, and a second one on it does not start).
    b = Daemon(exe, tmp, ["--job-state", os.path.join(tmp, "b.jobs")], sock=path)
    a.proc.send_signal(signal.SIGTERM)
    check(a.wait() == 0, "a exits 0:\n" + a.logtext())
    check(os.path.exists(path), "b's socket is still there after a's stop")
    c = b.client()
    check(c.call("ping", {"data": b"b"})["data"] == b"b", "b is reachable")
    c.close()
    check("is no longer this daemon's socket: left in place" in a.logtext(),
          "a says why:\n" + a.logtext())
    b.proc.send_signal(signal.SIGTERM)
    check(b.wait() == 0 and not os.path.exists(path), "b removes its own socket")
    # A regular file put there is left too.
    a = Daemon(exe, tmp, sock=path)
    os.unlink(path)
    with open(path, "w") as f:
        f.write("not a socket")
    a.proc.send_signal(signal.SIGTERM)
    check(a.wait() == 0, "a exits 0")
    with open(path) as f:
        check(f.read() == "not a socket", "the file is left as it was")
    os.unlink(path)


def t_sigterm(exe, tmp):
    """SIGTERM with tasks running and queued: the running task is canceled at the
    grace deadline, queued ones fail with ESHUTDOWN, everyone gets every answer
    before EOF, exit 0, socket removed, one thread left."""
    d = Daemon(exe, tmp, ["--shutdown-timeout", "300"])
    a, b, idle = d.client(), d.client(), d.client()
    idle.call("ping", {"data": b"i"})
    t1 = long_task(a)
    queued_a = [small_task(a) for _ in range(5)]
    wait_running(b, owner=a, task=t1)
    queued_b = [small_task(b) for _ in range(3)]
    b.call("ping", {"data": b"b"})  # b's tasks are queued behind t1 now
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    outs = [b.outcome(m) for m in queued_b] + [a.outcome(m) for m in queued_a]
    check(outs == ["ESHUTDOWN"] * 8, "queued tasks fail with ESHUTDOWN: %r" % outs)
    o1 = a.outcome(t1)
    check(o1 == "ECANCELED", "the running task is canceled at the deadline: %s" % o1)
    check(time.monotonic() - t0 < 10, "stopped near the 300 ms deadline")
    for c in (a, b, idle):
        c.expect_eof()
    check(d.wait() == 0, "exit 0:\n" + d.logtext())
    check(not os.path.exists(d.sock), "socket removed")
    d.check_clean_exit()
    log = d.logtext()
    check("1 task still running at the stop deadline: canceling it" in log,
          "logged the deadline and the running task:\n" + log)
    # No task, only answers the client does not read: the deadline says so
    # (it said "tasks still running" then too), and the connection is closed.
    d3 = Daemon(exe, tmp, ["--shutdown-timeout", "300"])
    s = socket.socket(socket.AF_UNIX)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(d3.sock)
    s.settimeout(2)
    frame = msgpack.packb([0, 0, "ping", [{"data": b"x" * (1 << 20)}]], use_bin_type=True)
    try:
        for _ in range(1000):  # until the daemon stops reading (max_unsent)
            s.sendall(frame)
        raise AssertionError("the daemon read 1 GiB of pings nobody reads the answers of")
    except socket.timeout:
        pass
    d3.proc.send_signal(signal.SIGTERM)
    check(d3.wait() == 0, "exit 0:\n" + d3.logtext())
    s.close()
    log = d3.logtext()
    check("still running at the stop deadline" not in log and
          "no task running at the stop deadline; 1 connection still open" in log and
          "connections still open 2000 ms after the deadline: closing them" in log,
          "no task is said to run:\n" + log)
    # A request only partly read when the stop begins gets no answer and no
    # protocol.error notice: the connection ends after the answers owed
    # (docs/protocol.md, "When a connection closes, and when the daemon
    # stops"; probe 19 E, an observation).
    d4 = Daemon(exe, tmp, ["--shutdown-timeout", "300"])
    s = socket.socket(socket.AF_UNIX)
    s.connect(d4.sock)
    s.settimeout(TIMEOUT)
    whole = msgpack.packb([0, 1, "ping", [{"data": b"a"}]], use_bin_type=True)
    part = msgpack.packb([0, 2, "ping", [{"data": b"b" * 4096}]], use_bin_type=True)
    s.sendall(whole + part[:len(part) // 2])
    u = msgpack.Unpacker(raw=False)
    got = []
    while not got:
        data = s.recv(65536)
        check(data, "the answer to the whole ping came before the end")
        u.feed(data)
        got = list(u)
    check(len(got) == 1 and got[0][:3] == [1, 1, None], "the whole ping answered: %r" % got)
    d4.proc.send_signal(signal.SIGTERM)
    while True:
        data = s.recv(65536)
        if not data:
            break
        u.feed(data)
        got += list(u)
    check(len(got) == 1, "nothing for the partly read request, then the end: %r" % got[1:])
    s.close()
    check(d4.wait() == 0, "exit 0:\n" + d4.logtext())
    # The message of ESHUTDOWN is clear.
    d2 = Daemon(exe, tmp, ["--shutdown-timeout", "300"])
    c = d2.client()
    t = long_task(c)
    q = small_task(c)
    wait_running(d2.client(), owner=c, task=t)
    d2.proc.send_signal(signal.SIGTERM)
    try:
        c.wait(q)
        raise AssertionError("queued task answered ok")
    except RpcError as e:
        check(e.name == "ESHUTDOWN" and "stopping" in e.err["message"],
              "clear shutting-down message: %r" % e.err)
    check(c.outcome(t) == "ECANCELED", "canceled")
    check(d2.wait() == 0, "exit 0")


def vk_long_fir(c):
    """Queues on vulkan:0 a c64 fir of 2^21 taps over 2^23 samples: one of its
    overlap-save blocks (2^24 complex values, 128 MiB) and the filter's row pass
    lavapipe's maxStorageBufferRange, so the direct kernel runs it, about 2e13
    multiply-adds (hours on lavapipe); returns its msgid."""
    n, k = 1 << 23, 1 << 21
    x = c.call("buffer.create", {"size": n * 8, "device": "vulkan:0"})["buffer"]
    h = c.call("buffer.create", {"size": k * 8, "device": "vulkan:0"})["buffer"]
    y = c.call("buffer.create", {"size": n * 8, "device": "vulkan:0"})["buffer"]
    return c.send("task.run", {"op": "fir", "device": "vulkan:0",
                               "inputs": [{"buffer": x, "dtype": "c64", "shape": [n]},
                                          {"buffer": h, "dtype": "c64", "shape": [k]}],
                               "outputs": [{"buffer": y}]})


def t_vkcancel(exe, tmp):
    """Long device work on vulkan:0 ends when canceled (probe 15, B 2: a fir whose
    direct kernel went to the device whole ran on for 15 minutes after its client
    left, and no SIGTERM could stop the daemon): the fir's direct kernel sees a
    cancel between its pieces, so its client's leaving frees the device, and
    SIGTERM at the stop deadline answers it ECANCELED and the daemon exits 0."""
    d = Daemon(exe, tmp, ["--shutdown-timeout", "300"], backends="cpu,vulkan")
    probe = d.client()
    if not [x for x in probe.call("status")["devices"] if x["id"] == "vulkan:0"]:
        d.stop()
        print("SKIP: no vulkan:0 device")
        sys.exit(77)
    a = d.client()
    t = vk_long_fir(a)
    wait_running(probe, dev="vulkan:0", owner=a, task=t)
    a.close()
    deadline = time.monotonic() + TIMEOUT
    while True:
        st = [x for x in probe.call("status")["devices"] if x["id"] == "vulkan:0"][0]
        if st["running"] == 0:
            break
        check(time.monotonic() < deadline,
              "the fir of a client that left still runs on vulkan:0: %r" % st)
    b = d.client()
    t = vk_long_fir(b)
    wait_running(probe, dev="vulkan:0", owner=b, task=t)
    d.proc.send_signal(signal.SIGTERM)
    o = b.outcome(t)
    check(o == "ECANCELED", "the running fir is canceled at the stop deadline: %s" % o)
    for c in (b, probe):
        c.expect_eof()
    check(d.wait() == 0, "exit 0:\n" + d.logtext())
    d.check_clean_exit()


def t_fast(exe, tmp):
    """A second SIGTERM during the grace period cancels the running task now;
    the stop still goes in order."""
    d = Daemon(exe, tmp, ["--shutdown-timeout", "120000"])
    a = d.client()
    t1 = long_task(a)
    q = small_task(a)
    wait_running(d.client(), owner=a, task=t1)
    d.proc.send_signal(signal.SIGTERM)
    check(a.outcome(q) == "ESHUTDOWN", "queued task failed: the stop began")
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    check(a.outcome(t1) == "ECANCELED", "second SIGTERM cancels the running task")
    a.expect_eof()
    check(d.wait() == 0, "exit 0:\n" + d.logtext())
    check(time.monotonic() - t0 < 10, "fast stop, not the 120 s grace")
    check(not os.path.exists(d.sock), "socket removed")
    d.check_clean_exit()
    check("second SIGTERM" in d.logtext(), "logged the fast stop")
    # SIGINT behaves like SIGTERM.
    d = Daemon(exe, tmp)
    d.proc.send_signal(signal.SIGINT)
    check(d.wait() == 0, "SIGINT: exit 0")
    d.check_clean_exit()
    # SIGPIPE is ignored: a client that vanishes with answers pending.
    d = Daemon(exe, tmp)
    c = d.client()
    for _ in range(50):
        c.send("ping", {"data": b"p" * 100000})
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    c = d.client()
    check(c.call("ping", {"data": b"alive"})["data"] == b"alive", "alive after EPIPE")
    c.close()
    # Signals dspkd has no use for are ignored (they used to end it by their
    # default action, devices open and the socket left behind).
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGVTALRM,
                signal.SIGIO, signal.SIGPWR, signal.SIGXFSZ):
        d.proc.send_signal(sig)
    c = d.client()
    check(c.call("ping", {"data": b"still"})["data"] == b"still",
          "alive after SIGUSR1 and the like")
    check(d.proc.poll() is None, "still running")
    c.close()
    d.stop()
    # A SIGHUP that comes while the daemon starts is acted on once it can be
    # (a reload), not by the default action: here it is pending from before
    # the exec (blocked in the child, which keeps it pending across exec).
    def pending_hup():
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGHUP])
        os.kill(os.getpid(), signal.SIGHUP)
    d = Daemon(exe, tmp, preexec_fn=pending_hup)
    c = d.client()
    check(c.call("ping", {"data": b"up"})["data"] == b"up", "serving after an early SIGHUP")
    t0 = time.monotonic()
    while "SIGHUP: reloading the configuration" not in d.logtext():
        check(time.monotonic() - t0 < TIMEOUT, "the early SIGHUP reloads:\n" + d.logtext())
        c.call("ping")
    c.close()
    d.stop()


def t_orphan(exe, tmp):
    """A task that outlives its client (probe 22 F3; a raw kernel runs to its
    end): status shows its running_op with its connection's id and closed:
    true, and at a stop the log says that a task of a closed connection still
    runs past the deadline, not "connections still open" when none is.  The
    test hook DSPKD_TEST_CANCEL_WAIT=before:FILE holds the runner, before the
    task runs, until the task's cancel (its client's leaving) and then until
    FILE exists, as a task that does not look at its cancel flag would."""
    go = os.path.join(tmp, "orphan-go")
    env = dict(os.environ, DSPKD_TEST_CANCEL_WAIT="before:" + go)
    d = Daemon(exe, tmp, ["--shutdown-timeout", "300"], env=env)
    a, probe = d.client(), d.client()
    a.call("ping")
    aid = [x["id"] for x in probe.call("status")["clients"] if not x["self"]][0]
    long_task(a, big=False)  # a runner's task (a small one runs on the loop)
    wait_log(d, "the runner waits for the task's cancel before it runs", "the task reached the hook")
    st = [x for x in probe.call("status")["devices"] if x["id"] == "cpu:0"][0]
    check(st["running_op"] is not None and st["running_op"].get("client") == aid and
          "closed" not in st["running_op"], "running, its client there: %r" % st)
    a.close()
    wait_log(d, "it waits for the file " + go, "the task's cancel came with its client's leaving")
    st = [x for x in probe.call("status")["devices"] if x["id"] == "cpu:0"][0]
    check(st["running_op"] is not None and st["running_op"].get("client") == aid and
          st["running_op"].get("closed") is True,
          "running, its client gone: closed: true %r" % st)
    probe.close()
    d.proc.send_signal(signal.SIGTERM)
    want = "1 task of closed connections still running 2000 ms after the deadline"
    wait_log(d, want, "the stop says the task of a closed connection runs on")
    with open(go, "w"):
        pass
    check(d.wait() == 0, "exit 0 once the task ended:\n" + d.logtext())
    log = d.logtext()
    check("connections still open" not in log, "no connection is said open:\n" + log)
    os.unlink(go)


def wait_log(d, text, what):
    deadline = time.monotonic() + TIMEOUT
    while text not in d.logtext():
        check(d.proc.poll() is None, "%s: dspkd ended (status %s):\n%s"
              % (what, d.proc.returncode, d.logtext()))
        check(time.monotonic() < deadline, "%s:\n%s" % (what, d.logtext()))
        time.sleep(0.005)


def t_earlysig(exe, tmp):
    """A stop or reload signal while dspkd starts (docs: dspkd(8) SIGNALS):
    waits until it can be acted on, never the default action, also when a
    thread that does not block it exists before main (a library's: the test
    hook DSPKD_TEST_START_PAUSE starts one, pauses the start at a point and
    waits until the signal was taken).  Each point, each signal."""
    for point in ("early", "config"):
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            d = Daemon(exe, tmp, env={"DSPKD_TEST_START_PAUSE": point}, ready=False)
            wait_log(d, "test: start paused at %s" % point, "paused at " + point)
            d.proc.send_signal(sig)
            what = "%s at %s" % (signal.Signals(sig).name, point)
            if sig == signal.SIGHUP:
                wait_log(d, "SIGHUP: reloading the configuration", what + " reloads")
                c = d.client()
                check(c.call("ping", {"data": b"up"})["data"] == b"up", what + ": serving")
                c.close()
                d.stop()
            else:
                rc = d.wait()
                check(rc == 0, "%s: exit status %d, want 0:\n%s" % (what, rc, d.logtext()))
                d.check_clean_exit()
                check(not os.path.exists(d.sock), what + ": no socket left")
                # Logged as a later one is: the journal says why it stopped.
                check("info: received %s\n" % signal.Signals(sig).name in d.logtext(),
                      what + ": the stop's cause logged:\n" + d.logtext())
            check("test: start resumes at %s (1 signals recorded)" % point in d.logtext(),
                  what + ": the signal was recorded:\n" + d.logtext())


def ignored_signals():
    """What dspkd(8) SIGNALS lists as ignored, read from the page (so that the
    list and the daemon agree): (signal numbers, the page's line)."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    with open(os.path.join(src, "man", "dspkd.8.scd")) as f:
        page = f.read()
    entry = re.search(r"\n(\*SIG[^\n]*)\n\tIgnored", page)
    check(entry, "dspkd(8) SIGNALS has an Ignored entry")
    nums = []
    for name in re.findall(r"\*(SIG[A-Z0-9+]+)\*", entry.group(1)):
        if name == "SIGRTMIN":
            nums += range(signal.SIGRTMIN, signal.SIGRTMAX + 1)
        elif name != "SIGRTMAX":
            nums.append(getattr(signal, name))
    return nums, entry.group(1)


def t_ignored(exe, tmp):
    """Every signal dspkd(8) SIGNALS lists as ignored is ignored (SigIgn in
    /proc), and one of each sent leaves the daemon serving; no signal whose
    default action ends or stops a process is left out of the page's lists
    but SIGQUIT, SIGKILL, SIGSTOP and the faults it names."""
    nums, line = ignored_signals()
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    with open(os.path.join(src, "man", "dspkd.8.scd")) as f:
        page = f.read()
    named = set(re.findall(r"\*(SIG[A-Z0-9+]+)\*", page.split("# SIGNALS", 1)[1]
                           .split("\n# ", 1)[0]))
    unnamed = [s.name for s in signal.Signals if s.name not in named]
    check(not unnamed, "dspkd(8) SIGNALS says nothing of %r" % unnamed)
    for name in ("SIGPROF", "SIGSTKFLT", "SIGSYS", "SIGTRAP", "SIGTSTP", "SIGTTIN",
                 "SIGTTOU", "SIGRTMIN", "SIGRTMAX"):
        check(name in line, "%s listed as ignored: %s" % (name, line))
    d = Daemon(exe, tmp)
    with open("/proc/%d/status" % d.proc.pid) as f:
        ign = int(re.search(r"^SigIgn:\s*([0-9a-f]+)$", f.read(), re.M).group(1), 16)
    missing = [signal.Signals(n).name if n < signal.SIGRTMIN else "SIGRTMIN+%d"
               % (n - signal.SIGRTMIN) for n in nums if not ign >> (n - 1) & 1]
    check(not missing, "listed as ignored but not: %r" % missing)
    for n in nums:
        d.proc.send_signal(n)
    c = d.client()
    check(c.call("ping", {"data": b"up"})["data"] == b"up", "serving after the signals")
    c.close()
    d.stop()
    # The signals the page says keep their default action have it also when
    # dspkd inherits them ignored (a script's "dspkd &" ignores SIGQUIT and
    # SIGINT): an inherited SIG_IGN of SIGQUIT was kept, and kill -QUIT did
    # nothing.  SIGQUIT then ends it at once (no core file: RLIMIT_CORE 0).
    import resource
    kept = (signal.SIGQUIT, signal.SIGXCPU, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
            signal.SIGILL, signal.SIGABRT, signal.SIGCHLD, signal.SIGCONT, signal.SIGURG,
            signal.SIGWINCH)
    for s in kept:
        check("*%s*" % s.name in page.split("# SIGNALS", 1)[1].split("\n# ", 1)[0],
              "dspkd(8) SIGNALS names %s" % s.name)

    def inherit_ignored():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        for s in kept + (signal.SIGINT,):
            signal.signal(s, signal.SIG_IGN)

    d = Daemon(exe, tmp, preexec_fn=inherit_ignored)
    with open("/proc/%d/status" % d.proc.pid) as f:
        ign = int(re.search(r"^SigIgn:\s*([0-9a-f]+)$", f.read(), re.M).group(1), 16)
    still = [s.name for s in kept + (signal.SIGINT,) if ign >> (s - 1) & 1]
    check(not still, "inherited ignored, still ignored: %r" % still)
    d.proc.send_signal(signal.SIGQUIT)
    rc = d.wait()
    check(rc == -signal.SIGQUIT, "SIGQUIT ends dspkd by its default action: %r\n%s"
          % (rc, d.logtext()))
    check(os.path.exists(d.sock), "the socket file stays after SIGQUIT")


def t_stopmetrics(exe, tmp):
    """GET /metrics answers 503 while the daemon stops (docs/protocol.md,
    "metrics"): during the grace period, a task held running by the test
    hook DSPKD_TEST_CANCEL_WAIT until it is canceled."""
    import urllib.error
    import urllib.request
    d = Daemon(exe, tmp, ["--shutdown-timeout", "300000", "--metrics-listen", "127.0.0.1:0"],
               env={"DSPKD_TEST_CANCEL_WAIT": "before"})
    url = re.search(r"metrics: serving (http://\S+/metrics)", d.logtext()).group(1)

    def get():
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
    st, body = get()
    check(st == 200 and "dspk_" in body, "metrics served: %d %r" % (st, body[:200]))
    a = d.client()
    x = {"dtype": "c64", "shape": [64], "data": bytes(64 * 8)}
    hook = "waits for the task's cancel before it runs"
    t = a.send("task.run", {"op": "fft", "device": "cpu:0", "inputs": [x]})
    wait_log(d, hook, "the fft reached the hook")
    q = a.send("task.run", {"op": "fft", "device": "cpu:0", "inputs": [x]})
    check(a.call("ping", {"data": b"q"})["data"] == b"q", "queued behind the held task")
    d.proc.send_signal(signal.SIGTERM)
    check(a.outcome(q) == "ESHUTDOWN", "queued task failed: the stop began")
    st, body = get()
    check(st == 503 and "stopping" in body, "503 during the stop: %d %r" % (st, body[:200]))
    d.proc.send_signal(signal.SIGTERM)
    check(a.outcome(t) == "ECANCELED", "the held task is canceled")
    a.expect_eof()
    check(d.wait() == 0, "exit 0:\n" + d.logtext())


def t_stopcut(exe, tmp):
    """A task.run whose work does not stop within 2 s of the stop deadline's
    cancel is answered ECANCELED "the daemon is stopping: the task was
    canceled", in task.cancel's words for a task.run (probe 20 F3: it said
    "the request was canceled", the words of the other methods).  The test
    hook DSPKD_TEST_CANCEL_WAIT=after:FILE holds the runner past the cancel
    until FILE exists, made once the answer came."""
    release = os.path.join(tmp, "release")
    d = Daemon(exe, tmp, ["--shutdown-timeout", "0"],
               env={"DSPKD_TEST_CANCEL_WAIT": "after:" + release})
    a = d.client()
    x = {"dtype": "c64", "shape": [64], "data": bytes(64 * 8)}
    t = a.send("task.run", {"op": "fft", "device": "cpu:0", "inputs": [x]})
    wait_log(d, "waits for the task's cancel after it runs", "the fft reached the hook")
    d.proc.send_signal(signal.SIGTERM)
    try:
        a.wait(t)
        raise AssertionError("the held task answered its result")
    except RpcError as e:
        check(e.name == "ECANCELED" and
              e.err["message"] == "the daemon is stopping: the task was canceled",
              "the task cut at the stop: %s %r" % (e.name, e.err))
    a.expect_eof()
    open(release, "w").close()
    check(d.wait() == 0, "exit 0:\n" + d.logtext())


def t_fdlimit(exe, tmp):
    """A connection the daemon cannot take for want of file descriptors
    (RLIMIT_NOFILE) gets a protocol.error ELIMIT notification, then EOF
    (it used to be closed in silence), and the log says so once (a
    warning at most once a minute, however many are refused); once
    descriptors are free again, clients are served."""
    import resource

    def low_nofile():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    d = Daemon(exe, tmp, ["--max-user-clients", "1000"], preexec_fn=low_nofile)
    socks = []
    for _ in range(100):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(TIMEOUT)
        s.connect(d.sock)
        socks.append(s)
    served = refused = 0
    for i, s in enumerate(socks):
        try:
            s.sendall(msgpack.packb([0, 1, "ping", [{"data": b"x"}]], use_bin_type=True))
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused already: its notice is still to be read
        up = msgpack.Unpacker(raw=False)
        got = None
        while got is None:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                got = "EOF"
                break
            up.feed(data)
            for m in up:
                got = m
                break
        if got != "EOF" and got[0] == 1:
            check(got[2] is None and got[3] == {"data": b"x"}, "ping answered: %r" % (got,))
            served += 1
            continue
        check(got != "EOF" and got[0] == 2 and got[1] == "protocol.error"
              and got[2][0]["name"] == "ELIMIT"
              and "file descriptor" in got[2][0]["message"],
              "connection %d: refused with protocol.error ELIMIT, not in silence: %r"
              % (i, got))
        rest = b""
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                rest += data
        except ConnectionResetError:
            pass
        check(rest == b"", "nothing after the notice but EOF: %r" % rest)
        refused += 1
    check(served >= 1 and refused >= 1, "served %d, refused %d" % (served, refused))
    log = d.logtext()
    lines = re.findall(r"warn: accept: Too many open files \(RLIMIT_NOFILE 64\): a connection "
                       r"was refused with protocol.error ELIMIT", log)
    check(len(lines) == 1, "one warning for %d refusals (at most once a minute):\n%s"
          % (refused, log))
    for s in socks:
        s.close()
    # Descriptors free again: served (the connections just closed may still
    # be counted for a moment: a few tries, each waiting on an answer).
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            c = d.client()
            check(c.call("ping", {"data": b"again"})["data"] == b"again", "served again")
            c.close()
            break
        except (RpcError, ConnectionError, EOFError, OSError, AssertionError):
            check(time.monotonic() < deadline, "served again once descriptors are free")
            time.sleep(0.05)
    d.stop()


def write(path, text):
    with open(path, "w", errors="surrogateescape") as f:
        f.write(text)


def t_reload(exe, tmp):
    conf = os.path.join(tmp, "reload.conf")
    write(conf, "[limits]\nmax_inflight = 100\nmax_buffers = 10\n")
    d = Daemon(exe, tmp, ["--config", conf, "--max-buffers", "7"], notify=True)
    n = d.notify
    n.until(lambda m: m.get("READY") == "1", "READY=1")
    c = d.client()
    lim = c.call("hello", {"version": 1, "client": "reload"})["limits"]
    check(lim["max_inflight"] == 100, "file applied: %r" % lim)
    check(lim["max_buffers"] == 7, "flag wins over file: %r" % lim)
    # A valid new file: taken, the client stays connected.
    write(conf, "[limits]\nmax_inflight = 50\nmax_buffers = 9\nmax_clients = 3\n"
          "[daemon]\nlog_level = debug\nshutdown_timeout = 2s\n")
    d.proc.send_signal(signal.SIGHUP)
    n.until(lambda m: m.get("RELOADING") == "1" and "MONOTONIC_USEC" in m, "RELOADING=1")
    done = n.until(lambda m: m.get("READY") == "1", "READY=1 after the reload")
    check(done.get("STATUS", "").startswith("configuration reloaded: "),
          "reload succeeded: %r" % done)
    lim = c.call("status")["daemon"]["limits"]
    check(lim["max_inflight"] == 50 and lim["max_clients"] == 3, "reloaded: %r" % lim)
    check(lim["max_buffers"] == 7, "the flag still wins: %r" % lim)
    # An invalid file: the running configuration stays, the log says why.
    write(conf, "[limits]\nmax_inflight = 20\nmax_clients = lots\n")
    d.proc.send_signal(signal.SIGHUP)
    n.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
    done = n.until(lambda m: m.get("READY") == "1", "READY=1 after the failed reload")
    check("failed" in done.get("STATUS", ""), "STATUS says the reload failed: %r" % done)
    lim = c.call("status")["daemon"]["limits"]
    check(lim["max_inflight"] == 50 and lim["max_clients"] == 3, "kept: %r" % lim)
    log = d.logtext()
    check("%s:3: max_clients" % conf in log and "keeping the running configuration" in log,
          "logged file:line and why:\n" + log)
    # A valid file that group or others could write: a reload refuses it as
    # the start does (outside probe 16 E1), the running configuration stays.
    write(conf, "[limits]\nmax_inflight = 20\n")
    os.chmod(conf, 0o646)
    d.proc.send_signal(signal.SIGHUP)
    n.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
    done = n.until(lambda m: m.get("READY") == "1", "READY=1 after the refused reload")
    check("failed" in done.get("STATUS", ""), "STATUS says the reload failed: %r" % done)
    lim = c.call("status")["daemon"]["limits"]
    check(lim["max_inflight"] == 50, "kept: %r" % lim)
    check("%s: refusing the configuration file: it is writable by group or others (mode 0646)"
          % conf in d.logtext(), "logged:\n" + d.logtext())
    # daemon.reload answers a refused file EINVAL, as an invalid one (the start's
    # exit status 2): no read failed (it was EIO, "a read error": probe 17, E 4).
    for mode in (0o646, 0o666):
        os.chmod(conf, mode)
        try:
            c.call("daemon.reload")
            check(False, "mode %o: the reload refused" % mode)
        except RpcError as e:
            check(e.name == "EINVAL" and e.err.get("message", "").startswith(
                "%s: refusing the configuration file: it is writable by group or others "
                "(mode 0%o)" % (conf, mode)), "mode %o: EINVAL: %s" % (mode, e))
        n.until(lambda m: m.get("READY") == "1", "READY=1 after daemon.reload")
    os.chmod(conf, 0o644)
    # The file replaced by a directory (it was read as an empty file: every
    # setting back to its default, "configuration reloaded"): refused too.
    os.rename(conf, conf + ".bak")
    os.mkdir(conf)
    d.proc.send_signal(signal.SIGHUP)
    n.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
    done = n.until(lambda m: m.get("READY") == "1", "READY=1 after the reload of a directory")
    check("failed" in done.get("STATUS", ""), "STATUS says the reload failed: %r" % done)
    lim = c.call("status")["daemon"]["limits"]
    check(lim["max_inflight"] == 50 and lim["max_clients"] == 3, "kept: %r" % lim)
    log = d.logtext()
    check("error: reload: %s: cannot read: Is a directory; keeping the running "
          "configuration" % conf in log, "logged at error:\n" + log)
    os.rmdir(conf)
    os.rename(conf + ".bak", conf)
    # Keys that need a restart are reported, not applied.  This reload
    # succeeds: its STATUS= replaces what the refused one said (it used to
    # send READY=1 alone, and systemctl status kept saying the reload failed).
    write(conf, "[daemon]\ncache = /nonexistent/other.db\n")
    d.proc.send_signal(signal.SIGHUP)
    n.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
    done = n.until(lambda m: m.get("READY") == "1", "READY=1")
    check(re.match(r"configuration reloaded: \d+ devices?, 1 client, 0 tasks running, 0 queued$",
                   done.get("STATUS", "")),
          "a good reload after a refused one says what holds now: %r" % done)
    # The same through daemon.reload: a refused file, then a good one.
    write(conf, "[limits]\nmax_clients = lots\n")
    check(c.call("ping", {"data": b"x"})["data"] == b"x", "alive")
    try:
        c.call("daemon.reload")
        raise AssertionError("an invalid file was taken")
    except RpcError as e:
        check(e.name == "EINVAL", "refused: %r" % e.err)
    n.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1 (daemon.reload)")
    done = n.until(lambda m: m.get("READY") == "1", "READY=1 (daemon.reload)")
    check("failed" in done.get("STATUS", ""), "STATUS says the reload failed: %r" % done)
    # cache with no_cache = yes is refused at a reload as at a start, naming
    # file:line, and the running configuration stays (it was taken in silence).
    before = c.call("status")["daemon"]["limits"]
    write(conf, "[limits]\nmax_clients = 4\n[daemon]\ncache = /nonexistent/other.db\n"
          "no_cache = yes\n")
    try:
        c.call("daemon.reload")
        raise AssertionError("cache with no_cache = yes was taken")
    except RpcError as e:
        check(e.name == "EINVAL" and "%s:5: no_cache = yes and cache (line 4) both given" % conf
              in e.err.get("message", ""), "refused: %r" % e.err)
    n.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1 (cache and no_cache)")
    done = n.until(lambda m: m.get("READY") == "1", "READY=1 (cache and no_cache)")
    check("failed" in done.get("STATUS", ""), "STATUS says the reload failed: %r" % done)
    check(c.call("status")["daemon"]["limits"] == before and before["max_clients"] != 4,
          "the running limits kept: %r" % before)
    write(conf, "[daemon]\ncache = /nonexistent/other.db\n")
    check(c.call("daemon.reload") == {"reloaded": True}, "daemon.reload")
    n.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1 (daemon.reload)")
    done = n.until(lambda m: m.get("READY") == "1", "READY=1 (daemon.reload)")
    check(re.match(r"configuration reloaded: \d+ devices?, 1 client, 0 tasks running, 0 queued$",
                   done.get("STATUS", "")), "daemon.reload's STATUS=: %r" % done)
    check("takes effect at the next start" in d.logtext(), "restart-only key reported")
    # So is a restart-only number (it was silently ignored): device_inflight
    # stays what the devices were started with.
    write(conf, "[daemon]\ndevice_inflight = 9\ncache_max_bytes = 1M\n")
    d.proc.send_signal(signal.SIGHUP)
    n.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
    n.until(lambda m: m.get("READY") == "1", "READY=1")
    log = d.logtext()
    for key in ("device_inflight", "cache_max_bytes"):
        check("%s: %s changed; it takes effect at the next start" % (conf, key) in log,
              "restart-only %s reported:\n%s" % (key, log))
    check("log_level changed" not in log and "max_clients changed" not in log,
          "reloadable keys are applied, not reported:\n" + log)
    check(c.call("status")["daemon"]["limits"]["max_clients"] == 256, "back to the default")
    check(c.call("ping", {"data": b"still"})["data"] == b"still", "client kept")
    c.close()
    d.stop()

    # A reload that changes max_clients checks the descriptors it needs, as
    # the start does (docs/admin.md, "File descriptors"): a warning when the
    # hard limit cannot hold them, the info line when it can.
    import resource
    write(conf, "[limits]\nmax_clients = 78\n")
    d = Daemon(exe, tmp, ["--config", conf],
               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)))
    c = d.client()
    warn = re.compile(r"warn: file descriptors: RLIMIT_NOFILE 1024 \(hard limit 1024\) is below "
                      r"the (\d+) that max_clients (\d+) connections may need")
    check(not warn.search(d.logtext()), "78 fit in 1024:\n" + d.logtext())
    check("needed at most for max_clients 78, " in d.logtext(), "the start's line")
    write(conf, "[limits]\nmax_clients = 5000\n")
    check(c.call("daemon.reload") == {"reloaded": True}, "reloaded to 5000")
    m = warn.search(d.logtext())
    check(m and m.group(2) == "5000" and int(m.group(1)) > 1024,
          "the reload warns as the start does:\n" + d.logtext())
    mark = len(d.logtext())
    write(conf, "[limits]\nmax_clients = 50\n")
    check(c.call("daemon.reload") == {"reloaded": True}, "reloaded to 50")
    check("file descriptors: RLIMIT_NOFILE 1024 (soft limit was 1024; " in d.logtext()[mark:]
          and "needed at most for max_clients 50, " in d.logtext()[mark:],
          "and says when it fits again:\n" + d.logtext()[mark:])
    mark = len(d.logtext())
    write(conf, "[limits]\nmax_clients = 50\nmax_inflight = 9\n")
    check(c.call("daemon.reload") == {"reloaded": True}, "max_clients unchanged")
    check("file descriptors" not in d.logtext()[mark:], "no line when max_clients stays")
    c.close()
    d.stop()

    # Started below debug, raised to debug by a reload: the stop's thread
    # report still has the count from before the devices opened (it said -1).
    write(conf, "[daemon]\nlog_level = info\n")
    d = Daemon(exe, tmp, ["--config", conf], log_level=None)
    c = d.client()
    write(conf, "[daemon]\nlog_level = debug\n")
    check(c.call("daemon.reload") == {"reloaded": True}, "reloaded to debug")
    c.close()
    d.stop()
    m = re.search(r"threads at exit: (\d+) \(before the devices opened: (-?\d+)\)", d.logtext())
    check(m and int(m.group(2)) > 0, "a real count before the devices opened:\n" + d.logtext())

    # A reload that lowers the message limits leaves a connection open
    # before it with the limits its hello gave (it sized its frames by them);
    # hello there says so, status says the daemon's, a new connection gets
    # the new ones.
    write(conf, "[limits]\nmax_message = 1M\nmax_elements = 1000000\nmax_rank = 8\n")
    d = Daemon(exe, tmp, ["--config", conf])
    old = d.client()
    before = old.call("hello", {"client": "old"})["limits"]
    check(before["max_message"] == 1 << 20, "start: %r" % before)
    write(conf, "[limits]\nmax_message = 64K\nmax_elements = 1000\nmax_rank = 2\n"
          "max_objects = 100\n")
    check(old.call("daemon.reload") == {"reloaded": True}, "reloaded smaller limits")
    kept = old.call("hello", {"client": "old"})["limits"]
    for k in ("max_message", "max_depth", "max_objects", "max_rank", "max_elements"):
        check(kept[k] == before[k], "%s kept for the old connection: %r" % (k, kept))
    now = old.call("status")["daemon"]["limits"]
    check(now["max_message"] == 65536 and now["max_elements"] == 1000 and now["max_rank"] == 2
          and now["max_objects"] == 100, "status says the daemon's: %r" % now)
    big = b"x" * 200000
    check(old.call("ping", {"data": big})["data"] == big, "a 200 KB ping on the old connection")
    x = {"dtype": "f32", "shape": [2, 2, 2], "data": b"\0" * 32}
    got = old.call("task.run", {"op": "map", "device": "cpu:0", "inputs": [x],
                                "options": {"fn": "abs"}})
    check(got["outputs"][0]["shape"] == [2, 2, 2], "rank 3 on the old connection: %r" % got)
    new = d.client()
    check(new.call("hello", {})["limits"]["max_message"] == 65536, "new connection: new limits")
    try:
        new.call("task.run", {"op": "map", "device": "cpu:0", "inputs": [x],
                              "options": {"fn": "abs"}})
        check(False, "rank 3 on a new connection after max_rank 2")
    except Exception as e:
        check("max_rank" in str(e), "rank 3 refused on the new connection: %s" % e)
    new.close()
    old.close()
    d.stop()

    # Each refusal of daemon.reload, whatever its code, is the one line
    # "error: reload: ...; keeping the running configuration" (docs/admin.md),
    # the answer's message: the generic "client N: daemon.reload #ID: ECODE"
    # line repeated it, at err for EIO, at debug for the others (probe 19 E2).
    write(conf, "[limits]\nmax_clients = 10\n")
    d = Daemon(exe, tmp, ["--config", conf])
    c = d.client()

    def bad_syntax():
        write(conf, "[limits]\nmax_clients = lots\n")

    def unsafe():
        write(conf, "[limits]\nmax_clients = 5\n")
        os.chmod(conf, 0o666)

    def state_is_conf():
        write(conf, "[daemon]\njob_state = %s\n" % conf)

    def state_nodir():
        write(conf, "[daemon]\njob_state = %s\n" % os.path.join(tmp, "nodir", "x.jobs"))

    def missing():
        os.rename(conf, conf + ".away")

    def directory():
        os.rename(conf, conf + ".away")
        os.mkdir(conf)

    for code, setup, want in (
            ("EINVAL", bad_syntax, "%s:2: max_clients: expected" % conf),
            ("EINVAL", unsafe, "%s: refusing the configuration file" % conf),
            ("EINVAL", state_is_conf, "%s: job_state %s is the configuration file" % (conf, conf)),
            ("EINVAL", state_nodir, "its directory %s: No such file" % os.path.join(tmp, "nodir")),
            ("ENOENT", missing, "%s: cannot read: No such file or directory" % conf),
            ("EIO", directory, "%s: cannot read: Is a directory" % conf)):
        mark = len(d.logtext())
        setup()
        try:
            c.call("daemon.reload")
            check(False, "%s: the reload was taken" % setup.__name__)
        except RpcError as e:
            got = e.err.get("message", "")
            check(e.name == code and want in got, "%s: %s %r" % (setup.__name__, e.name, got))
        log = d.logtext()[mark:]
        lines = [ln for ln in log.splitlines() if "keeping the running configuration" in ln]
        check(len(lines) == 1 and re.match(r"dspkd\[\d+\]: error: reload: ", lines[0])
              and lines[0].endswith(got), "%s: one reload: line at error, the answer's "
              "message:\n%s" % (setup.__name__, log))
        check("daemon.reload #" not in log, "%s: no generic line:\n%s" % (setup.__name__, log))
        if os.path.isdir(conf):
            os.rmdir(conf)
        if os.path.exists(conf + ".away"):
            os.rename(conf + ".away", conf)
        write(conf, "[limits]\nmax_clients = 10\n")
        os.chmod(conf, 0o644)
    check(c.call("status")["daemon"]["limits"]["max_clients"] == 10, "the start's kept")
    c.close()
    d.stop()


# The keys only a restart changes (dspk.conf(5), docs/admin.md).
RESTART_ONLY = ("socket", "cache", "no_cache", "cache_max_bytes", "job_state", "backends",
                "raw_kernels", "foreground", "metrics_listen", "device_inflight")


def reload_and_wait(d, what):
    d.proc.send_signal(signal.SIGHUP)
    d.notify.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1 " + what)
    return d.notify.until(lambda m: m.get("READY") == "1", "READY=1 " + what)


def t_reloadkeys(exe, tmp):
    """A restart-only key is reported at a reload whenever its value (the
    file's, else its default) is not the one the daemon started with: changed,
    added or removed alike; never a key the command line set."""
    conf = os.path.join(tmp, "keys.conf")
    sock = os.path.join(tmp, "keys.sock")
    full = ("[daemon]\nsocket = %s\ncache = %s\nno_cache = no\ncache_max_bytes = 1M\n"
            "backends = cpu\nraw_kernels = none\nforeground = yes\n"
            "metrics_listen = 127.0.0.1:0\n"
            "device_inflight = 3\njob_state = %s\n"
            % (sock, os.path.join(tmp, "keys.db"), os.path.join(tmp, "keys.jobs")))
    write(conf, full)
    d = Daemon(exe, tmp, ["--config", conf], notify=True, sock=sock, backends=None,
               config=None, socket_flag=False)
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1")

    def changed_since(mark):
        return set(re.findall(r"%s: (\w+) changed; it takes effect at the next start"
                              % re.escape(conf), d.logtext()[mark:]))

    # Every key removed (foreground = yes stays, the others back to their
    # defaults): each one whose default is not its value at start is logged.
    mark = len(d.logtext())
    write(conf, "[daemon]\nforeground = yes\n")
    reload_and_wait(d, "(keys removed)")
    got = changed_since(mark)
    want = set(RESTART_ONLY) - {"no_cache", "foreground"}  # no: as at start; a flag
    check(got == want, "removed restart-only keys logged: %r, want %r\n%s"
          % (sorted(got), sorted(want), d.logtext()))
    # The start's values again: nothing to say.
    mark = len(d.logtext())
    write(conf, full)
    reload_and_wait(d, "(start's values)")
    check(changed_since(mark) == set(), "nothing changed: %r" % changed_since(mark))
    # Each one changed on its own (one reload each); foreground is not here:
    # the test's --foreground set it (the last check below).
    for key, value in (("socket", os.path.join(tmp, "other.sock")), ("cache", "/x/other.db"),
                       ("no_cache", "yes"), ("cache_max_bytes", "2M"), ("backends", "cpu,vulkan"),
                       ("raw_kernels", "vulkan:0"),
                       ("metrics_listen", "127.0.0.1:1"),
                       ("device_inflight", "5"),
                       ("job_state", os.path.join(tmp, "other.jobs"))):
        mark = len(d.logtext())
        text = re.sub(r"(?m)^%s = .*$" % key, "%s = %s" % (key, value), full)
        want = {key}
        if key == "no_cache":  # cache with no_cache = yes is refused: the cache goes,
            text = re.sub(r"(?m)^cache = .*\n", "", text)  # and both keys changed
            want = {"cache", "no_cache"}
        write(conf, text)
        reload_and_wait(d, "(%s changed)" % key)
        check(changed_since(mark) == want, "%s changed: logged %r" % (key, changed_since(mark)))
    # cache set to no file (":memory:"; the file refuses ""): the key changed
    # is cache, not no_cache, though the change is from a file to none (it
    # said no_cache).
    mark = len(d.logtext())
    write(conf, re.sub(r"(?m)^cache = .*$", "cache = :memory:", full))
    reload_and_wait(d, "(cache = :memory:)")
    check(changed_since(mark) == {"cache"}, "cache = :memory:: logged %r" % changed_since(mark))
    c = d.client()
    check(c.call("status")["daemon"]["socket"] == sock, "the socket stays")
    c.close()
    d.stop()
    # A key the command line set is not the file's to change.
    write(conf, "[daemon]\ndevice_inflight = 3\n")
    d = Daemon(exe, tmp, ["--config", conf, "--device-inflight", "2"], notify=True, config=None)
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1")
    mark = len(d.logtext())
    write(conf, "[daemon]\n")
    reload_and_wait(d, "(a flag's key removed)")
    check(changed_since(mark) == set(), "a flag's key: %r" % changed_since(mark))
    d.stop()
    # --no-cache and --cache decide both cache and no_cache: neither is the
    # file's, whichever of the two the file sets.
    for flags in (["--no-cache"], ["--cache", ""], ["--cache", os.path.join(tmp, "flag.db")]):
        write(conf, "[daemon]\n")
        d = Daemon(exe, tmp, ["--config", conf] + flags, notify=True, config=None)
        d.notify.until(lambda m: m.get("READY") == "1", "READY=1")
        for text in ("cache = %s\n" % os.path.join(tmp, "elsewhere.db"), "no_cache = yes\n",
                     "no_cache = no\ncache = %s\n" % os.path.join(tmp, "third.db")):
            mark = len(d.logtext())
            write(conf, "[daemon]\n" + text)
            reload_and_wait(d, "(%s, file %r)" % (flags, text))
            check(changed_since(mark) == set(), "%s, file %r: %r"
                  % (flags, text, changed_since(mark)))
        d.stop()
    # Started without a cache file: the key the file changed is the one
    # named, and a file that names no cache file in another way changes
    # nothing.
    for start, then, want in (("cache = :memory:\n", "", {"cache"}),
                              ("no_cache = yes\n", "", {"no_cache"}),
                              ("no_cache = yes\n", "cache = /x/a.db\n",
                               {"cache", "no_cache"}),
                              ("cache = :memory:\n", "no_cache = yes\n", set()),
                              ("no_cache = yes\n", "cache = :memory:\n", set())):
        write(conf, "[daemon]\n" + start)
        d = Daemon(exe, tmp, ["--config", conf], notify=True, config=None)
        d.notify.until(lambda m: m.get("READY") == "1", "READY=1")
        mark = len(d.logtext())
        write(conf, "[daemon]\n" + then)
        reload_and_wait(d, "(%r, then %r)" % (start, then))
        check(changed_since(mark) == want, "%r, then %r: logged %r, want %r"
              % (start, then, changed_since(mark), want))
        d.stop()
    # The comparison is by value: a file that sets socket, cache or job_state
    # to the very file the daemon runs on (their defaults at start: the
    # socket of $DSPK_SOCKET, the cache of $XDG_CACHE_HOME, the socket's
    # .jobs), or that removes one whose default is the value running,
    # changes nothing (the example file's "uncommenting changes nothing").
    esock = os.path.join(tmp, "env.sock")
    same = ("[daemon]\nsocket = %s\ncache = %s\njob_state = %s\n"
            % (esock, os.path.join(tmp, "dspk", "cache.db"), os.path.join(tmp, "env.jobs")))
    for start, then in (("[daemon]\n", same), (same, "[daemon]\n"),
                        ("[daemon]\n", same.replace(tmp + "/", tmp + "/./")),
                        ("[daemon]\nbackends = cpu,vulkan\nraw_kernels = cpu:0,vulkan:0\n",
                         "[daemon]\nbackends = vulkan,cpu\nraw_kernels = vulkan:0,cpu:0\n")):
        write(conf, start)
        d = Daemon(exe, tmp, ["--config", conf], notify=True, sock=esock, config=None,
                   socket_flag=False, env={"DSPK_SOCKET": esock},
                   backends=None if "backends" in start else "cpu")
        d.notify.until(lambda m: m.get("READY") == "1", "READY=1")
        mark = len(d.logtext())
        write(conf, then)
        reload_and_wait(d, "(the running values, %r)" % then)
        check(changed_since(mark) == set(), "the running values: %r\n%s"
              % (changed_since(mark), d.logtext()))
        d.stop()
    reload_nodefault(exe, tmp)


def reload_nodefault(exe, tmp):
    """A daemon with no default socket (not root, XDG_RUNTIME_DIR and
    DSPK_SOCKET unset) whose file drops socket: the reload is refused, as
    the next start refuses that file, and nothing is logged as changed
    (probe 20 E2: every restart-only key was "changed" and the file
    "reloaded"); the same daemon's other edits log only what changed."""
    env = {"XDG_RUNTIME_DIR": "", "DSPK_SOCKET": ""}
    pre = None
    run = os.path.join(tmp, "nodefault")
    os.mkdir(run, 0o700)
    if os.geteuid() == 0:  # the daemon as nobody: root always has a default socket
        os.chmod(tmp, 0o711)
        os.chown(run, 65534, 65534)

        def pre():
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
    conf = os.path.join(tmp, "nodefault.conf")
    sock = os.path.join(run, "s.sock")
    cache = "cache = %s\n" % os.path.join(run, "c.db")
    write(conf, "[daemon]\nsocket = %s\n%s" % (sock, cache))
    os.chmod(conf, 0o644)
    d = Daemon(exe, tmp, ["--config", conf], sock=sock, config=None, socket_flag=False,
               env=env, preexec_fn=pre)

    def reload(text):
        write(conf, text)
        os.chmod(conf, 0o644)
        mark = len(d.logtext())
        c = d.client()
        try:
            got = c.call("daemon.reload")
        except RpcError as e:
            got = e
        c.close()
        changed = set(re.findall(r"%s: (\w+) changed; it takes effect at the next start"
                                 % re.escape(conf), d.logtext()[mark:]))
        return got, changed, d.logtext()[mark:]

    got, changed, log = reload("[daemon]\n" + cache)
    check(isinstance(got, RpcError) and got.name == "EINVAL" and
          "the file sets no socket, and this daemon has no default one (XDG_RUNTIME_DIR is "
          "empty" in got.err.get("message", "") and "keeping the running configuration" in
          got.err.get("message", ""), "socket dropped: refused: %r" % (got,))
    check(changed == set() and "reloaded" not in log and
          re.search(r"error: reload: the file sets no socket", log),
          "socket dropped: one err line, nothing changed: %r\n%s" % (changed, log))
    got, changed, log = reload("[daemon]\nsocket = %s\n" % sock)
    check(got == {"reloaded": True} and changed == {"cache"},
          "cache dropped: only cache changed: %r %r" % (got, changed))
    got, changed, log = reload("[daemon]\nsocket = %s\n%s" % (os.path.join(run, "o.sock"),
                                                           cache))
    check(got == {"reloaded": True} and changed == {"socket", "job_state"},
          "socket moved: socket and job_state changed: %r %r" % (got, changed))
    d.stop()
    # The start refuses the file the reload refused.
    write(conf, "[daemon]\n" + cache)
    os.chmod(conf, 0o644)
    d = Daemon(exe, tmp, ["--config", conf], sock=sock, config=None, socket_flag=False,
               env=env, preexec_fn=pre, ready=False)
    check(d.wait() == 1 and "XDG_RUNTIME_DIR is empty: give the socket with --socket PATH"
          in d.logtext(), "the next start refuses it:\n" + d.logtext())


def t_reloaddefault(exe, tmp):
    """Without --config the default file is read when it exists: at a reload
    too, when it did not at start; daemon.reload answers reloaded: false when
    no file was read, and --config "" never reads one."""
    h = subprocess.run([exe, "--help"], stdout=subprocess.PIPE, timeout=TIMEOUT).stdout.decode()
    m = re.search(r"default\s+(/\S+/dspk/dspkd\.conf)\s+when it exists", h)
    check(m, "--help names the default file:\n" + h)
    default = m.group(1)
    etc = os.path.dirname(os.path.dirname(default))
    # The default's directory is replaced, in a mount namespace of the
    # daemon's own, by one of the test's, so that nothing on the host changes.
    mine = os.path.join(tmp, "etc")
    os.makedirs(os.path.join(mine, "dspk"))
    unshare = ["unshare", "-m", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare.insert(1, "-r")
    probe = subprocess.run(unshare + ["sh", "-c", 'mount --bind "$0" "$1"', mine, etc],
                           stderr=subprocess.PIPE, timeout=TIMEOUT)
    if probe.returncode != 0 or not os.path.isdir(etc):
        print("skipped: cannot bind a directory over %s in a mount namespace (%s)"
              % (etc, probe.stderr.decode().strip()))
        sys.exit(77)
    wrapper = os.path.join(tmp, "in-ns.sh")
    write(wrapper, "#!/bin/sh\nexec %s sh -c 'mount --bind \"$0\" \"$1\" || exit 77; "
          "shift; exec \"$@\"' %s %s %s \"$@\"\n" % (" ".join(unshare), mine, etc, exe))
    os.chmod(wrapper, 0o755)
    d = Daemon(wrapper, tmp, config=None)
    c = d.client()
    check(c.call("daemon.reload") == {"reloaded": False}, "no default file: reloaded false")
    check(c.call("status")["daemon"]["limits"]["max_clients"] == 256, "the default")
    check("info: no configuration file (%s does not exist)" % default in d.logtext(),
          "the start says no file was read:\n" + d.logtext())
    # A default file that is there but cannot be read is no absent file: a
    # reload refuses it and keeps what runs.
    conf = os.path.join(mine, "dspk", "dspkd.conf")
    os.symlink(os.path.join(tmp, "nowhere.conf"), conf)
    try:
        c.call("daemon.reload")
        raise AssertionError("a dangling default file was taken for an absent one")
    except RpcError as e:
        check(e.name == "ENOENT" and "symbolic link to a missing file" in e.err.get("message", ""),
              "dangling: %r" % e.err)
    os.remove(conf)
    # The file appears: a reload reads it.
    write(os.path.join(mine, "dspk", "dspkd.conf"), "[limits]\nmax_clients = 2\n")
    check(c.call("daemon.reload") == {"reloaded": True}, "the default file read")
    check(c.call("status")["daemon"]["limits"]["max_clients"] == 2, "applied")
    check("configuration reloaded from %s" % default in d.logtext(), d.logtext())
    write(os.path.join(mine, "dspk", "dspkd.conf"), "[limits]\nmax_clients = 3\n")
    check(c.call("daemon.reload") == {"reloaded": True}, "read again")
    check(c.call("status")["daemon"]["limits"]["max_clients"] == 3, "applied again")
    # Once read, a missing file is an error (as with --config PATH).
    os.remove(os.path.join(mine, "dspk", "dspkd.conf"))
    try:
        c.call("daemon.reload")
        raise AssertionError("a default file that went away was taken")
    except RpcError as e:
        check(e.name == "ENOENT", "missing now: %r" % e.err)
    check(c.call("status")["daemon"]["limits"]["max_clients"] == 3, "kept")
    c.close()
    d.stop()
    # --config "": no file, now or at a reload, whatever exists.
    write(os.path.join(mine, "dspk", "dspkd.conf"), "[limits]\nmax_clients = 2\n")
    d = Daemon(wrapper, tmp, config="")
    c = d.client()
    check(c.call("daemon.reload") == {"reloaded": False}, "--config \"\": reloaded false")
    check(c.call("status")["daemon"]["limits"]["max_clients"] == 256, "nothing read")
    check('info: no configuration file (--config "")' in d.logtext(), d.logtext())
    c.close()
    d.stop()
    # The default file, read: the start names it.
    d = Daemon(wrapper, tmp, config=None)
    check("info: configuration read from %s" % default in d.logtext(), d.logtext())
    d.stop()
    # Only "no such file" means absent: a default file that cannot be reached
    # stops the start (exit 2), as any file that cannot be read, with why.
    unreachable = [("a symbolic link to a missing file",
                    lambda: os.symlink(os.path.join(tmp, "nowhere.conf"), conf),
                    "No such file or directory (a symbolic link to a missing file)"),
                   ("a symbolic link loop", lambda: os.symlink(conf, conf),
                    os.strerror(errno.ELOOP))]
    os.remove(conf)
    for what, make, why in unreachable:
        make()
        d = Daemon(wrapper, tmp, config=None, ready=False)
        check(d.wait() == 2, "%s: exit 2:\n%s" % (what, d.logtext()))
        check("error: %s: cannot read: %s" % (default, why) in d.logtext(),
              "%s:\n%s" % (what, d.logtext()))
        os.remove(conf)
    # Its directory not searchable by the daemon's user (root searches any).
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return
    write(conf, "[policy]\nallow_users = root\n")
    os.chmod(os.path.join(mine, "dspk"), 0o700)
    run = tempfile.mkdtemp(prefix="dspkd-l-run-", dir="/tmp")  # reachable by nobody
    os.chmod(run, 0o777)
    nobody = os.path.join(tmp, "in-ns-nobody.sh")
    write(nobody, "#!/bin/sh\nexec %s sh -c 'mount --bind \"$0\" \"$1\" || exit 77; "
          "shift; exec setpriv --reuid=65534 --regid=65534 --clear-groups \"$@\"' %s %s %s "
          "\"$@\"\n" % (" ".join(unshare), mine, etc, exe))
    os.chmod(nobody, 0o755)
    try:
        d = Daemon(nobody, tmp, config=None, ready=False, sock=os.path.join(run, "s.sock"))
        rc = d.wait()
    finally:
        shutil.rmtree(run, ignore_errors=True)
    check(rc == 2, "unsearchable directory: exit 2:\n" + d.logtext())
    check("error: %s: cannot read: %s" % (default, os.strerror(errno.EACCES)) in d.logtext(),
          d.logtext())


def t_hooks(exe, tmp):
    """A test build (DSPK_TEST_HOOKS) warns at start for each test-hook
    variable set, so that one run as a service is noticed; the list of hook
    names it knows (daemon/testhooks.c, HOOK_NAMES) is every hook of the
    sources."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    want = set()
    for top in ("proto", "cache", "backends", "daemon", "client"):
        for root, _, files in os.walk(os.path.join(src, top)):
            for f in files:
                if not f.endswith((".c", ".h", ".cpp", ".cu")):
                    continue
                with open(os.path.join(root, f), errors="replace") as fh:
                    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", fh.read(), flags=re.S)
                want |= set(re.findall(r'DSPK_TEST_HOOK\("([A-Z0-9_]+)"\)', text))
                for n in re.findall(r'DSPK__GPURT_HOOK\(\w+, "([A-Z0-9_]+)"\)', text):
                    want |= {"DSPK_CUDA_" + n, "DSPK_HIP_" + n}
    with open(os.path.join(src, "daemon", "testhooks.c")) as fh:
        table = re.search(r"HOOK_NAMES\[\] = \{(.*?)\};", fh.read(), re.S).group(1)
    have = set(re.findall(r'"([A-Z0-9_]+)"', table))
    check(want and have == want, "testhooks.c HOOK_NAMES: missing %r, extra %r"
          % (sorted(want - have), sorted(have - want)))
    d = Daemon(exe, tmp, env={"DSPKD_TEST_EXIT": "none", "DSPK_VK_SPIN_US": "1",
                              "DSPK_TEST_BACKENDS": "cpu"})
    d.stop()
    warned = re.findall(r"warn: test build: (\w+)=\S* is set: a test hook", d.logtext())
    check(sorted(warned) == ["DSPKD_TEST_EXIT", "DSPK_VK_SPIN_US"],
          "one warning per hook variable set (not for other variables): %r\n%s"
          % (warned, d.logtext()))
    d = Daemon(exe, tmp)
    d.stop()
    check("test build:" not in d.logtext(), "no hook variable, no warning:\n" + d.logtext())


def t_config(exe, tmp):
    def start_fail(text, want, name="bad.conf", mode=None, owner=None):
        conf = os.path.join(tmp, name)
        write(conf, text)
        if mode is not None:
            os.chmod(conf, mode)
        if owner is not None:
            os.chown(conf, owner, owner)
        p = subprocess.run([exe, "--foreground", "--config", conf, "--backends", "cpu",
                            "--socket", os.path.join(tmp, "never.sock")],
                           stderr=subprocess.PIPE, timeout=TIMEOUT)
        err = p.stderr.decode()
        check(p.returncode == 2, "invalid file: exit 2, got %d: %s" % (p.returncode, err))
        check(want % {"f": conf} in err, "error %r in %r" % (want % {"f": conf}, err))
        check(not os.path.exists(os.path.join(tmp, "never.sock")), "never listened")

    start_fail("[limits]\nmax_clients = 4\nmax_cliens = 5\n",
               '%(f)s:3: unknown key "max_cliens" in [limits]')
    # A key is spelled with "_" (dspk.conf(5)); "-" is the command line's
    # spelling.  Every dashed key name was taken as the key (probe 19 E1), a
    # second spelling nobody documented: it is an unknown key, with a hint.
    # Every key of the shipped example file (systemd/dspkd.conf), in its own
    # section, in another one and above any section.
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    section, keys = None, []
    with open(os.path.join(src, "systemd", "dspkd.conf")) as fh:
        for line in fh:
            m = re.match(r"\[(\w+)\]$", line.strip())
            if m:
                section = m.group(1)
            m = re.match(r"#([a-z_]+) =", line)
            if m and section:
                keys.append((section, m.group(1)))
    dashed = [(sec, k) for sec, k in keys if "_" in k]
    check(len(keys) >= 33 and len(dashed) >= 29, "keys of the example file: %r" % keys)
    for sec, k in dashed:
        dash = k.replace("_", "-")
        start_fail("[%s]\n%s = 1\n" % (sec, dash),
                   '%%(f)s:2: unknown key "%s" in [%s]; did you mean %s?\n' % (dash, sec, k))
        other = "policy" if sec != "policy" else "limits"
        start_fail("[%s]\n%s = 1\n" % (other, dash),
                   '%%(f)s:2: unknown key "%s" in [%s]; did you mean %s (in [%s])?\n'
                   % (dash, other, k, sec))
    start_fail("max-clients = 5\n", '%(f)s:1: unknown key "max-clients" before any [section]; '
               'did you mean max_clients (in [limits])?\n')
    # Only a dashed key name gets the hint: a mixed one too, not another name.
    start_fail("[limits]\nmax_user-clients = 5\n", '%(f)s:2: unknown key "max_user-clients" '
               'in [limits]; did you mean max_user_clients?\n')
    start_fail("[limits]\nmax-cliens = 5\n", '%(f)s:2: unknown key "max-cliens" in [limits]\n')
    start_fail("[daemon]\nend-job = 5\n", '%(f)s:2: unknown key "end-job" in [daemon]\n')
    # A dashed key and its "_" spelling are two names, not one key given twice.
    start_fail("[limits]\nmax_clients = 5\nmax-clients = 6\n",
               '%(f)s:3: unknown key "max-clients" in [limits]; did you mean max_clients?\n')
    # Every path of the file is absolute, as job_state's is (dspk.conf(5)): a
    # relative cache or socket was the start directory's, logged relative, and a
    # daemon whose epilog refuses the same file (probe 17, E 5).
    start_fail("[daemon]\ncache = relative.db\n", '%(f)s:2: cache: expected an absolute path '
               'or :memory:, got "relative.db" (a relative path would be the directory dspkd '
               'started in)')
    start_fail("[daemon]\nsocket = rel.sock\n", '%(f)s:2: socket: expected an absolute path '
               'or @NAME (an abstract socket), got "rel.sock" (a relative path would be the '
               'directory dspkd started in)')
    start_fail("[daemon]\njob_state = rel.jobs\n", '%(f)s:2: job_state: expected an absolute '
               'path, got "rel.jobs"')
    # A list names each item once (its repeat was taken in silence, and
    # raw_kernels' warning then logged once per repeat: probe 17, E 6).
    start_fail("[daemon]\nbackends = cpu,vulkan,cpu\n", '%(f)s:2: backends: expected each '
               'backend once; got "cpu" twice in "cpu,vulkan,cpu"')
    start_fail("[daemon]\nraw_kernels = vulkan:0,cuda:1,vulkan:0\n", '%(f)s:2: raw_kernels: '
               'expected each device once; got "vulkan:0" twice in "vulkan:0,cuda:1,vulkan:0"')
    for opt, val, want in (("--backends", "cpu,cpu", 'expected each backend once; got "cpu" '
                            'twice in "cpu,cpu"'),
                           ("--raw-kernels", "cuda:0,cuda:0", 'expected each device once; got '
                            '"cuda:0" twice')):
        q = subprocess.run([exe, "--foreground", "--config", "", opt, val, "--socket",
                            os.path.join(tmp, "never.sock")], stderr=subprocess.PIPE,
                           timeout=TIMEOUT)
        err = q.stderr.decode()
        check(q.returncode == 2 and len(err.splitlines()) == 1 and
              ("error: %s: %s" % (opt, want)) in err, "%s %s: %d %r" % (opt, val, q.returncode,
                                                                       err))
    # A user quota above max_clients never applies: a warning at start and at a
    # reload, naming both (it was silent).
    wconf = os.path.join(tmp, "quota.conf")
    write(wconf, "[limits]\nmax_clients = 4\nmax_user_clients = 8\n")
    want = ("warn: %s: max_user_clients 8 is more than max_clients 4: one user is bounded by "
            "max_clients alone (give max_user_clients 4 or less)\n" % wconf)
    d = Daemon(exe, tmp, config=wconf, sock=os.path.join(tmp, "quota.sock"))
    check(d.logtext().count(want) == 1, "warned at start:\n" + d.logtext())
    write(wconf, "[limits]\nmax_clients = 6\nmax_user_clients = 6\n")
    c = d.client()
    c.call("daemon.reload")
    check(d.logtext().count(want) == 1 and "more than max_clients 6" not in d.logtext(),
          "max_user_clients = max_clients: no warning:\n" + d.logtext())
    write(wconf, "[limits]\nmax_clients = 4\nmax_user_clients = 8\n")
    c.call("daemon.reload")
    check(d.logtext().count(want) == 2, "warned at the reload:\n" + d.logtext())
    c.close()
    d.stop()
    start_fail("# comment\n[limits]\nmax_depth = 2\n", "%(f)s:3: max_depth: expected an integer")
    start_fail("[limits]\nmax_unsent = 12Q\n", "%(f)s:2: max_unsent")
    start_fail("[limits]\nmax_user_memory = 150%\n", "%(f)s:2: max_user_memory: expected a size")
    start_fail("[limits]\nmax_conn_memory = 0\n", "%(f)s:2: max_conn_memory: expected a size")
    # One number rule for every number (outside probe 16 E3): a leading 0
    # reads two ways, in a count, a size, a duration and a share alike.
    start_fail("[limits]\nmax_depth = 016\n", '%(f)s:2: max_depth: expected an integer from 4 to '
               '1024, got "016" (a leading 0 reads two ways: none is allowed)')
    start_fail("[limits]\nmax_unsent = 064M\n", '%(f)s:2: max_unsent: expected a size')
    start_fail("[limits]\nmax_user_memory = 050%\n", '%(f)s:2: max_user_memory: expected a size')
    start_fail("[daemon]\nshutdown_timeout = 05s\n", '%(f)s:2: shutdown_timeout: expected an '
               'integer')
    start_fail("[daemon]\nforeground = maybe\n",
               "%(f)s:2: foreground: expected yes|no, true|false, on|off or 1|0, got \"maybe\"")
    # A file other users could change (outside probe 16 E1: a file of
    # nobody's that everyone could write was read, its admin_users with it):
    # refused whoever owns it, as is one in a directory they could change.
    admin = "[policy]\nadmin_users = nobody\n"
    start_fail(admin, "%(f)s: refusing the configuration file: it is writable by group or "
               "others (mode 0666) (whoever can change it decides who may connect and who is "
               "an admin): chmod go-w it", name="w.conf", mode=0o666)
    start_fail(admin, "%(f)s: refusing the configuration file: it is writable by group or "
               "others (mode 0620)", name="g.conf", mode=0o620)
    sub = os.path.join(tmp, "open")
    os.mkdir(sub)
    os.chmod(sub, 0o777)
    # The fix names what to change: the directory, not the file (probe 22 E2).
    start_fail(admin, "%%(f)s: refusing the configuration file: its directory %s is a "
               "directory writable by group or others without the sticky bit (mode 0777"
               % sub, name="open/c.conf", mode=0o644)
    start_fail(admin, "(whoever can change it can replace the file): chmod go-w the "
               "directory %s (or chmod +t it), or move the file" % sub, name="open/c.conf",
               mode=0o644)
    if os.getuid() == 0:
        nobody = 65534
        start_fail(admin, "%(f)s: refusing the configuration file: it is owned by uid 65534, "
                   "not by dspkd's uid 0 (whoever can change it decides who may connect "
                   "and who is an admin): chown root and chmod go-w it", name="n.conf",
                   mode=0o644, owner=nobody)
        # Another user's link to a root file that is safe itself.
        good = os.path.join(tmp, "good.conf")
        write(good, "[daemon]\nlog_level = info\n")
        os.chmod(sub, 0o1777)
        ln = os.path.join(sub, "ln.conf")
        os.symlink(good, ln)
        os.lchown(ln, nobody, nobody)
        p = subprocess.run([exe, "--foreground", "--config", ln, "--backends", "cpu",
                            "--socket", os.path.join(tmp, "never.sock")],
                           stderr=subprocess.PIPE, timeout=TIMEOUT)
        check(p.returncode == 2 and "%s: refusing the configuration file: it is a symbolic "
              "link owned by uid 65534, not by dspkd's uid 0" % ln in p.stderr.decode() and
              # chown would follow the link (probe 22 E2): the fix is the link's.
              p.stderr.decode().rstrip().endswith(": remove the link (or chown -h it to "
                                                  "root)") and
              "chmod" not in p.stderr.decode(),
              "another user's link: %d %s" % (p.returncode, p.stderr.decode()))
    start_fail("[limits]\nsocket = /x\n", '%(f)s:2: key "socket" belongs in section [daemon]')
    # A key above the first header is in no section: the message says so
    # (never "in []", a section nobody wrote) and where it belongs.
    start_fail("max_clients = 5\n",
               '%(f)s:1: key "max_clients" comes before any [section]; it belongs in [limits]')
    start_fail("# c\nfoo = 1\n", '%(f)s:2: unknown key "foo" before any [section]')
    # What cannot be seen in the file is shown escaped in the message: a tab,
    # a zero-width space, a control byte, a byte that is not UTF-8, a backslash.
    start_fail("[limits]\nmax_\u200bclients = 5\n",
               '%(f)s:2: unknown key "max_\\u200bclients" in [limits]')
    start_fail("[daemon]\nforeground = ye\x01s\n",
               '%(f)s:2: foreground: expected yes|no, true|false, on|off or 1|0, '
               'got "ye\\x01s"')
    start_fail("[daemon]\nlog_level = de\\bug\u00a0\n",
               '%(f)s:2: log_level: expected error, warn, notice, info or debug, '
               'got "de\\\\bug\\u00a0"')
    start_fail("[limits\t]\nmax_clients = 4\n", "%(f)s:1: unknown section [limits\\t]")
    start_fail(b"[limits]\nmax_cl\xffients = 5\n".decode("utf-8", "surrogateescape"),
               '%(f)s:2: unknown key "max_cl\\xffients" in [limits]')
    # What libinih takes but reads otherwise than dspk.conf(5) says (its
    # compiled-in leniencies) is refused by config.c's reader, naming the line:
    # an unknown section, with keys or without (inih never shows it to the
    # handler) ...
    start_fail("[nosuch]\nsocket = /x\n", "%(f)s:1: unknown section [nosuch]")
    start_fail("[limits]\nmax_clients = 4\n[bogus]\n", "%(f)s:3: unknown section [bogus]")
    # ... text after a section's "]" (inih ignored it), a comment included ...
    start_fail("[daemon] trailing junk\nlog_level = info\n",
               "%(f)s:1: text after the section header [daemon]")
    start_fail("[limits] ; limits\nmax_clients = 4\n",
               "%(f)s:1: text after the section header [limits]")
    # ... a comment after a value (inih cut the value at " ;": "root" alone
    # was allowed; log_level = info ; c was taken as info) ...
    start_fail("[policy]\nallow_users = root ; nosuchuser_zz\n",
               "%(f)s:2: a comment cannot follow a value")
    # A list of [policy] given again adds to it, up to 1024 entries (probe 15
    # E6); any other key given twice is refused.
    start_fail("[policy]\n" + "allow_groups = %s\n" % ",".join(str(200000 + i)
                                                           for i in range(16)) * 64
               + "allow_groups = 1\n", "%(f)s:66: allow_groups: more than 1024 entries")
    start_fail("[daemon]\nlog_level = info\nlog_level = info\n",
               '%(f)s:3: key "log_level" given twice')
    start_fail("[daemon]\nlog_level = info\t; c\n", "%(f)s:2: a comment cannot follow a value")
    # ... ":" for "=" ...
    start_fail("[daemon]\nlog_level : info\n", '%(f)s:2: expected key = value (":" does not')
    # ... a NUL byte (inih saw the value end there) ...
    start_fail("[daemon]\nlog_level = info\0junk\n", "%(f)s:2: NUL byte")
    # ... an indented line meant to continue a value (inih took it as a
    # continuation: 'key "log_level" given twice') ...
    start_fail("[daemon]\nlog_level = info\n  warn\n",
               "%(f)s:3: an indented line does not continue the value above")
    # ... and a line beyond inih's buffer (it took the rest for the next line
    # and named that one): refused at its own line, a comment too.
    start_fail("[daemon]\n#%s\nlog_level = info\n" % ("x" * 199),
               "%(f)s:2: line longer than 199 bytes")
    start_fail("[daemon]\ncache = /%s\n" % ("c" * 191), "%(f)s:2: line longer than 199 bytes")
    start_fail("[daemon]\nthis line is wrong\n", "%(f)s:2: syntax error")
    # One UTF-8 byte order mark at the very start is ignored (good.conf below
    # starts with one); a second one, or one after a blank, is refused as one
    # on any other line is (libinih skipped it: "[limits]" was read).
    for text in ("\ufeff\ufeff[limits]\nmax_clients = 3\n", " \ufeff[limits]\n",
                 "\ufeff\ufeff\n[limits]\n"):
        start_fail(text, "%(f)s:1: a byte order mark (\\ufeff) that is not the first bytes "
                   "of the file: only one, at the very start, is ignored")
    # cache with no_cache = yes is refused at the second of them, whichever
    # comes first, as --cache with --no-cache is (no_cache won in silence);
    # no_cache = no with a cache is no conflict (good.conf below).
    start_fail("[daemon]\nno_cache = yes\ncache = %s/zz.db\n" % tmp,
               "%(f)s:3: cache and no_cache = yes (line 2) both given (give one)")
    start_fail("[daemon]\ncache = %s/zz.db\n[limits]\nmax_clients = 3\n[daemon]\nno_cache = on\n"
               % tmp,
               "%(f)s:6: no_cache = on and cache (line 2) both given (give one)")
    check(not os.path.exists(os.path.join(tmp, "zz.db")), "no cache file made")
    # An empty cache is a bad value, as every empty value of the file but
    # the [policy] lists (--cache "" is the command line's --no-cache).
    start_fail("[daemon]\ncache =\n",
               "%(f)s:2: cache: expected a path (no_cache = yes runs without a cache)")
    start_fail("[limits]\nmax_rank = 3\nmax_rank = 4\n", '%(f)s:3: key "max_rank" given twice')
    start_fail("[daemon]\ndevice_inflight = 0\n", "%(f)s:2: device_inflight")
    start_fail("[daemon]\ndevice_inflight = 65\n", "%(f)s:2: device_inflight")
    # Strings checked when the file is read, not when the devices or the
    # listener start (which exited 1 without file:line): backends is a comma
    # list of known backends without blanks, metrics_listen has a port.
    start_fail("[daemon]\nbackends = cpu,nosuch\n", '%(f)s:2: backends: expected a comma list')
    start_fail("[daemon]\nbackends = cpu, vulkan\n", '%(f)s:2: backends: expected a comma list')
    start_fail("[daemon]\nbackends = cpu,\n", '%(f)s:2: backends: expected a comma list')
    start_fail("[daemon]\nmetrics_listen = nope\n", "%(f)s:2: metrics_listen: expected ADDR:PORT")
    start_fail("[daemon]\nmetrics_listen = 127.0.0.1:65536\n",
               "%(f)s:2: metrics_listen: expected ADDR:PORT with a port from 0 to 65535")
    start_fail("[daemon]\nmetrics_listen = 127.0.0.1:\n", "%(f)s:2: metrics_listen")
    # A socket path beyond a Unix socket's 107 bytes is a bad value too (it
    # passed up to 255 bytes and failed to listen, exit 1).
    start_fail("[daemon]\nsocket = /tmp/%s\n" % ("s" * 110),
               "%(f)s:2: socket: expected a non-empty path of at most 107 bytes")
    # So is a $DSPK_SOCKET of 108 bytes (it was exit 1, at the listen's check).
    p = subprocess.run([exe, "--foreground", "--config", "", "--backends", "cpu", "--no-cache"],
                       stderr=subprocess.PIPE, timeout=TIMEOUT,
                       env=dict(os.environ, DSPK_SOCKET="/tmp/" + "s" * 103))
    check(p.returncode == 2 and b"$DSPK_SOCKET: expected a path of at most 107 bytes (a Unix "
          b"socket's limit), got 108 bytes" in p.stderr, "long $DSPK_SOCKET: %d %r"
          % (p.returncode, p.stderr))
    # A socket in a directory that does not exist: exit 1, saying so (libuv
    # reports it as "permission denied", even to root).
    p = subprocess.run([exe, "--foreground", "--config", "", "--backends", "cpu", "--no-cache",
                        "--socket", os.path.join(tmp, "no-such-dir", "s.sock")],
                       stderr=subprocess.PIPE, timeout=TIMEOUT)
    err = p.stderr.decode()
    check(p.returncode == 1 and "no-such-dir: No such file or directory" in err and
          "permission denied" not in err, "socket in a missing directory: %d %s" %
          (p.returncode, err))
    p = subprocess.run([exe, "--foreground", "--device-inflight", "65"],
                       stderr=subprocess.PIPE, timeout=TIMEOUT)
    check(p.returncode == 2 and b"--device-inflight: expected an integer from 1 to 64" in
          p.stderr, "--device-inflight 65: %r" % p.stderr)
    # The options come from the same table as the keys: the same range checks,
    # getopt_long's unambiguous prefixes, and --help shows each default.
    for args, want in ((["--max-dep", "2"], '--max-depth: expected an integer from 4 to 1024, '
                        'got "2"'),
                       (["--max-user-memory=150%"], "--max-user-memory: expected a size"),
                       (["--shutdown-timeout", "5x"], "--shutdown-timeout: expected an integer"),
                       (["--idle-trim", "5m"], "milliseconds (suffix ms or s allowed)"),
                       (["--backends", ""], "--backends: expected a comma list (no blanks) of "
                        "cpu, cuda, vulkan, hip; got an empty list"),
                       (["--backends", "cpu,"], '--backends: expected a comma list'),
                       (["--raw-kernels", ""], "--raw-kernels: expected all, none, or a comma "
                        "list (no blanks) of device ids such as vulkan:0 or cuda:1; got an "
                        "empty value"),
                       # An index reads one way: vulkan:00 would name no device
                       # while a person reads vulkan:0 (probe 15 E7).
                       (["--raw-kernels", "vulkan:00"], '--raw-kernels: expected all, none, or '
                        'a comma list (no blanks) of device ids such as vulkan:0 or cuda:1 (the '
                        'index without a leading 0); got "vulkan:00" in "vulkan:00"'),
                       (["--raw-kernels", "vulkan:0,cuda:01"], '--raw-kernels: expected all, '
                        'none'),
                       (["--metrics-listen", ""], "--metrics-listen: expected ADDR:PORT"),
                       (["--ready-fd", "999"], "--ready-fd: 999: not an open file descriptor"),
                       (["--backends", "cpu,nosuch"], '--backends: expected a comma list'),
                       (["--socket", "/tmp/" + "s" * 110], "--socket: expected a non-empty path"),
                       (["--socket", ""], "--socket: expected a non-empty path"),
                       (["--metrics-listen", "127.0.0.1:99999"],
                        "--metrics-listen: expected ADDR:PORT with a port from 0 to 65535"),
                       (["--max-u", "1"], "ambiguous"), (["stray"], 'unexpected argument "stray"'),
                       # A switch given a value is named as such, not "unrecognized";
                       # --cache=x is --cache's value (--cache-max-bytes starts alike).
                       (["--foreground=1"], "option '--foreground' takes no value"),
                       (["--no-cache=yes"], "option '--no-cache' takes no value"),
                       (["--fore=1"], "option '--foreground' takes no value"),
                       (["--no-such=1"], "unrecognized option '--no-such=1'"),
                       # An option given twice is refused, as a key twice in the
                       # file is: the last one never silently wins.
                       (["--max-clients", "5", "--max-clients", "6"],
                        "option '--max-clients' given twice"),
                       (["--backends", "cpu", "--backends=vulkan"],
                        "option '--backends' given twice"),
                       (["--log-level", "info", "--log-l", "info"],
                        "option '--log-level' given twice"),
                       (["--config", "", "--foreground"], "option '--config' given twice"),
                       (["--foreground"], "option '--foreground' given twice"),
                       (["--no-cache", "--cache", "x.db"],
                        "options '--no-cache' and '--cache' both given"),
                       (["--cache", "x.db", "--no-cache"],
                        "options '--cache' and '--no-cache' both given"),
                       # Numbers parse one way for every type: no leading blank
                       # (nor a newline), as sizes already refused.
                       (["--max-clients", " 8"], '--max-clients: expected an integer from 1'),
                       (["--max-clients", "\n8"], '--max-clients: expected an integer'),
                       (["--device-inflight", " 8"], "--device-inflight: expected an integer"),
                       (["--ready-fd", " 1"], '--ready-fd: expected an integer'),
                       (["--shutdown-timeout", " 5"], "--shutdown-timeout: expected an integer"),
                       (["--cache-max-bytes", " 8K"], "--cache-max-bytes: expected a size"),
                       (["--max-user-memory", " 8%"], "--max-user-memory: expected a size"),
                       (["--max-user-memory", "\t8M"], "--max-user-memory: expected a size"),
                       # --metrics-listen: no form read two ways.
                       (["--metrics-listen", "::1:0"],
                        "--metrics-listen: an IPv6 address goes in brackets ([::1]:0)"),
                       (["--metrics-listen", "fe80::1%eth0:0"],
                        "--metrics-listen: an IPv6 address goes in brackets "
                        "([fe80::1%eth0]:0)"),
                       (["--metrics-listen", "0:0"],
                        "--metrics-listen: expected ADDR:PORT"),
                       (["--metrics-listen", "127.1:0"],
                        "--metrics-listen: expected ADDR:PORT"),
                       (["--metrics-listen", "127.0.0.1:080"],
                        "--metrics-listen: expected ADDR:PORT"),
                       # inet_aton's other forms (hexadecimal, octal, fewer
                       # parts), a blank, and brackets around no IPv6 address.
                       *[(["--metrics-listen", a], "--metrics-listen: expected ADDR:PORT")
                         for a in ("0x7f.1:0", "0x7f000001:0", "127.0x0.0.1:0",
                                   "0X7F.0.0.1:0", "0177.0.0.1:0", "2130706433:0",
                                   "127.0.0.1 :0", " 127.0.0.1:0", "127.0.0.1\t:0",
                                   "local host:0", "[]:0", "[127.0.0.1]:0",
                                   "[localhost]:0", "[::1%]:0",
                                   # no IPv6 address as it stands either: no
                                   # hint to bracket it (probe 15 E8)
                                   "[::1]x:0", "x[::1]:0", "::1x:0", "fe80::1%:0")]):
        p = subprocess.run([exe, "--foreground", "--config", ""] + args, stderr=subprocess.PIPE,
                           stdout=subprocess.PIPE, timeout=TIMEOUT)
        check(p.returncode == 2 and want in p.stderr.decode(), "%r: %r" % (args, p.stderr))
    p = subprocess.run([exe, "--help"], stdout=subprocess.PIPE, timeout=TIMEOUT)
    usage = p.stdout.decode()
    for opt, dflt in (("--max-message SIZE", "256M"), ("--max-user-memory SIZE|N%", "50%"),
                      ("--log-level LEVEL", "info"), ("--shutdown-timeout MS", "10000")):
        i = usage.find("  " + opt + " ")
        entry = " ".join(usage[i:].split("\n  -")[0].split()) if i >= 0 else ""
        check(p.returncode == 0 and "(default %s)" % dflt in entry,
              "--help: %s (default %s):\n%s" % (opt, dflt, usage))
    p = subprocess.run([exe, "--foreground", "--config", os.path.join(tmp, "missing.conf")],
                       stderr=subprocess.PIPE, timeout=TIMEOUT)
    check(p.returncode == 2 and b"missing.conf: cannot read" in p.stderr,
          "missing --config file: %r" % p.stderr)
    # A directory was read as an empty file (the start went on with the
    # defaults); a FIFO would block the start: only a regular file is read.
    os.mkdir(os.path.join(tmp, "conf.d"))
    os.mkfifo(os.path.join(tmp, "conf.fifo"))
    for name, want in (("conf.d", b"conf.d: cannot read: Is a directory"),
                       ("conf.fifo", b"conf.fifo: cannot read: not a regular file (a FIFO)")):
        p = subprocess.run([exe, "--foreground", "--config", os.path.join(tmp, name),
                            "--backends", "cpu", "--no-cache",
                            "--socket", os.path.join(tmp, "never.sock")],
                           stderr=subprocess.PIPE, timeout=TIMEOUT)
        check(p.returncode == 2 and want in p.stderr, "--config %s: %d %r" %
              (name, p.returncode, p.stderr))
    # Every setting from the file: socket, backends, limits with units, policy.
    conf = os.path.join(tmp, "good.conf")
    sock = os.path.join(tmp, "fromfile.sock")
    # Also what the syntax allows at its edges: a line of 199 bytes,
    # indented lines (inih took the second indented key for a continuation
    # of the first), a ";" in a value that follows no blank (--no-cache
    # wins over the cache).
    write(conf, "\ufeff; the example's style\n[daemon]\nsocket = %s\nbackends = cpu\n"
          "log_level = debug\nshutdown_timeout = 5s\ncache = %s/x;y.db\nno_cache = no\n#%s\n\n"
          "  [limits]\n  max_message = 64M\n  max_unsent = 1M\n\tmax_clients = 8\n\n"
          "[policy]\nallow_users = root, %d\nallow_groups = 0\nadmin_users = %d\n" %
          (sock, tmp, "x" * 198, os.getuid(), os.getuid()))
    r, w = os.pipe()
    log = open(os.path.join(tmp, "good.log"), "w+")
    p = subprocess.Popen([exe, "--foreground", "--config", conf, "--ready-fd", str(w),
                          "--no-cache"], pass_fds=[w], stderr=log)
    os.close(w)
    got, _, _ = select.select([r], [], [], TIMEOUT)
    check(got and os.read(r, 16) == b"READY\n", "started from the file")
    os.close(r)
    c = Client(sock, TIMEOUT)
    st = c.call("status")
    lim = st["daemon"]["limits"]
    check(lim["max_message"] == 64 << 20 and lim["max_unsent"] == 1 << 20 and
          lim["max_clients"] == 8, "limits with units: %r" % lim)
    check([x["id"] for x in st["devices"]] == ["cpu:0"], "backends from the file")
    c.close()
    p.send_signal(signal.SIGTERM)
    check(p.wait(TIMEOUT) == 0, "exit 0")
    log.seek(0)
    text = log.read()
    check("debug:" in text, "log_level from the file")
    # A start without a cache says so, naming what turned it off.
    check("info: cache: none (--no-cache): nothing persists\n" in text,
          "no cache logged:\n" + text)
    d = Daemon(exe, tmp, ["--cache", ""])
    d.stop()
    check('info: cache: none (--cache ""): nothing persists\n' in d.logtext(),
          '--cache "" logged:\n' + d.logtext())
    nc = os.path.join(tmp, "nocache.conf")
    write(nc, "[daemon]\nno_cache = yes\n")
    d = Daemon(exe, tmp, ["--config", nc])
    d.stop()
    check("info: cache: none (no_cache = yes in %s): nothing persists\n" % nc in d.logtext(),
          "the file's no_cache logged:\n" + d.logtext())
    # --ready-fd on a descriptor READY cannot be written to: open read-only,
    # refused at start as a closed one is (the daemon served, and whoever
    # waited for READY waited for ever); a write that fails later (a full
    # device) is a warning that says READY was not written.
    ro = os.open("/dev/null", os.O_RDONLY)
    p = subprocess.run([exe, "--foreground", "--config", "", "--backends", "cpu", "--no-cache",
                        "--socket", os.path.join(tmp, "never.sock"), "--ready-fd", str(ro)],
                       pass_fds=[ro], stderr=subprocess.PIPE, timeout=TIMEOUT)
    os.close(ro)
    check(p.returncode == 2 and ("--ready-fd: %d: not open for writing (READY could not be "
                                 "written there)" % ro).encode() in p.stderr and
          not os.path.exists(os.path.join(tmp, "never.sock")),
          "--ready-fd read-only: %d %r" % (p.returncode, p.stderr))
    full = os.open("/dev/full", os.O_WRONLY)
    note = Notify(tmp)
    e = dict(os.environ, NOTIFY_SOCKET=note.path)
    log = open(os.path.join(tmp, "full.log"), "w+")
    p = subprocess.Popen([exe, "--foreground", "--config", "", "--backends", "cpu", "--no-cache",
                          "--socket", os.path.join(tmp, "full.sock"), "--ready-fd", str(full)],
                         pass_fds=[full], stderr=log, env=e)
    os.close(full)
    try:
        note.until(lambda m: m.get("READY") == "1", "READY=1 with --ready-fd on /dev/full")
    finally:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(TIMEOUT)
        note.close()
    log.seek(0)
    text = log.read()
    check(rc == 0 and "warn: cannot write READY to --ready-fd %d: No space left on device\n"
          % full in text, "--ready-fd on /dev/full: %d\n%s" % (rc, text))
    # The installed example starts with every key enabled as it is written
    # (its values are the defaults, or marked examples that any host takes;
    # a computed default's line, which shows the computation, stays out):
    # only the paths and the port are the test machine's.  Its policy lists
    # were users and groups a host may lack (wheel on Debian): exit 2.
    ex = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "systemd",
                      "dspkd.conf")
    text = open(ex).read()
    # A computed default shows its computation, to be left commented
    # (probe 18 E4: "#max_user_clients = 64" fixed what follows max_clients).
    computed = re.findall(r"(?m)^#(\w+) = .*leave the key out", text)
    check(computed == ["max_user_clients", "max_user_maps", "max_memory"],
          "the computed defaults: %r" % computed)
    enabled = re.sub(r"(?m)^#(\w+ =)(?!.*leave the key out)", r"\1", text)
    keys = re.findall(r"(?m)^(\w+) =", enabled)
    check(len(keys) == len(set(keys)) >= 30, "every key enabled once: %r" % keys)
    enabled = re.sub(r"(?m)^socket = .*$", "socket = %s" % os.path.join(tmp, "ex.sock"),
                     enabled)
    enabled = re.sub(r"(?m)^cache = .*$", "cache = %s" % os.path.join(tmp, "ex.db"), enabled)
    enabled = re.sub(r"(?m)^job_state = .*$", "job_state = %s" % os.path.join(tmp, "ex.jobs"),
                     enabled)
    # A port the system picks: the example's may be taken on the test machine.
    enabled = re.sub(r"(?m)^metrics_listen = .*$", "metrics_listen = 127.0.0.1:0", enabled)
    conf = os.path.join(tmp, "example.conf")
    write(conf, enabled)
    d = Daemon(exe, tmp, ["--config", conf], socket_flag=False, backends=None,
               sock=os.path.join(tmp, "ex.sock"))
    c = d.client()
    shown = c.call("status")["daemon"]
    c.close()
    d.stop()
    # The values shown are the defaults: the same limits as with no file.
    d = Daemon(exe, tmp)
    c = d.client()
    dflt = c.call("status")["daemon"]
    c.close()
    d.stop()
    check(shown["limits"] == dflt["limits"], "the example's limits are the defaults: %r, "
          "not %r" % (shown["limits"], dflt["limits"]))


AS_NOBODY = r"""
import json, socket, sys, msgpack
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
s.connect(sys.argv[1])
up = msgpack.Unpacker(raw=False)
out = []
for i, method in enumerate(sys.argv[2:]):
    try:
        s.sendall(msgpack.packb([0, i + 1, method,
                                 [{"data": b"x"}] if method == "ping" else []],
                                use_bin_type=True))
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused at once: what it said is still to be read
    got = None
    while got is None:
        try:
            data = s.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            got = "EOF"
            break
        up.feed(data)
        for m in up:
            if m[0] == 2:
                got = "notify:%s:%s" % (m[1], m[2][0]["name"])
            elif m[0] == 1:
                got = m[2]["name"] if m[2] else "ok"
    out.append(got)
    if got == "EOF" or got.startswith("notify"):
        break
print(json.dumps(out))
"""


def as_user(sock, uid, *methods):
    p = subprocess.run([sys.executable, "-c", AS_NOBODY, sock] + list(methods),
                       user=uid, group=uid, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=TIMEOUT)
    check(p.returncode == 0, "client as uid %d: %s" % (uid, p.stderr.decode()))
    import json
    return json.loads(p.stdout)


def t_policy(exe, tmp):
    """allow_users/allow_groups at the connection, admin_users/admin_groups for
    daemon.reload and daemon.stop, changed by a reload without dropping anyone."""
    if os.getuid() != 0:
        # Only the defaults can be checked: the daemon's own user is an admin.
        d = Daemon(exe, tmp)
        c = d.client()
        check(c.call("daemon.reload") == {"reloaded": True}, "own user reloads")
        check(c.call("daemon.stop") == {"stopping": True}, "own user stops")
        c.expect_eof()
        check(d.wait() == 0, "exit 0")
        return
    nobody = 65534
    os.chmod(tmp, 0o711)
    conf = os.path.join(tmp, "policy.conf")
    write(conf, "[policy]\nallow_users = 12345\nadmin_users = 12345\n")
    os.chmod(conf, 0o644)
    d = Daemon(exe, tmp, ["--config", conf, "--no-cache"], notify=True)
    os.chmod(d.sock, 0o666)
    got = as_user(d.sock, nobody, "ping")
    check(got == ["notify:protocol.error:EPERM"], "not allowed to connect: %r" % got)
    # The log names the user turned away, as every client line does.
    check(re.search(r"notice: client \d+ \(pid \d+ uid %d gid \d+\): EPERM: permission denied: "
                    r"uid %d may not connect \(root, the daemon's own user \(uid 0\), allow_users "
                    r"and allow_groups in the \[policy\] of dspkd.conf\)" % (nobody, nobody),
                    d.logtext()), "the refused uid is logged:\n" + d.logtext())
    root = d.client()
    check(root.call("ping", {"data": b"r"})["data"] == b"r", "the daemon's own user connects")
    # admin_users adds admins; root (here also the daemon's own user) stays
    # one (it used to lose every admin right once the list was set).
    check(root.call("daemon.reload") == {"reloaded": True},
          "root is an admin whatever admin_users says")
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1 after root's reload")
    reg = root.call("job.register", {"job": 4242, "uid": nobody})
    check(root.call("job.end", {"job": 4242}) is not None, "root registers and ends a job: %r"
          % reg)
    # allow_users over three lines (one line holds at most 199 bytes): each
    # adds to the list (probe 15 E6), nobody on the last line is admitted.
    write(conf, "[policy]\n" + "".join("allow_users = %s\n" % ",".join(
        str(100000 + 14 * k + i) for i in range(14)) for k in range(2))
        + "allow_users = nobody\nadmin_groups = 12345\n")
    d.proc.send_signal(signal.SIGHUP)
    d.notify.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1")
    # Not an admin: every privileged method says EPERM, cache.clear too.
    got = as_user(d.sock, nobody, "ping", "daemon.reload", "cache.clear")
    check(got == ["ok", "EPERM", "EPERM"], "allowed, not an admin: %r" % got)
    for m in ("daemon.reload", "cache.clear"):
        check(re.search(r"notice: client \d+ \(pid \d+ uid %d gid \d+\): %s refused: not an "
                        r"admin" % (nobody, m), d.logtext()), "%s refusal logged:\n%s"
              % (m, d.logtext()))
        # That notice is the refusal's one line: no generic "client N: METHOD #ID:
        # EPERM" line repeats it (probe 19 E2, the rule of daemon.reload's refusals).
        check(not re.search(r"client \d+: %s #\d+: EPERM" % m, d.logtext()),
              "%s refusal logged once:\n%s" % (m, d.logtext()))
    write(conf, "[policy]\nallow_users = nobody\nadmin_groups = %d\n" % nobody)
    d.proc.send_signal(signal.SIGHUP)
    d.notify.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1")
    # An admin by admin_groups: the same rule lets it clear the cache (ENOENT:
    # this daemon has none), not only call the admin methods.
    got = as_user(d.sock, nobody, "ping", "daemon.reload", "cache.clear")
    check(got == ["ok", "ok", "ENOENT"], "allowed and admin after the reload: %r" % got)
    # A name that does not resolve (a user deleted, LDAP not up at boot)
    # admits no one and is a warning, not a refused reload or start (outside
    # probe 15 E5: one stale name stopped every reload and the start); a
    # list of such names alone still admits no one else, never everyone.
    n = len(d.logtext())
    write(conf, "[policy]\nallow_users = no-such-user-here,nobody\n"
          "admin_groups = %d,no-such-group-here\n" % nobody)
    check(root.call("daemon.reload") == {"reloaded": True}, "a stale name: reloaded")
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1 (a stale name)")
    log = d.logtext()[n:]
    check('warn: %s:2: allow_users: no such user "no-such-user-here": such a name admits no '
          "one until a reload finds it (the other entries apply)" % conf in log and
          'warn: %s:3: admin_groups: no such group "no-such-group-here"' % conf in log,
          "the stale names are warned of:\n" + log)
    got = as_user(d.sock, nobody, "ping", "daemon.reload")
    check(got == ["ok", "ok"], "the other entries apply: %r" % got)
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1 after nobody's reload")
    # ...on a list's later line too (its lines add up: probe 15 E6).
    n = len(d.logtext())
    write(conf, "[policy]\nallow_users = nobody\nallow_users = no-such-user-2\n"
          "admin_groups = %d\n" % nobody)
    check(root.call("daemon.reload") == {"reloaded": True}, "a stale name, line 2: reloaded")
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1 (a stale name on line 3)")
    log = d.logtext()[n:]
    check('warn: %s:3: allow_users: no such user "no-such-user-2"' % conf in log,
          "a later line's stale name is warned of:\n" + log)
    check(as_user(d.sock, nobody, "ping") == ["ok"], "the first line's entry applies")
    # A number is plain decimal, as every number of dspk.conf(5): a sign or a
    # leading 0 makes the word a name, which no user has (outside probe 16
    # E3: "+65534" and "065534" admitted uid 65534 without a word).
    for word in ("+%d" % nobody, "0%d" % nobody):
        n = len(d.logtext())
        write(conf, "[policy]\nallow_users = %s\nadmin_groups = %d\n" % (word, nobody))
        check(root.call("daemon.reload") == {"reloaded": True}, "%s: reloaded" % word)
        d.notify.until(lambda m: m.get("READY") == "1", "READY=1 (%s)" % word)
        log = d.logtext()[n:]
        check('warn: %s:2: allow_users: no such user "%s"' % (conf, word) in log,
              "%s is a name, warned of:\n%s" % (word, log))
        got = as_user(d.sock, nobody, "ping")
        check(got == ["notify:protocol.error:EPERM"], "%s admits no one: %r" % (word, got))
    # A name of any length is looked up (a directory service's may be long): one
    # of 64 bytes or more was "name too long", a refused reload and start
    # (probe 17, E 2), where the documented rule is the warning.
    long_u, long_g = "u" * 64, "g" * 150
    n = len(d.logtext())
    write(conf, "[policy]\nallow_users = %s,nobody\nadmin_groups = %d,%s\n"
          % (long_u, nobody, long_g))
    check(root.call("daemon.reload") == {"reloaded": True}, "long names: reloaded")
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1 (long names)")
    log = d.logtext()[n:]
    check('warn: %s:2: allow_users: no such user "%s": such a name admits no one' % (
          conf, long_u) in log and
          'warn: %s:3: admin_groups: no such group "%s"' % (conf, long_g) in log,
          "long names are warned of:\n" + log)
    check(as_user(d.sock, nobody, "ping") == ["ok"], "long names: the other entries apply")
    lst = Daemon(exe, tmp, ["--config", conf, "--no-cache"], sock=os.path.join(tmp, "ls.sock"))
    check('allow_users: no such user "%s"' % long_u in lst.logtext(),
          "long name warned at start:\n" + lst.logtext())
    lst.proc.send_signal(signal.SIGTERM)
    check(lst.wait() == 0, "exit 0")
    write(conf, "[policy]\nallow_users = no-such-user-here\nadmin_groups = %d\n" % nobody)
    check(root.call("daemon.reload") == {"reloaded": True}, "only a stale name: reloaded")
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1 (only a stale name)")
    got = as_user(d.sock, nobody, "ping")
    check(got == ["notify:protocol.error:EPERM"], "a stale name alone admits no one: %r" % got)
    # The start too (it exited 2).
    st = Daemon(exe, tmp, ["--config", conf, "--no-cache"], sock=os.path.join(tmp, "st.sock"))
    check('allow_users: no such user "no-such-user-here"' in st.logtext(),
          "warned at start:\n" + st.logtext())
    st.proc.send_signal(signal.SIGTERM)
    check(st.wait() == 0, "exit 0")
    # An admin must pass the allow lists too: admin_users adds admins among those
    # admitted, it admits no one (dspk.conf(5), admin.md: probe 17, E 7).
    write(conf, "[policy]\nallow_users = root\nadmin_users = nobody\n")
    check(root.call("daemon.reload") == {"reloaded": True}, "admin not allowed: reloaded")
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1 (admin not allowed)")
    got = as_user(d.sock, nobody, "ping")
    check(got == ["notify:protocol.error:EPERM"], "an admin the allow lists leave out: %r" % got)
    write(conf, "[policy]\nallow_users = nobody\nadmin_groups = %d\n" % nobody)
    check(root.call("daemon.reload") == {"reloaded": True}, "back")
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1 (back)")
    check(root.call("daemon.reload") == {"reloaded": True}, "root is still an admin")
    check(root.call("ping", {"data": b"k"})["data"] == b"k", "root kept its connection")
    got = as_user(d.sock, nobody, "daemon.stop")
    check(got == ["ok"], "an admin stops the daemon: %r" % got)
    root.expect_eof()
    check(d.wait() == 0, "exit 0 after daemon.stop:\n" + d.logtext())
    d.check_clean_exit()
    check(not os.path.exists(d.sock), "socket removed")


def client_as(sock, uid):
    """A Client whose connection a child process of uid made (the kernel
    records the peer at connect), handed back here over a socketpair."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(sock)
            socket.send_fds(b, [b"c"], [c.fileno()])
        finally:
            os._exit(0)
    b.close()
    _, fds, _, _ = socket.recv_fds(a, 1, 1)
    a.close()
    os.waitpid(pid, 0)
    check(len(fds) == 1, "a connection of uid %d" % uid)
    c = Client.__new__(Client)
    c.sock = socket.socket(fileno=fds[0])
    c.sock.settimeout(TIMEOUT)
    c.up = msgpack.Unpacker(raw=False)
    c.msgid = 0
    c.responses = {}
    c.notes = []
    return c


def t_policyreload(exe, tmp):
    """A reload whose allow lists no longer admit a connected peer closes
    that peer's connections with the protocol.error EPERM a new connection
    gets (dspk.conf(5), RELOAD); others, and a reload that still admits the
    peer, leave them open.  By SIGHUP and by daemon.reload."""
    if os.getuid() != 0:
        print("skip: needs root (a second uid)")
        return
    nobody = 65534
    os.chmod(tmp, 0o711)
    conf = os.path.join(tmp, "policy.conf")
    write(conf, "[policy]\nallow_users = nobody\n")
    os.chmod(conf, 0o644)
    d = Daemon(exe, tmp, ["--config", conf, "--no-cache"], notify=True)
    os.chmod(d.sock, 0o666)
    nb = client_as(d.sock, nobody)
    check(nb.call("ping", {"data": b"n"})["data"] == b"n", "nobody connects")
    root = d.client()
    # Still admitted (by allow_groups now): the connection stays.
    write(conf, "[policy]\nallow_users = 12345\nallow_groups = %d\n" % nobody)
    d.proc.send_signal(signal.SIGHUP)
    d.notify.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1")
    check(nb.call("ping", {"data": b"m"})["data"] == b"m", "still admitted: kept")
    # No longer admitted: closed with the connect refusal.
    write(conf, "[policy]\nallow_users = 12345\n")
    d.proc.send_signal(signal.SIGHUP)
    d.notify.until(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
    d.notify.until(lambda m: m.get("READY") == "1", "READY=1")
    nb.expect_eof()
    want = ("permission denied: uid %d may not connect (root, the daemon's own user (uid 0), "
            "allow_users and allow_groups in the [policy] of dspkd.conf)" % nobody)
    check(len(nb.notes) == 1 and nb.notes[0][1] == "protocol.error" and
          nb.notes[0][2][0]["name"] == "EPERM" and want in str(nb.notes[0][2][0]),
          "revoked by SIGHUP: %r" % nb.notes)
    check("reload: 1 connection(s) closed: allow_users and allow_groups no longer admit "
          "their users" in d.logtext(), "the closes logged:\n" + d.logtext())
    check(root.call("ping", {"data": b"r"})["data"] == b"r", "root kept its connection")
    # By daemon.reload: the caller (root) stays, nobody's connection goes.
    write(conf, "[policy]\nallow_users = nobody\n")
    check(root.call("daemon.reload") == {"reloaded": True}, "reload admits nobody again")
    nb = client_as(d.sock, nobody)
    check(nb.call("ping", {"data": b"o"})["data"] == b"o", "nobody connects again")
    write(conf, "[policy]\nallow_groups = 12345\n")
    check(root.call("daemon.reload") == {"reloaded": True}, "reload revokes nobody")
    nb.expect_eof()
    check(len(nb.notes) == 1 and nb.notes[0][2][0]["name"] == "EPERM",
          "revoked by daemon.reload: %r" % nb.notes)
    check(root.call("ping", {"data": b"s"})["data"] == b"s", "root kept its connection")
    # An admin whose own daemon.reload takes it out of the allow lists: its
    # connection is closed with the notice (no answer), the daemon goes on.
    write(conf, "[policy]\nallow_users = nobody\nadmin_users = nobody\n")
    check(root.call("daemon.reload") == {"reloaded": True}, "nobody an admin")
    nb = client_as(d.sock, nobody)
    write(conf, "[policy]\nallow_users = 12345\n")
    msgid = nb.send("daemon.reload")
    nb.expect_eof()
    check(msgid not in nb.responses and len(nb.notes) == 1 and
          nb.notes[0][2][0]["name"] == "EPERM", "the caller revoked: %r %r"
          % (nb.responses, nb.notes))
    check(root.call("ping", {"data": b"t"})["data"] == b"t", "the daemon goes on")
    # A trace begun as an admin ends at a reload that takes the admin right
    # away, answered at once with what it recorded until then (outside probe
    # 16 E4: it showed every user's jobs in full for up to its 600 s); the
    # traces of callers still admins go on.  (The notifications each reload
    # sends are read, or the daemon's sd_notify would block on a full queue.)
    def drain():
        d.notify.sock.setblocking(False)
        try:
            while True:
                d.notify.next()
        except BlockingIOError:
            pass
        finally:
            d.notify.sock.settimeout(TIMEOUT)

    drain()
    write(conf, "[policy]\nallow_users = nobody\nadmin_users = nobody\n")
    check(root.call("daemon.reload") == {"reloaded": True}, "nobody an admin again")
    drain()
    nb = client_as(d.sock, nobody)
    tr = nb.send("trace", {"seconds": 600})
    check(nb.call("ping", {"data": b"u"})["data"] == b"u", "the trace began")
    rt = root.send("trace", {"seconds": 600})
    check(root.call("ping", {"data": b"v"})["data"] == b"v", "root's trace began")
    root.wait(small_task(root))
    n = len(d.logtext())
    write(conf, "[policy]\nallow_users = nobody\n")
    check(root.call("daemon.reload") == {"reloaded": True}, "nobody no longer an admin")
    drain()
    got = nb.wait(tr)
    check(got["end_us"] - got["start_us"] < 600 * 10**6, "ended early: %r" % got)
    mine = [j for j in got["jobs"] if j["name"] == "map"]
    check(len(mine) == 1 and mine[0]["client"] != 0,
          "root's job, run while nobody was an admin, in full: %r" % got["jobs"])
    check(re.search(r"notice: client \d+ \(pid \d+ uid %d gid \d+\): trace #%d ended at the "
                    r"reload: the caller is no longer an admin" % (nobody, tr),
                    d.logtext()[n:]), "the end logged:\n" + d.logtext()[n:])
    # From now on nobody's traces show root's jobs as "other".
    tr = nb.send("trace", {"seconds": 600})
    check(nb.call("ping", {"data": b"w"})["data"] == b"w", "a new trace began")
    root.wait(small_task(root))
    check(root.call("ping", {"data": b"x"})["data"] == b"x" and rt not in root.responses,
          "root's trace goes on")
    root.call("daemon.stop")
    got = nb.wait(tr)
    check([j["name"] for j in got["jobs"]] == ["other"], "anonymous now: %r" % got["jobs"])
    root.wait(rt)
    check(d.wait() == 0, "exit 0")


def mode_is(path, want, what):
    m = os.lstat(path).st_mode & 0o7777
    check(m == want, "%s: %s is mode %04o, want %04o" % (what, path, m, want))


def with_umask(mask, uid=None):
    """A preexec_fn: the child's umask (and user, when uid is given), so that
    what it creates does not depend on the test's own umask."""
    def f():
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.umask(mask)
    return f


def t_umask(exe, tmp):
    """Every file and directory dspkd makes has its documented mode whatever
    the umask (probe 22 E1, E2): the cache's directories 0700, the cache file
    and its -wal and -shm 0600, a new one and one rebuilt after corruption
    (SQLite made that one 0644 & ~umask: 0644 under umask 022), the state
    file's lock and the state file 0600, the socket 0660.  A daemon not run
    as root under umask 0777 (which made its cache unusable and a mode-000
    lock that refused every later start with a bare "Permission denied") then
    starts again under umask 022 with the same files; a lock file left mode
    000 is refused naming the path, its mode and the fix."""
    for mask in (0o000, 0o022, 0o777):
        what = "umask %03o" % mask
        d = os.path.join(tmp, "m%03o" % mask)
        os.mkdir(d)
        db, jobs = os.path.join(d, "new", "sub", "c.db"), os.path.join(d, "s.jobs")
        extra = ["--cache", db, "--job-state", jobs]
        a = Daemon(exe, tmp, extra, sock=os.path.join(d, "s.sock"),
                   preexec_fn=with_umask(mask))
        for x in ("new", "new/sub"):
            mode_is(os.path.join(d, x), 0o700, what)
        for x in ("", "-wal", "-shm"):
            mode_is(db + x, 0o600, what + ", a new cache")
        mode_is(jobs + ".lock", 0o600, what)
        mode_is(a.sock, 0o660, what)
        a.client().call("job.register", {"job": 7, "uid": 1000})
        mode_is(jobs, 0o600, what + ", the state file")
        a.stop()
        # Corrupt (a file of another mode: it makes no difference), rebuilt.
        with open(db, "wb") as f:
            f.write(b"junk" * 1000)
        os.chmod(db, 0o644)
        b = Daemon(exe, tmp, extra, sock=os.path.join(d, "s.sock"),
                   preexec_fn=with_umask(mask))
        check("was corrupt" in b.logtext() and "rebuilt it" in b.logtext(),
              "rebuilt: " + b.logtext())
        for x in ("", "-wal", "-shm"):
            mode_is(db + x, 0o600, what + ", a rebuilt cache")
        b.stop()

    if os.getuid() != 0:
        return
    # As uid 65534, under umask 0777, with the default socket under its
    # XDG_RUNTIME_DIR (the directory dspk made there 0700).
    nobody = 65534
    os.chmod(tmp, 0o711)
    w = os.path.join(tmp, "w")
    os.mkdir(w)
    os.chown(w, nobody, nobody)
    rt = os.path.join(w, "rt")
    os.mkdir(rt, 0o700)
    os.chown(rt, nobody, nobody)
    sock = os.path.join(rt, "dspk", "dspkd.sock")
    db, jobs = os.path.join(w, "sub", "c.db"), os.path.join(w, "s.jobs")
    extra = ["--cache", db, "--job-state", jobs]
    env = {"XDG_RUNTIME_DIR": rt}
    a = Daemon(exe, tmp, extra, sock=sock, socket_flag=False, env=env,
               preexec_fn=with_umask(0o777, nobody))
    check("in-memory" not in a.logtext(), "a usable cache: " + a.logtext())
    mode_is(os.path.dirname(sock), 0o700, "umask 777, uid 65534")
    mode_is(sock, 0o660, "umask 777, uid 65534")
    mode_is(os.path.join(w, "sub"), 0o700, "umask 777, uid 65534")
    for x in ("", "-wal", "-shm"):
        mode_is(db + x, 0o600, "umask 777, uid 65534")
    mode_is(jobs + ".lock", 0o600, "umask 777, uid 65534")
    a.stop()
    b = Daemon(exe, tmp, extra, sock=sock, socket_flag=False, env=env,
               preexec_fn=with_umask(0o022, nobody))
    check("in-memory" not in b.logtext(), "the same cache again: " + b.logtext())
    b.stop()
    # A lock file left mode 000 (by an older dspkd): refused, saying which
    # file, its mode and what to do.
    os.chmod(jobs + ".lock", 0)
    c = Daemon(exe, tmp, extra, sock=sock, socket_flag=False, env=env, ready=False,
               preexec_fn=with_umask(0o022, nobody))
    check(c.wait() == 2, "exit status 2: " + c.logtext())
    want = ("cannot lock %s.lock: Permission denied (mode 0000, owner uid 65534; dspkd runs "
            "as uid 65534 and must read and write it): chmod 600 it" % jobs)
    check(want in c.logtext(), "%r in the log: %s" % (want, c.logtext()))


def t_relsocket(exe, tmp):
    """A relative --socket, --cache and --config in the foreground are named
    absolute, as a detached daemon names them (probe 22 E3: "listening on
    u/s.sock" and status's daemon.socket "u/s.sock" told no one which file
    that was): the start log, status's daemon.socket and cache.stats' path.
    A relative socket whose absolute form is longer than a socket's 107
    bytes is still bound (as given) and named absolute."""
    for sub in ("u", "d" * 110):
        cwd = os.path.join(tmp, sub)
        os.mkdir(cwd)
        write(os.path.join(cwd, "r.conf"), "")
        sock, db, conf = (os.path.join(cwd, x) for x in ("r.sock", "r.db", "r.conf"))
        d = Daemon(exe, tmp, ["--socket", "r.sock", "--cache", "r.db", "--config", "r.conf"],
                   sock="r.sock", cwd=cwd)
        log = d.logtext()
        for line in ("info: listening on %s\n" % sock, "info: cache: %s\n" % db,
                     "info: configuration read from %s\n" % conf):
            check(line in log, "%r in the log: %s" % (line, log))
        here = os.getcwd()
        os.chdir(cwd)
        try:
            c = d.client()
            st = c.call("status")
            cs = c.call("cache.stats")
            c.close()
        finally:
            os.chdir(here)
        check(st["daemon"]["socket"] == sock, "daemon.socket %r, want %r"
              % (st["daemon"]["socket"], sock))
        check(cs["path"] == db, "cache.stats path %r, want %r" % (cs["path"], db))
        # Not d.stop(): cache.stats ran on libuv's thread pool, whose threads
        # stay to the exit (check_clean_exit counts them as the devices').
        d.proc.send_signal(signal.SIGTERM)
        check(d.wait() == 0, "exit status 0: " + d.logtext())
        check(not os.path.exists(sock), "the socket removed at the stop")


def exit_path(exe, tmp, how, want_rc, backends="cpu"):
    d = Daemon(exe, tmp, env={"DSPKD_TEST_EXIT": how}, backends=backends)
    a = d.client()
    t1 = long_task(a)
    wait_running(d.client(), owner=a, task=t1)
    d.proc.send_signal(signal.SIGHUP)
    if how == "fatal":
        check(a.outcome(t1) == "ECANCELED", "fatal: the running task is canceled and "
              "answered")
    a.expect_eof()
    rc = d.wait()
    log = d.logtext()
    check(rc == want_rc, "%s: exit status %d, want %d:\n%s" % (how, rc, want_rc, log))
    return d, log


def t_exits(exe, tmp):
    # exit() from the loop: the atexit handler closes each device on its runner
    # and joins it before libc's other exit handlers run.
    d, log = exit_path(exe, tmp, "atexit", 3)
    i_closed, i_done = log.find("cpu:0: device closed"), log.find("exit handler: 1 runner")
    check(0 <= i_closed < i_done, "device closed, then the handler finished:\n" + log)
    check("exit handler: canceled 1 running task" in log, "the running task canceled:\n" + log)
    # exit() from a thread that is neither the loop nor a runner: the running
    # task is canceled all the same (through its device, not the loop's
    # connections), the runner joined after it closed its device.
    d, log = exit_path(exe, tmp, "thread", 4)
    i_cancel = log.find("exit handler: canceled 1 running task")
    i_closed, i_done = log.find("cpu:0: device closed"), log.find("exit handler: 1 runner")
    check(0 <= i_cancel < i_closed < i_done, "thread: canceled, closed, joined:\n" + log)
    # exit() from a runner (as a backend calling it would): it closes its own
    # device on its own thread before the process ends.
    d = Daemon(exe, tmp, env={"DSPKD_TEST_EXIT": "runner"})
    a = d.client()
    d.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + TIMEOUT
    while "calls exit(5)" not in d.logtext():
        check(time.monotonic() < deadline, "SIGHUP taken:\n" + d.logtext())
        time.sleep(0.01)
    # An fft: tiny maps and reduces and small gemms may run on the loop thread
    # instead; an fft, which plans, always goes to the runner.
    x = {"dtype": "c64", "shape": [64], "data": bytes(64 * 8)}
    a.send("task.run", {"op": "fft", "device": "cpu:0", "inputs": [x]})
    a.expect_eof()
    rc = d.wait()
    log = d.logtext()
    check(rc == 5, "runner: exit status %d, want 5:\n%s" % (rc, log))
    i_exit, i_closed = log.find("calling exit(5) from the runner"), log.find("cpu:0: device closed")
    check(0 <= i_exit < i_closed < log.find("the calling runner's device closed"),
          "runner: its own device closed:\n" + log)
    # A fatal error in the loop: fast ordered stop, exit 1.
    d, log = exit_path(exe, tmp, "fatal", 1)
    check("fatal: test" in log, "logged the fatal error")
    d.check_clean_exit()
    check(not os.path.exists(d.sock), "socket removed")
    # A failure during the start after the devices opened.
    d = Daemon(exe, tmp, env={"DSPKD_TEST_EXIT": "startup-fail"}, ready=False)
    rc = d.wait()
    log = d.logtext()
    check(rc == 1, "startup failure: exit 1, got %d:\n%s" % (rc, log))
    check("cpu:0: cpu" in log, "the device had opened")
    d.check_clean_exit()
    check(not os.path.exists(d.sock), "no socket left")
    # The same, without the hook: a regular file where the socket goes.
    f = os.path.join(tmp, "file-in-the-way")
    write(f, "x")
    p = subprocess.run([exe, "--foreground", "--socket", f, "--backends", "cpu", "--config",
                        ""], stderr=subprocess.PIPE, timeout=TIMEOUT)
    check(p.returncode == 1 and os.path.isfile(f), "refused: %r" % p.stderr)
    # The end of main after SIGTERM (every device the build can open).
    d = Daemon(exe, tmp, backends=None)
    d.stop()
    # exit() with every device open.
    d, log = exit_path(exe, tmp, "atexit", 3, backends=None)
    opened = [x for x in re.findall(r"info: ([a-z]+:\d+): ", log) if "closed" not in x]
    for dev in set(opened):
        check("%s: device closed" % dev in log, "%s closed at exit:\n%s" % (dev, log))
    if os.environ.get("DSPK_LIFECYCLE_VERBOSE"):
        print(log)


def t_cycles(exe, tmp, count=200):
    """DSPK_LIFECYCLE_BACKENDS=all cycles every backend the build has (GPU hosts)."""
    backends = os.environ.get("DSPK_LIFECYCLE_BACKENDS", "cpu")
    sock = os.path.join(tmp, "cycle.sock")
    log = open(os.path.join(tmp, "cycles.log"), "w+")
    t0 = time.monotonic()
    for i in range(count):
        p = dspk_daemon.start([exe, "--foreground", "--socket", sock, "--config", "",
                               "--log-level", "warn", "--no-cache"] +
                              ([] if backends == "all" else ["--backends", backends]),
                              TIMEOUT, stderr=log)
        if p is None:
            log.seek(0)
            raise AssertionError("cycle %d: not ready:\n%s" % (i, log.read()[-3000:]))
        if i % 10 == 0:
            c = Client(sock, TIMEOUT)
            check(c.call("ping", {"data": b"%d" % i})["data"] == b"%d" % i, "ping")
            c.close()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(TIMEOUT)
        if rc != 0 or os.path.exists(sock):
            log.seek(0)
            raise AssertionError("cycle %d: exit %d, socket left %s:\n%s"
                                 % (i, rc, os.path.exists(sock), log.read()[-3000:]))
    print("%d start/stop cycles (backends: %s) in %.1f s"
          % (count, backends, time.monotonic() - t0))


GROUPS = {
    "notify": t_notify,
    "activation": t_activation,
    "abstract": t_abstract,
    "sigterm": t_sigterm,
    "sockreplaced": t_sockreplaced,
    "ownfiles": t_ownfiles,
    "cachefiles": t_cachefiles,
    "fast": t_fast,
    "vkcancel": t_vkcancel,
    "reload": t_reload,
    "reloadkeys": t_reloadkeys,
    "reloaddefault": t_reloaddefault,
    "hooks": t_hooks,
    "config": t_config,
    "exits": t_exits,
    "policy": t_policy,
    "policyreload": t_policyreload,
    "earlysig": t_earlysig,
    "ignored": t_ignored,
    "stopmetrics": t_stopmetrics,
    "stopcut": t_stopcut,
    "fdlimit": t_fdlimit,
    "cycles": t_cycles,
    "orphan": t_orphan,
    "umask": t_umask,
    "relsocket": t_relsocket,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspkd", required=True)
    ap.add_argument("group", choices=sorted(GROUPS))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dspkd-l-", dir="/tmp")
    try:
        t0 = time.monotonic()
        GROUPS[a.group](os.path.abspath(a.dspkd), tmp)
        print("ok %s (%.2f s)" % (a.group, time.monotonic() - t0))
    except BaseException:
        for d in DAEMONS:
            d.kill()
            sys.stderr.write("---- dspkd log ----\n" + d.logtext()[-4000:])
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
