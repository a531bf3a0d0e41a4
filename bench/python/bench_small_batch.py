"""Batched products of small matrices on a device (vulkan:0 by default),
the cases of an outside tester's report: contract i,i->i, batched gemm
(n,1,1)@(n,1,1), contract ab,ab->b with a=3, against map mul on the same
data and against cpu:0.  Run against a daemon on $DSPK_SOCKET:

    python3 bench/python/bench_small_batch.py [DEVICE]

Each time is the best of 3 calls after a first (compiling) one."""
import sys
import time

import numpy as np

import dspk


def best(f, reps=3):
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main():
    dev = sys.argv[1] if len(sys.argv) > 1 else "vulkan:0"
    c = dspk.connect()
    print("| case | %s | cpu:0 |" % dev)
    print("|---|---|---|")
    for n in (5000, 20000, 80000):
        a = np.ones(n, np.float32)
        A = np.ones((n, 1, 1), np.float32)
        for name, f in (("contract i,i->i n=%d" % n, lambda d: c.contract("i,i->i", a, a, device=d)),
                        ("map mul n=%d" % n, lambda d: c.map("mul", a, a, device=d)),
                        ("gemm (n,1,1)@(n,1,1) n=%d" % n, lambda d: c.gemm(A, A, device=d))):
            print("| %s | %.4f s | %.4f s |" % (name, best(lambda: f(dev)), best(lambda: f("cpu:0"))))
    x = np.ones((3, 1500000), np.float32)
    print("| contract ab,ab->b a=3 b=1.5M | %.4f s | %.4f s |"
          % (best(lambda: c.contract("ab,ab->b", x, x, device=dev), 1),
             best(lambda: c.contract("ab,ab->b", x, x, device="cpu:0"), 1)))


if __name__ == "__main__":
    main()
