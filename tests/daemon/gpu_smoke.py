#!/usr/bin/python3
"""dspkd on a GPU host, end to end through the wire protocol (docs/protocol.md).

Needs only python3 and msgpack (no numpy: references are naive loops in
double precision), so it runs on the GPU machine as well.  Starts dspkd with
every backend, and when a cuda device is present checks: "any" picks the GPU
(once, although cuda and vulkan both list it), ops and buffers on the GPU
against references, many requests in flight, fairness between two clients on
the GPU, cancel, a disconnect with queued GPU work, answers that mean done
(a gemm 8192^2 into a buffer: time_us at least its device time), and SIGTERM:
exit 0 with every device closed.  Exits 77 (skipped) when there is no cuda device.

    gpu_smoke.py --dspkd PATH
"""
import argparse
import cmath
import math
import os
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

import msgpack

TIMEOUT = 120.0


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from dspk_rpc import Client, RpcError, check  # noqa: E402


def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


def unf32(b):
    return list(struct.unpack("<%df" % (len(b) // 4), b))


def tensor(vals, shape):
    return {"dtype": "f32", "shape": list(shape), "data": f32(vals)}


def gemm_ref(a, b, m, k, n):
    return [sum(a[i * k + p] * b[p * n + j] for p in range(k)) for i in range(m) for j in range(n)]


def close(got, want, what, tol=1e-4):
    check(len(got) == len(want), "%s: %d values, want %d" % (what, len(got), len(want)))
    scale = max([1.0] + [abs(w) for w in want])
    err = max([abs(g - w) for g, w in zip(got, want)] + [0.0])
    check(err <= tol * scale, "%s: max error %g" % (what, err))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspkd", required=True)
    ap.add_argument("--device", default="cuda:0",
                    help="device under test (cpu:0 checks this script without a GPU)")
    ap.add_argument("--backends", default=None)
    a = ap.parse_args()
    dev = a.device
    rng = random.Random(11)
    tmp = tempfile.mkdtemp(prefix="dspkd-gpu-", dir="/tmp")
    sock = os.path.join(tmp, "d.sock")
    log = open(os.path.join(tmp, "dspkd.log"), "w+")
    r, w = os.pipe()
    args = [a.dspkd, "--foreground", "--socket", sock, "--ready-fd", str(w),
            "--cache", os.path.join(tmp, "cache.db"), "--log-level", "debug"]
    if a.backends:
        args += ["--backends", a.backends]
    proc = subprocess.Popen(args, pass_fds=[w], stderr=log)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], TIMEOUT)
        check(ready and os.read(r, 16) == b"READY\n", "dspkd ready")
        t_ready = time.monotonic()
        c = Client(sock, TIMEOUT)
        devs = c.call("devices", {"all": True})
        ids = [d["id"] for d in devs["devices"]]
        print("devices:", ids, "unavailable:", devs["unavailable"])
        if dev not in ids:
            print("skip: no %s device" % dev)
            c.sock.close()
            proc.send_signal(signal.SIGTERM)
            check(proc.wait(TIMEOUT) == 0, "exit 0")
            sys.exit(77)

        # "any" is the GPU, through cuda although vulkan lists it too.
        x = [rng.uniform(-1, 1) for _ in range(1000)]
        res = c.call("task.run", {"op": "map", "device": "any", "inputs": [tensor(x, [1000])],
                                  "options": {"fn": "abs"}})
        print("first result %.1f ms after READY" % ((time.monotonic() - t_ready) * 1e3))
        check(res["device"] == dev, "any -> %s, got %s" % (dev, res["device"]))
        close(unf32(res["outputs"][0]["data"]), [abs(v) for v in x], "map abs")

        # The device's caps (issue 15): with cuBLAS, f16/bf16 gemm; raw kernels in its
        # own language only, another one ENOTSUP before anything runs; a glsl kernel
        # sent to "any" goes to a Vulkan device (the same GPU under vulkan) when one is open.
        info = [d for d in devs["devices"] if d["id"] == dev][0]
        print("%s caps: ops %r, kernel_langs %r" % (dev, info["ops"], info["kernel_langs"]))
        if dev.startswith("cuda:"):
            check(info["kernel_langs"] == ["cuda"], "%s kernel_langs" % dev)
            check("f16" in info["ops"]["gemm"] and "bf16" in info["ops"]["gemm"],
                  "%s runs f16/bf16 gemm (cuBLAS)" % dev)
            glsl = ("#version 450\nlayout(local_size_x = 1) in;\n"
                    "layout(std430, binding = 0) buffer B { float x[]; };\n"
                    "void main() { x[0] = 7.0; }\n")
            kern = {"op": "kernel", "inputs": [tensor([0.0] * 4, [4])],
                    "options": {"lang": "glsl", "source": glsl, "args": [{"tensor": 0}]}}
            try:
                c.call("task.run", dict(kern, device=dev))
                raise AssertionError("a glsl kernel ran on %s" % dev)
            except RpcError as e:
                check(e.name == "ENOTSUP" and dev in e.err["message"], "glsl on %s: %s" % (dev, e))
            # A client's cuda source: compiled by the daemon's compile child
            # (dspkd --kernel-compile cuda:ARCH, within its memory and time
            # limits), it runs; the same source from this uid again is a hit.
            cu = (b'extern "C" __global__ void k(float *x, float a) {'
                  b' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < 4) x[i] = a * i; }')
            raw = {"op": "kernel", "device": dev, "inputs": [tensor([0.0] * 4, [4])],
                   "options": {"lang": "cuda", "source": cu, "entry": "k", "grid": [1],
                               "block": [4], "args": [{"tensor": 0}, {"f32": 2.5}]}}
            def kentries():
                return c.call("cache.stats", {})["kinds"]["kernels"]["entries"]
            k0 = kentries()
            # A module that loads but lacks the entry asked for, and one the
            # driver refuses to load (a 1 TiB device array: out of memory),
            # are not stored in the persistent cache; one that runs is, once.
            try:
                c.call("task.run", dict(raw, options=dict(raw["options"], entry="nope")))
                raise AssertionError("a missing entry ran")
            except RpcError as e:
                check(e.name == "EINVAL" and "nope" in e.err["message"], "missing entry: %s" % e)
            huge = dict(raw, options=dict(raw["options"], source=(
                b'extern "C" __device__ char big[1ull << 40];' + cu.replace(
                    b"x[i] = a * i;", b"x[i] = a * i + big[i];"))))
            try:
                c.call("task.run", huge)
                raise AssertionError("a module with a 1 TiB device array loaded")
            except RpcError as e:
                check("cuModuleLoadData" in e.err["message"], "1 TiB module: %s" % e)
                print("1 TiB module refused:", e.name, e.err["message"][:120])
            check(kentries() == k0, "refused modules stored: %d entries, were %d"
                  % (kentries(), k0))
            for _ in range(2):
                res = c.call("task.run", raw)
                close(unf32(res["outputs"][0]["data"]), [0.0, 2.5, 5.0, 7.5], "cuda raw kernel")
            check(kentries() == k0 + 1, "the kernel that ran stored once: %d entries, were %d"
                  % (kentries(), k0))
            print("cuda raw kernel (compile child): ok")
            vk = [d["id"] for d in devs["devices"] if "glsl" in d["kernel_langs"]]
            if vk:
                res = c.call("task.run", dict(kern, device="any"))
                print("glsl kernel on any ran on", res["device"])
                check(res["device"] in vk and unf32(res["outputs"][0]["data"])[0] == 7.0,
                      "glsl kernel on any: %r" % res["device"])

        m, k, n = 33, 27, 19
        A = [rng.uniform(-1, 1) for _ in range(m * k)]
        B = [rng.uniform(-1, 1) for _ in range(k * n)]
        res = c.call("task.run", {"op": "gemm", "inputs": [tensor(A, [m, k]), tensor(B, [k, n])]})
        check(res["device"] == dev, "gemm on any ran on %s" % dev)
        close(unf32(res["outputs"][0]["data"]), gemm_ref(A, B, m, k, n), "gemm")

        N = 64
        X = [complex(rng.uniform(-1, 1), rng.uniform(-1, 1)) for _ in range(N)]
        data = struct.pack("<%df" % (2 * N), *[v for z in X for v in (z.real, z.imag)])
        res = c.call("task.run", {"op": "fft", "device": dev,
                                  "inputs": [{"dtype": "c64", "shape": [N], "data": data}]})
        got = unf32(res["outputs"][0]["data"])
        got = [complex(got[2 * i], got[2 * i + 1]) for i in range(N)]
        ref = [sum(X[t] * cmath.exp(-2j * math.pi * f * t / N) for t in range(N)) for f in range(N)]
        close([abs(g - w) for g, w in zip(got, ref)], [0.0] * N, "fft", tol=1e-3)

        # Buffers on the GPU, pipelined writes and a task that reads them.
        ba = c.call("buffer.create", {"device": dev, "size": 4 * m * k})["buffer"]
        bb = c.call("buffer.create", {"device": dev, "size": 4 * k * n})["buffer"]
        bc = c.call("buffer.create", {"device": dev, "size": 4 * m * n})["buffer"]
        w1 = c.send("buffer.write", {"buffer": ba, "data": f32(A)})
        w2 = c.send("buffer.write", {"buffer": bb, "data": f32(B)})
        t = c.send("task.run", {"op": "gemm", "inputs": [
            {"buffer": ba, "dtype": "f32", "shape": [m, k]},
            {"buffer": bb, "dtype": "f32", "shape": [k, n]}], "outputs": [{"buffer": bc}]})
        c.wait(w1)
        c.wait(w2)
        check(c.wait(t)["device"] == dev, "buffers pin %s" % dev)
        close(unf32(c.call("buffer.read", {"buffer": bc})["data"]), gemm_ref(A, B, m, k, n),
              "gemm in GPU buffers")

        # An answer means done: a gemm written into a buffer is answered once
        # the device finished it, so its time_us is at least its device time
        # (measured here as the wall time per gemm of a pipelined batch that
        # ends with a read, which orders after all of the device's work).
        G = 8192 if dev.startswith("cuda") else 384
        gb = c.call("buffer.create", {"device": dev, "size": 4 * G * G})["buffer"]
        go = c.call("buffer.create", {"device": dev, "size": 4 * G * G})["buffer"]
        piece = 1 << 24  # floats per write: 64 MiB, below max_message
        for off in range(0, G * G, piece):
            c.call("buffer.write", {"buffer": gb, "offset": 4 * off,
                                    "data": f32([1.0 / G]) * min(piece, G * G - off)})
        gref = {"buffer": gb, "dtype": "f32", "shape": [G, G]}
        gtask = {"op": "gemm", "device": dev, "inputs": [gref, gref], "outputs": [{"buffer": go}]}
        c.call("task.run", gtask)  # planning, first use of the library
        c.call("buffer.read", {"buffer": go, "size": 4})
        nb = 8
        per_us = None
        singles = []
        factor = 0.8 if dev.startswith("cuda") else 0.2
        # On the cpu a small gemm's wall time is mostly the client's and the
        # host's noise: there the bound only checks the plumbing, and a batch
        # slowed by other work on the host (CI runs tests side by side on two
        # cores: once 5.5 ms per gemm against 0.75 ms alone) is measured again,
        # up to 4 rounds, keeping the fastest batch and the longest single.
        for _ in range(4 if not dev.startswith("cuda") else 1):
            for _ in range(2):  # the faster batch: less of the host's noise
                t0 = time.monotonic()
                batch = [c.send("task.run", gtask) for _ in range(nb)]
                bt = [c.wait(m)["time_us"] for m in batch]
                c.call("buffer.read", {"buffer": go, "size": 4})
                us = (time.monotonic() - t0) * 1e6 / nb
                if per_us is None or us < per_us:
                    per_us, btimes = us, bt
            singles += [c.call("task.run", gtask)["time_us"] for _ in range(3)]
            if max(singles) >= factor * per_us:
                break
        print("gemm %d^2 on %s: time_us of single tasks %s, pipelined %s; device time per "
              "gemm (pipelined wall / %d) %.0f us" % (G, dev, singles, btimes, nb, per_us))
        check(max(singles) >= factor * per_us,
              "gemm %d^2 answered before its work was done: time_us %s, the device takes "
              "%.0f us per gemm" % (G, singles, per_us))
        check(max(btimes) <= per_us * nb + 2000,
              "pipelined time_us %s: more than the batch took" % btimes)
        close(unf32(c.call("buffer.read", {"buffer": go, "offset": 4 * (G * G - 3)})["data"]),
              [1.0 / G] * 3, "gemm %d^2 into a buffer" % G)
        c.call("buffer.free", {"buffer": gb})
        c.call("buffer.free", {"buffer": go})

        # Many in flight, answered by msgid.
        ids_ = {}
        for i in range(50):
            v = [rng.uniform(-2, 2) for _ in range(100)]
            ids_[c.send("task.run", {"op": "reduce", "device": dev,
                                     "inputs": [tensor(v, [100])], "options": {"fn": "sum"}})] = v
        for mid, v in ids_.items():
            close(unf32(c.wait(mid)["outputs"][0]["data"]), [sum(v)], "pipelined reduce", 1e-4)

        # Fairness and cancel on the GPU: client 1 floods big gemms.
        S = 4096 if dev.startswith("cuda") else 256
        big = c.call("buffer.create", {"device": dev, "size": 4 * S * S})["buffer"]
        out = c.call("buffer.create", {"device": dev, "size": 4 * S * S})["buffer"]
        c.call("buffer.write", {"buffer": big, "data": f32([1.0 / S]) * (S * S)})
        ref = {"buffer": big, "dtype": "f32", "shape": [S, S]}
        flood = [c.send("task.run", {"op": "gemm", "inputs": [ref, ref],
                                     "outputs": [{"buffer": out}]}) for _ in range(200)]
        c.wait(flood[0])
        check(c.call("task.cancel", {"msgid": flood[-1]}) == {"canceled": True}, "cancel queued")
        c2 = Client(sock, TIMEOUT)
        mine = c2.call("task.run", {"op": "map", "device": dev, "inputs": [tensor(x, [1000])],
                                    "options": {"fn": "scale", "alpha": 2.0}})
        close(unf32(mine["outputs"][0]["data"]), [2 * v for v in x], "client 2")
        pending = [f for f in flood if f not in c.responses]
        print("client 2 done with %d of client 1's 200 gemms still pending" % len(pending))
        check(len(pending) > 50, "fair on the GPU")
        try:
            c.wait(flood[-1])
            check(False, "canceled task answered")
        except RpcError as e:
            check(e.name == "ECANCELED", "ECANCELED, got %s" % e.name)
        # Client 1 vanishes with its queue full; the daemon keeps serving.
        c.sock.close()
        deadline = time.monotonic() + TIMEOUT
        while True:
            st = c2.call("status")
            cu = [d for d in st["devices"] if d["id"] == dev][0]
            if len(st["clients"]) == 1 and cu["queued"] == 0 and cu["running"] == 0:
                break
            check(time.monotonic() < deadline, "disconnect cleaned up")
        print(dev, "status:", cu)
        if "vulkan:0" in ids:
            res = c2.call("task.run", {"op": "map", "device": "vulkan:0",
                                       "inputs": [tensor(x, [1000])], "options": {"fn": "abs"}})
            close(unf32(res["outputs"][0]["data"]), [abs(v) for v in x], "vulkan map")
        c2.sock.close()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(TIMEOUT)
        log.seek(0)
        text = log.read()
        check(rc == 0, "exit 0 after SIGTERM, got %d" % rc)
        check("%s: device closed" % dev in text, "%s closed at the stop" % dev)
        check(not os.path.exists(sock), "socket removed")
        print("ok gpu_smoke")
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.seek(0)
        sys.stderr.write(log.read()[-6000:])
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
