"""What the Python benchmarks share: a dspkd on the cpu backend for one run.

Imported by bench/datapath/bench_fresh.py, bench/datapath/bench_numpy.py,
bench/python/bench_python.py and bench/python/bench_shared.py (each puts
bench/common on sys.path).
"""
import glob
import os
import select
import subprocess
import sys
import time


def start_daemon(exe, tmp, cache=False):
    """Starts exe (dspkd) on a socket in tmp, cpu backend, no cache (cache:
    a cache file in tmp, as a user's daemon has: FFTW_MEASURE plans and
    tuned gemm threads); returns (process, socket path) once it wrote READY,
    or exits."""
    sock = os.path.join(tmp, "dspkd.sock")
    store = ["--cache", os.path.join(tmp, "cache.db")] if cache else ["--no-cache"]
    r, w = os.pipe()
    proc = subprocess.Popen([exe, "--foreground", "--socket", sock, "--backends", "cpu"]
                            + store + ["--ready-fd", str(w)], pass_fds=[w],
                            stderr=subprocess.DEVNULL)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 60)
    if not ready or os.read(r, 16) != b"READY\n":
        proc.kill()
        sys.exit("dspkd did not start")
    os.close(r)
    return proc, sock


def wait_fftw(pid, limit=300):
    """Waits (at most limit seconds) until dspkd `pid` has no thread measuring
    an FFTW plan (named dspk-fftw-plan): with a cache, the first transform of
    a size runs on a provisional FFTW_ESTIMATE plan while FFTW_MEASURE finds
    the one kept, on another core (bench/common/bench_daemon.c's
    dspk_bench_wait_fftw, the same for the C benchmarks)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        busy = False
        for f in glob.glob("/proc/%d/task/*/comm" % pid):
            try:
                with open(f) as fh:
                    busy |= fh.read().startswith("dspk-fftw-plan")
            except OSError:
                pass
        if not busy:
            return
        time.sleep(0.1)
