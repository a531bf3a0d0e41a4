#!/usr/bin/python3
"""Wall time of fresh dspk-submit processes against a warm daemon.

    bench_fresh.py --dspkd build/daemon/dspkd --submit build/client/submit/dspk-submit
                   [--dspkd OTHER/dspkd] [--submit OTHER/dspk-submit ...] [--reps N]
                   [--device cpu:0] [--only NAME] [--json F]
    bench_fresh.py --socket SOCK --submit ... --device cuda:0   (a daemon already running)
                   [--reference "build/bench/cuda/bench_cuda firstresult"]

The commands of docs/performance.md's "first result" breakdown, each a fresh
process: ping, gemm 64^2, reduce sum / map abs / map add / gemm on 1024^2 f32
.npy files (4 MiB each; results written with -o).  map add moves what the
first-result gemm moves (8 MiB in, 4 MiB out) with next to no compute, which
on cpu:0 (a gemm 1024^2 takes tens of ms there) shows the data path alone.  With several --submit binaries (e.g. a
build before and after a change) they take turns in every repetition, so a
noisy machine slows them alike; with as many --dspkd as --submit, each
binary talks to its own daemon (builds of both sides before and after a
change).  Per command and binary: the median wall time
of the whole process (spawn to exit), its spread (min .. max), the median
CPU time of the process (user + system, less sensitive to a busy machine
than wall time), and the daemon's median time_us for the task (from --json), so wall - time_us is what
the process, the socket and the files cost.  Each run's output file is removed
before it starts (untimed), so every run creates its output as a first result does.  Results are checked against
numpy when it is there (the inputs are written without it).

--reference names a fresh in-process program that computes the same gemm
(issue 18's first-result goal compares against one): it is spawned and timed
the same way, taking turns with the gemm 1024^2 command, and the ratio of the
two medians is printed.
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

import array
import random
import shlex

try:  # only to check the results; the inputs are written without it
    import numpy as np
except ImportError:
    np = None


def save_f32(path, shape, rng):
    """A C-order float32 .npy of random values in [-1, 1) (format 1.0)."""
    n = 1
    for d in shape:
        n *= d
    vals = array.array("f", (rng.uniform(-1.0, 1.0) for _ in range(n)))
    if sys.byteorder != "little":
        vals.byteswap()
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % (
        ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else ""))
    hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(hdr).to_bytes(2, "little") + hdr.encode())
        f.write(vals.tobytes())


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from pydaemon import start_daemon  # noqa: E402


def spawn(argv, out_path):
    """Runs argv with stdout to out_path; returns (wall seconds, exit status,
    CPU seconds of the process: user + system)."""
    fa = [(os.POSIX_SPAWN_OPEN, 1, out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
          (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
    t0 = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=fa)
    _, st, ru = os.wait4(pid, 0)
    return (time.perf_counter() - t0, os.waitstatus_to_exitcode(st),
            ru.ru_utime + ru.ru_stime)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dspkd", action="append",
                    help="start this daemon (cpu backend, no cache); one per --submit, or one")
    ap.add_argument("--socket", help="use the daemon already listening here")
    ap.add_argument("--submit", action="append", required=True,
                    help="a dspk-submit binary; several take turns")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--device", default="cpu:0")
    ap.add_argument("--only", help="run only the commands whose name contains this")
    ap.add_argument("--json", help="write every sample here (seconds, microseconds)")
    ap.add_argument("--reference", help="a fresh in-process program computing the gemm "
                    "1024^2 (a command line), timed in turn with it")
    ap.add_argument("--reference-reps", type=int, default=5)
    opt = ap.parse_args()
    if bool(opt.dspkd) == bool(opt.socket):
        sys.exit("give one of --dspkd and --socket")
    if opt.dspkd and len(opt.dspkd) not in (1, len(opt.submit)):
        sys.exit("give one --dspkd, or one per --submit")
    tmp = tempfile.mkdtemp(prefix="dspk-fresh-")
    procs, socks = [], []
    for k, exe in enumerate(opt.dspkd or []):
        d = os.path.join(tmp, "d%d" % k)
        os.mkdir(d)
        p, so = start_daemon(exe, d)
        procs.append(p)
        socks.append(so)
    if opt.socket:
        socks = [opt.socket]
    rng = random.Random(7)
    f = lambda n: os.path.join(tmp, n)
    save_f32(f("a.npy"), (1024, 1024), rng)
    save_f32(f("b.npy"), (1024, 1024), rng)
    save_f32(f("s.npy"), (64, 64), rng)
    dev = ["--device", opt.device, "--json"]
    cases = [
        ("ping", ["ping", "-c", "1"], None),
        ("gemm 64^2", ["gemm", f("s.npy"), f("s.npy"), "-o", f("c64.npy")] + dev,
         lambda: np.load(f("s.npy")) @ np.load(f("s.npy"))),
        ("reduce sum 1024^2 (4 MiB in)", ["reduce", "sum", f("a.npy")] + dev, None),
        ("map abs 1024^2 (4 MiB in, 4 MiB out)",
         ["map", "abs", f("a.npy"), "-o", f("abs.npy")] + dev,
         lambda: np.abs(np.load(f("a.npy")))),
        ("map add 1024^2 (8 MiB in, 4 MiB out)",
         ["map", "add", f("a.npy"), f("b.npy"), "-o", f("add.npy")] + dev,
         lambda: np.load(f("a.npy")) + np.load(f("b.npy"))),
        ("gemm 1024^2 (8 MiB in, 4 MiB out)",
         ["gemm", f("a.npy"), f("b.npy"), "-o", f("c.npy")] + dev,
         lambda: np.load(f("a.npy")).astype(np.float64) @ np.load(f("b.npy"))),
    ]
    if opt.only:
        cases = [c for c in cases if opt.only in c[0]]
    subs = [os.path.abspath(s) for s in opt.submit]
    print("# %s, %d cpus, load average %s, %d repetitions, device %s" % (
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.cpu_count(),
        " ".join(open("/proc/loadavg").read().split()[:3]), opt.reps, opt.device))
    out = {}
    fails = 0
    ref_wall = []

    def ref_run(rep):
        nonlocal fails
        argv = shlex.split(opt.reference)
        w, rc, _ = spawn(argv, f("ref.txt"))
        if rc != 0:
            fails += 1
            print("FAIL reference %s: exit %d" % (opt.reference, rc))
        elif rep > 0:
            ref_wall.append(w)

    try:
        for name, args, ref in cases:
            wall = [[] for _ in subs]
            cpu = [[] for _ in subs]
            tus = [[] for _ in subs]
            outfile = [a for a in args if a.endswith(".npy") and "-o" in args and
                       args.index(a) == args.index("-o") + 1]
            for rep in range(opt.reps + 1):  # the first round warms up, not counted
                for i, s in enumerate(subs):
                    if outfile and os.path.exists(outfile[0]):
                        # every run writes a new file, as a first result does (an
                        # existing one is replaced through a temporary renamed over
                        # it, and freeing the old file's pages then costs about 2 ms
                        # per 4 MiB on these machines: docs/performance.md)
                        os.unlink(outfile[0])
                    log = f("out.txt")
                    sock = socks[i % len(socks)]
                    if opt.reference and name.startswith("gemm 1024") and \
                            i == 0 and rep <= opt.reference_reps:
                        ref_run(rep)
                    w, rc, u = spawn([s, "--socket", sock] + args, log)
                    if rc != 0:
                        fails += 1
                        print("FAIL %s (%s): exit %d" % (name, s, rc))
                        continue
                    if ref is not None and np is not None and rep == 1:
                        got = np.load(outfile[0])
                        want = ref()
                        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4,
                                                                       atol=1e-3):
                            fails += 1
                            print("FAIL %s (%s): wrong result" % (name, s))
                    if rep == 0:
                        continue
                    wall[i].append(w)
                    cpu[i].append(u)
                    if "--json" in args:
                        tus[i].append(json.load(open(log))["time_us"])
            for i, s in enumerate(subs):
                if not wall[i]:
                    continue
                t = wall[i]
                extra = ""
                if tus[i]:
                    extra = ", time_us %d" % statistics.median(tus[i])
                label = name if len(subs) == 1 else "%s [%d]" % (name, i)
                print("%-40s median %7.2f ms (%7.2f .. %7.2f), cpu %6.2f ms%s" % (
                    label, statistics.median(t) * 1e3, min(t) * 1e3, max(t) * 1e3,
                    statistics.median(cpu[i]) * 1e3, extra))
                out["%s [%s]" % (name, s)] = {"wall_s": t, "cpu_s": cpu[i], "time_us": tus[i]}
        if ref_wall:
            print("%-40s median %7.2f ms (%7.2f .. %7.2f), %d runs" % (
                "fresh in-process program", statistics.median(ref_wall) * 1e3,
                min(ref_wall) * 1e3, max(ref_wall) * 1e3, len(ref_wall)))
            for key, v in out.items():
                if key.startswith("gemm 1024"):
                    print("first result: %.1fx (%s)" % (
                        statistics.median(ref_wall) / statistics.median(v["wall_s"]), key))
            out["reference"] = {"wall_s": ref_wall}
        if len(subs) > 1:
            for i, s in enumerate(subs):
                print("# [%d] %s%s" % (i, s, " with " + opt.dspkd[i] if len(socks) > 1 else ""))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait()
    if opt.json:
        with open(opt.json, "w") as fh:
            json.dump(out, fh)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
