"""Starting and stopping a dspkd for the Python end-to-end tests, shared by
tests/daemon/dspkd_test.py, tests/observe, tests/cluster/jobs_test.py and
python/tests (conftest.py): the daemon runs in the foreground and says READY
on --ready-fd when it serves (the tests wait for that, never sleep), and
stops on SIGTERM.  Needs only python3."""
import os
import select
import signal
import subprocess


def cmdline(exe, sock, extra=(), backends="cpu"):
    """dspkd's command line for a test: in the foreground on sock, debug log
    (unless extra has --log-level), then extra; backends (unless extra has
    --backends) and no cache (never the user's ~/.cache, unless extra has
    --cache or --no-cache).  dspkd refuses an option given twice."""
    extra = list(extra)
    args = [exe, "--foreground", "--socket", sock] + \
        ([] if "--log-level" in extra else ["--log-level", "debug"]) + extra
    if "--backends" not in extra:
        args += ["--backends", backends]
    if "--cache" not in extra and "--no-cache" not in extra:
        args += ["--no-cache"]
    return args


def start(args, timeout, **popen):
    """Runs the command line args with --ready-fd added (popen: more
    subprocess.Popen arguments) and waits up to timeout seconds for READY.
    Returns the process, or None when it did not become ready (it is then
    killed and reaped; its log says why)."""
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(list(args) + ["--ready-fd", str(w)], pass_fds=[w], **popen)
    finally:
        os.close(w)
    ready, _, _ = select.select([r], [], [], timeout)
    data = os.read(r, 16) if ready else b""
    os.close(r)
    if data != b"READY\n":
        proc.kill()
        proc.wait()
        return None
    return proc


def stop(proc, timeout):
    """Sends SIGTERM (unless the process has exited) and returns the exit
    status, or None when it did not exit within timeout seconds (it is then
    killed and reaped)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def become(uid, gid):
    """Makes this process uid and gid with no supplementary groups: how a
    test's child (a fork or a preexec_fn) acts as another user."""
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def fork_as(uid, gid, fn):
    """Forks a child that becomes uid and gid (no supplementary groups) and
    calls fn(to_parent, from_parent) with the write end of one pipe to the
    parent and the read end of another from it; the child exits 0 when fn
    returns, 1 when it raises.  Returns (pid, from_child, to_child) in the
    parent: the child's pid and the parent's ends of the two pipes (the
    child's ends are closed here).  The caller closes its ends and reaps the
    child (os.waitpid).  How the tests act as another user while they talk
    to it (they run as root)."""
    from_child, to_parent = os.pipe()
    from_parent, to_child = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(from_child)
            os.close(to_child)
            become(uid, gid)
            fn(to_parent, from_parent)
            code = 0
        finally:
            os._exit(code)
    os.close(to_parent)
    os.close(from_parent)
    return pid, from_child, to_child


def read_to_eof(fd):
    """Everything readable from fd until its end (a child's pipe); closes fd."""
    data = b""
    while True:
        more = os.read(fd, 1 << 16)
        if not more:
            break
        data += more
    os.close(fd)
    return data


def run_as(uid, gid, fn):
    """Runs fn() in a child process as uid and gid (no supplementary groups)
    and returns what it returned, which must be msgpack-able; raises
    AssertionError when the child failed.  How the tests act as another user
    (they run as root)."""
    import msgpack
    pid, r, w = fork_as(uid, gid, lambda out, _: os.write(out, msgpack.packb(fn())))
    os.close(w)
    data = read_to_eof(r)
    _, status = os.waitpid(pid, 0)
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        raise AssertionError("the child as uid %d failed (status %d)" % (uid, status))
    return msgpack.unpackb(data)


def activate(args, address, timeout, env=None):
    """Runs the dspkd command line args under systemd-socket-activate, listening on
    address (a path, or "@name" for an abstract socket, as systemd's ListenStream=
    takes it); env: variables passed to dspkd (with the sanitizers' options of this
    process).  Returns the activator's process once it listens (dspkd is executed
    in its place at the first connection; its log is the process's stderr, a pipe:
    read it with proc.stderr.read() after the stop), or None when
    systemd-socket-activate is missing."""
    import shutil
    sa = shutil.which("systemd-socket-activate") or "/usr/bin/systemd-socket-activate"
    if not os.path.exists(sa):
        return None
    cmd = [sa, "-l", address]
    e = dict(env or {})
    for v in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
        if v in os.environ:
            e.setdefault(v, os.environ[v])
    for k, v in e.items():
        cmd += ["-E", "%s=%s" % (k, v)]
    proc = subprocess.Popen(cmd + list(args), stderr=subprocess.PIPE)
    ready, _, _ = select.select([proc.stderr], [], [], timeout)
    first = proc.stderr.readline().decode() if ready else ""
    if not first.startswith("Listening on"):
        proc.kill()
        proc.wait()
        raise AssertionError("systemd-socket-activate did not listen: %r" % first)
    return proc
