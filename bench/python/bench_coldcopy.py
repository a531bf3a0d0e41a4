#!/usr/bin/python3
"""What a 16 MiB copy costs in this process, back to back and after a 0.5 s pause: into
populated memfd pages (a shared temporary's copy-in) and out into a new array (a result's
copy-out).  The copies the Python client makes for operands from numpy arrays; docs/
performance.md, "Python gemm from numpy arrays after this round".  No daemon."""
import time, numpy as np, mmap, os, sys
n = 4 << 20
a = np.random.rand(n).astype(np.float32)
fd = os.memfd_create("x"); os.ftruncate(fd, n*4)
mm = mmap.mmap(fd, n*4); dst = np.frombuffer(mm, np.float32)
dst[:] = 0
for pause in (0, 0.5):
    ts = []
    for i in range(9):
        if pause: time.sleep(pause)
        t0 = time.perf_counter(); np.copyto(dst, a); ts.append((time.perf_counter()-t0)*1e3)
    print("pause", pause, "copy 16 MiB ms median %.2f min %.2f max %.2f" % (np.median(ts), min(ts), max(ts)))
    ts = []
    for i in range(9):
        if pause: time.sleep(pause)
        t0 = time.perf_counter(); b = dst.copy(); ts.append((time.perf_counter()-t0)*1e3)
    print("pause", pause, "copy out to new array ms median %.2f min %.2f max %.2f" % (np.median(ts), min(ts), max(ts)))
