#!/usr/bin/env python3
"""The "Example (Python)" of docs/protocol.md, run as written against a real
dspkd: the block is read from the page and executed with $DSPK_SOCKET naming
the daemon's socket, then its call() is used where the page says the daemon
may send what a naive client mishandles:
 - an answer longer than msgpack-python's default max_buffer_size (100 MiB):
   a buffer.read of 110 MiB (the daemon sends up to max_message - 64 data
   bytes), which raised BufferFull;
 - a protocol.error before the daemon closes the connection (a ping nested
   deeper than max_depth): call() must raise, naming it (it looped on
   recv() returning b"" at 100% CPU);
 - the end of the stream with no notice (the notice is sent only if the
   socket takes it at once): a peer that reads the request and closes.
Each wait is bounded by an alarm: a client that spins fails, it does not hang.

The example finds the socket by the page's "Connecting" rule (probe 18 A1: it
read $XDG_RUNTIME_DIR unchecked, a KeyError when unset and a relative path
when empty, and knew neither /run/dspk, Slurm jobs nor @name): its
socket_path() is checked against a table written from that rule (euid and
environment set for each row), and the block runs as written, against the
daemon, found through $DSPK_SOCKET, through $XDG_RUNTIME_DIR (as a user
other than root: the euid the block sees) and, under systemd-socket-activate,
through $DSPK_SOCKET=@name (an abstract socket).

usage: doc_example.py DSPKD PROTOCOL_MD"""
import contextlib
import os
import re
import signal
import socket
import sys
import tempfile
import threading

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import dspk_daemon  # noqa: E402

TIMEOUT = 60


class Fail(AssertionError):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def example(md):
    text = open(md).read()
    m = re.search(r"^## Example \(Python\)\n.*?^```python\n(.*?)^```$", text, re.S | re.M)
    check(m, "no ```python block under \"## Example (Python)\" in %s" % md)
    return m.group(1)


def on_alarm(signum, frame):
    raise Fail("the example's call() did not return within %d s (a busy loop?)" % TIMEOUT)


def raises(fn, exc, *words):
    signal.alarm(TIMEOUT)
    try:
        fn()
    except exc as e:
        for w in words:
            check(w in str(e), "%r lacks %r" % (str(e), w))
        return
    finally:
        signal.alarm(0)
    raise Fail("no %s raised" % exc.__name__)


ENV = ("DSPK_SOCKET", "XDG_RUNTIME_DIR", "SLURM_JOB_ID")


@contextlib.contextmanager
def as_env(euid, **env):
    """The block's view: os.geteuid() answers euid, and of ENV only the
    variables in env are set (as given, "" included)."""
    saved = {k: os.environ.get(k) for k in ENV}
    real = os.geteuid
    os.geteuid = lambda: euid
    for k in ENV:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        yield
    finally:
        os.geteuid = real
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_example(code, euid, **env):
    """Executes the block as written, with euid and env (as_env); its
    namespace."""
    ns = {"__name__": "doc_example"}
    with as_env(euid, **env):
        signal.alarm(TIMEOUT)
        exec(code, ns)
        signal.alarm(0)
    np = ns["np"]
    check(np.allclose(ns["c"], ns["a"] @ ns["b"], rtol=1e-5), "the gemm's result")
    return ns


# "Connecting", row by row: (euid, environment, the socket).
RUN = "/run/dspk/dspkd.sock"
PATHS = [
    (1000, {"DSPK_SOCKET": "/s/d.sock", "XDG_RUNTIME_DIR": "/x"}, "/s/d.sock"),
    (0, {"DSPK_SOCKET": "/s/d.sock"}, "/s/d.sock"),
    (1000, {"DSPK_SOCKET": "/s/d.sock", "SLURM_JOB_ID": "7"}, "/s/d.sock"),
    (1000, {"DSPK_SOCKET": "@dspk"}, "@dspk"),
    (1000, {"XDG_RUNTIME_DIR": "/run/user/1000"}, "/run/user/1000/dspk/dspkd.sock"),
    (1000, {"DSPK_SOCKET": "", "XDG_RUNTIME_DIR": "/x"}, "/x/dspk/dspkd.sock"),
    (1000, {}, RUN),                                   # unset: was a KeyError
    (1000, {"XDG_RUNTIME_DIR": ""}, RUN),              # empty: was "dspk/dspkd.sock"
    (1000, {"XDG_RUNTIME_DIR": "rel"}, RUN),           # relative: was "rel/dspk/..."
    (0, {"XDG_RUNTIME_DIR": "/run/user/0"}, RUN),      # root: the node's daemon
    (1000, {"XDG_RUNTIME_DIR": "/x", "SLURM_JOB_ID": "7"}, RUN),  # a Slurm job
]


def main():
    exe, md = sys.argv[1], sys.argv[2]
    code = compile(example(md), "docs/protocol.md: Example (Python)", "exec")
    signal.signal(signal.SIGALRM, on_alarm)
    tmp = tempfile.mkdtemp(prefix="dspk-docex-")
    # Where $XDG_RUNTIME_DIR=tmp puts it.
    os.mkdir(os.path.join(tmp, "dspk"))
    sock = os.path.join(tmp, "dspk", "dspkd.sock")
    log = open(os.path.join(tmp, "d.log"), "w+", errors="replace")
    proc = dspk_daemon.start(dspk_daemon.cmdline(exe, sock), TIMEOUT, stderr=log)
    if proc is None:
        log.seek(0)
        sys.stderr.write(log.read())
        raise Fail("dspkd did not start")
    os.environ["DSPK_SOCKET"] = sock
    try:
        # As written: hello and a gemm, with $DSPK_SOCKET naming the socket.
        ns = run_example(code, os.geteuid(), DSPK_SOCKET=sock)
        call = ns["call"]
        # The socket path rule, row by row.
        for euid, env, want in PATHS:
            with as_env(euid, **env):
                got = ns["socket_path"]()
            check(got == want, "socket_path() as uid %d with %r: %r, not %r"
                  % (euid, env, got, want))
        # As written, found through $XDG_RUNTIME_DIR (a user other than root).
        run_example(code, 1000, XDG_RUNTIME_DIR=tmp)["s"].close()
        # A lone "@" names nothing.
        with as_env(1000, DSPK_SOCKET="@"):
            raises(lambda: exec(code, {"__name__": "doc_example"}), ValueError,
                   "abstract socket name after '@' is empty")

        # An answer over 100 MiB (well within max_message - 64 by default).
        n = 110 << 20
        signal.alarm(TIMEOUT)
        b = call(3, "buffer.create", {"device": "cpu:0", "size": n})["buffer"]
        data = call(4, "buffer.read", {"buffer": b})["data"]
        signal.alarm(0)
        check(len(data) == n, "buffer.read of %d bytes: got %d" % (n, len(data)))
        del data

        # protocol.error, then the daemon closes: call() raises, naming it.
        v = 1
        for _ in range(20):
            v = [v]
        raises(lambda: call(5, "ping", {"data": b"x", "extra": v}), ConnectionError,
               "ELIMIT", "max_depth")

        # The end of the stream with no notice: a peer that reads the request
        # and closes.
        a, peer = socket.socketpair()

        def close_after_request():
            peer.recv(4096)
            peer.close()
        t = threading.Thread(target=close_after_request)
        t.start()
        ns["s"] = a
        ns["unpacker"] = msgpack.Unpacker(raw=False, max_buffer_size=0)
        raises(lambda: call(6, "ping"), ConnectionError)
        t.join()
        a.close()

        # The daemon still serves a fresh run of the example.
        ns = {"__name__": "doc_example"}
        signal.alarm(TIMEOUT)
        exec(code, ns)
        signal.alarm(0)
        ns["s"].close()
    finally:
        rc = dspk_daemon.stop(proc, TIMEOUT)
    if rc != 0:
        log.seek(0)
        sys.stderr.write(log.read()[-6000:])
    check(rc == 0, "dspkd exited %r" % rc)
    abstract = abstract_socket(exe, code, tmp)
    print("ok: the example of docs/protocol.md%s" % abstract)


def abstract_socket(exe, code, tmp):
    """The block as written with $DSPK_SOCKET=@name, against a daemon on an
    activated abstract socket (dspkd binds none itself); what to add to the
    final line (a note when systemd-socket-activate is missing)."""
    name = "dspk-test-docex-%d" % os.getpid()
    args = dspk_daemon.cmdline(exe, "@unused", ["--log-level", "info"])
    args = args[:args.index("--socket")] + args[args.index("--socket") + 2:]
    p = dspk_daemon.activate(args + ["--config", ""], "@" + name, TIMEOUT,
                             env={"RUNTIME_DIRECTORY": tmp})
    if p is None:
        return " (not @name: systemd-socket-activate is missing)"
    try:
        run_example(code, 1000, DSPK_SOCKET="@" + name)["s"].close()
    finally:
        rc = dspk_daemon.stop(p, TIMEOUT)
        text = p.stderr.read().decode(errors="replace")
    check(rc == 0, "the activated dspkd exited %r:\n%s" % (rc, text[-6000:]))
    return ", $DSPK_SOCKET=@name included"


if __name__ == "__main__":
    main()
