#!/usr/bin/python3
"""The Python client against numpy and against the C client, side by side in one run.

    bench_python.py --dspkd build/daemon/dspkd --submit build/client/submit/dspk-submit
    bench_python.py --socket PATH --submit ...      (a daemon already running)

Cases (docs/performance.md, "Python client"):
  gemm 2048x2048 f32, numpy arrays in, numpy result out  vs numpy's a @ b
  (and with operands and result kept in the daemon: DeviceArrays, out=)
  fft c64 2^20                                            vs numpy.fft.fft
  ping round trip from Python                             vs `dspk-submit ping -c N`
The two sides of a comparison take turns in every repetition; each gemm starts after a
pause (--settle, 0.5 s), since OpenBLAS's workers busy-wait after a call; gemm is timed
twice: right after the pause, and right after an untimed gemm of its own side (a loop's
steady state).
Each line: median, and the spread (min .. max) over the repetitions.  The daemon of
--dspkd is started on a private socket with --backends cpu (the cpu:0 device: the same
OpenBLAS as numpy's, and FFTW) and a cache file in a temporary directory, as a user's
daemon has (FFTW_MEASURE plans: the fft is timed once the daemon's measured plan is
in place, not on the provisional one it runs meanwhile), so it shares this machine's
cores with the client.
Import dspk from python/ of this tree unless it is installed.
"""
import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import dspk
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "python"))
    import dspk


def timed(fn, reps, warm=2):
    for _ in range(warm):
        fn()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return t


def interleaved(fns, reps, warm=2, settle=0.0, lead=0):
    """Times of each fn, the fns taking turns in every repetition (fair under a load
    that changes during the run), each timed call `settle` seconds after the last
    and right after `lead` untimed calls of the same fn."""
    for fn in fns:
        for _ in range(warm):
            fn()
    t = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            if settle:
                time.sleep(settle)
            for _ in range(lead):
                fn()
            t0 = time.perf_counter()
            fn()
            t[i].append(time.perf_counter() - t0)
    return t


def line(name, t, unit=1e3, u="ms"):
    return "%-34s median %9.3f %s  (min %9.3f .. max %9.3f, n=%d)" % (
        name, statistics.median(t) * unit, u, min(t) * unit, max(t) * unit, len(t))


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from pydaemon import start_daemon, wait_fftw  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dspkd", help="start this dspkd on a private socket")
    ap.add_argument("--socket", help="use the daemon at this socket")
    ap.add_argument("--submit", help="dspk-submit, for the C client's ping")
    ap.add_argument("--reps", type=int, default=9, help="repetitions of gemm and fft")
    ap.add_argument("--pings", type=int, default=5000, help="round trips per ping run")
    ap.add_argument("--settle", type=float, default=0.5,
                    help="seconds of pause before each timed gemm (0: none)")
    opt = ap.parse_args()
    proc = None
    tmp = tempfile.mkdtemp(prefix="dspk-bench-")
    if opt.dspkd:
        proc, sock = start_daemon(opt.dspkd, tmp, cache=True)
    else:
        sock = opt.socket or dspk.default_socket()
    try:
        c = dspk.connect(sock, name="bench_python")
        rng = np.random.default_rng(1)
        print("# %s, %s, %d cpus, load average %s at start" % (
            time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), platform.processor()
            or platform.machine(), os.cpu_count(), " ".join("%.2f" % v for v in
                                                           os.getloadavg())))
        print("# python %s, numpy %s, dspkd %s, device cpu:0" % (
            platform.python_version(), np.__version__, c.daemon_version))

        n = 2048
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        ref = a @ b
        got = c.gemm(a, b, device="cpu:0")
        assert np.allclose(got, ref, rtol=1e-3, atol=1e-2), "gemm result differs"
        da, db = c.to_device(a, "cpu:0"), c.to_device(b, "cpu:0")
        dc = c.empty((n, n), np.float32, "cpu:0")
        # OpenBLAS's workers, numpy's as the daemon's, busy-wait for about 0.1 s after
        # a call: on a 2-core machine they would take a core from whichever side runs
        # next, so each gemm starts after a pause (as bench_shared.py's)
        t_np, t_dk, t_dev = interleaved([lambda: a @ b,
                                         lambda: c.gemm(a, b, device="cpu:0"),
                                         lambda: c.gemm(da, db, out=dc)], opt.reps,
                                        settle=opt.settle)
        # The same, each timed gemm right after an untimed one of its own side: a loop's
        # steady state, with no idle memory (a pause leaves written pages slow to touch
        # again on some virtual machines: docs/performance.md)
        b_np, b_dk, b_dev = interleaved([lambda: a @ b,
                                         lambda: c.gemm(a, b, device="cpu:0"),
                                         lambda: c.gemm(da, db, out=dc)], opt.reps,
                                        settle=opt.settle, lead=1)
        assert np.allclose(dc.numpy(), ref, rtol=1e-3, atol=1e-2), "gemm result differs"
        for d in (da, db, dc):
            d.free()
        for how, (n_, k_, v_) in (("after a pause", (t_np, t_dk, t_dev)),
                                  ("back to back", (b_np, b_dk, b_dev))):
            print("# gemm, each timed call %s" % how)
            print(line("gemm 2048^2 f32  numpy a @ b", n_))
            print(line("gemm 2048^2 f32  dspk c.gemm", k_))
            print(line("gemm 2048^2 f32  dspk DeviceArrays", v_))
            print("%-34s %.3f (numpy median / dspk median; >1: dspk faster)" % (
                "gemm  ratio", statistics.median(n_) / statistics.median(k_)))
            print("%-34s %.3f (numpy median / DeviceArray median)" % (
                "gemm  ratio, DeviceArrays", statistics.median(n_) / statistics.median(v_)))

        x = (rng.standard_normal(1 << 20) + 1j * rng.standard_normal(1 << 20)).astype(
            np.complex64)
        got = c.fft(x, device="cpu:0")
        assert np.allclose(got, np.fft.fft(x), rtol=1e-3, atol=1e-1), "fft result differs"
        if proc:  # the daemon's measured plan, as a user's daemon keeps in its cache
            wait_fftw(proc.pid)
            c.fft(x, device="cpu:0")
        t_np, t_dk = interleaved([lambda: np.fft.fft(x),
                                  lambda: c.fft(x, device="cpu:0")], opt.reps)
        print(line("fft 2^20 c64     numpy.fft.fft", t_np))
        print(line("fft 2^20 c64     dspk c.fft", t_dk))
        print("%-34s %.3f (numpy median / dspk median; >1: dspk faster)" % (
            "fft   ratio", statistics.median(t_np) / statistics.median(t_dk)))

        t_py = timed(c.ping, opt.pings, warm=100)
        print(line("ping             python c.ping()", t_py, 1e6, "us"))
        if opt.submit:
            out = subprocess.run([opt.submit, "--socket", sock, "ping", "-c",
                                  str(opt.pings), "--json"], check=True,
                                 capture_output=True, text=True).stdout
            j = json.loads(out.strip().splitlines()[-1])
            print("%-34s median %9.3f us  (min %9.3f .. p99 %9.3f, n=%d)" % (
                "ping             C dspk-submit", j["median_us"], j["min_us"],
                j.get("p99_us", float("nan")), j["count"]))
            print("%-34s %.3f (python median / C median; <= 2 wanted)" % (
                "ping  ratio", statistics.median(t_py) * 1e6 / j["median_us"]))
        print("# load average at end %s" % " ".join("%.2f" % v for v in os.getloadavg()))
        c.close()
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            proc.wait()


if __name__ == "__main__":
    main()
