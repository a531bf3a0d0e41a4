#!/usr/bin/python3
"""Writes the seed corpora of tests/fuzz (corpus/<harness>/): a handful of
valid inputs each, so the fuzzers start from real messages.  Run it again
after changing it; the files are committed.  Needs python3-msgpack and
python3-numpy."""
import io
import os
import struct

import msgpack
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def put(name, items):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    # Only the seeds: inputs added by hand (crash reproducers) stay.
    for f in os.listdir(d):
        if f.startswith("seed"):
            os.unlink(os.path.join(d, f))
    for i, data in enumerate(items):
        with open(os.path.join(d, "seed%02d" % i), "wb") as f:
            f.write(data)


def pack(o):
    return msgpack.packb(o, use_bin_type=True)


def tensor(dtype, shape, fill=1.0):
    dt = {"f32": "<f4", "f64": "<f8", "c64": "<c8", "c128": "<c16",
          "f16": "<f2"}[dtype]
    a = np.full(shape, fill, dtype=dt)
    return {"dtype": dtype, "shape": list(shape), "data": a.tobytes()}


REQUESTS = [
    [0, 1, "ping", []],
    [0, 2, "hello", [{"client": "fuzz", "protocol": 1}]],
    [0, 3, "buffer.create", [{"bytes": 4096}]],
    [0, 4, "buffer.write", [{"buffer": 1, "offset": 0, "data": b"\0" * 16}]],
    [0, 5, "buffer.read", [{"buffer": 1, "offset": 0, "bytes": 16}]],
    [0, 6, "task.run", [{"op": "gemm", "device": "cpu:0",
                         "inputs": [tensor("f32", (2, 3)), tensor("f32", (3, 2))]}]],
    [0, 7, "task.run", [{"op": "fft", "inputs": [tensor("c64", (8,))],
                         "options": {"inverse": True}}]],
    [0, 8, "task.run", [{"op": "gemm", "inputs": [
        {"dtype": "f32", "shape": [4, 4], "buffer": 1, "offset": 0},
        tensor("f32", (4, 1))], "output": {"buffer": 1, "offset": 64}}]],
    [0, 9, "task.cancel", [{"msgid": 6}]],
    [2, "progress", [{"msgid": 1}]],
    [1, 10, None, {"ok": True}],
]

# frame: 2 bytes max_message, 1 byte max_depth, 1 byte max_objects, stream.
LIMS = struct.pack("<HBB", 4096, 16, 255)
frames = [LIMS + pack(r) for r in REQUESTS[:6]]
frames.append(LIMS + pack(REQUESTS[0]) + pack(REQUESTS[1]))       # two frames
frames.append(LIMS + pack(REQUESTS[5])[:20])                        # incomplete
frames.append(LIMS + b"\xdd\x00\x00\xff\xff")                      # huge array32
frames.append(LIMS + pack([[[[[[[[[[1]]]]]]]]]]))                   # deep
frames.append(LIMS + pack(REQUESTS[3])[:-8])                        # write, data to come
RUN_ANSWER = [1, 6, None, {"device": "cpu:0", "outputs": [tensor("f32", (2, 2), 2.0)],
                           "time_us": 35}]
frames.append(LIMS + pack(RUN_ANSWER))                              # a task.run answer
frames.append(LIMS + pack(RUN_ANSWER)[:-20])                        # its data to come
put("frame", frames)

put("msg", [pack(r) for r in REQUESTS])

# tensor: max_rank, log2 max_elements, 2 extra bytes, one tensor map.
TLIMS = struct.pack("<BBH", 8, 20, 0)
put("tensor", [TLIMS + pack(t) for t in [
    tensor("f32", (2, 3)), tensor("f64", (4,)), tensor("c64", (2, 2)),
    tensor("c128", ()), tensor("f16", (1, 1, 2)),
    {"dtype": "f32", "shape": [0, 5], "data": b""},
    {"dtype": "c64", "shape": [16, 16], "buffer": 3, "offset": 128},
    {"dtype": "bf16", "shape": [2], "data": b"\0\0\0\0"},
]])


def npy(a, version=None):
    f = io.BytesIO()
    if version is None:
        np.save(f, a)
    else:
        np.lib.format.write_array(f, a, version=version)
    return f.getvalue()


put("npy", [
    npy(np.arange(6, dtype="<f4").reshape(2, 3)),
    npy(np.zeros((2, 2), dtype="<c8")),
    npy(np.float64(3.5)),
    npy(np.zeros((0, 4), dtype="<f8")),
    npy(np.ones((3,), dtype="<f2"), version=(2, 0)),
    npy(np.ones((1, 2, 1), dtype="<c16"), version=(3, 0)),
])

put("config", [s.encode() for s in [
    "[daemon]\nsocket = /run/dspk/dspkd.sock\nlog_level = info\n"
    "shutdown_timeout = 10s\n",
    "[limits]\nmax_message = 256M\nmax_depth = 16\nmax_objects = 1048576\n"
    "max_rank = 8\nmax_elements = 2147483648\nmax_inflight = 1024\n"
    "max_unsent = 64M\nmax_buffers = 4096\nmax_clients = 256\n",
    "[policy]\nallow_users = root, 0\nallow_groups = root\n"
    "admin_users = 0\nadmin_groups = 0\n",
    "; comment\n# another\n[daemon]\ncache = /var/cache/dspk/cache.db\n"
    "no_cache = no\ncache_max_bytes = 1G\nbackends = cpu\nforeground = yes\n",
    "[limits]\nmax_message = 63\n",
    # What config.c's reader refuses or takes beyond libinih: a byte order
    # mark and indentation, " ;" after a value, ':', text after "]", an
    # empty unknown section, a NUL byte, a line longer than 199 bytes.
    "\ufeff[daemon]\n  log_level = debug\n\tforeground = no\n",
    "[daemon]\nlog_level = info ; c\nbackends : cpu\n[limits] x\n[bogus]\n",
    "[daemon]\nlog_level = info\0junk\n",
    "[daemon]\n#" + "x" * 199 + "\nlog_level = info\n",
]])
