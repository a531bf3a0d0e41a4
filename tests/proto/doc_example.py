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

usage: doc_example.py DSPKD PROTOCOL_MD"""
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


def main():
    exe, md = sys.argv[1], sys.argv[2]
    code = compile(example(md), "docs/protocol.md: Example (Python)", "exec")
    signal.signal(signal.SIGALRM, on_alarm)
    tmp = tempfile.mkdtemp(prefix="dspk-docex-")
    sock = os.path.join(tmp, "d.sock")
    log = open(os.path.join(tmp, "d.log"), "w+", errors="replace")
    proc = dspk_daemon.start(dspk_daemon.cmdline(exe, sock), TIMEOUT, stderr=log)
    if proc is None:
        log.seek(0)
        sys.stderr.write(log.read())
        raise Fail("dspkd did not start")
    os.environ["DSPK_SOCKET"] = sock
    try:
        # As written: hello and a gemm.
        ns = {"__name__": "doc_example"}
        signal.alarm(TIMEOUT)
        exec(code, ns)
        signal.alarm(0)
        np = ns["np"]
        check(np.allclose(ns["c"], ns["a"] @ ns["b"], rtol=1e-5), "the gemm's result")
        call = ns["call"]

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
    print("ok: the example of docs/protocol.md")


if __name__ == "__main__":
    main()
