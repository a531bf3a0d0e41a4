#!/usr/bin/env python3
"""Every method of the protocol's table (protocol.json, from proto/schema.c)
against a running dspkd: called with valid arguments, its result is a map
whose keys are the table's result fields (every field the table marks
required, no key it lacks) and whose values have each field's type (a str
for metrics), nested maps the table describes included (a map's fields,
each item of an array, each value of a map keyed by names); called without
a required parameter, or with a parameter of the wrong type, it is EINVAL
naming that parameter.  A method the table lists without a sample call here
fails the test, so a new method gets one.  task.run's outputs are checked
in each of their forms (inline, inline sent from the device's memory,
written into a buffer, written into a shared buffer as libdspkclient's
temporaries are), and trace's job records with a trace that records the
whole session (answered at daemon.stop).

usage: schema_results.py PROTOCOL_JSON DSPKD"""
import fcntl
import json
import os
import select
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from dspk_rpc import Client, RpcError, check  # noqa: E402

TIMEOUT = 30


F32 = {"dtype": "f32", "shape": [2], "data": b"\0" * 8}


def samples(c):
    """A valid call of every method, in an order that works (buffer before its use,
    daemon.stop last)."""
    f32 = F32
    return [
        ("hello", {"version": 1, "client": "schema"}),
        ("ping", {"data": b"x"}),
        ("devices", {"all": True}),
        ("status", None),
        ("buffer.create", {"device": "cpu:0", "size": 16}),
        ("buffer.write", lambda st: {"buffer": st["buffer"], "offset": 0, "data": b"\0" * 8}),
        ("buffer.read", lambda st: {"buffer": st["buffer"], "offset": 0, "size": 8}),
        ("task.run", lambda st: {"op": "map", "device": "cpu:0", "inputs": [f32],
                                 "options": {"fn": "abs"},
                                 "outputs": [{"buffer": st["buffer"], "offset": 0}]}),
        ("buffer.free", lambda st: {"buffer": st["buffer"]}),
        ("buffer.import", {"device": "cpu:0", "size": 4096}),
        ("buffer.share", {"device": "cpu:0", "size": 4096}),
        ("task.cancel", {"msgid": 12345}),
        ("cache.stats", None),
        ("cache.clear", {"kinds": ["blobs"]}),
        ("metrics", None),
        ("trace", {"seconds": 0.01}),
        ("job.register", {"job": 42, "uid": 0, "devices": []}),
        ("status", None),  # again, with a job to list
        ("job.end", {"job": 42}),
        ("job.end", {"job": 43}),  # never registered: the optional fields absent
        ("daemon.reload", None),
        ("daemon.stop", None),
    ]


def memfd(size):
    """A memfd of size bytes sealed against shrinking, as buffer.import takes."""
    fd = os.memfd_create("schema", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


# What each type of the table is once decoded from msgpack.
PYTYPES = {"uint": int, "int": int, "str": str, "bin": bytes, "bool": bool,
           "number": (int, float), "array": list, "map": dict, "enum": str,
           "enum_list": list}


def check_map(path, fields, res):
    """res: a map whose keys are those of fields (each field marked required
    present, no other key), each value as check_value says."""
    check(isinstance(res, dict), "%s is a map: %r" % (path, res))
    byname = {f["name"]: f for f in fields}
    need = sorted(f["name"] for f in fields if f["required"])
    check(set(need) <= set(res) <= set(byname),
          "%s: keys %r, the table says %r (required %r)" % (path, sorted(res),
                                                             sorted(byname), need))
    check([k for k in byname if k in res] == list(res),
          "%s: keys in the order %r, the table's is %r" % (path, list(res), list(byname)))
    for k, v in res.items():
        check_value("%s.%s" % (path, k), byname[k], v)


def check_value(path, f, v):
    """v of f's type (nil where the table allows it), and what the table says
    it holds: a map's fields, each item of an array, each value of a map keyed
    by names among its keys."""
    if v is None and f.get("nil"):
        return
    t = f["type"]
    ok = isinstance(v, PYTYPES[t]) and not (t in ("uint", "int", "number") and
                                            isinstance(v, bool)) and \
        not (t == "uint" and v < 0)
    check(ok, "%s is %r, the table says %s" % (path, v, t))
    if t in ("enum", "enum_list"):
        for x in (v if t == "enum_list" else [v]):
            check(x in f["choices"], "%s: %r is not one of %r" % (path, x, f["choices"]))
    if "fields" in f:
        check_map(path, f["fields"], v)
    if "item" in f and t == "array":
        for i, x in enumerate(v):
            check_value("%s[%d]" % (path, i), f["item"], x)
    if "item" in f and t == "map":
        for k, x in v.items():
            check(k in f["keys"], "%s: key %r is not one of %r" % (path, k, f["keys"]))
            check_value("%s.%s" % (path, k), f["item"], x)


# Nested maps the sample calls must have shown (so the checks above ran).
SEEN = ["devices.devices[0].ops", "devices.unavailable[0].reason", "status.clients[0].job",
        "status.jobs[0].devices", "status.devices[0].stats", "status.daemon.limits",
        "cache.stats.kinds.blobs.evictions", "hello.limits.max_clients",
        "task.run.outputs[0].buffer", "task.run.outputs[0].data", "task.run.outputs[0].shape[0]",
        "trace.devices[0]", "trace.jobs[0].error"]


def run_outputs(c, m, seen):
    """task.run's outputs in their other forms, each against the table: inline
    (small: read back; 128 KiB: sent from the device's block), and written
    into a shared buffer (as libdspkclient's temporaries)."""
    def run(inp, outputs=None):
        args = {"op": "map", "device": "cpu:0", "inputs": [inp], "options": {"fn": "abs"}}
        if outputs is not None:
            args["outputs"] = outputs
        res = c.call("task.run", args)
        check_result("task.run", m, res)
        paths("task.run", res, seen)
        return res["outputs"][0]

    big = {"dtype": "f32", "shape": [32768], "data": b"\0" * 131072}
    check(len(run(F32)["data"]) == 8, "an inline output")
    check(len(run(big)["data"]) == 131072, "a large inline output")
    shared = c.call("buffer.share", {"device": "cpu:0", "size": 4096})
    out = run(F32, [{"buffer": shared["buffer"], "offset": 64}])
    check(out["buffer"] == shared["buffer"] and out["offset"] == 64,
          "an output in a shared buffer: %r" % out)
    c.call("buffer.free", {"buffer": shared["buffer"]})


def paths(prefix, v, out):
    out.add(prefix)
    if isinstance(v, dict):
        for k, x in v.items():
            paths("%s.%s" % (prefix, k), x, out)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            paths("%s[%d]" % (prefix, i), x, out)


def check_result(name, m, res):
    """res against m's result fields: a str for "str"; else a map whose keys are
    the table's (each field marked required present, no other key, in the
    table's order) and whose values have their field's type, at any depth."""
    if m["result"] == "str":
        check(isinstance(res, str), "%s answers a str" % name)
        return
    check_map(name, m["result"], res)


def wrong(p):
    """A value of another type than p's."""
    return b"\x01" if p["type"] in ("str", "enum", "uint", "number", "bool") else 5


def main():
    schema = json.load(open(sys.argv[1]))
    exe = sys.argv[2]
    methods = {m["name"]: m for m in schema["methods"]}
    tmp = tempfile.mkdtemp(prefix="dspk-schema-")
    sock = os.path.join(tmp, "d.sock")
    conf = os.path.join(tmp, "dspkd.conf")
    open(conf, "w").write("")
    r, w = os.pipe()
    log = open(os.path.join(tmp, "log"), "w+")
    proc = subprocess.Popen([exe, "--foreground", "--socket", sock, "--ready-fd", str(w),
                             "--backends", "cpu", "--cache",
                             os.path.join(tmp.encode(), b"c\xff.db"),
                             "--config", conf], pass_fds=[w], stderr=log)
    os.close(w)
    ready, _, _ = select.select([r], [], [], TIMEOUT)
    check(ready and os.read(r, 16) == b"READY\n", "dspkd ready")
    c = Client(sock, TIMEOUT)
    # A trace of the whole session on its own connection: answered at
    # daemon.stop with every job the samples ran.
    tracer = Client(sock, TIMEOUT)
    whole = tracer.send("trace", {"seconds": 600})
    state = {}
    called = set()
    seen = set()
    try:
        for name, args in samples(c):
            check(name in methods, "sample call of %s, which the table lacks" % name)
            m = methods[name]
            if callable(args):
                args = args(state)
            # Each parameter: a wrong type, then (if required) absent, is EINVAL
            # naming it (admin methods and those without params have none).
            for p in m["params"]:
                bad = dict(args or {})
                bad[p["name"]] = wrong(p)
                try:
                    c.call(name, bad)
                    raise AssertionError("%s with %s=%r accepted" % (name, p["name"], bad[p["name"]]))
                except RpcError as e:
                    check(e.name == "EINVAL" and p["name"] in e.err["message"],
                          "%s %s of another type: %s" % (name, p["name"], e))
                if p["required"]:
                    bad = dict(args)
                    del bad[p["name"]]
                    try:
                        c.call(name, bad)
                        raise AssertionError("%s without %s accepted" % (name, p["name"]))
                    except RpcError as e:
                        check(e.name == "EINVAL" and p["name"] in e.err["message"],
                              "%s without %s: %s" % (name, p["name"], e))
            fds = [memfd(4096)] if name == "buffer.import" else None
            try:
                res = c.call(name, args, fds)
            finally:
                for fd in fds or []:
                    os.close(fd)
            check_result(name, m, res)
            paths(name, res, seen)
            if name == "cache.stats":
                # A str of the table stays valid UTF-8 (docs/protocol.md,
                # "Errors"): the file name's stray byte is U+FFFD.
                check(res["path"].endswith("/c\ufffd.db"), "cache.stats path %r" % res["path"])
            if name == "buffer.create":
                state["buffer"] = res["buffer"]
            if name == "task.run":
                run_outputs(c, m, seen)
            called.add(name)
        res = tracer.wait(whole)
        check_result("trace", methods["trace"], res)
        paths("trace", res, seen)
        check(any(j["kind"] == "task" and j["error"] is None and "compute_end_us" in j
                  for j in res["jobs"]),
              "the session's trace has its tasks and their phases: %r" % res["jobs"])
        check(called == set(methods), "no sample call of %s" % sorted(set(methods) - called))
        check(set(SEEN) <= seen, "nested fields never shown: %r" % sorted(set(SEEN) - seen))
        check(proc.wait(TIMEOUT) == 0, "dspkd stopped by daemon.stop")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.seek(0)
    print("every method of the table answers its table's result keys (%d methods)"
          % len(called))
    return 0


if __name__ == "__main__":
    sys.exit(main())
