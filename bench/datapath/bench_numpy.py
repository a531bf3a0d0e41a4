#!/usr/bin/python3
"""numpy's side of bench_datapath, side by side in one run.

    bench_numpy.py --dspkd build/daemon/dspkd --submit build/client/submit/dspk-submit [--json F]

  reduce sum 2^26 f32, operand in a daemon buffer (Python client, DeviceArray)
                                                vs numpy.sum on the same array
  a fresh `dspk-submit reduce sum X.npy` on 256 MiB
                                                vs a one-shot `python3 -c` numpy script
The sides take turns in every repetition; median and spread (min .. max).
"""
import argparse
import json
import os
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


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from pydaemon import start_daemon  # noqa: E402


def interleaved(fns, reps, warm=1):
    for fn in fns:
        for _ in range(warm):
            fn()
    t = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            t[i].append(time.perf_counter() - t0)
    return t


def line(name, t):
    return "%-46s median %9.3f ms  (min %9.3f .. max %9.3f, n=%d)" % (
        name, statistics.median(t) * 1e3, min(t) * 1e3, max(t) * 1e3, len(t))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dspkd", required=True)
    ap.add_argument("--submit", required=True)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", help="write every sample here (seconds)")
    opt = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dspk-bench-")
    proc, sock = start_daemon(opt.dspkd, tmp)
    out = {}
    try:
        c = dspk.connect(sock, name="bench_numpy")
        rng = np.random.default_rng(3)
        x = rng.standard_normal(1 << 26).astype(np.float32)
        dx = c.to_device(x, "cpu:0")
        got = float(np.asarray(c.reduce(dx, "sum")))
        want = float(np.sum(x.astype(np.float64)))
        assert abs(got - want) <= 1e-6 * np.sum(np.abs(x)), (got, want)
        t_np, t_dk = interleaved([lambda: np.sum(x), lambda: c.reduce(dx, "sum")], opt.reps)
        dx.free()
        c.close()
        print(line("reduce sum 2^26 f32  numpy.sum", t_np))
        print(line("reduce sum 2^26 f32  dspk, resident", t_dk))
        print("%-46s %.3f (numpy median / dspk median; >= 1 wanted)" % (
            "reduce ratio", statistics.median(t_np) / statistics.median(t_dk)))
        out["reduce.numpy"], out["reduce.dspk"] = t_np, t_dk

        f = os.path.join(tmp, "x.npy")
        np.save(f, rng.standard_normal(1 << 26).astype(np.float32))  # 256 MiB
        env = dict(os.environ, DSPK_SOCKET=sock)
        submit = [opt.submit, "--socket", sock, "reduce", "sum", f]
        script = [sys.executable, "-c",
                  "import sys, numpy; print(numpy.load(sys.argv[1]).sum())", f]
        run = lambda cmd: subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        t_py, t_sub = interleaved([lambda: run(script), lambda: run(submit)], opt.reps)
        print(line("256 MiB reduce, one-shot numpy script", t_py))
        print(line("256 MiB reduce, fresh dspk-submit reduce", t_sub))
        print("%-46s %.3f (script median / dspk-submit median; > 1 wanted)" % (
            "fresh-process ratio", statistics.median(t_py) / statistics.median(t_sub)))
        out["oneshot.numpy"], out["oneshot.submit"] = t_py, t_sub
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    if opt.json:
        with open(opt.json, "w") as fh:
            json.dump(out, fh)


if __name__ == "__main__":
    main()
