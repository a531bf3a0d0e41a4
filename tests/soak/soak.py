#!/usr/bin/env python3
"""Soak test of dspkd (issue 11): many client processes, each with tasks and
buffer operations pipelined, some of them killed (SIGKILL) while their work is
in flight.  Checks that nothing is lost and nothing is left behind:

- every answer a surviving client gets is checked against numpy (no wrong
  result, no missing or duplicated answer);
- the daemon stays up and serves a fresh client after every round;
- once every client is gone, status shows no connection but the checker's,
  no buffer, no request in flight, and the cpu pool's bytes in use are back
  where they were before the first client;
- SIGTERM then exits 0 (under AddressSanitizer: no leak reports).

  soak.py --dspkd PATH [--rounds R] [--clients N] [--kill-every K] [--seed S]

Kills are triggered by events, not by timers: a client prints a line once its
first batch is sent and waits, before it reads any answer, until the driver
either kills it or tells it to go on, so every killed client has work in
flight.  Prints one summary line
(clients, tasks, answers checked, kills, seconds)."""
import argparse
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import numpy as np  # noqa: E402
from dspk_rpc import Client, RpcError, check  # noqa: E402

TIMEOUT = 120


def tensor(a):
    dt = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64",
          np.dtype(np.complex64): "c64"}[a.dtype]
    return {"dtype": dt, "shape": list(a.shape), "data": np.ascontiguousarray(a).tobytes()}


def array(t):
    dt = {"f32": np.float32, "f64": np.float64, "c64": np.complex64, "c128": np.complex128}
    return np.frombuffer(t["data"], dt[t["dtype"]]).reshape(t["shape"])


def close(got, want, what):
    tol = 1e-3 * max(1.0, float(np.max(np.abs(want)))) if want.size else 0
    check(got.shape == want.shape and np.allclose(got, want, atol=tol, rtol=1e-3),
          "%s: wrong result" % what)


def make_job(rng):
    """One request and the check of its answer."""
    kind = rng.integers(0, 5)
    if kind == 0:
        a = rng.standard_normal((rng.integers(1, 48), 32)).astype(np.float32)
        b = rng.standard_normal((32, rng.integers(1, 48))).astype(np.float32)
        req = {"op": "gemm", "device": "cpu:0", "inputs": [tensor(a), tensor(b)]}
        return "task.run", req, lambda r: close(array(r["outputs"][0]), a @ b, "gemm")
    if kind == 1:
        x = (rng.standard_normal(256) + 1j * rng.standard_normal(256)).astype(np.complex64)
        req = {"op": "fft", "device": "cpu:0", "inputs": [tensor(x)]}
        return "task.run", req, lambda r: close(array(r["outputs"][0]), np.fft.fft(x), "fft")
    if kind == 2:
        x = rng.standard_normal((64, 33))
        req = {"op": "reduce", "device": "cpu:0", "inputs": [tensor(x)],
               "options": {"fn": "sum", "axes": [1]}}
        return "task.run", req, lambda r: close(array(r["outputs"][0]), x.sum(axis=1), "reduce")
    if kind == 3:
        x = rng.standard_normal(1000)
        req = {"op": "map", "device": "cpu:0", "inputs": [tensor(x)], "options": {"fn": "abs"}}
        return "task.run", req, lambda r: close(array(r["outputs"][0]), np.abs(x), "map")
    return "ping", {"data": bytes(rng.integers(0, 256, 64, dtype=np.uint8))}, None


def worker(path, seed, batches, depth):
    """One client: `batches` rounds of `depth` pipelined requests, plus a
    buffer it creates, writes, reads back and (unless killed) frees."""
    rng = np.random.default_rng(seed)
    c = Client(path, TIMEOUT)
    c.call("hello", {"version": 1, "client": "soak-%d" % seed})
    buf = c.call("buffer.create", {"device": "cpu:0", "size": 1 << 16})["buffer"]
    payload = bytes(rng.integers(0, 256, 1 << 16, dtype=np.uint8))
    checked = 0
    for b in range(batches):
        jobs = []
        jobs.append((c.send("buffer.write", {"buffer": buf, "offset": 0, "data": payload}),
                     None))
        for _ in range(depth):
            method, req, verify = make_job(rng)
            jobs.append((c.send(method, req), verify))
        rd = c.send("buffer.read", {"buffer": buf, "offset": 0, "size": 1 << 16})
        if b == 0:
            print("inflight", flush=True)  # the driver kills us now, or says go
            check(sys.stdin.readline() == "go\n", "the driver says go")
        for msgid, verify in jobs:
            res = c.wait(msgid)
            if verify is not None:
                verify(res)
            checked += 1
        check(bytes(c.wait(rd)["data"]) == payload, "buffer.read gives what was written")
        checked += 1
    c.call("buffer.free", {"buffer": buf})
    c.close()
    print(json.dumps({"checked": checked}), flush=True)


def status(path):
    c = Client(path, TIMEOUT)
    s = c.call("status", {})
    c.close()
    return s


def cpu_in_use(s):
    cpu = [d for d in s["devices"] if d["id"] == "cpu:0"][0]
    return cpu["stats"].get("pool_bytes_in_use", 0)


def driver(args):
    tmp = tempfile.mkdtemp(prefix="dspk-soak-")
    path = os.path.join(tmp, "dspkd.sock")
    log = open(os.path.join(tmp, "dspkd.log"), "w+")
    r, w = os.pipe()
    proc = subprocess.Popen([args.dspkd, "--foreground", "--socket", path, "--ready-fd",
                             str(w), "--backends", "cpu", "--no-cache", "--log-level", "warn"],
                            pass_fds=[w], stderr=log)
    os.close(w)
    ready, _, _ = select.select([r], [], [], TIMEOUT)
    check(ready and os.read(r, 16) == b"READY\n", "dspkd became ready")
    os.close(r)
    rng = random.Random(args.seed)
    base = cpu_in_use(status(path))
    t0 = time.monotonic()
    clients = kills = checked = tasks = 0
    try:
        for rnd in range(args.rounds):
            procs = []
            for i in range(args.clients):
                seed = rnd * 100000 + i
                p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker",
                                      path, "--seed", str(seed), "--batches",
                                      str(args.batches), "--depth", str(args.depth)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                procs.append((p, rng.randrange(args.kill_every) == 0))
            clients += len(procs)
            tasks += len(procs) * args.batches * (args.depth + 2)
            for p, kill in procs:
                first = p.stdout.readline()
                check(first == "inflight\n", "worker started: %r" % first)
                if kill:
                    p.send_signal(signal.SIGKILL)
                    kills += 1
                else:
                    p.stdin.write("go\n")
                    p.stdin.flush()
            for p, kill in procs:
                out = p.stdout.read()
                rc = p.wait(TIMEOUT)
                if kill:
                    check(rc == -signal.SIGKILL, "killed worker: rc %d" % rc)
                    continue
                check(rc == 0, "worker failed (rc %d); daemon log:\n%s" % (rc, out))
                checked += json.loads(out.strip().splitlines()[-1])["checked"]
            check(proc.poll() is None, "dspkd still runs after round %d" % rnd)
        # Everything the clients held is gone once the daemon has seen the
        # closes: poll status (an event the daemon reports, not a timer).
        deadline = time.monotonic() + TIMEOUT
        while True:
            s = status(path)
            left = (s["daemon"]["connections"], sum(c["buffers"] for c in s["clients"]),
                    sum(c["inflight"] for c in s["clients"]),
                    sum(d["queued"] + d["running"] for d in s["devices"]), cpu_in_use(s))
            if left == (1, 0, 0, 0, base):  # status itself is not a request in flight
                break
            check(time.monotonic() < deadline,
                  "left behind (connections, buffers, inflight, queued+running, pool bytes): "
                  "%r, pool at start %d" % (left, base))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(TIMEOUT)
        log.seek(0)
        text = log.read()
    check(rc == 0, "dspkd exit %d after SIGTERM:\n%s" % (rc, text[-4000:]))
    check("ERROR: AddressSanitizer" not in text and "LeakSanitizer" not in text,
          "sanitizer report:\n" + text[-4000:])
    print("soak: %d clients (%d killed with work in flight), %d requests sent, %d answers "
          "checked, 0 lost, nothing left behind, %.1f s"
          % (clients, kills, tasks, checked, time.monotonic() - t0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspkd")
    ap.add_argument("--worker")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--kill-every", type=int, default=3)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--depth", type=int, default=16)
    args = ap.parse_args()
    if args.worker:
        try:
            worker(args.worker, args.seed, args.batches, args.depth)
        except (AssertionError, RpcError, OSError, EOFError) as e:
            print("worker %d: %s" % (args.seed, e), flush=True)
            sys.exit(1)
        return
    driver(args)


if __name__ == "__main__":
    main()
