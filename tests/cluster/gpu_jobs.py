#!/usr/bin/env python3
"""Slurm job allocations on a real GPU host (a step of scripts/gpu-all.sh; exit 77 without a
cuda device).  Checks what the CI cannot: that the prolog's UUIDs from nvidia-smi
(`GPU-...`) name dspk's cuda devices, that the same physical GPU under cuda and vulkan has one
UUID (so a job given GPU 0 gets both cuda:0 and its vulkan twin, and nothing else), and that
a job without that GPU gets ENODEV under both backends.  Needs only python3-msgpack (no
numpy): results are checked against a gemm computed here.

    gpu_jobs.py --dspkd PATH
"""
import argparse
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from dspk_rpc import Client, RpcError, check  # noqa: E402

TIMEOUT = 120


def norm(u):
    return "".join(ch for ch in u.lower() if ch in "0123456789abcdef")


def gemm(c, device, n=8):
    a = [float((i * 7) % 5 - 2) for i in range(n * n)]
    t = {"dtype": "f32", "shape": [n, n], "data": struct.pack("<%df" % (n * n), *a)}
    res = c.call("task.run", {"op": "gemm", "device": device, "inputs": [t, t]})
    got = struct.unpack("<%df" % (n * n), res["outputs"][0]["data"])
    for i in range(n):
        for j in range(n):
            want = sum(a[i * n + k] * a[k * n + j] for k in range(n))
            check(abs(got[i * n + j] - want) < 1e-3, "gemm on %s: [%d,%d]" % (device, i, j))
    return res["device"]


def outcome(c, method, args):
    try:
        c.call(method, args)
        return "ok"
    except RpcError as e:
        return e.name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspkd", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dspk-gpujobs-")
    sock = os.path.join(tmp, "dspkd.sock")
    r, w = os.pipe()
    log = open(os.path.join(tmp, "dspkd.log"), "w+")
    p = subprocess.Popen([a.dspkd, "--foreground", "--socket", sock, "--ready-fd", str(w),
                          "--no-cache", "--backends", "cpu,cuda,vulkan"], pass_fds=[w],
                         stderr=log)
    os.close(w)
    ok = False
    try:
        ready, _, _ = select.select([r], [], [], TIMEOUT)
        check(ready and os.read(r, 16) == b"READY\n", "dspkd ready")
        admin = Client(sock, TIMEOUT)
        devs = admin.call("devices", {})["devices"]
        cuda = [d for d in devs if d["backend"] == "cuda"]
        if not cuda:
            print("no cuda device: not run")
            ok = True
            return 77
        for d in devs:
            print("%-10s %-40s %s" % (d["id"], d["name"], d["uuid"]))
        smi = {}
        if shutil.which("nvidia-smi"):
            out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=60).stdout
            for line in out.splitlines():
                idx, uuid = [x.strip() for x in line.split(",", 1)]
                smi[int(idx)] = uuid
            print("nvidia-smi:", smi)
            for d in cuda:
                check(norm(d["uuid"]) in {norm(u) for u in smi.values()},
                      "%s's UUID is one nvidia-smi lists" % d["id"])
        gpu0 = cuda[0]
        # The form the prolog's nvidia-smi fallback registers, when index 0 is cuda:0.
        uuid0 = smi[0] if 0 in smi and norm(smi[0]) == norm(gpu0["uuid"]) else gpu0["uuid"]
        print("job 1 is given", uuid0)
        twins = sorted(d["id"] for d in devs if d["backend"] != "cpu" and
                       norm(d["uuid"]) == norm(gpu0["uuid"]))
        print("%s under every backend: %s" % (gpu0["id"], twins))
        cpu = [d["id"] for d in devs if d["backend"] == "cpu"]
        ans = admin.call("job.register", {"job": 1, "uid": os.getuid(), "devices": [uuid0]})
        check(sorted(ans["devices"]) == sorted(cpu + twins), "job 1's devices: %r" % ans)
        admin.call("job.register", {"job": 2, "uid": os.getuid(), "devices": []})
        c1 = Client(sock, TIMEOUT)
        c1.call("hello", {"version": 1, "job": 1})
        seen = sorted(d["id"] for d in c1.call("devices", {})["devices"])
        check(seen == sorted(cpu + twins), "job 1 sees %r" % seen)
        for dev in twins:
            print("job 1 on %s: ok" % gemm(c1, dev))
        others = [d["id"] for d in devs if d["backend"] != "cpu" and d["id"] not in twins]
        for dev in others:
            check(outcome(c1, "buffer.create", {"device": dev, "size": 64}) == "ENODEV",
                  "job 1 on %s" % dev)
        print("job 1, any: %s" % gemm(c1, "any"))
        c2 = Client(sock, TIMEOUT)
        c2.call("hello", {"version": 1, "job": 2})
        for dev in twins + others:
            check(outcome(c2, "buffer.create", {"device": dev, "size": 64}) == "ENODEV",
                  "job 2 on %s" % dev)
        check(gemm(c2, "any") in cpu, "job 2, any: the cpu")
        end = admin.call("job.end", {"job": 1})
        check(end["ended"] and end["connections"] == 1, "job.end 1: %r" % end)
        admin.call("job.end", {"job": 2})
        check(admin.call("status", {})["jobs"] == [], "no job left")
        admin.close()
        ok = True
        print("gpu jobs: ok")
        return 0
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        if not ok or rc != 0:
            log.seek(0)
            sys.stderr.write(log.read()[-6000:])
            if ok:
                sys.exit(1)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
