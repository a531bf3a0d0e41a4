"""What the Python benchmarks share: a dspkd on the cpu backend for one run.

Imported by bench/datapath/bench_fresh.py, bench/datapath/bench_numpy.py
and bench/python/bench_python.py (each puts bench/common on sys.path).
"""
import os
import select
import subprocess
import sys


def start_daemon(exe, tmp):
    """Starts exe (dspkd) on a socket in tmp, cpu backend, no cache; returns
    (process, socket path) once it wrote READY, or exits."""
    sock = os.path.join(tmp, "dspkd.sock")
    r, w = os.pipe()
    proc = subprocess.Popen([exe, "--foreground", "--socket", sock, "--backends", "cpu",
                             "--no-cache", "--ready-fd", str(w)], pass_fds=[w],
                            stderr=subprocess.DEVNULL)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 60)
    if not ready or os.read(r, 16) != b"READY\n":
        proc.kill()
        sys.exit("dspkd did not start")
    os.close(r)
    return proc, sock
