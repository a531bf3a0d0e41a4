#!/usr/bin/env python3
"""Shared arrays (Client.empty_shared) against numpy in one run, interleaved:
gemm 2048^2 f32 (numpy's a @ b vs c.gemm(a, b, out=o) with a, b, o shared; and numpy's
matmul on the shared arrays themselves, which tells what their 4 KiB pages cost against
numpy's huge pages), fft 2^20 c64 (numpy.fft.fft vs c.fft(x, out=y)), and the bytes one
task request puts on the socket.  Each timed call starts after a pause (--settle, 0.5 s):
OpenBLAS's worker threads, numpy's as the daemon's, busy-wait for about 0.1 s after a
call, and on a 2-core machine they would take a core from whichever side runs next.

    python3 bench/python/bench_shared.py --dspkd build/daemon/dspkd [--reps 7]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "python"))
import dspk  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from pydaemon import start_daemon, wait_fftw  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspkd", required=True)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--settle", type=float, default=0.5)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="dspk-bsh-")
    # A cache, as a user's daemon has: FFTW_MEASURE plans (the fft is timed on the
    # measured one, not on the provisional plan run while it is measured)
    p, sock = start_daemon(a.dspkd, d, cache=True)
    try:
        return run(a, sock, p.pid)
    finally:  # the daemon holds this process's stdout: never leave it behind
        p.terminate()
        p.wait()


def run(a: argparse.Namespace, sock: str, pid: int) -> int:
    c = dspk.connect(sock)
    print("# %s, load average %s" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                      " ".join(open("/proc/loadavg").read().split()[:3])))
    n = 2048
    rng = np.random.default_rng(0)
    A, B = rng.random((n, n), np.float32), rng.random((n, n), np.float32)
    sa, sb, so = (c.empty_shared((n, n), np.float32) for _ in range(3))
    sa[:], sb[:] = A, B
    nf = 1 << 20
    X = (rng.standard_normal(nf) + 1j * rng.standard_normal(nf)).astype(np.complex64)
    sx, sy = c.empty_shared(nf, np.complex64), c.empty_shared(nf, np.complex64)
    sx[:] = X
    sent = []
    orig = c._send_chunks

    def counting(ch, *rest, **kw):
        # whatever the client's own signature: every argument passes through
        sent.append(sum(memoryview(x).nbytes for x in ch))
        return orig(ch, *rest, **kw)
    c._send_chunks = counting
    res = {"gemm numpy": [], "gemm shared": [], "fft numpy": [], "fft shared": [],
           "gemm numpy on the shared arrays": []}
    so2 = np.empty((n, n), np.float32)

    def timed(f):
        time.sleep(a.settle)
        t = time.perf_counter()
        f()
        return time.perf_counter() - t
    c.gemm(sa, sb, out=so)  # gemm's thread count tuned, fft's plan measured first
    c.fft(sx, out=sy)
    wait_fftw(pid)
    for i in range(a.reps + 1):
        t1 = timed(lambda: A @ B)
        t2 = timed(lambda: c.gemm(sa, sb, out=so))
        t3 = timed(lambda: np.fft.fft(X))
        t4 = timed(lambda: c.fft(sx, out=sy))
        t5 = timed(lambda: np.matmul(sa, sb, out=so2))
        if i:  # the first round warms up
            for k, v in zip(res, (t1, t2, t3, t4, t5)):
                res[k].append(v * 1e3)
    np.testing.assert_allclose(so, A @ B, rtol=1e-3)
    np.testing.assert_allclose(sy, np.fft.fft(X), rtol=1e-2, atol=1e-2)
    for k, v in res.items():
        print("| %s | %.1f | %.1f .. %.1f |" % (k, statistics.median(v), min(v), max(v)))
    print("gemm ratio numpy/shared %.3f, fft ratio numpy/shared %.2f"
          % (statistics.median(res["gemm numpy"]) / statistics.median(res["gemm shared"]),
             statistics.median(res["fft numpy"]) / statistics.median(res["fft shared"])))
    print("bytes sent per task request: max %d" % max(sent))
    c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
