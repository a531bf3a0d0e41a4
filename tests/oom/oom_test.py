#!/usr/bin/python3
"""Allocation-failure test of dspkd, in the style of libuv's test-loop-oom
and SQLite's malloc fault injection.

dspkd runs with tests/oom's shim preloaded (oom_shim.c).  A first
connection sends the request set below with no fault and the shim counts
the allocations it caused (C).  Then, for every N in 1..C+3, a fresh
connection arms the shim to fail the Nth allocation counted from its accept
and sends the same requests, one at a time; then the same again with the
Nth and every later allocation failing (until the next accept).  For every
N:
  - each request gets exactly one well-formed answer (a result or an error;
    a failed allocation answers ENOMEM or, where a later step fails, the
    error of that step), or the daemon closes the connection; it closes a
    connection only when a failed allocation leaves it unable to go on with
    it (reading: no buffer for the bytes; writing: no frame for an answer),
    never anything else;
  - the daemon stays up: it answers a ping on a new connection whenever a
    connection was closed, and at the end;
At the end SIGTERM must stop it with status 0: under ASan that includes
LeakSanitizer's check, so no failure path leaked.

    oom_test.py --dspkd PATH --shim PATH/liboom_shim.so [--max-n K]
"""
import argparse
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile

import msgpack
import numpy as np

TIMEOUT = 20.0


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def tensor(x):
    x = np.ascontiguousarray(x)
    name = {np.dtype("float32"): "f32", np.dtype("complex64"): "c64"}[x.dtype]
    return {"dtype": name, "shape": list(x.shape), "data": x.tobytes()}


A = np.arange(16, dtype=np.float32).reshape(4, 4)
X = (np.arange(8) + 1j).astype(np.complex64)
REQUESTS = [
    ("hello", {"version": 1, "client": "oom"}),
    ("ping", {"data": b"x" * 100}),
    ("buffer.create", {"size": 256 << 10, "device": "cpu:0"}),
    ("buffer.write", {"buffer": None, "offset": 0, "data": A.tobytes()}),
    # Larger than the first read buffer: its data is received in place.
    ("buffer.write", {"buffer": None, "offset": 4096, "data": bytes(range(256)) * 512}),
    ("buffer.read", {"buffer": None, "offset": 0, "size": 64}),
    ("task.run", {"op": "gemm", "device": "cpu:0", "inputs": [tensor(A), tensor(A)]}),
    ("task.run", {"op": "fft", "device": "cpu:0", "inputs": [tensor(X)]}),
    ("task.run", {"op": "gemm", "device": "cpu:0",
                  "inputs": [{"dtype": "f32", "shape": [4, 4], "buffer": None, "offset": 0},
                             tensor(A)],
                  "outputs": [{"buffer": None, "offset": 64}]}),
    ("task.run", {"op": "reduce", "device": "cpu:0", "inputs": [tensor(A)],
                  "options": {"fn": "sum"}}),
    ("status", {}),
    ("buffer.free", {"buffer": None}),
]


def with_buffer(args, buf):
    """Fills the None buffer ids of a request with buf."""
    if isinstance(args, dict):
        return {k: (buf if (k == "buffer" and v is None) else with_buffer(v, buf))
                for k, v in args.items()}
    if isinstance(args, list):
        return [with_buffer(v, buf) for v in args]
    return args


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(TIMEOUT)
        self.s.connect(path)
        self.up = msgpack.Unpacker(raw=False, max_buffer_size=1 << 30)
        self.msgid = 0

    def call(self, method, args):
        """The response [1, id, err, res], or None when the daemon closed."""
        self.msgid += 1
        try:
            self.s.sendall(msgpack.packb([0, self.msgid, method, [args]], use_bin_type=True))
        except (BrokenPipeError, ConnectionResetError):
            return None
        while True:
            for m in self.up:
                check(isinstance(m, list) and len(m) in (3, 4) and m[0] in (1, 2),
                      "bad message %r" % (m,))
                if m[0] == 2:
                    continue
                check(m[1] == self.msgid, "answer to %d while waiting for %d (a second "
                      "answer?)" % (m[1], self.msgid))
                check((m[2] is None) != (m[3] is None), "exactly one of error/result")
                if m[2] is not None:
                    e = m[2]
                    check(isinstance(e.get("code"), int) and e["code"] < 0 and
                          isinstance(e.get("name"), str) and e.get("message"),
                          "bad error %r" % (e,))
                return m
            try:
                data = self.s.recv(1 << 20)
            except ConnectionResetError:
                data = b""
            if not data:
                return None
            self.up.feed(data)

    def close(self):
        self.s.close()


def run_set(path):
    """Sends REQUESTS; returns (outcomes, closed): one 'ok' or error name per
    answered request, and whether the daemon closed the connection."""
    c = Conn(path)
    out = []
    buf = 1
    closed = False
    for method, args in REQUESTS:
        try:
            m = c.call(method, with_buffer(args, buf))
        except socket.timeout:
            raise AssertionError("%s (request %d) got no answer in %g s" %
                                 (method, len(out) + 1, TIMEOUT))
        if m is None:
            closed = True
            break
        if m[2] is None and method == "buffer.create":
            buf = m[3]["buffer"]
        out.append("ok" if m[2] is None else m[2]["name"])
    c.close()
    return out, closed


def ping(path):
    c = Conn(path)
    m = c.call("ping", {"data": b"alive"})
    c.close()
    check(m == [1, 1, None, {"data": b"alive"}], "the daemon answers a ping: %r" % (m,))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspkd", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--max-n", type=int, default=0, help="try at most this many N (0: all)")
    o = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dspk-oom-")
    sock = os.path.join(tmp, "dspkd.sock")
    ctl = os.path.join(tmp, "ctl")
    log = open(os.path.join(tmp, "dspkd.log"), "w+", errors="replace")  # it quotes client bytes

    def arm(n, persist=False):
        with open(ctl, "w") as f:
            f.write("%d%s\n" % (n, "+" if persist else ""))

    def logtext():
        log.flush()
        log.seek(0)
        return log.read()

    arm(0)
    env = dict(os.environ)
    env["DSPK_OOM_CTL"] = ctl
    pre = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = o.shim + (":" + pre if pre else "")
    # The shim comes before ASan's runtime in the library list; ASan works
    # behind it (the shim calls ASan's malloc), its start-up check is off.
    env["ASAN_OPTIONS"] = "verify_asan_link_order=0:detect_leaks=1:abort_on_error=1:" + \
        env.get("ASAN_OPTIONS", "")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    r, w = os.pipe()
    proc = subprocess.Popen([o.dspkd, "--foreground", "--socket", sock, "--ready-fd", str(w),
                             "--backends", "cpu", "--no-cache", "--log-level", "info"],
                            pass_fds=[w], stderr=log, env=env)
    os.close(w)
    ready, _, _ = select.select([r], [], [], TIMEOUT)
    check(ready and os.read(r, 16) == b"READY\n", "dspkd did not become ready")
    os.close(r)
    tally = {}
    errors = {}
    try:
        # The reference run: everything succeeds; count its allocations.
        base, closed = run_set(sock)
        check(not closed and base == ["ok"] * len(REQUESTS), "reference run: %r" % base)
        ping(sock)  # its accept writes the count of the reference run
        with open(ctl + ".count") as f:
            count = int(f.read())
        check(count > 10, "the shim counted %d allocations (is it loaded?)" % count)
        last = count + 3
        if o.max_n:
            last = min(last, o.max_n)
        for persist in (False, True):
            what = "allocations %d and later" if persist else "allocation %d"
            for n in range(1, last + 1):
                arm(n, persist)
                try:
                    out, closed = run_set(sock)
                except AssertionError as e:
                    raise AssertionError("%s failed: %s\n%s" % (what % n, e,
                                                                  logtext()[-3000:]))
                arm(0)
                if proc.poll() is not None:
                    raise AssertionError("dspkd died when %s failed:\n%s"
                                         % (what % n, logtext()[-8000:]))
                for x in out:
                    if x != "ok":
                        errors[x] = errors.get(x, 0) + 1
                key = ("persistent " if persist else "") + ("closed" if closed
                                                            else "all answered")
                tally[key] = tally.get(key, 0) + 1
                if closed:
                    ping(sock)
        ping(sock)
        # Failing allocations must show up as answers, or this test tests
        # nothing.
        check(errors.get("ENOMEM", 0) > 0, "no ENOMEM answer at all: %r" % errors)
        ok = True
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    text = logtext()
    print("oom_test: %d allocations per request set; N = 1..%d: %r; error answers: %r"
          % (count, last, tally, dict(sorted(errors.items()))))
    bad = [ln for ln in text.splitlines() if "Sanitizer" in ln or "runtime error:" in ln]
    if proc.returncode != 0 or bad or not ok:
        sys.stderr.write(text[-20000:])
        print("oom_test: FAILED: exit status %d, %d sanitizer lines" % (proc.returncode,
                                                                       len(bad)))
        return 1
    for f in os.listdir(tmp):
        os.unlink(os.path.join(tmp, f))
    os.rmdir(tmp)
    print("oom_test: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
