#!/usr/bin/python3
"""dspkd's Vulkan backend under the Khronos validation layer
(VK_LAYER_KHRONOS_validation, Debian's vulkan-validationlayers): every
Vulkan call the daemon makes for the cases below is checked by the layer,
and any "Validation Error" it prints fails the test (but one that a
structure of an extension newer than the layer is of an "unknown
VkStructureType": the layer cannot check it; such messages are listed).  lavapipe, the CPU
driver, runs invalid Vulkan it does not need to refuse (a storage-buffer
binding past maxStorageBufferRange, for one), so results alone do not show
it.

The cases: fft (complex and real, power-of-two, odd and Bluestein lengths)
on a slice at the end of a buffer larger than maxStorageBufferRange (as
input, as output written there, and in place); tensors of about half of
max_tensor_bytes whose temporaries (Bluestein's padded rows, real rows
widened to complex) are larger than the range; and a few ordinary ops
(gemm, fir, reduce, map, contract, a raw GLSL kernel).  Every result is
checked against numpy.

Tensors above DSPK_VALIDATION_INLINE_MAX bytes (default 128 MiB) go through
daemon buffers in pieces, not inline: a large GPU's max_tensor_bytes (4 GiB
on an H100) passes max_message.

Exit status: 0 when every case passed and the layer reported nothing, 77
(skipped) when the machine has no Vulkan device, 1 otherwise, including
when the validation layer is not installed (a test that could not look
must not pass: install vulkan-validationlayers, scripts/deps.sh)."""
import argparse
import glob
import os
import re
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import dspk_daemon  # noqa: E402
import dspk_rpc  # noqa: E402

LAYER = "VK_LAYER_KHRONOS_validation"
NAMES = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64",
         np.dtype(np.complex64): "c64", np.dtype(np.complex128): "c128"}
DTYPES = {v: k for k, v in NAMES.items()}


def layer_installed():
    """The layer's manifest where the Vulkan loader looks for explicit
    layers (VK_LAYER_PATH, the XDG data and config directories, /etc)."""
    dirs = [d for d in os.environ.get("VK_LAYER_PATH", "").split(":") if d]
    xdg = os.environ.get("XDG_DATA_DIRS", "/usr/local/share:/usr/share").split(":")
    for base in xdg + ["/etc", "/usr/local/etc"]:
        if base:
            dirs.append(os.path.join(base, "vulkan", "explicit_layer.d"))
    for d in dirs:
        for f in glob.glob(os.path.join(d, "*.json")):
            try:
                with open(f, encoding="utf-8") as fh:
                    if LAYER in fh.read():
                        return f
            except OSError:
                pass
    return None


def tensor(x):
    x = np.asarray(x)
    return {"dtype": NAMES[x.dtype], "shape": list(x.shape), "data": x.tobytes()}


def array(t, shape=None):
    a = np.frombuffer(t["data"], dtype=DTYPES[t["dtype"]])
    return a.reshape(t["shape"] if shape is None else shape)


def close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError("%s: shape %s, numpy's %s" % (what, got.shape, want.shape))
    single = got.dtype in (np.float32, np.complex64)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    if not err <= (2e-3 if single else 1e-9) * scale:
        raise AssertionError("%s: max error %g (scale %g)" % (what, err, scale))
    print("ok  %s" % what, flush=True)


def rand(rng, shape, dt):
    dt = np.dtype(dt)
    x = rng.standard_normal(shape)
    if dt.kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dt)


def run(c, dev, op, inputs, options=None, outputs=None):
    args = {"op": op, "device": dev,
            "inputs": [x if isinstance(x, dict) else tensor(x) for x in inputs]}
    if options is not None:
        args["options"] = options
    if outputs is not None:
        args["outputs"] = outputs
    return c.call("task.run", args)["outputs"]


# Tensors larger than this go through daemon buffers (written and read in
# pieces of PIECE bytes), not inline: a GPU's max_tensor_bytes (4 GiB on an
# H100) passes max_message (256 MiB by default).
INLINE_MAX = int(os.environ.get("DSPK_VALIDATION_INLINE_MAX", 128 << 20))
PIECE = 64 << 20


def run_big(c, dev, op, x, out_dtype, out_shape, options=None):
    """op on x, whose output has out_dtype and out_shape: inline when both
    are small, else from and into buffers.  Returns the output as an array."""
    x = np.ascontiguousarray(x)
    nout = int(np.prod(out_shape)) * np.dtype(out_dtype).itemsize
    if x.nbytes <= INLINE_MAX and nout <= INLINE_MAX:
        return array(run(c, dev, op, [x], options)[0])
    bx = c.call("buffer.create", {"device": dev, "size": x.nbytes})["buffer"]
    bo = c.call("buffer.create", {"device": dev, "size": nout})["buffer"]
    try:
        raw = memoryview(x).cast("B")
        for off in range(0, x.nbytes, PIECE):
            c.call("buffer.write", {"buffer": bx, "offset": off,
                                    "data": bytes(raw[off:off + PIECE])})
        inp = {"buffer": bx, "offset": 0, "dtype": NAMES[x.dtype], "shape": list(x.shape)}
        run(c, dev, op, [inp], options, outputs=[{"buffer": bo, "offset": 0}])
        got = bytearray()
        for off in range(0, nout, PIECE):
            got += c.call("buffer.read", {"buffer": bo, "offset": off,
                                          "size": min(PIECE, nout - off)})["data"]
        return np.frombuffer(bytes(got), out_dtype).reshape(out_shape)
    finally:
        c.call("buffer.free", {"buffer": bx})
        c.call("buffer.free", {"buffer": bo})


def fft_ref(x):
    """numpy's transform, in the dtype the daemon returns (c64 for f32 and
    c64, c128 for f64 and c128)."""
    x = np.asarray(x)
    single = x.dtype in (np.float32, np.complex64)
    y = np.fft.fft(x) if x.dtype.kind == "c" else np.fft.rfft(x)
    return y.astype(np.complex64 if single else np.complex128)


def big_buffer_cases(c, dev, lim, rng):
    """fft of slices at the end of a buffer past maxStorageBufferRange:
    VkFFT used to bind the whole buffer (its bufferSize was the VkBuffer's
    size), a range past the limit."""
    size = (lim + (1 << 20)) & ~4095
    buf = c.call("buffer.create", {"device": dev, "size": size})["buffer"]
    try:
        for dt, shape in ((np.complex64, (64,)), (np.complex64, (3, 17)),
                          (np.complex64, (2, 15)), (np.float32, (128,)),
                          (np.float32, (2, 15)), (np.float32, (3, 34)),
                          (np.complex128, (4, 32)), (np.float64, (2, 34))):
            x = rand(rng, shape, dt)
            nb = x.nbytes
            off = size - nb
            c.call("buffer.write", {"buffer": buf, "offset": off, "data": x.tobytes()})
            ref = fft_ref(x)
            what = "fft %s %s" % (NAMES[x.dtype], shape)
            inp = {"buffer": buf, "offset": off, "dtype": NAMES[x.dtype], "shape": list(shape)}
            try:
                got = run(c, dev, "fft", [inp])[0]
            except dspk_rpc.RpcError as e:
                if e.name == "EDTYPE" and NAMES[x.dtype] in ("f64", "c128"):
                    continue  # no shaderFloat64 on this device
                raise
            close(array(got), ref, what + " of the end of a %d-byte buffer" % size)
            # The result written at the end of that buffer, before the input.
            oo = (off - ref.nbytes) & ~63
            run(c, dev, "fft", [inp], outputs=[{"buffer": buf, "offset": oo}])
            data = c.call("buffer.read", {"buffer": buf, "offset": oo,
                                          "size": ref.nbytes})["data"]
            close(np.frombuffer(data, ref.dtype).reshape(ref.shape), ref,
                  what + " written at the end of that buffer")
            if x.dtype.kind == "c":
                # In place: the output is the input's own bytes.
                run(c, dev, "fft", [inp], outputs=[{"buffer": buf, "offset": off}])
                data = c.call("buffer.read", {"buffer": buf, "offset": off,
                                              "size": nb})["data"]
                close(np.frombuffer(data, ref.dtype).reshape(ref.shape), ref,
                      what + " in place at the end of that buffer")
    finally:
        c.call("buffer.free", {"buffer": buf})


def large_cases(c, dev, lim, rng):
    """Tensors within max_tensor_bytes whose temporaries are not: Bluestein's
    rows of m >= 2n-1 (complex and real), real rows widened to complex; and
    the ELIMIT where a temporary cannot be made to fit."""
    for dt, n, frac in ((np.complex64, 17, 0.5), (np.float32, 15, 0.6),
                        (np.float32, 17, 0.3), (np.complex64, 1 << 14, 0.9)):
        es = np.dtype(dt).itemsize
        rows = int(lim * frac) // (n * es)
        x = rand(rng, (rows, n), dt)
        ref = fft_ref(x)
        got = run_big(c, dev, "fft", x, ref.dtype, ref.shape)
        close(got, ref, "fft %s (%d, %d), %d bytes" % (NAMES[x.dtype], rows, n, x.nbytes))
        del got, x, ref
    # contract remakes a result holding an infinity from 12-byte parts: A of
    # 0.4 x max_tensor_bytes (f32) would need 1.2 times the range, ELIMIT.
    rows = int(lim * 0.4) // 4
    a = np.ones((rows, 1), np.float32)
    a[rows // 2, 0] = np.inf
    try:
        if a.nbytes <= INLINE_MAX:
            run(c, dev, "contract", [a, np.ones((1, 1), np.float32)], {"subscripts": "ik,kj->ij"})
        else:
            ba = c.call("buffer.create", {"device": dev, "size": a.nbytes})["buffer"]
            try:
                raw = memoryview(a).cast("B")
                for off in range(0, a.nbytes, PIECE):
                    c.call("buffer.write", {"buffer": ba, "offset": off,
                                            "data": bytes(raw[off:off + PIECE])})
                run(c, dev, "contract", [{"buffer": ba, "offset": 0, "dtype": "f32",
                                          "shape": [rows, 1]}, np.ones((1, 1), np.float32)],
                    {"subscripts": "ik,kj->ij"}, outputs=[{"buffer": ba, "offset": 0}])
            finally:
                c.call("buffer.free", {"buffer": ba})
        raise AssertionError("contract of %d bytes with an inf ran: ELIMIT expected" % a.nbytes)
    except dspk_rpc.RpcError as e:
        if e.name != "ELIMIT" or "maxStorageBufferRange" not in e.err.get("message", ""):
            raise AssertionError("contract: %s, not ELIMIT naming maxStorageBufferRange" % e)
        print("ok  contract (%d, 1) with an inf: %s" % (rows, e.err["message"]), flush=True)
    del a
    if lim != (1 << 27) - 15:
        return  # the limits below are lavapipe's (docs/protocol.md, fft)
    # A single row whose temporary passes the range: ELIMIT naming the limit
    # (real f32 of 2^24: (n+1) x 8 bytes; c64 of 17 x 246725: Bluestein's
    # m = 2^24 from 2n-1, (m+1) x 8 bytes), where the tensor itself fits.
    for dt, n in ((np.float32, 1 << 24), (np.complex64, 17 * 246725)):
        x = np.zeros((n,), dt)
        try:
            run(c, dev, "fft", [x])
        except dspk_rpc.RpcError as e:
            if e.name != "ELIMIT" or "maxStorageBufferRange" not in e.err.get("message", ""):
                raise AssertionError("fft %s n=%d: %s, not ELIMIT naming maxStorageBufferRange"
                                     % (NAMES[x.dtype], n, e))
            print("ok  fft %s n=%d: %s" % (NAMES[x.dtype], n, e.err["message"]), flush=True)
            continue
        raise AssertionError("fft %s n=%d ran: ELIMIT expected" % (NAMES[x.dtype], n))


KERNEL = """#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) writeonly buffer B { float b[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < 1000u) b[i] = 2.0 * a[i] + 1.0;
}
"""


def ordinary_cases(c, dev, rng):
    A, B = rand(rng, (33, 20), np.float32), rand(rng, (20, 17), np.float32)
    close(array(run(c, dev, "gemm", [A, B])[0]), A.astype(np.float64) @ B, "gemm f32")
    A, B = rand(rng, (2, 9, 5), np.float32), rand(rng, (2, 5, 7), np.float32)
    close(array(run(c, dev, "gemm", [A, B])[0]), A @ B, "gemm f32 batched")
    for xs, k in (((2, 3000), 400), ((3, 500), 9)):
        X, H = rand(rng, xs, np.float32), rand(rng, (k,), np.float32)
        ref = np.stack([np.convolve(r.astype(np.float64), H)[:xs[1]] for r in X])
        close(array(run(c, dev, "fir", [X, H])[0]), ref, "fir %s k=%d" % (xs, k))
    X = rand(rng, (5, 6, 7), np.float32)
    close(array(run(c, dev, "reduce", [X], {"fn": "sum", "axes": [0, 2]})[0]),
          X.sum(axis=(0, 2)), "reduce sum")
    close(array(run(c, dev, "reduce", [X], {"fn": "max"})[0]), X.max(), "reduce max")
    A, B = rand(rng, (100,), np.float32), rand(rng, (100,), np.float32)
    close(array(run(c, dev, "map", [A, B], {"fn": "axpy", "alpha": 1.5})[0]), 1.5 * A + B,
          "map axpy")
    close(array(run(c, dev, "map", [A], {"fn": "exp"})[0]), np.exp(A), "map exp")
    A, B = rand(rng, (4, 6, 5), np.float32), rand(rng, (5, 3), np.float32)
    for subs in ("bij,jk->bik", "abc,cd->dba"):
        close(array(run(c, dev, "contract", [A, B], {"subscripts": subs})[0]),
              np.einsum(subs, A.astype(np.float64), B), "contract " + subs)
    a = rand(rng, (1000,), np.float32)
    out = run(c, dev, "kernel", [a, np.zeros(1000, np.float32)],
              {"lang": "glsl", "source": KERNEL.encode(), "args": [{"tensor": 0}, {"tensor": 1}],
               "grid": [16, 1, 1]})
    close(array(out[1]), 2 * a + 1, "kernel glsl")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspkd", required=True)
    ap.add_argument("--cases", default="ordinary,big,large",
                    help="which case sets to run (comma-separated: ordinary, big, large)")
    args = ap.parse_args()
    manifest = layer_installed()
    if not manifest:
        print("FAIL: the Vulkan validation layer %s is not installed (Debian: "
              "apt-get install vulkan-validationlayers, as scripts/deps.sh does); this test "
              "cannot check the Vulkan backend without it" % LAYER)
        return 1
    print("validation layer: %s" % manifest)
    tmp = tempfile.mkdtemp(prefix="dspk-vkval-")
    sock = os.path.join(tmp, "s.sock")
    logpath = os.path.join(tmp, "dspkd.log")
    env = dict(os.environ, VK_INSTANCE_LAYERS=LAYER, VK_LOADER_DEBUG="layer")
    # The layer's own messages go to stdout; the loader's report of the
    # layers it loads to stderr: both into the log.
    with open(logpath, "wb") as log:
        proc = dspk_daemon.start(
            dspk_daemon.cmdline(args.dspkd, sock, ["--log-level", "info", "--config", ""],
                                backends="vulkan"),
            120, env=env, stdout=log, stderr=log)
    failed = None
    skipped = False
    try:
        if proc is None:
            failed = "dspkd did not start"
        else:
            c = dspk_rpc.Client(sock, 600)
            ans = c.call("devices", {})
            vk = [d for d in ans["devices"] if d["backend"] == "vulkan"]
            if not vk:
                why = [u.get("reason", "") for u in ans.get("unavailable", [])
                       if u.get("backend") == "vulkan"]
                print("no Vulkan device: %s" % (why or "none reported"))
                if any("layer" in w.lower() for w in why):
                    failed = "the Vulkan backend did not start with %s: %s" % (LAYER, why)
                else:
                    skipped = True
            else:
                dev, lim = vk[0]["id"], vk[0]["max_tensor_bytes"]
                print("device %s, max_tensor_bytes %d" % (dev, lim), flush=True)
                rng = np.random.default_rng(14)
                sets = args.cases.split(",")
                if "ordinary" in sets:
                    ordinary_cases(c, dev, rng)
                if "big" in sets:
                    big_buffer_cases(c, dev, lim, rng)
                if "large" in sets:
                    large_cases(c, dev, lim, rng)
            c.close()
    except (AssertionError, dspk_rpc.RpcError, OSError, EOFError) as e:
        failed = "%s: %s" % (type(e).__name__, e)
    finally:
        status = dspk_daemon.stop(proc, 60) if proc is not None else None
    with open(logpath, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    shutil.rmtree(tmp, ignore_errors=True)
    errors = [ln for ln in text.splitlines() if "Validation Error" in ln]
    # A structure of an extension newer than the layer (Debian 12's layer is
    # of Vulkan 1.3.239; an H100's driver offers VK_KHR_cooperative_matrix,
    # whose structures dspkd chains) is one the layer cannot check: it says
    # "unknown VkStructureType" of a valid chain.  Those are listed, not
    # counted; any other message about the chain still fails.
    unknown = [ln for ln in errors if "-pNext-pNext" in ln and
               re.search(r"unknown VkStructureType \(1[0-9]{9}\)", ln)]
    errors = [ln for ln in errors if ln not in unknown]
    if unknown:
        kinds = sorted(set(re.findall(r"unknown VkStructureType \((\d+)\)", "\n".join(unknown))))
        print("note: %d message(s) of structure types this layer does not know (not checked): %s"
              % (len(unknown), ", ".join(kinds)))
    loaded = any(LAYER in ln and ("Insert" in ln or "loaded" in ln.lower())
                 for ln in text.splitlines())
    if errors:
        print("FAIL: %d validation errors in dspkd's output, the first ones:" % len(errors))
        for ln in errors[:10]:
            print("  " + ln[:1500])
        return 1
    if failed:
        print("FAIL: " + failed)
        print("dspkd's log ends:\n" + text[-4000:])
        return 1
    if skipped:
        print("SKIP: no Vulkan device")
        return 77
    if not loaded:
        print("FAIL: the loader did not report loading %s (VK_LOADER_DEBUG=layer):"
              " nothing was validated" % LAYER)
        print(text[-3000:])
        return 1
    if status != 0:
        print("FAIL: dspkd exited with status %r" % status)
        return 1
    print("PASS: no validation errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
