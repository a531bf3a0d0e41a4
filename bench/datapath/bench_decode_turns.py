#!/usr/bin/python3
"""Another user's ping while one user floods dspkd with costly messages.

    sudo bench_decode_turns.py DSPKD [DSPKD...] [--conns 16] [--objects 1000000] [--rounds 3]

Decoding requests is the daemon's main loop's work, shared by every client.
User A (the caller, root) floods from --conns connections with valid `ping`
messages holding --objects msgpack objects each (nil values in an ignored key:
about one byte each, the costliest bytes to scan and decode) and never reads
the small answers; user B (uid 65534, through group 0 as the tests do) times 41
pings. Each line: B's median and maximum round trip, idle and under the flood.
Several daemons given are measured in turns (round robin over --rounds), so an
old and a new build can be compared side by side in one run. Needs root (to be
two users).
"""
import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "common"))
import dspk_daemon  # noqa: E402
from dspk_rpc import Client  # noqa: E402

NOBODY = 65534


def b_pings(sock, n=41):
    """B's round trips (seconds), from a child process as uid NOBODY."""
    def pings():
        b = Client(sock, 60)
        b.call("ping")
        t = []
        for _ in range(n):
            t0 = time.monotonic()
            b.call("ping", {"data": b"b"})
            t.append(time.monotonic() - t0)
        return t
    return dspk_daemon.run_as(NOBODY, 0, pings)


def flood(sock, conns, objects):
    """Starts the flooding connections; returns their pids once each has had
    three messages taken by the daemon."""
    frame = msgpack.packb([0, 1, "ping", [{"junk": [None] * objects}]], use_bin_type=True)
    gr, gw = os.pipe()
    kids = []
    for _ in range(conns):
        pid = os.fork()
        if pid == 0:
            try:
                c = Client(sock, 60)  # its answers (a few bytes each) are never read
                for i in range(1 << 30):
                    c.sock.sendall(frame)
                    if i == 2:
                        os.write(gw, b"x")
            finally:
                os._exit(0)
        kids.append(pid)
    os.close(gw)
    got = 0
    while got < conns:
        more = os.read(gr, conns)
        if not more:
            break
        got += len(more)
    os.close(gr)
    return kids


def one(exe, conns, objects):
    tmp = tempfile.mkdtemp(prefix="dspk-turns-")
    os.chmod(tmp, 0o711)
    sock = os.path.join(tmp, "d.sock")
    log = open(os.path.join(tmp, "log"), "w")
    proc = dspk_daemon.start(dspk_daemon.cmdline(exe, sock, ["--log-level", "warn"]), 60,
                             stderr=log)
    if proc is None:
        raise SystemExit("%s did not start" % exe)
    try:
        idle = b_pings(sock)
        kids = flood(sock, conns, objects)
        try:
            busy = b_pings(sock)
        finally:
            for k in kids:
                os.kill(k, signal.SIGKILL)
                os.waitpid(k, 0)
    finally:
        dspk_daemon.stop(proc, 60)
        shutil.rmtree(tmp, ignore_errors=True)
    return idle, busy


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dspkd", nargs="+")
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--objects", type=int, default=1000000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (two users)")
    print("# user A floods from %d connections, %d objects a message; user B pings"
          % (a.conns, a.objects))
    for rnd in range(a.rounds):
        for exe in a.dspkd:
            idle, busy = one(exe, a.conns, a.objects)
            print("round %d %-40s B ping idle median %7.2f ms (max %7.2f) | flooded median "
                  "%8.2f ms (max %8.2f)" % (rnd, exe, statistics.median(idle) * 1e3,
                                            max(idle) * 1e3, statistics.median(busy) * 1e3,
                                            max(busy) * 1e3), flush=True)


if __name__ == "__main__":
    main()
