#!/usr/bin/python3
"""The Python client's data paths on cpu:0, side by side in one run: each case with the
automatic shared-memory path (operands and results of at least shared_threshold bytes
through shared temporaries) against the socket (shared_threshold 0), and buffer.read
answers received in place against the unpacker's copies.

    bench_paths.py --dspkd build/daemon/dspkd [--reps 7]

Cases:
  gemm 2048^2 f32, numpy in and out:  numpy a @ b | shared temporaries | the socket
  fft c64 2^20, numpy in and out:     numpy.fft.fft | shared temporaries | the socket
  DeviceArray.numpy() of 64 MiB:      received in place | through the unpacker
The sides take turns in every repetition; each line: median and spread (min .. max).
Starts its own dspkd (--backends cpu --no-cache) on a private socket; imports dspk from
python/ of this tree unless it is installed.
"""
import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

import numpy as np

try:
    import dspk
    from dspk import _client
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "python"))
    import dspk
    from dspk import _client


# The timing helpers and the daemon start of bench_python.py (same folder).
from bench_python import interleaved, line, start_daemon  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dspkd", required=True)
    ap.add_argument("--reps", type=int, default=7)
    opt = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dspk-bench-")
    proc, sock = start_daemon(opt.dspkd, tmp)
    try:
        c = dspk.connect(sock, name="bench_paths")
        s = dspk.connect(sock, name="bench_paths-socket")
        s.shared_threshold = 0
        print("# %s, %d cpus, load average %s at start" % (
            time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.cpu_count(),
            " ".join("%.2f" % v for v in os.getloadavg())))
        rng = np.random.default_rng(1)
        n = 2048
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        ref = a @ b
        for cl in (c, s):
            assert np.allclose(cl.gemm(a, b, device="cpu:0"), ref, rtol=1e-3, atol=1e-2)
        t = interleaved([lambda: a @ b, lambda: c.gemm(a, b, device="cpu:0"),
                         lambda: s.gemm(a, b, device="cpu:0")], opt.reps)
        for name, v in zip(("numpy a @ b", "dspk, shared temporaries", "dspk, socket"), t):
            print(line("gemm 2048^2 f32  " + name, v))
        print("gemm ratios (numpy / dspk): shared temporaries %.3f, socket %.3f" % (
            statistics.median(t[0]) / statistics.median(t[1]),
            statistics.median(t[0]) / statistics.median(t[2])))

        x = (rng.standard_normal(1 << 20) + 1j * rng.standard_normal(1 << 20)).astype(
            np.complex64)
        t = interleaved([lambda: np.fft.fft(x), lambda: c.fft(x, device="cpu:0"),
                         lambda: s.fft(x, device="cpu:0")], opt.reps)
        for name, v in zip(("numpy.fft.fft", "dspk, shared temporaries", "dspk, socket"), t):
            print(line("fft 2^20 c64     " + name, v))
        print("fft ratios (numpy / dspk): shared temporaries %.3f, socket %.3f" % (
            statistics.median(t[0]) / statistics.median(t[1]),
            statistics.median(t[0]) / statistics.median(t[2])))

        big = np.ones(16 << 20, np.float32)  # 64 MiB
        d = c.to_device(big, "cpu:0")
        direct = _client._DIRECT_MIN

        def unpacked():
            _client._DIRECT_MIN = 1 << 62
            try:
                return d.numpy()
            finally:
                _client._DIRECT_MIN = direct

        t = interleaved([d.numpy, unpacked], opt.reps, warm=1)
        print(line("DeviceArray.numpy() 64 MiB, in place", t[0]))
        print(line("DeviceArray.numpy() 64 MiB, unpacker", t[1]))
        print("# load average at end %s" % " ".join("%.2f" % v for v in os.getloadavg()))
        d.free()
        c.close()
        s.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()


if __name__ == "__main__":
    main()
