#!/usr/bin/python3
"""How long a copy into memory that has sat idle takes on this machine.

    bench/datapath/idle_pages.py [--mib 16] [--reps 9]

Copies MIB MiB from a warm array into a warm destination after a pause of 0, 0.01, 0.1,
0.2 and 0.5 s, for two destinations: a memfd mapping (shared memory, as libdspkclient's
and the Python client's shared temporaries and dspk_shared_alloc buffers; MADV_HUGEPAGE
asked, which takes effect only where transparent_hugepage/shmem_enabled allows it) and
anonymous memory advised for huge pages (as numpy's large arrays).  Both are written
once before, so no copy allocates pages.  Prints the median and range in ms per pause.
The benchmarks that pause between timed calls (to let OpenBLAS's workers park) pay
this cost wherever it is large.
"""
import argparse
import mmap
import os
import statistics
import time

import numpy as np


def mapping(n, shared):
    if shared:
        fd = os.memfd_create("dspk-idle-pages", os.MFD_CLOEXEC)
        os.ftruncate(fd, n)
        mm = mmap.mmap(fd, n)
        os.close(fd)
    else:
        mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):
        pass
    a = np.frombuffer(mm, np.uint8)
    a[:] = 1
    return mm, a


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--reps", type=int, default=9)
    opt = ap.parse_args()
    n = opt.mib << 20
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            shmem = f.read().strip()
    except OSError:
        shmem = "(unknown)"
    print("# %s UTC, %d cpus, shmem_enabled: %s" % (
        time.strftime("%Y-%m-%d %H:%M", time.gmtime()), os.cpu_count(), shmem))
    src = np.random.default_rng(1).integers(0, 255, n, dtype=np.uint8)
    dst = {"shared (memfd)": mapping(n, True), "anonymous": mapping(n, False)}
    print("| pause s | destination | copy of %d MiB, median ms (min-max) |" % opt.mib)
    print("|---|---|---|")
    for pause in (0, 0.01, 0.1, 0.2, 0.5):
        for name, (_, a) in dst.items():
            t = []
            for _ in range(opt.reps):
                time.sleep(pause)
                t0 = time.perf_counter()
                np.copyto(a, src)
                t.append((time.perf_counter() - t0) * 1e3)
            print("| %g | %s | %.2f (%.2f-%.2f) |" % (pause, name, statistics.median(t),
                                                      min(t), max(t)))


if __name__ == "__main__":
    main()
