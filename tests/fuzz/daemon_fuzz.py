#!/usr/bin/python3
"""Daemon-level fuzzer: starts dspkd on a temporary socket and sends it
--frames frames over many connections, then checks that it is still up,
answers a ping, stops with status 0 on SIGTERM, and wrote no sanitizer
report (run it against build-asan's dspkd for ASan/UBSan/LSan).

Frames, chosen at random (seeded, so a run can be repeated):
  - valid requests of every method (small tensors, buffers of the
    connection, cancels);
  - valid requests mutated as msgpack trees (values replaced by edge-case
    integers, strings, bins, nils, nested containers; keys added, dropped);
  - the same packed and then mutated as bytes (bit flips, cuts, inserts);
  - random msgpack objects, random methods with random params;
  - cut frames, headers that announce 2^32-1 elements or bytes, deep nests.
A connection sends a burst, reads while it writes, and then either waits
for the answers of the requests it knows to be well formed, or closes at
once (in flight requests are then canceled); some connections are left
open with half a frame while others run.  Every message read is decoded
strictly (raw=False: str must be valid UTF-8) and checked against
docs/protocol.md's framing rules: each well-formed request with its msgid
gets exactly one response, a protocol error is announced by a
protocol.error notification before the daemon closes.

    daemon_fuzz.py --dspkd PATH [--frames N] [--seed S]
Exit status 0 when every check held; the last lines give the figures.
"""
import argparse
import os
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

import msgpack

TIMEOUT = 60.0
INTS = [0, 1, 2, 3, 7, 8, 63, 64, 255, 256, 4095, 4096, 65535, 65536, 2**31 - 1, 2**31,
        2**32 - 1, 2**32, 2**40, 2**53, 2**62, 2**63 - 1, 2**64 - 1, -1, -2, -2**31,
        -2**63]
DTYPES = ["f32", "f64", "c64", "c128", "f16", "bf16", "i32", "", "f32\0"]
ITEM = {"f32": 4, "f64": 8, "c64": 8, "c128": 16, "f16": 2, "bf16": 2}
# No daemon.stop: the fuzzer runs as the daemon's own user, who is always an
# admin (root and the daemon's user are, whatever admin_users says), and a
# valid daemon.stop would end the run; the refusal of a non-admin is tested
# by lifecycle_policy and proto.conformance.
METHODS = ["hello", "ping", "devices", "status", "buffer.create", "buffer.write",
           "buffer.read", "buffer.free", "task.run", "task.cancel", "cache.stats",
           "cache.clear", "daemon.reload"]
OPS = ["gemm", "fft", "fir", "contract", "reduce", "map", "kernel", "nope"]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class Gen:
    def __init__(self, rnd):
        self.r = rnd
        self.msgid = 0

    def tensor(self, shape, dtype="f32"):
        n = 1
        for d in shape:
            n *= d
        return {"dtype": dtype, "shape": list(shape),
                "data": self.r.randbytes(n * ITEM[dtype]) if n * ITEM[dtype] < 4096
                else bytes(n * ITEM[dtype])}

    def valid(self):
        """A well-formed request (its arguments may still be refused)."""
        r = self.r
        m = r.choice(["ping", "ping", "hello", "devices", "status", "buffer.create",
                      "buffer.write", "buffer.read", "buffer.free", "task.run", "task.run",
                      "task.run", "task.cancel", "cache.stats"])
        a = None
        if m == "ping":
            a = {"data": r.randbytes(r.randrange(64))} if r.random() < 0.5 else None
        elif m == "hello":
            a = {"version": 1, "client": "fuzz"}
        elif m == "devices":
            a = {"all": r.random() < 0.5}
        elif m == "buffer.create":
            a = {"size": r.choice([16, 64, 4096, 65536]), "device": "cpu:0"}
        elif m == "buffer.write":
            a = {"buffer": r.randrange(1, 6), "offset": r.choice([0, 8, 16]),
                 "data": r.randbytes(r.choice([0, 8, 16, 64]))}
        elif m == "buffer.read":
            a = {"buffer": r.randrange(1, 6), "offset": r.choice([0, 8]),
                 "size": r.choice([0, 8, 16])}
        elif m == "buffer.free":
            a = {"buffer": r.randrange(1, 6)}
        elif m == "task.cancel":
            a = {"msgid": max(1, self.msgid - r.randrange(4))}
        elif m == "cache.stats":
            a = {}
        else:
            a = self.task()
        return m, a

    def task(self):
        r = self.r
        op = r.choice(OPS[:6])
        dt = r.choice(["f32", "f64"])
        ct = "c64" if dt == "f32" else "c128"
        n = r.choice([1, 2, 3, 4, 8])
        if op == "gemm":
            ins = [self.tensor((n, n + 1), dt), self.tensor((n + 1, 2), dt)]
            opts = {"trans_a": False, "alpha": 1.5}
        elif op == "fft":
            ins = [self.tensor((2, n), r.choice([dt, ct]))]
            opts = {"inverse": r.random() < 0.5}
        elif op == "fir":
            ins = [self.tensor((n * 4,), dt), self.tensor((3,), dt)]
            opts = {}
        elif op == "contract":
            ins = [self.tensor((n, 3), dt), self.tensor((3, 2), dt)]
            opts = {"subscripts": "ik,kj->ij"}
        elif op == "reduce":
            ins = [self.tensor((n, 3), dt)]
            opts = {"fn": r.choice(["sum", "max", "min", "mean"]), "axes": [-1]}
        else:
            ins = [self.tensor((n,), dt), self.tensor((n,), dt)]
            opts = {"fn": r.choice(["add", "sub", "mul", "axpy"]), "alpha": 2.0}
        a = {"op": op, "device": r.choice(["cpu:0", "any"]), "inputs": ins, "options": opts}
        if r.random() < 0.2:
            a["inputs"][0] = {"dtype": dt, "shape": [2, 2], "buffer": r.randrange(1, 4),
                              "offset": 0}
        if r.random() < 0.2:
            a["outputs"] = [r.choice([None, {"buffer": r.randrange(1, 4), "offset": 0}])]
        return a

    def value(self, depth=0):
        r = self.r
        k = r.randrange(11 if depth < 4 else 8)
        if k == 0:
            return r.choice(INTS)
        if k == 1:
            return r.randrange(-1000, 1000)
        if k == 2:
            return r.choice([0.0, -0.0, 1.5, 1e308, float("inf"), float("nan"), -1.0])
        if k == 3:
            return r.choice([None, True, False])
        if k == 4:
            return r.choice(DTYPES + METHODS + OPS + ["", "é" * 40, "\x1b[2J", "a" * 300])
        if k == 5:
            return r.randbytes(r.choice([0, 1, 3, 4, 8, 16, 100]))
        if k == 6:
            return r.choice(["dtype", "shape", "data", "buffer", "offset", "size", "op",
                             "inputs", "outputs", "options", "msgid", "device"])
        if k == 7:
            return [r.choice(INTS) for _ in range(r.randrange(9))]
        if k == 8:
            return [self.value(depth + 1) for _ in range(r.randrange(5))]
        if k == 9:
            return {r.choice([r.choice(INTS), b"k", None, 1.5]) if r.random() < 0.2
                    else str(self.value(6)): self.value(depth + 1)
                    for _ in range(r.randrange(5))}
        return self.tensor(tuple(r.randrange(4) for _ in range(r.randrange(4))),
                           r.choice(list(ITEM)))

    def mutate(self, o, depth=0):
        """Replaces, drops or adds one or more nodes of a msgpack tree."""
        r = self.r
        if r.random() < 0.15 or depth > 6:
            return self.value(depth)
        if isinstance(o, dict) and o:
            o = dict(o)
            key = r.choice(list(o))
            c = r.randrange(4)
            if c == 0:
                del o[key]
            elif c == 1:
                o[str(self.value(6))] = self.value(depth + 1)
            else:
                o[key] = self.mutate(o[key], depth + 1)
            return o
        if isinstance(o, list) and o:
            o = list(o)
            i = r.randrange(len(o))
            c = r.randrange(5)
            if c == 0:
                del o[i]
            elif c == 1:
                o.insert(i, self.value(depth + 1))
            else:
                o[i] = self.mutate(o[i], depth + 1)
            return o
        return self.value(depth)

    def request(self, m, a, msgid=None):
        if msgid is None:
            self.msgid += 1
            msgid = self.msgid
        return [0, msgid, m, [a] if a is not None else []], msgid

    def frame(self):
        """(bytes, msgid or None, kind): msgid when the frame is a request
        the daemon must answer (the envelope is well formed)."""
        r = self.r
        k = r.random()
        if k < 0.30:
            req, mid = self.request(*self.valid())
            return pack(req), mid, "valid"
        if k < 0.55:
            req, mid = self.request(*self.valid())
            args = self.mutate(req[3][0]) if req[3] else self.value()
            m = req[2] if r.random() < 0.8 else self.mutate(req[2])
            # Each of these is answered (docs/protocol.md, Malformed input):
            # a request with a uint32 msgid gets an error or a result.
            if not isinstance(m, str):
                return pack([0, mid, m, [args]]), mid, "mutated-method"
            if isinstance(args, dict) or args is None:
                return pack([0, mid, m, [args]]), mid, "mutated"
            return pack([0, mid, m, [args]]), mid, "mutated-params"
        if k < 0.70:
            req, mid = self.request(*self.valid())
            b = bytearray(pack(req))
            for _ in range(r.randrange(1, 4)):
                c = r.randrange(4)
                i = r.randrange(len(b))
                if c == 0:
                    b[i] ^= 1 << r.randrange(8)
                elif c == 1:
                    b[i] = r.choice([0xc1, 0xc7, 0xd4, 0xdc, 0xdd, 0xde, 0xdf, 0xc6,
                                     0xdb, 0xff, 0x00, 0x7f])
                elif c == 2:
                    b[i:i] = r.randbytes(r.randrange(1, 5))
                else:
                    del b[i]
            return bytes(b), None, "bytes"
        if k < 0.80:
            m = r.choice(METHODS + ["", "x" * 70, "é" * 30, "ping\0", "task.run.x"])
            mid = self.next_id()
            return pack([0, mid, m, [self.value()]]), mid, "random-method"
        if k < 0.88:
            return pack(self.value()), None, "random-msgpack"
        if k < 0.93:
            return r.choice([
                b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
                b"\xdb\xff\xff\xff\xff", b"\x94\x00\x01\xdb\xff\xff\xff\xff",
                b"\x94\x00\x01\xa4ping\xdd\x7f\xff\xff\xff", b"\x91" * 70,
                b"\x94\x00\x01\xa4ping\x91" + b"\x81\xa1k" * 40 + b"\xc0",
                b"\xc1", b"\xd4\x01\x02", b"\x92\xcf" + b"\xff" * 8]), None, "header"
        if k < 0.96:
            req, _ = self.request(*self.valid())
            b = pack(req)
            return b[:r.randrange(len(b))], None, "cut"
        return r.randbytes(r.randrange(1, 64)), None, "random-bytes"

    def next_id(self):
        self.msgid += 1
        return self.msgid


def pack(o):
    return msgpack.packb(o, use_bin_type=True)


class Stats:
    def __init__(self):
        self.frames = 0
        self.conns = 0
        self.responses = 0
        self.errors = {}
        self.closed_by_daemon = 0
        self.kinds = {}


def check_message(m, expect):
    check(isinstance(m, list) and len(m) >= 3 and m[0] in (1, 2), "bad message %r" % (m,))
    if m[0] == 2:
        check(len(m) == 3 and isinstance(m[1], str) and isinstance(m[2], list),
              "bad notification %r" % (m,))
        return None
    check(len(m) == 4, "response has 4 elements: %r" % (m,))
    check((m[2] is None) != (m[3] is None), "exactly one of error/result is nil: %r" % (m,))
    if m[2] is not None:
        e = m[2]
        check(isinstance(e, dict) and isinstance(e.get("code"), int) and e["code"] < 0
              and isinstance(e.get("name"), str) and isinstance(e.get("message"), str)
              and e["message"], "bad error %r" % (e,))
    else:
        check(isinstance(m[3], dict), "result is a map: %r" % (m,))
    return m[1]


def run_conn(path, frames, wait, stats, idle):
    """Sends frames (list of (bytes, msgid)); reads while writing; with wait,
    waits for every expected answer (or the daemon's close)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    s.connect(path)
    s.setblocking(False)
    stats.conns += 1
    up = msgpack.Unpacker(raw=False, max_buffer_size=1 << 30, strict_map_key=False)
    expect = {}
    data = bytearray()
    for b, mid in frames:
        data += b
        if mid is not None:
            expect[mid] = expect.get(mid, 0) + 1
    sent = 0
    eof = False
    saw_protocol_error = False
    deadline = time.monotonic() + TIMEOUT
    while not eof:
        if sent == len(data) and (not wait or not expect):
            break
        check(time.monotonic() < deadline, "connection stalled: %d of %d bytes sent, "
              "%d answers missing" % (sent, len(data), sum(expect.values())))
        w = [s] if sent < len(data) else []
        rd, wr, _ = select.select([s], w, [], 1.0)
        if rd:
            try:
                chunk = s.recv(1 << 20)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                eof = True
                break
            up.feed(chunk)
            while True:
                try:
                    m = next(up)
                except StopIteration:
                    break
                except UnicodeDecodeError as e:
                    raise AssertionError("the daemon sent a str that is not UTF-8 (%s)" % e)
                mid = check_message(m, expect)
                if m[0] == 2 and m[1] == "protocol.error":
                    saw_protocol_error = True
                if mid is None:
                    continue
                stats.responses += 1
                if m[2] is not None:
                    stats.errors[m[2]["name"]] = stats.errors.get(m[2]["name"], 0) + 1
                if mid in expect:
                    expect[mid] -= 1
                    if not expect[mid]:
                        del expect[mid]
        if wr:
            try:
                sent += s.send(data[sent:sent + 65536])
            except (BrokenPipeError, ConnectionResetError):
                eof = True
    if eof:
        stats.closed_by_daemon += 1
        # Only a frame that breaks the protocol closes a connection.
        check(not all(mid is not None for _, mid in frames),
              "the daemon closed a connection whose frames were all well-formed "
              "requests (%d answers missing)" % sum(expect.values()))
    if idle is not None and not eof and len(idle) < 16:
        # Leave it open with half a frame; it is closed later.
        try:
            s.send(b"\x94\x00\xce")
        except OSError:
            pass
        idle.append(s)
        return saw_protocol_error
    s.close()
    return saw_protocol_error


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspkd", required=True)
    ap.add_argument("--frames", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    o = ap.parse_args()
    rnd = random.Random(o.seed)
    gen = Gen(rnd)
    stats = Stats()
    tmp = tempfile.mkdtemp(prefix="dspk-fuzz-")
    sock = os.path.join(tmp, "dspkd.sock")
    conf = os.path.join(tmp, "dspkd.conf")
    # admin_users names someone else (the fuzzer, the daemon's own user, is an
    # admin all the same: no daemon.stop in METHODS), and the limits are
    # small enough for the fuzzer to reach every one of them.
    with open(conf, "w") as f:
        f.write("[policy]\nadmin_users = 65534\n"
                "[limits]\nmax_message = 1M\nmax_elements = 1048576\nmax_buffers = 8\n"
                "max_inflight = 64\nmax_unsent = 4M\nmax_clients = 64\n"
                # the fuzzer (one user) holds up to 17 connections at once
                "max_user_clients = 64\n")
    log = open(os.path.join(tmp, "dspkd.log"), "w+", errors="replace")  # it quotes client bytes
    r, w = os.pipe()
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    proc = subprocess.Popen([o.dspkd, "--foreground", "--socket", sock, "--ready-fd", str(w),
                             "--config", conf, "--backends", "cpu", "--no-cache",
                             "--log-level", "info"], pass_fds=[w], stderr=log, env=env)
    os.close(w)
    ready, _, _ = select.select([r], [], [], TIMEOUT)
    check(ready and os.read(r, 16) == b"READY\n", "dspkd did not become ready")
    os.close(r)

    def logtext():
        log.flush()
        log.seek(0)
        return log.read()

    t0 = time.monotonic()
    idle = []
    ok = False
    try:
        while stats.frames < o.frames:
            n = min(o.frames - stats.frames, rnd.choice([1, 2, 5, 10, 20, 50, 100]))
            frames = []
            for _ in range(n):
                b, mid, kind = gen.frame()
                frames.append((b, mid))
                stats.kinds[kind] = stats.kinds.get(kind, 0) + 1
                # Bytes that may not be one whole object end the burst: what
                # followed would not line up with frames any more.
                if kind in ("bytes", "header", "cut", "random-bytes"):
                    break
            stats.frames += len(frames)
            wait = rnd.random() < 0.8
            run_conn(sock, frames, wait, stats, idle if rnd.random() < 0.05 else None)
            if len(idle) >= 16 or rnd.random() < 0.01:
                for s in idle:
                    s.close()
                idle.clear()
            if proc.poll() is not None:
                raise AssertionError("dspkd died (status %s) after %d frames:\n%s"
                                     % (proc.returncode, stats.frames, logtext()[-6000:]))
        for s in idle:
            s.close()
        # Still serving: a fresh connection gets its ping answered.
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(TIMEOUT)
        c.connect(sock)
        c.sendall(pack([0, 7, "ping", [{"data": b"alive"}]]))
        up = msgpack.Unpacker(raw=False)
        m = None
        while m is None:
            chunk = c.recv(1 << 16)
            check(chunk, "daemon closed the ping connection")
            up.feed(chunk)
            for x in up:
                m = x
        check(m == [1, 7, None, {"data": b"alive"}], "ping after the fuzz: %r" % (m,))
        c.close()
        ok = True
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        text = logtext()
        secs = time.monotonic() - t0
    bad = [ln for ln in text.splitlines()
           if "ERROR: AddressSanitizer" in ln or "ERROR: LeakSanitizer" in ln
           or "runtime error:" in ln]
    print("daemon_fuzz: seed %d: %d frames over %d connections in %.1f s (%.0f frames/s); "
          "%d responses, %d connections closed by the daemon" %
          (o.seed, stats.frames, stats.conns, secs, stats.frames / max(secs, 1e-9),
           stats.responses, stats.closed_by_daemon))
    print("daemon_fuzz: frames by kind: %s" % dict(sorted(stats.kinds.items())))
    print("daemon_fuzz: error answers: %s" % dict(sorted(stats.errors.items())))
    if bad or proc.returncode != 0 or not ok:
        sys.stderr.write(text[-20000:])
        print("daemon_fuzz: FAILED: exit status %s, %d sanitizer lines" %
              (proc.returncode, len(bad)))
        return 1
    if not o.keep:
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)
    print("daemon_fuzz: passed (dspkd up, ping answered, exit status 0, no sanitizer report)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
