"""Every op and dtype of the cpu backend against numpy references."""
from __future__ import annotations

import os

import numpy as np
import pytest

import dspk
from conftest import TIMEOUT
from dspk_kernels import GLSL_AXPY  # tests/common, on the path through conftest.py

RNG = np.random.default_rng(13)
FLOAT = [np.float32, np.float64]
ALL = [np.float32, np.float64, np.complex64, np.complex128]


def rand(shape, dtype):
    dt = np.dtype(dtype)
    x = RNG.uniform(-1, 1, shape)
    if dt.kind == "c":
        x = x + 1j * RNG.uniform(-1, 1, shape)
    return x.astype(dt)


def close(got, want, dtype, scale=1.0):
    """got ~ want within the precision of dtype, relative to want's largest entry."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    single = np.dtype(dtype) in (np.float32, np.complex64, np.float16) or \
        np.dtype(dtype) == dspk.bfloat16
    tol = (1e-4 if single else 1e-11) * scale
    ref = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    err = float(np.max(np.abs(got.astype(np.complex128) - want))) if want.size else 0.0
    assert err <= tol * ref, "max error %g (reference scale %g)" % (err, ref)


@pytest.mark.parametrize("dtype", FLOAT)
def test_gemm(client, dtype):
    a, b, c = rand((33, 17), dtype), rand((17, 20), dtype), rand((33, 20), dtype)
    got = client.gemm(a, b, device="cpu:0")
    assert got.dtype == np.dtype(dtype) and got.flags.writeable
    close(got, a.astype(np.float64) @ b, dtype)
    close(client.gemm(a, b, c, alpha=0.5, beta=-2.0), 0.5 * (a @ b) - 2.0 * c, dtype)
    close(client.gemm(a.T.copy(), b.T.copy(), trans_a=True, trans_b=True), a @ b, dtype)
    # batch axes broadcast as in numpy.matmul; a non-contiguous view is fine
    ab, bb = rand((3, 1, 5, 4), dtype), rand((2, 4, 6), dtype)
    close(client.gemm(ab, bb), np.matmul(ab, bb), dtype)
    close(client.gemm(a[:, ::2], b[::2, :]), a[:, ::2] @ b[::2, :], dtype)


def test_gemm_beta_follows_c(client):
    """gemm(a, b, c) ignored c (beta defaulted to 0.0) where dspk-submit gemm A B C adds
    it, and gemm(a, b, beta=2.0) silently ignored beta.  Now beta defaults to 1.0 with c
    and 0.0 without, an explicit beta=0.0 with c reads no c, a nonzero beta without c
    is InvalidArgument and a zero one is taken (python.md; dspk-submit's --beta is
    refused without C whatever its value, cli.md)."""
    a, b, c = rand((5, 3), np.float64), rand((3, 4), np.float64), rand((5, 4), np.float64)
    close(client.gemm(a, b, c), a @ b + c, np.float64)
    close(client.submit("gemm", a, b, c).result(TIMEOUT), a @ b + c, np.float64)
    close(client.gemm(a, b, c, alpha=2.0), 2 * (a @ b) + c, np.float64)
    nan = np.full((5, 4), np.nan)
    close(client.gemm(a, b, nan, beta=0.0), a @ b, np.float64)     # BLAS: reads no c
    close(client.gemm(a, b), a @ b, np.float64)
    close(client.gemm(a, b, beta=0.0), a @ b, np.float64)
    close(client.gemm(a, b, beta=-0.0), a @ b, np.float64)
    for beta in (2.0, -1, 1e-300):
        with pytest.raises(dspk.InvalidArgument, match="beta"):
            client.gemm(a, b, beta=beta)
        with pytest.raises(dspk.InvalidArgument, match="beta"):
            client.submit("gemm", a, b, beta=beta)


def test_gemm_beta_zero_in_f32(client):
    """A beta that rounds to 0 in f32 (1e-50, -1e-50, 7e-46: ties to even) is 0 in an
    f32, f16 or bf16 product, which the daemon takes without c (protocol.md); the
    client refused it as nonzero.  In f64, and for 1.5e-45 (the smallest f32
    subnormal), it stays nonzero: InvalidArgument."""
    a32 = rand((3, 4), np.float32)
    b32 = rand((4, 2), np.float32)
    for x, y in ((a32, b32), (a32.astype(np.float16), b32.astype(np.float16)),
                 (dspk.to_bfloat16(a32), dspk.to_bfloat16(b32))):
        # the reference: numpy's product of the operands as f64
        if x.dtype == dspk.bfloat16:
            ref = dspk.from_bfloat16(x).astype(np.float64) @ dspk.from_bfloat16(y)
        else:
            ref = x.astype(np.float64) @ y.astype(np.float64)
        for beta in (1e-50, -1e-50, 7e-46, -0.0, np.float64(1e-50)):
            assert np.float32(beta) == 0
            close(client.gemm(x, y, beta=beta), ref, np.float32)
            close(client.submit("gemm", x, y, beta=beta).result(TIMEOUT), ref, np.float32)
        for beta in (1.5e-45, 1):
            assert np.float32(beta) != 0
            with pytest.raises(dspk.InvalidArgument, match="beta"):
                client.gemm(x, y, beta=beta)
    with pytest.raises(dspk.InvalidArgument, match="beta"):
        client.gemm(a32.astype(np.float64), b32.astype(np.float64), beta=1e-50)


def test_gemm_half_and_bf16(client):
    a, b = rand((16, 24), np.float32), rand((24, 8), np.float32)
    ah, bh = a.astype(np.float16), b.astype(np.float16)
    got = client.gemm(ah, bh)
    assert got.dtype == np.float32  # f16 in, f32 out
    close(got, ah.astype(np.float64) @ bh.astype(np.float64), np.float32)
    ab, bb = dspk.to_bfloat16(a), dspk.to_bfloat16(b)
    assert ab.dtype == dspk.bfloat16
    got = client.gemm(ab, bb)
    assert got.dtype == np.float32
    want = dspk.from_bfloat16(ab).astype(np.float64) @ dspk.from_bfloat16(bb)
    close(got, want, np.float32)
    np.testing.assert_allclose(dspk.from_bfloat16(ab), a, rtol=2 ** -8)


def test_gemm_complex_is_edtype(client):
    a = rand((4, 4), np.complex64)
    with pytest.raises(dspk.DtypeError) as e:
        client.gemm(a, a)
    assert e.value.code == -7 and e.value.name == "EDTYPE" and "gemm" in e.value.message


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_fft_complex(client, dtype):
    x = rand((3, 256), dtype)
    y = client.fft(x)
    assert y.dtype == np.dtype(dtype)
    close(y, np.fft.fft(x.astype(np.complex128)), dtype, scale=16)
    close(client.fft(x, inverse=True), np.fft.ifft(x.astype(np.complex128)), dtype)
    odd = rand(97, dtype)
    close(client.fft(odd), np.fft.fft(odd.astype(np.complex128)), dtype, scale=16)


@pytest.mark.parametrize("dtype,out", [(np.float32, np.complex64),
                                       (np.float64, np.complex128)])
def test_fft_real(client, dtype, out):
    x = rand((2, 100), dtype)
    y = client.fft(x)
    assert y.dtype == np.dtype(out) and y.shape == (2, 51)
    close(y, np.fft.rfft(x.astype(np.float64)), dtype, scale=16)
    with pytest.raises(dspk.Error):
        client.fft(x, inverse=True)  # real + inverse is an error


def lfilter(h, x):
    """scipy.signal.lfilter(h, 1, x) along the last axis, in float64/complex128."""
    x2 = x.reshape(-1, x.shape[-1]).astype(np.complex128)
    y = np.stack([np.convolve(row, h.astype(np.complex128))[:x.shape[-1]] for row in x2])
    return y.reshape(x.shape)


@pytest.mark.parametrize("dtype", ALL)
def test_fir(client, dtype):
    x, h = rand((2, 300), dtype), rand(17, dtype)
    y = client.fir(x, h)
    assert y.dtype == np.dtype(dtype) and y.shape == x.shape
    close(y, lfilter(h, x), dtype, scale=8)


@pytest.mark.parametrize("dtype", ALL)
def test_contract(client, dtype):
    a, b = rand((4, 5, 6), dtype), rand((6, 5, 3), dtype)
    for subs in ("ijk,kjl->il", "ijk,klm->ijlm", "ijk,kjl->li"):
        bb = b if subs != "ijk,klm->ijlm" else rand((6, 2, 3), dtype)
        close(client.contract(subs, a, bb), np.einsum(subs, a.astype(np.complex128), bb),
              dtype, scale=8)
    with pytest.raises(dspk.Error):
        client.contract("ij,jk", a[0], b[:, 0])  # no explicit ->


@pytest.mark.parametrize("dtype", ALL)
def test_reduce(client, dtype):
    x = rand((4, 6, 5), dtype)
    x64 = x.astype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)
    fns = ["sum", "mean"] + (["max", "min"] if np.dtype(dtype).kind == "f" else [])
    for fn in fns:
        ref = getattr(x64, fn)
        close(client.reduce(x, fn), ref(), dtype, scale=30)
        close(client.reduce(x, fn, axes=1), ref(axis=1), dtype, scale=8)
        close(client.reduce(x, fn, axes=[0, -1]), ref(axis=(0, 2)), dtype, scale=8)
    assert client.reduce(x).shape == ()
    if np.dtype(dtype).kind == "c":
        with pytest.raises(dspk.Error):
            client.reduce(x, "max")


@pytest.mark.parametrize("dtype", ALL)
def test_map(client, dtype):
    a, b = rand((7, 9), dtype), rand((7, 9), dtype)
    close(client.map("add", a, b), a + b, dtype)
    close(client.map("sub", a, b), a - b, dtype)
    close(client.map("mul", a, b), a * b, dtype)
    close(client.map("scale", a, alpha=2.5), 2.5 * a, dtype)
    close(client.map("axpy", a, b, alpha=-0.5), -0.5 * a + b, dtype)
    close(client.map("exp", a), np.exp(a.astype(np.complex128)), dtype)
    got = client.map("abs", a)
    close(got, np.abs(a), dtype)
    assert got.dtype == np.abs(a).dtype  # complex gives the real dtype


def test_half_is_refused_where_unsupported(client):
    x = rand(64, np.float16)
    for call in (lambda: client.fft(x), lambda: client.map("exp", x),
                 lambda: client.reduce(x)):
        with pytest.raises(dspk.DtypeError):
            call()


def test_kernel_on_cpu_is_enotsup(client):
    with pytest.raises(dspk.NotSupported) as e:
        client.kernel("void main() {}", np.zeros(4, np.float32), lang="glsl", grid=1,
                      block=1, device="cpu:0")
    assert isinstance(e.value, NotImplementedError) and e.value.code == -19


def test_zero_size_and_scalar(client):
    x = np.zeros((0, 5), np.float32)
    assert client.map("scale", x, alpha=2.0).shape == (0, 5)
    # fft of no rows longer than the longest transform (2^31-1): empty too
    y = client.fft(np.zeros((0, 1 << 31), np.complex64))
    assert y.shape == (0, 1 << 31) and y.dtype == np.complex64
    assert client.fft(np.zeros((2, 0, 1 << 31), np.float64)).shape == (2, 0, (1 << 30) + 1)
    s = np.array(3.0, np.float64)
    got = client.map("scale", s, alpha=2.0)
    assert got.shape == () and got == 6.0


def test_kernel_glsl_on_vulkan():
    """A raw GLSL kernel on vulkan:0 (lavapipe where there is no GPU)."""
    from conftest import Daemon
    d = Daemon(["--backends", "cpu,vulkan"])
    try:
        with dspk.connect(d.socket) as c:
            if "vulkan:0" not in [x["id"] for x in c.devices()]:
                pytest.skip("no vulkan:0 device here")
            n = 1000
            z = rand(n, np.float64)
            dz = c.to_device(z, device="vulkan:0")
            y, z2 = c.kernel(GLSL_AXPY, np.zeros(n, np.float32), dz, lang="glsl",
                             grid=(n + 63) // 64, block=64, device="vulkan:0",
                             args=[{"tensor": 0}, {"tensor": 1}, {"i32": n},
                                   {"f32": 1.5}, {"f64": -0.25}])
            assert z2 is dz and isinstance(y, np.ndarray)
            np.testing.assert_allclose(y, 1.5 * z.astype(np.float32) + np.arange(n),
                                       rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(dz.numpy(), z * -0.25)
            with pytest.raises(dspk.CompileError):
                c.kernel(GLSL_AXPY.replace("float(i);", "float(i)"), np.zeros(4, np.float32),
                         dz, lang="glsl", grid=1, block=64, device="vulkan:0")
    finally:
        d.stop()


def _bad_ops():
    f32, f64 = np.float32, np.float64
    z = np.zeros
    return [
        ("gemm", (z((3, 4), f32), z((5, 6), f32)), {}),
        ("gemm", (z((4, 3), f32), z((5, 6), f32)), {"trans_a": True, "trans_b": True}),
        ("gemm", (z((3, 4), f32), z((4, 6), f64)), {}),
        ("gemm", (z((3, 4), np.complex64), z((4, 6), np.complex64)), {}),
        ("gemm", (z(4, f32), z((4, 6), f32)), {}),
        ("gemm", (z((2, 3, 4), f32), z((5, 4, 6), f32)), {}),
        ("gemm", (z((3, 4), f32), z((4, 6), f32), z((3, 6), f64)), {}),
        ("gemm", (z((3, 4), f32), z((4, 6), f32), z((2, 3, 6), f32)), {}),
        ("gemm", (z((3, 4), f32), z((4, 6), f32), z((3, 5), f32)), {}),
        ("fft", (z(8, np.float16),), {}),
        ("fft", (z((), np.complex64),), {}),
        ("fft", (z((3, 0), np.complex64),), {}),
        ("fft", (z(8, f32),), {"inverse": True}),
        ("fir", (z(8, np.float16), z(3, np.float16)), {}),
        ("fir", (z(8, f32), z(3, f64)), {}),
        ("fir", (z((), f32), z(3, f32)), {}),
        ("fir", (z(8, f32), z((3, 1), f32)), {}),
        ("fir", (z(8, f32), z(0, f32)), {}),
        ("contract", ("ij,jk->ik", z((2, 3), np.float16), z((3, 2), np.float16)), {}),
        ("contract", ("ij,jk->ik", z((2, 3), f32), z((3, 2), f64)), {}),
        ("reduce", (z(8, np.float16),), {}),
        ("reduce", (z(8, np.complex64), "max"), {}),
        ("map", ("add", z(8, f32), z(8, f64)), {}),
        ("map", ("add", z(8, f32), z((8, 1), f32)), {}),
        ("map", ("sub", z((2, 8), f32), z((2, 7), f32)), {}),
        ("map", ("exp", z(8, np.float16)), {}),
        ("map", ("add", z(8, f32)), {}),
    ]


@pytest.mark.parametrize("case", range(len(_bad_ops())))
def test_refused_operands_are_refused_before_sending(client, monkeypatch, case):
    """Operands the daemon's op refuses (gemm's inner dimensions, a dtype the op lacks)
    were sent, all their data, and only then refused.  Now the client refuses them first
    with the daemon's very error (class and words of backends/op.c): compared here with
    the daemon's own answer to the same op, sent with the client's check turned off."""
    op, args, kw = _bad_ops()[case]
    sent = client._next_id
    with pytest.raises(dspk.Error) as local:
        getattr(client, op)(*args, **kw)
    assert client._next_id == sent, "a request was sent"
    from dspk import _client
    monkeypatch.setattr(_client, "_op_refusal", lambda *a: None)
    with pytest.raises(dspk.Error) as remote:
        getattr(client, op)(*args, **kw)
    assert client._next_id != sent, "the daemon was not asked"
    assert type(local.value) is type(remote.value)
    assert (local.value.code, local.value.name, local.value.message) == \
        (remote.value.code, remote.value.name, remote.value.message)


def test_a_refused_large_operand_is_not_sent(client):
    """A gemm whose inner dimensions differ, of a 64 MiB operand (staged through buffers
    or written into the message), refused with nothing sent; in submit() too."""
    a = np.zeros((4096, 4096), np.float32)
    b = np.zeros((4095, 8), np.float32)
    sent = client._next_id
    with pytest.raises(dspk.ShapeError, match=r"^ESHAPE: gemm: A has K=4096 \(axis 1\) but "
                                              r"B has K=4095 \(axis 0\)$"):
        client.gemm(a, b)
    with pytest.raises(dspk.ShapeError):
        client.submit("gemm", a, b)
    assert client._next_id == sent
    assert [x for x in client.status()["clients"] if x["self"]][0]["buffers"] == 0


# The dtype rule each row of python.md's Ops table states, and the result dtype
# (wire name) of each dtype the op takes; every other dtype is DtypeError.
# Probe 23 H L1: the gemm row said "f32/f64, f16 and bf16 in with f32 out",
# which reads as f32 for every dtype, where f64 gives f64.
OP_DTYPE_RULES = {
    "gemm": ("a and b of one dtype: f32 or f64 (the result of that dtype), or f16 or bf16 "
             "(the result f32)", {"f32": "f32", "f64": "f64", "f16": "f32", "bf16": "f32"}),
    "fft": ("x c64 or c128 (the result of that dtype); real x, f32 or f64: `numpy.fft.rfft` "
            "(the result c64 or c128)",
            {"c64": "c64", "c128": "c128", "f32": "c64", "f64": "c128"}),
    "fir": ("x and h of one dtype, f32, f64, c64 or c128, the result of that dtype",
            {d: d for d in ("f32", "f64", "c64", "c128")}),
    "contract": ("a and b of one dtype, f32, f64, c64 or c128, the result of that dtype",
                 {d: d for d in ("f32", "f64", "c64", "c128")}),
    "reduce": ("x f32, f64, c64 or c128, the result of x's dtype",
               {d: d for d in ("f32", "f64", "c64", "c128")}),
    "map": ("one dtype, f32, f64, c64 or c128, the result of a's dtype",
            {d: d for d in ("f32", "f64", "c64", "c128")}),
}


def test_ops_table_states_each_ops_dtype_rule(client):
    """Each row of python.md's Ops table states the op's dtypes and the dtype of its
    result, as the daemon has them (backends/op.c; protocol.md's op table), and each
    dtype the row names gives that result, every other is DtypeError."""
    import re
    md = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                      "python.md")
    if not os.path.exists(md):  # a copy of python/ alone (tests/python/run.sh)
        pytest.skip("docs/python.md not found from here")
    text = " ".join(open(md).read().split())
    names = {"f16": np.float16, "f32": np.float32, "f64": np.float64,
             "c64": np.complex64, "c128": np.complex128}
    for op, (rule, results) in OP_DTYPE_RULES.items():
        row = re.search(r"\| `%s\(.*?\|(.*?) \|" % op, text)
        assert row, "python.md has no Ops row for %s" % op
        assert rule in row.group(1), "python.md's %s row lacks %r: %s" % (op, rule,
                                                                           row.group(1))
        for wire in ("f16", "bf16", "f32", "f64", "c64", "c128"):
            def arr(shape):
                x = RNG.uniform(-1, 1, shape)
                if wire == "bf16":
                    return dspk.to_bfloat16(x.astype(np.float32))
                return x.astype(names[wire])
            call = {"gemm": lambda: client.gemm(arr((2, 3)), arr((3, 2)), device="cpu:0"),
                    "fft": lambda: client.fft(arr((2, 8)), device="cpu:0"),
                    "fir": lambda: client.fir(arr((2, 8)), arr((3,)), device="cpu:0"),
                    "contract": lambda: client.contract("ij,jk->ik", arr((2, 3)),
                                                        arr((3, 2)), device="cpu:0"),
                    "reduce": lambda: client.reduce(arr((2, 3)), "sum", device="cpu:0"),
                    "map": lambda: client.map("add", arr((2, 3)), arr((2, 3)),
                                              device="cpu:0")}[op]
            if wire not in results:
                with pytest.raises(dspk.DtypeError):
                    call()
                continue
            got = call().dtype
            want = dspk.bfloat16 if results[wire] == "bf16" else np.dtype(names[results[wire]])
            assert got == want, "%s of %s gave %s, want %s" % (op, wire, got, want)
