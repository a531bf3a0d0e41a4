#!/usr/bin/python3
"""End-to-end tests of what dspkd tells about itself: the `metrics` method and
its HTTP listener (read with Prometheus's own parser, python3-prometheus-
client), `dspk-submit top` (driven in tmux, read with capture-pane) and
`trace` / `dspk-submit trace` (Chrome trace-event JSON).

Each group starts its own dspkd (cpu only, no cache) on a temporary socket,
waits for READY and for each condition by polling with a deadline, never a
fixed sleep, runs a known sequence of tasks and checks the counters, the
screen or the trace against it.

    observe_test.py --dspkd PATH --submit PATH GROUP
"""
import argparse
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import dspk_daemon  # noqa: E402
import dspk_rpc  # noqa: E402
from dspk_rpc import RpcError, check  # noqa: E402

TIMEOUT = 30.0


def _mhd_version():
    """The libmicrohttpd dspkd runs with (the system's), as (major, minor,
    patch), or None when it cannot be loaded here."""
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("microhttpd")
    if not name:
        return None
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.MHD_get_version.restype = ctypes.c_char_p
    try:
        return tuple(int(x) for x in lib.MHD_get_version().decode().split(".")[:3])
    except ValueError:
        return None


# libmicrohttpd 0.9.75 and earlier: how dspkd tells a folded line, and what
# that library's parser does before dspkd sees a request (docs/protocol.md).
_MHD = _mhd_version()
MHD_OLD = _MHD is not None and _MHD <= (0, 9, 75)
DAEMONS = []



def raw_http(host, port, request, enough=lambda got: False):
    """Sends request (bytes) on a new connection to host:port and reads the
    answer until the daemon closes it or enough(bytes read so far)."""
    s = socket.create_connection((host, int(port)), timeout=TIMEOUT)
    s.sendall(request)
    got = b""
    while not enough(got):
        more = s.recv(65536)
        if not more:
            break
        got += more
    s.close()
    return got

def tensor(a):
    names = {np.dtype(np.float64): "f64", np.dtype(np.complex128): "c128"}
    a = np.ascontiguousarray(a)
    return {"dtype": names[a.dtype], "shape": list(a.shape), "data": a.tobytes()}


class Daemon:
    def __init__(self, exe, tmp, extra=()):
        self.sock = os.path.join(tmp, "dspkd-%d.sock" % len(DAEMONS))
        self.log = open(os.path.join(tmp, "dspkd-%d.log" % len(DAEMONS)), "w+")
        self.proc = dspk_daemon.start(dspk_daemon.cmdline(exe, self.sock, extra), TIMEOUT,
                                      stderr=self.log)
        if not self.proc:
            raise AssertionError("dspkd did not become ready:\n" + self.logtext())
        DAEMONS.append(self)

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def client(self):
        return dspk_rpc.Client(self.sock, TIMEOUT)

    def metrics_url(self):
        m = re.search(r"metrics: serving (http://\S+/metrics)", self.logtext())
        check(m, "the log names the metrics URL:\n" + self.logtext())
        return m.group(1)

    def stop(self):
        rc = dspk_daemon.stop(self.proc, TIMEOUT)
        if rc is None:
            raise AssertionError("dspkd did not stop on SIGTERM:\n" + self.logtext())
        check(rc == 0, "dspkd exited with %d after SIGTERM:\n%s" % (rc, self.logtext()))


def wait_until(what, fn, timeout=TIMEOUT, every=0.02):
    """Polls fn() until it returns something true; fails after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        check(time.monotonic() < deadline, "timed out waiting for " + what)
        time.sleep(every)


def samples(text):
    """{(name, frozenset(labels)): value} through Prometheus's parser."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def val(ss, name, **labels):
    key = (name, frozenset(labels.items()))
    check(key in ss, "metric %s%r present" % (name, labels))
    return ss[key]


def running_mine(c, dev="cpu:0"):
    """The running_op of dev in status, or None."""
    for x in c.call("status")["devices"]:
        if x["id"] == dev:
            return x["running_op"]
    return None


# ---- metrics -------------------------------------------------------------------

def check_histograms(ss, name):
    """Buckets are cumulative, +Inf equals _count, for every series."""
    series = {}
    for (n, labels), v in ss.items():
        if n == name + "_bucket":
            d = dict(labels)
            le = d.pop("le")
            series.setdefault(frozenset(d.items()), []).append(
                (float("inf") if le == "+Inf" else float(le), v))
    check(series, "%s has series" % name)
    for labels, b in series.items():
        b.sort()
        check(all(b[i][1] <= b[i + 1][1] for i in range(len(b) - 1)), "%s cumulative" % name)
        check(b[-1][0] == float("inf") and b[-1][1] == ss[(name + "_count", labels)],
              "%s: +Inf bucket is the count" % name)


def t_metrics(exe, submit, tmp):
    """A known sequence of tasks, then the counters through the method, the
    HTTP listener and dspk-submit metrics --json."""
    d = Daemon(exe, tmp, ["--metrics-listen", "127.0.0.1:0"])
    url = d.metrics_url()
    c = d.client()
    rng = np.random.default_rng(1)
    A = rng.standard_normal((64, 64))
    sent = 0
    for _ in range(3):
        c.call("task.run", {"op": "gemm", "device": "cpu:0", "inputs": [tensor(A), tensor(A)]})
        sent += 2 * A.nbytes
    c.call("task.run", {"op": "fft", "device": "cpu:0", "inputs": [tensor(A)]})
    sent += A.nbytes
    # Operands in buffers, so the gemms below cost no transfer: 3 buffer jobs.
    N = 1200
    B = rng.standard_normal((N, N))
    bb = c.call("buffer.create", {"device": "cpu:0", "size": B.nbytes})["buffer"]
    c.call("buffer.write", {"buffer": bb, "data": B.tobytes()})
    ob = c.call("buffer.create", {"device": "cpu:0", "size": B.nbytes})["buffer"]
    sent += B.nbytes
    ref = {"buffer": bb, "dtype": "f64", "shape": [N, N]}
    # A gemm canceled while it runs finishes as ECANCELED.  It may finish
    # before the cancel arrives on a fast machine: then it counts as ok and
    # the next one is tried.
    extra_ok = tries = 0
    while True:
        tries += 1
        check(tries <= 20, "a running gemm canceled within 20 tries")
        slow = c.send("task.run", {"op": "gemm", "inputs": [ref, ref],
                                   "outputs": [{"buffer": ob}]})
        wait_until("the slow gemm to run", lambda: running_mine(c), every=0.001)
        c.call("task.cancel", {"msgid": slow})
        outcome = c.outcome(slow)
        check(outcome in ("ok", "ECANCELED"), "slow gemm: %s" % outcome)
        if outcome == "ECANCELED":
            break
        extra_ok += 1
    # A request refused before it reaches a device is not a task.
    try:
        c.call("task.run", {"op": "gemm", "device": "cpu:0", "inputs": [tensor(A)]})
        check(False, "a gemm of one input is refused")
    except RpcError:
        pass

    text = c.call("metrics")
    check(isinstance(text, str), "metrics answers a str")
    ss = samples(text)
    dev = {"device": "cpu:0"}
    check(val(ss, "dspk_tasks_total", op="gemm", result="ok", **dev) == 3 + extra_ok,
          "3 (+%d) gemms ok" % extra_ok)
    check(val(ss, "dspk_tasks_total", op="fft", result="ok", **dev) == 1, "1 fft ok")
    check(val(ss, "dspk_tasks_total", op="gemm", result="canceled", **dev) == 1, "1 canceled")
    check(("dspk_tasks_total", frozenset(dict(op="gemm", result="error", **dev).items()))
          not in ss, "no gemm failed")
    check(val(ss, "dspk_task_run_seconds_count", op="gemm", **dev) == 3 + tries,
          "every gemm run timed")
    check(val(ss, "dspk_task_run_seconds_count", op="fft", **dev) == 1, "1 fft run timed")
    check(val(ss, "dspk_task_queue_seconds_count", **dev) == 4 + 3 + tries,
          "every task and buffer job queued")
    check(0 < val(ss, "dspk_task_run_seconds_sum", op="gemm", **dev) < 60, "gemm run time")
    check_histograms(ss, "dspk_task_run_seconds")
    check_histograms(ss, "dspk_task_queue_seconds")
    check(val(ss, "dspk_queue_depth", **dev) == 0, "queue empty")
    check(val(ss, "dspk_running_jobs", **dev) == 0, "nothing running")
    check(val(ss, "dspk_jobs_total", result="ok", **dev) == 4 + 3 + extra_ok, "jobs ok")
    check(val(ss, "dspk_jobs_total", result="error", **dev) == 1, "1 job failed (canceled)")
    up = val(ss, "dspk_uptime_seconds")
    busy = val(ss, "dspk_device_busy_seconds_total", **dev)
    check(0 < busy <= up, "busy time %g within uptime %g" % (busy, up))
    check(0 <= val(ss, "dspk_device_busy_ratio", **dev) <= 1, "busy ratio")
    check(val(ss, "dspk_device_memory_bytes", **dev) > 0, "device memory")
    for n in ("dspk_memory_in_use_bytes", "dspk_memory_cached_bytes",
              "dspk_retire_deferred_total", "dspk_retire_released_total",
              "dspk_retire_leaked_total", "dspk_kernels_compiled_total"):
        check(val(ss, n, **dev) >= 0, n)
    for kind in ("kernels", "autotune", "blobs"):
        check(val(ss, "dspk_cache_hits_total", kind=kind) == 0, "no cache: no hits")
        check(val(ss, "dspk_cache_misses_total", kind=kind) == 0, "no cache: no misses")
    check(val(ss, "dspk_connections") == 1, "one connection open")
    check(val(ss, "dspk_connections_total") == 1, "one accepted")
    check(val(ss, "dspk_received_bytes_total") > sent, "bytes in > %d tensor bytes" % sent)
    check(val(ss, "dspk_sent_bytes_total") > 3 * A.nbytes, "bytes out > the gemm results")
    check(val(ss, "dspk_info", version=val_version(c)) == 1, "version")

    # The same counters over HTTP, with the Prometheus content type.
    with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
        check(r.status == 200, "GET /metrics")
        check(r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), "content type")
        hs = samples(r.read().decode())
    for key in (("dspk_tasks_total", dict(op="gemm", result="ok", **dev)),
                ("dspk_tasks_total", dict(op="gemm", result="canceled", **dev)),
                ("dspk_task_run_seconds_count", dict(op="gemm", **dev)),
                ("dspk_connections", {}), ("dspk_connections_total", {})):
        check(val(hs, key[0], **key[1]) == val(ss, key[0], **key[1]), "HTTP agrees: %r" % (key,))
    for path, method, code in (("/", "GET", 404), ("/metrics", "POST", 405)):
        req = urllib.request.Request(url.replace("/metrics", path), method=method,
                                     data=b"x" if method == "POST" else None)
        try:
            urllib.request.urlopen(req, timeout=TIMEOUT)
            check(False, "%s %s refused" % (method, path))
        except urllib.error.HTTPError as e:
            check(e.code == code, "%s %s: %d" % (method, path, e.code))
    # A refused request is answered from its headers, before any body: no
    # "100 Continue" invites the upload, and the answer comes while the body
    # is still unsent (a client that sends none still gets it).
    host, port = url.split("/")[2].rsplit(":", 1)
    for head, code in (("POST /metrics HTTP/1.1\r\nExpect: 100-continue\r\n", 405),
                       ("PUT /metrics HTTP/1.1\r\n", 405),
                       ("POST /other HTTP/1.1\r\nExpect: 100-continue\r\n", 405),
                       ("GET /other HTTP/1.1\r\nExpect: 100-continue\r\n", 404),
                       ("GET /metrics HTTP/1.1\r\nExpect: 100-continue\r\n", 400)):
        s = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        s.sendall(("%sHost: x\r\nContent-Length: %d\r\n\r\n" % (head, 1 << 30)).encode())
        got = b""
        while b"\r\n\r\n" not in got:
            more = s.recv(4096)
            check(more, "an answer before the body: %r" % got)
            got += more
        s.close()
        status = got.split(b"\r\n")[0]
        check(status.startswith(b"HTTP/1.1 %d " % code) and b"100 Continue" not in got,
              "%r answered %d at once: %r" % (head.split("\r")[0], code, got[:200]))

    # Malformed requests, whole (headers and nothing more): 400 with the reason,
    # whichever line comes first (libmicrohttpd's lookup sees only the first).
    for hdrs, why in (("Content-Length: 0\r\nContent-Length: 5\r\n",
                       b"duplicate Content-Length"),
                      ("Content-Length: 0\r\ncontent-length: 0\r\n",
                       b"duplicate Content-Length"),
                      ("Host: y\r\n", b"duplicate Host"),
                      ("Content-Length: x\r\n", b"Content-Length"),  # libmicrohttpd's 400
                      ("Transfer-Encoding: chunked\r\n", b"takes no body"),
                      # A line folded onto Host (libmicrohttpd 0.9 joins it to the
                      # name): not "no Host header".
                      (" Folded: y\r\n", b"a line folded onto the one before it"),
                      ("\tz\r\n", b'"Hostz" may be a Host line with a line folded'),
                      ("Bad Name: y\r\n", b"no token"),
                      # A fold onto any other field, whatever it holds: a word
                      # (the join "X-Ac" is a token), a tab, blanks only (probe
                      # 15 A2, E9); with libmicrohttpd 0.9.75 and earlier.
                      *([("X-A: b\r\n c\r\n", b"a line folded onto the one before it"),
                         ("X-A: b\r\n\tc\r\n", b"a line folded onto the one before it"),
                         ("X-A:\r\n c\r\n", b"a line folded onto the one before it"),
                         ("Content-Length: 0\r\n  \r\n",
                          b"a line folded onto the one before it"),
                         ("X-A: b\r\n c\r\nY: z\r\n", b"a line folded onto the one before it")]
                        if MHD_OLD else []),
                      ("X : y\r\n", b"no token")):
        got = raw_http(host, port, ("GET /metrics HTTP/1.1\r\nHost: x\r\n%s\r\n" % hdrs)
                       .encode(), lambda got, why=why: b"\r\n\r\n" in got and why in got)
        check(got.startswith(b"HTTP/1.1 400 ") and why in got,
              "%r: want 400 %r, got %r" % (hdrs, why, got[:300]))
    # The request target and version (docs/protocol.md, "metrics"): HTTP/1.1
    # without Host is 400 (RFC 9112 3.2), HTTP/1.0 without it is served; a
    # query is ignored; the path is compared as sent, not percent-decoded
    # (/metrics%00 and /%6detrics were served), and the absolute form is 404.
    for line, with_host, code in (("GET /metrics HTTP/1.1", False, 400),
                                  ("HEAD /metrics HTTP/1.1", False, 400),
                                  ("GET /metrics HTTP/1.0", False, 200),
                                  ("GET /metrics?x=1 HTTP/1.1", True, 200),
                                  ("GET /metrics?a=%00 HTTP/1.1", True, 200),
                                  ("GET /metrics%00 HTTP/1.1", True, 404),
                                  ("GET /%6detrics HTTP/1.1", True, 404),
                                  ("GET /metrics%3fx HTTP/1.1", True, 404),
                                  ("GET http://x/metrics HTTP/1.1", True, 404)):
        got = raw_http(host, port, ("%s\r\n%sConnection: close\r\n\r\n"
                                    % (line, "Host: x\r\n" if with_host else "")).encode())
        check(re.match(rb"HTTP/1\.[01] %d " % code, got) and
              (code != 400 or line.startswith("HEAD") or b"no Host header" in got) and
              (code != 200 or line.startswith("HEAD") or b"dspk_connections" in got),
              "%r: want %d, got %r" % (line, code, got[:200]))
    # A well-formed GET with Content-Length: 0 is still served.
    got = raw_http(host, port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                               b"Connection: close\r\n\r\n")
    check(got.startswith(b"HTTP/1.1 200 ") and b"dspk_connections" in got,
          "GET with Content-Length: 0: %r" % got[:200])
    # Fields of every shape that is not a fold are served: blanks around the
    # value, none, an empty value (the fold check reads how libmicrohttpd
    # stores each line).
    got = raw_http(host, port, b"GET /metrics HTTP/1.1\r\nHost:x\r\nA:   b  \r\nB:\tc\r\n"
                               b"E:\r\nF: \r\nG:\t\r\nConnection: close\r\n\r\n")
    check(got.startswith(b"HTTP/1.1 200 ") and b"dspk_connections" in got,
          "fields of other shapes: %r" % got[:200])
    # What libmicrohttpd 0.9 reads before the daemon sees the request, as
    # docs/protocol.md says: an empty field name dropped, a value cut at a
    # NUL (both served), a request line with tabs closed with no answer.
    if MHD_OLD:
        for req, want in ((b"GET /metrics HTTP/1.1\r\nHost: x\r\n: b\r\n", b"HTTP/1.1 200 "),
                          (b"GET /metrics HTTP/1.1\r\nHost: a\0b\r\n", b"HTTP/1.1 200 "),
                          (b"GET\t/metrics\tHTTP/1.1\r\nHost: x\r\n", b"")):
            try:
                got = raw_http(host, port, req + b"Connection: close\r\n\r\n")
            except ConnectionResetError:  # closed with the request unread
                got = b""
            check(got.startswith(want) if want else got == b"", "%r: %r" % (req, got[:200]))

    # dspk-submit metrics: the text, and --json with the same values.
    p = subprocess.run([submit, "-S", d.sock, "metrics"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    check(p.returncode == 0, "dspk-submit metrics: %s" % p.stderr)
    cs = samples(p.stdout)
    check(val(cs, "dspk_tasks_total", op="gemm", result="ok", **dev) == 3 + extra_ok,
          "CLI text")
    check(val(cs, "dspk_connections_total") == 2, "the CLI's connection counted")
    p = subprocess.run([submit, "-S", d.sock, "metrics", "--json"], capture_output=True,
                       text=True, timeout=TIMEOUT)
    check(p.returncode == 0, "dspk-submit metrics --json: %s" % p.stderr)
    js = json.loads(p.stdout)
    got = [x["value"] for x in js if x["name"] == "dspk_tasks_total" and
           x["labels"] == {"device": "cpu:0", "op": "fft", "result": "ok"}]
    check(got == [1], "JSON sample: %r" % got)
    infs = [x for x in js if x["labels"].get("le") == "+Inf"]
    check(infs and all(isinstance(x["value"], (int, float)) for x in infs), "+Inf buckets")
    c.close()
    d.stop()

    # The configuration key does what the flag does; a bad address stops the start.
    conf = os.path.join(tmp, "metrics.conf")
    with open(conf, "w") as f:
        f.write("[daemon]\nmetrics_listen = 127.0.0.1:0\n")
    d = Daemon(exe, tmp, ["--config", conf])
    with urllib.request.urlopen(d.metrics_url(), timeout=TIMEOUT) as r:
        check(val(samples(r.read().decode()), "dspk_connections") == 0, "no client yet")
    d.stop()
    p = subprocess.run([exe, "--foreground", "--socket", os.path.join(tmp, "bad.sock"),
                        "--backends", "cpu", "--no-cache", "--metrics-listen", "127.0.0.1"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    check(p.returncode == 2 and "--metrics-listen" in p.stderr and "ADDR:PORT" in p.stderr,
          "a listen address without a port is a bad command line (exit 2): %d %s" %
          (p.returncode, p.stderr))


def val_version(c):
    return c.call("status")["daemon"]["version"]


# ---- trace -----------------------------------------------------------------------

def t_trace(exe, submit, tmp):
    """dspk-submit trace while gemm, fft and reduce run in order: valid Chrome
    trace-event JSON with the three tasks in order on cpu:0."""
    d = Daemon(exe, tmp)
    c = d.client()
    for bad in ({}, {"seconds": 0}, {"seconds": -1}, {"seconds": 601}, {"seconds": "1"}):
        try:
            c.call("trace", bad)
            check(False, "trace %r refused" % bad)
        except RpcError as e:
            check(e.name == "EINVAL", "trace %r: %s" % (bad, e.name))
    out = os.path.join(tmp, "t.json")
    tr = subprocess.Popen([submit, "-S", d.sock, "trace", "-o", out, "--seconds", "5", "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until("the trace to start", lambda: samples(c.call("metrics")).get(
        ("dspk_traces_in_progress", frozenset())) == 1)
    rng = np.random.default_rng(2)
    A = rng.standard_normal((128, 128))
    ids = []
    for op, ins, opts in (("gemm", [A, A], None), ("fft", [A], None),
                          ("reduce", [A], {"fn": "sum"})):
        args = {"op": op, "device": "cpu:0", "inputs": [tensor(x) for x in ins]}
        if opts:
            args["options"] = opts
        mid = c.send("task.run", args)
        c.wait(mid)
        ids.append(mid)
    so, se = tr.communicate(timeout=TIMEOUT)
    check(tr.returncode == 0, "dspk-submit trace: %s" % se)
    check(json.loads(so) == {"output": out, "seconds": 5, "jobs": 3, "dropped": 0},
          "trace --json summary: %r" % so)
    with open(out) as f:
        doc = json.load(f)
    ev = doc["traceEvents"]
    check(isinstance(ev, list) and ev, "traceEvents is a non-empty list")
    for e in ev:
        for k in ("name", "ph", "pid", "tid"):
            check(k in e, "event has %s: %r" % (k, e))
        check(e["ph"] in ("X", "M"), "complete or metadata events: %r" % e)
        if e["ph"] == "X":
            check(isinstance(e["ts"], (int, float)) and e["ts"] >= 0, "ts >= 0: %r" % e)
            check(isinstance(e["dur"], (int, float)) and e["dur"] >= 0, "dur >= 0: %r" % e)
    pids = {e["args"]["name"]: e["pid"] for e in ev
            if e["ph"] == "M" and e["name"] == "process_name"}
    check("cpu:0" in pids, "a process for cpu:0: %r" % pids)
    cpu = pids["cpu:0"]
    tasks = sorted((e for e in ev if e["ph"] == "X" and e["pid"] == cpu and e["cat"] == "task"),
                   key=lambda e: e["ts"])
    check([e["name"] for e in tasks] == ["gemm", "fft", "reduce"],
          "the tasks in order: %r" % [e["name"] for e in tasks])
    check([e["args"]["msgid"] for e in tasks] == ids, "their msgids")
    check(len({e["tid"] for e in tasks}) == 1, "one runner thread")
    for t in tasks:
        inside = [e for e in ev if e["ph"] == "X" and e["pid"] == cpu and e["tid"] == t["tid"]
                  and e["cat"] == "phase" and t["ts"] <= e["ts"]
                  and e["ts"] + e["dur"] <= t["ts"] + t["dur"]]
        names = [e["name"] for e in sorted(inside, key=lambda e: e["ts"])]
        check(names == ["upload", "compute", "download"], "%s phases: %r" % (t["name"], names))
    queued = [e for e in ev if e["ph"] == "X" and e.get("cat") == "queue"]
    for t in tasks:
        q = [e for e in queued if e["args"]["msgid"] == t["args"]["msgid"]
             and e["args"]["client"] == t["args"]["client"]]
        check(len(q) <= 1 and all(e["ts"] + e["dur"] == t["ts"] for e in q),
              "a queue wait ends where its task starts")
    check(doc["otherData"]["dropped"] == 0, "nothing dropped")

    # A client that leaves ends its trace (and the recording) at once.
    gone = d.client()
    gone.send("trace", {"seconds": 600})
    traces = lambda: samples(c.call("metrics")).get(("dspk_traces_in_progress", frozenset()))
    wait_until("the client's trace to start", lambda: traces() == 1)
    gone.close()
    wait_until("the trace to end with its client", lambda: traces() == 0)

    # A trace still recording when the daemon stops is answered at once.
    t0 = time.monotonic()
    mid = c.send("trace", {"seconds": 600})
    wait_until("the second trace", lambda: samples(c.call("metrics")).get(
        ("dspk_traces_in_progress", frozenset())) == 1)
    d.proc.send_signal(signal.SIGTERM)
    res = c.wait(mid)
    check(time.monotonic() - t0 < TIMEOUT and res["jobs"] == [] and res["devices"] == ["cpu:0"],
          "trace answered at the stop: %r" % res)
    c.close()
    check(d.proc.wait(TIMEOUT) == 0, "dspkd exits 0")


def t_trace_tune(exe, submit, tmp):
    """A gemm on vulkan:0 autotunes on its first run: its trace record has the
    tuning phase inside compute (exit 77, skipped, without a Vulkan device)."""
    d = Daemon(exe, tmp, ["--backends", "cpu,vulkan"])
    c = d.client()
    if "vulkan:0" not in [x["id"] for x in c.call("devices")["devices"]]:
        print("skip: no vulkan:0")
        c.close()
        d.stop()
        sys.exit(77)
    mid = c.send("trace", {"seconds": 600})
    wait_until("the trace to start", lambda: samples(c.call("metrics")).get(
        ("dspk_traces_in_progress", frozenset())) == 1)
    A = np.random.default_rng(4).standard_normal((256, 256)).astype(np.float32)
    g = c.call("task.run", {"op": "gemm", "device": "vulkan:0", "inputs": [
        {"dtype": "f32", "shape": [256, 256], "data": A.tobytes()}] * 2})
    check(g["device"] == "vulkan:0", "ran on vulkan:0")
    ss = samples(c.call("metrics"))
    check(val(ss, "dspk_kernels_compiled_total", device="vulkan:0") > 0, "kernels compiled")
    check(val(ss, "dspk_tasks_total", device="vulkan:0", op="gemm", result="ok") == 1, "gemm ok")
    # The stop answers the trace at once with what it recorded.
    d.proc.send_signal(signal.SIGTERM)
    jobs = [j for j in c.wait(mid)["jobs"] if j["device"] == "vulkan:0"]
    check(len(jobs) == 1 and jobs[0]["name"] == "gemm", "one gemm on vulkan:0: %r" % jobs)
    j = jobs[0]
    check("tune_start_us" in j, "the gemm tuned: %r" % j)
    check(j["queued_us"] <= j["start_us"] <= j["upload_end_us"] <= j["tune_start_us"]
          <= j["tune_end_us"] <= j["compute_end_us"] <= j["end_us"], "phases in order: %r" % j)
    check(j["tune_end_us"] > j["tune_start_us"], "tuning took time")
    c.close()
    check(d.proc.wait(TIMEOUT) == 0, "dspkd exits 0")


# ---- top -------------------------------------------------------------------------

class Tmux:
    def __init__(self, tmp):
        self.sock = os.path.join(tmp, "tmux.sock")
        self.env = dict(os.environ, TERM="xterm-256color")

    def run(self, *args, check_rc=True):
        p = subprocess.run(["tmux", "-S", self.sock] + list(args), capture_output=True,
                           text=True, env=self.env, timeout=TIMEOUT)
        if check_rc:
            check(p.returncode == 0, "tmux %r: %s" % (args, p.stderr))
        return p

    def screen(self):
        return self.run("capture-pane", "-p", "-t", "top").stdout

    def alive(self):
        return self.run("has-session", "-t", "top", check_rc=False).returncode == 0

    def kill(self):
        self.run("kill-server", check_rc=False)


def device_line(screen, dev="cpu:0"):
    for line in screen.splitlines():
        if line.startswith(dev + " "):
            return line
    return None


def t_top(exe, submit, tmp):
    """dspk-submit top in tmux: the device line, the running op while a long
    gemm runs, q quits with status 0; --once prints one frame."""
    d = Daemon(exe, tmp)
    p = subprocess.run([submit, "-S", d.sock, "top", "--once"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    check(p.returncode == 0, "top --once: %s" % p.stderr)
    line = device_line(p.stdout)
    check(line and re.search(r"\b0%", line) and line.rstrip().endswith("-"),
          "an idle cpu:0 line: %r" % p.stdout)
    check("BUSY" in p.stdout and "RUNNING" in p.stdout, "headers: %r" % p.stdout)
    p = subprocess.run([submit, "-S", d.sock, "top", "--json"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    check(p.returncode == 0, "top --json: %s" % p.stderr)
    devs = {x["id"]: x for x in json.loads(p.stdout)["devices"]}
    check(devs["cpu:0"]["running_op"] is None and devs["cpu:0"]["busy"] == 0,
          "top --json: an idle cpu:0: %r" % devs)

    tm = Tmux(tmp)
    rc = os.path.join(tmp, "top.rc")
    try:
        tm.run("new-session", "-d", "-s", "top", "-x", "160", "-y", "40",
               "%s -S %s top -n 0.1; echo $? > %s" % (submit, d.sock, rc))
        wait_until("the cpu:0 line in top", lambda: device_line(tm.screen()))
        c = d.client()
        c.call("hello", {"version": 1, "client": "observe-test"})
        N = 1000
        B = np.random.default_rng(3).standard_normal((N, N))
        bb = c.call("buffer.create", {"device": "cpu:0", "size": B.nbytes})["buffer"]
        c.call("buffer.write", {"buffer": bb, "data": B.tobytes()})
        ob = c.call("buffer.create", {"device": "cpu:0", "size": B.nbytes})["buffer"]
        ref = {"buffer": bb, "dtype": "f64", "shape": [N, N]}
        # Gemms back to back on buffers: one runs while the others wait, so
        # the screen shows a gemm running long before the last one ends.
        for _ in range(200):
            c.send("task.run", {"op": "gemm", "inputs": [ref, ref], "outputs": [{"buffer": ob}]})
        seen = wait_until("a running gemm in top", lambda: (
            lambda ln: ln if ln and re.search(r"\bgemm \d+(\.\d)?[sm]", ln) else None)(
                device_line(tm.screen())))
        print("top showed: %s" % seen.rstrip())
        check(re.search(r"\d+%", seen), "busy shown: %r" % seen)
        check("observe-test" in tm.screen(), "the client listed by name")
        c.close()  # drops the queued gemms, cancels the running one
        wait_until("the device idle again", lambda: (
            lambda ln: ln and ln.rstrip().endswith("-"))(device_line(tm.screen())))
        tm.run("send-keys", "-t", "top", "q")
        wait_until("top to quit", lambda: not tm.alive())
        with open(rc) as f:
            check(f.read().strip() == "0", "top exits 0 on q")
    finally:
        tm.kill()
    d.stop()


def t_httpidle(exe, submit, tmp):
    """Idle and half-sent connections to the HTTP listener do not starve
    scrapes (the listener took 16 connections with a 30 s timeout: 64
    half-sent requests blocked every scrape for minutes); the listener's
    per-client messages are debug lines; its log names the real address."""
    d = Daemon(exe, tmp, ["--metrics-listen", "127.0.0.1:0"])
    url = d.metrics_url()
    m = re.match(r"http://127\.0\.0\.1:(\d+)/metrics$", url)
    check(m and int(m.group(1)) > 0, "URL with the address and the chosen port: %s" % url)
    port = int(m.group(1))
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
    for s in socks[:64]:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
    with urllib.request.urlopen(url, timeout=4) as r:
        check(r.status == 200 and b"dspk_connections" in r.read(),
              "a scrape with 100 idle or half-sent connections open")
    # An idle connection is closed by the listener (5 s without progress).
    socks[80].settimeout(30)
    check(socks[80].recv(1) == b"", "the listener closed an idle connection")
    for s in socks:
        s.close()
    with urllib.request.urlopen(url, timeout=4) as r:
        check(r.status == 200, "a scrape after they closed")
    d.stop()
    log = d.logtext()
    bad = [ln for ln in log.splitlines() if "metrics listener" in ln and "debug:" not in ln]
    check(not bad, "libmicrohttpd's messages about clients are debug lines: %s" % bad)

    # Every address (":PORT"): IPv6 and IPv4 alike, one dual-stack socket on
    # [::]; 0.0.0.0 only on a host without IPv6 (it bound 0.0.0.0 always:
    # a scrape of [::1] was refused).
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        probe.bind(("::1", 0))
        probe.close()
        has_v6 = True
    except OSError as e:
        has_v6 = False
        print("note: no IPv6 loopback here (%s): only the IPv4 fallback is checked" % e)
    d = Daemon(exe, tmp, ["--metrics-listen", ":0"])
    url = d.metrics_url()
    m = re.match(r"http://(0\.0\.0\.0|\[::\]):([1-9]\d*)/metrics$", url)
    check(m and m.group(1) == ("[::]" if has_v6 else "0.0.0.0"),
          "URL of a listener on every address: %s" % url)
    for host in ["127.0.0.1"] + (["[::1]"] if has_v6 else []):
        with urllib.request.urlopen("http://%s:%s/metrics" % (host, m.group(2)),
                                    timeout=TIMEOUT) as r:
            check(r.status == 200 and b"dspk_connections" in r.read(),
                  "a scrape of %s on a listener on every address" % host)
    check("(every address, IPv6 and IPv4)" in d.logtext(), ":0 said every address")
    d.stop()
    # [::]:0 is the same listener as :0 (dual-stack), and said so.
    if has_v6:
        d = Daemon(exe, tmp, ["--metrics-listen", "[::]:0"])
        url = d.metrics_url()
        m = re.match(r"http://\[::\]:([1-9]\d*)/metrics$", url)
        check(m and "(every address, IPv6 and IPv4)" in d.logtext(),
              "[::]:0 said every address:\n" + d.logtext())
        with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % m.group(1),
                                    timeout=TIMEOUT) as r:
            check(r.status == 200, "[::]:0 is reached over IPv4")
        d.stop()

    # An address of another host: the error names the cause, not "port 0".
    p = subprocess.run([exe, "--foreground", "--socket", os.path.join(tmp, "bad2.sock"),
                        "--backends", "cpu", "--no-cache", "--metrics-listen", "192.0.2.1:9999"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    check(p.returncode != 0 and "port 0" not in p.stderr and
          "192.0.2.1:9999: cannot listen: bind: " in p.stderr and
          "not an address of this host" in p.stderr,
          "listen on a foreign address: %d %s" % (p.returncode, p.stderr))
    check("error: --metrics-listen 192.0.2.1:9999: " in p.stderr,
          "the option is named, not the file's key: %s" % p.stderr)
    # A name that does not resolve: the host is quoted, not host:port; the
    # option named as given (the file's key, after its file, when set there).
    p = subprocess.run([exe, "--foreground", "--socket", os.path.join(tmp, "bad3.sock"),
                        "--backends", "cpu", "--no-cache", "--metrics-listen",
                        "nosuchhost.invalid:0"], capture_output=True, text=True, timeout=TIMEOUT)
    check(p.returncode == 1 and "error: --metrics-listen nosuchhost.invalid:0: cannot resolve "
          'the address "nosuchhost.invalid": ' in p.stderr,
          "unresolvable: %d %s" % (p.returncode, p.stderr))
    conf = os.path.join(tmp, "unresolvable.conf")
    with open(conf, "w") as f:
        f.write("[daemon]\nmetrics_listen = nosuchhost.invalid:0\n")
    p = subprocess.run([exe, "--foreground", "--socket", os.path.join(tmp, "bad3.sock"),
                        "--backends", "cpu", "--no-cache", "--config", conf],
                       capture_output=True, text=True, timeout=TIMEOUT)
    check(p.returncode == 1 and "error: %s: metrics_listen nosuchhost.invalid:0: cannot "
          "resolve" % conf in p.stderr, "unresolvable, from the file: %d %s"
          % (p.returncode, p.stderr))


GROUPS = {"metrics": t_metrics, "trace": t_trace, "trace_tune": t_trace_tune, "top": t_top, "httpidle": t_httpidle}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspkd", required=True)
    ap.add_argument("--submit", required=True)
    ap.add_argument("group", choices=sorted(GROUPS))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dspk-obs-", dir="/tmp")
    try:
        t0 = time.monotonic()
        GROUPS[a.group](a.dspkd, a.submit, tmp)
        print("ok %s (%.2f s)" % (a.group, time.monotonic() - t0))
    except BaseException:
        for d in DAEMONS:
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
            sys.stderr.write("---- dspkd log ----\n" + d.logtext()[-4000:])
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
