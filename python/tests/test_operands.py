"""Operands and parameters at the edges: big-endian dtypes, the device a task is pinned
to (out=, DeviceArrays, shared arrays) deciding where operands are staged, shared
arrays without a file descriptor each, kernel tensors given back as themselves,
numbers beyond float64 or 64 bits, misaligned views of shared arrays, and operands
beyond max_elements refused before they are copied."""
from __future__ import annotations

import contextlib
import os
import resource

import fractions

import numpy as np
import pytest

import dspk
from conftest import TIMEOUT, Daemon

RNG = np.random.default_rng(12)

DOUBLE = """#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform P { int n; } p;
void main() { uint i = gl_GlobalInvocationID.x; if (i < p.n) x[i] = 2.0 * x[i]; }
"""


def mine(c):
    return [x for x in c.status()["clients"] if x["self"]][0]


@pytest.fixture(scope="module")
def vk_daemon(tmp_path_factory):
    """A daemon with the cpu and vulkan backends (lavapipe counts); skipped without
    vulkan:0."""
    d = Daemon(["--backends", "cpu,vulkan",
                "--cache", str(tmp_path_factory.mktemp("vk") / "cache.db")])
    with dspk.connect(d.socket, timeout=TIMEOUT) as c:
        has = "vulkan:0" in [x["id"] for x in c.devices()]
    if not has:
        d.stop()
        pytest.skip("no vulkan:0 device here")
    yield d
    d.stop()


@pytest.fixture()
def vk(vk_daemon):
    with dspk.connect(vk_daemon.socket, timeout=TIMEOUT) as c:
        yield c


# ---- C: big-endian dtypes ------------------------------------------------------------

def test_big_endian_dtype_is_taken_as_little_endian(client):
    """empty() and empty_shared() kept '>f8': the daemon's little-endian bytes read
    back swapped, and every out= failed after writing."""
    s = client.empty_shared(3, ">f8")
    d = client.empty(3, ">f8")
    assert s.dtype == np.dtype("<f8") and d.dtype == np.dtype("<f8")
    assert client.empty_shared(2, ">c8").dtype == np.dtype("<c8")
    for o in (s, d):
        assert client.map("scale", np.ones(3), alpha=5.0, out=o) is o
    np.testing.assert_array_equal(s, [5, 5, 5])
    np.testing.assert_array_equal(d.numpy(), [5, 5, 5])
    t = client.to_device(np.arange(4, dtype=">f4"))
    assert t.dtype == np.dtype("<f4")
    np.testing.assert_array_equal(t.numpy(), np.arange(4))
    # A big-endian view of a shared array: refused as out= before anything is sent.
    with pytest.raises(dspk.InvalidArgument, match="big-endian"):
        client.map("scale", np.ones(3), out=s.view(">f8"))
    np.testing.assert_array_equal(s, [5, 5, 5])


# ---- D: out= pins the task, so staging follows it --------------------------------------

def test_out_on_vulkan_with_a_large_plain_operand(vk):
    """out= on vulkan:0 with device="any" and a plain operand of at least
    shared_threshold: the operand was staged in shared memory on cpu:0, and the
    daemon refused buffers on two devices."""
    x = RNG.random((400, 400))  # 1.28 MB, above the 1 MiB threshold
    assert x.nbytes >= vk.shared_threshold
    o = vk.empty((400, 400), np.float64, device="vulkan:0")
    assert vk.map("scale", x, alpha=2.0, out=o) is o
    np.testing.assert_allclose(o.numpy(), 2 * x)
    so = vk.empty_shared((400, 400), np.float64, device="vulkan:0")
    assert vk.map("add", x, x, out=so) is so
    np.testing.assert_allclose(so, 2 * x)
    g = vk.empty((400, 400), np.float64, device="vulkan:0")
    vk.gemm(x, x, out=g)
    np.testing.assert_allclose(g.numpy(), x @ x, rtol=1e-10)
    f = vk.submit("map", "scale", x, alpha=3.0, out=o)
    assert f.result(TIMEOUT) is o
    np.testing.assert_allclose(o.numpy(), 3 * x)


# ---- H: shared arrays hold no file descriptor; out of descriptors -----------------

def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_shared_arrays_hold_no_file_descriptor(client):
    """Python's mmap kept a dup of the memfd for each shared array: a process could
    hold no more shared arrays than its open file limit."""
    before = _fds()
    keep = [client.empty_shared(16) for _ in range(20)]
    assert _fds() == before
    for i, a in enumerate(keep):
        a[:] = i
    assert client.reduce(keep[7]) == 7 * 16


def _take_descriptors(dups):
    """Duplicates stdin until the open file limit stops it; returns the new ones
    (also added to dups)."""
    got = []
    try:
        while True:
            got.append(os.dup(0))
    except OSError:
        pass
    dups += got
    return got


@contextlib.contextmanager
def _no_descriptors(extra):
    """The open file limit lowered to what is open plus extra, and every descriptor
    under it taken; yields the list of those taken (close and pop to free one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    dups = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (_fds() + extra, hard))
    try:
        _take_descriptors(dups)
        yield dups
    finally:
        for fd in dups:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_out_of_file_descriptors(client):
    """With no descriptor to be had, empty_shared raised a bare OSError, and a large
    plain operand (the automatic shared-memory path) failed the same way instead of
    going through the socket."""
    x = np.ones(300000)                       # 2.4 MB: the shared path
    y = RNG.random((600, 600))                # a 2.9 MB result too
    with _no_descriptors(4):
        with pytest.raises(dspk.LimitExceeded, match="open file limit"):
            client.empty_shared(4)
        assert client.reduce(x) == x.size
        got = client.gemm(y, y)
    # Compared once descriptors are back: numpy imports numpy.testing on first
    # use, which failed for want of a descriptor when this test ran alone.
    np.testing.assert_allclose(got, y @ y, rtol=1e-10)


# ---- I: kernel gives shared arrays (and staged tensors) back as themselves -------------

def test_kernel_gives_shared_arrays_back(vk):
    """kernel() made a DeviceArray(device='') of a shared tensor's buffer; freeing it
    freed the shared array's buffer."""
    s = vk.empty_shared(64, np.float32, device="vulkan:0")
    s[:] = 1
    part = s[32:]
    r = vk.kernel(DOUBLE, s, lang="glsl", grid=1, args=[{"tensor": 0}, {"i32": 64}])
    assert len(r) == 1 and r[0] is s
    r = vk.kernel(DOUBLE, part, lang="glsl", grid=1, args=[{"tensor": 0}, {"i32": 32}])
    assert r[0] is part
    np.testing.assert_array_equal(s, [2] * 32 + [4] * 32)
    assert vk.reduce(s) == 2 * 32 + 4 * 32


def test_kernel_on_a_slice_off_the_devices_binding_alignment(vk):
    """A slice of a shared array at a multiple of its item size but not of the
    device's minStorageBufferOffsetAlignment (16 bytes: s[1:5] of float32 starts 4
    bytes in) was ENOTSUP "offset must be a multiple of 16 bytes" for kernel, while
    every built-in op took it.  Now the daemon runs it through an aligned copy written
    back over the slice: in place, as for an aligned one, and nothing else of the
    array is touched."""
    s = vk.empty_shared(64, np.float32, device="vulkan:0")
    s[:] = np.arange(64)
    want = np.arange(64, dtype=np.float32)
    for lo, hi in ((1, 5), (3, 40), (4, 8)):
        part = s[lo:hi]
        r = vk.kernel(DOUBLE, part, lang="glsl", grid=1,
                      args=[{"tensor": 0}, {"i32": hi - lo}])
        assert r[0] is part
        want[lo:hi] *= 2
        np.testing.assert_array_equal(s, want)
    assert vk.reduce(s[1:5]) == want[1:5].sum()


def test_kernel_gives_back_each_object_passed(vk):
    """Two view objects of the same bytes (a1 = s[24:34]; a2 = s[24:34]) came back as
    [a1, a1]: results were matched by address.  python.md: the very array object
    passed, so result i is the object passed as tensor i; DeviceArrays likewise."""
    s = vk.empty_shared(64, np.float32, device="vulkan:0")
    s[:] = 1
    a1, a2 = s[32:], s[32:]
    r = vk.kernel(DOUBLE, a1, a2, lang="glsl", grid=1, args=[{"tensor": 0}, {"i32": 32}])
    assert r[0] is a1 and r[1] is a2
    d = vk.to_device(np.ones(8, np.float32), device="vulkan:0")
    d2 = dspk.DeviceArray(vk, d.buffer, d.device, d.shape, d.dtype)
    r = vk.kernel(DOUBLE, d, d2, s, a2, lang="glsl", grid=1,
                  args=[{"tensor": 0}, {"i32": 8}])
    assert r[0] is d and r[1] is d2 and r[2] is s and r[3] is a2
    np.testing.assert_array_equal(d.numpy(), [2] * 8)


def test_kernel_staged_tensor_comes_back_as_numpy(vk_daemon, monkeypatch):
    """A tensor too large for one message went through a temporary buffer, freed once
    the task was sent: kernel() gave back a DeviceArray of that freed buffer."""
    d = Daemon(["--backends", "cpu,vulkan", "--max-message", "256K"])
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            x = np.arange(100000, dtype=np.float32)  # 400 KB
            r = c.kernel(DOUBLE, x, lang="glsl", grid=(100000 + 63) // 64,
                         device="vulkan:0", args=[{"tensor": 0}, {"i32": 100000}])
            assert isinstance(r[0], np.ndarray)
            np.testing.assert_array_equal(r[0], 2 * x)
            f = c.submit("kernel", DOUBLE, x, np.ones(64, np.float32), lang="glsl",
                         grid=(100000 + 63) // 64, device="vulkan:0",
                         args=[{"tensor": 0}, {"i32": 100000}])
            r = f.result(TIMEOUT)
            np.testing.assert_array_equal(r[0], 2 * x)
            np.testing.assert_array_equal(r[1], np.ones(64))
            assert mine(c)["buffers"] == 0
    finally:
        d.stop()


# ---- J: 16-bit operands of shared arrays ending off a 4-byte word (vulkan) --------------

F16_DOUBLE = """#version 450
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { uint xw[]; };
layout(std430, binding = 1) buffer Y { float16_t y[]; };
layout(push_constant) uniform P { uint n; } p;
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < p.n) y[i] = float16_t(2.0 * unpackHalf2x16(xw[i >> 1])[i & 1u]);
}
"""


@pytest.mark.parametrize("bf16", [False, True], ids=["f16", "bf16"])
def test_vulkan_shared_16bit_odd_count(vk, bf16):
    """A shared array of an odd number of f16/bf16 elements (its bytes end at 2 mod 4)
    was bound on vulkan:0 with exactly its size: shaders read 16-bit data as 32-bit
    words, robust buffer access gave 0 for the last, partly covered one, and gemm saw
    the last element as 0.  Inline operands and DeviceArrays (pool blocks, whole words)
    were right."""
    def to16(a):
        return dspk.to_bfloat16(a) if bf16 else np.asarray(a, np.float16)
    dt = dspk.bfloat16 if bf16 else np.float16
    for shape in ((5, 7), (1, 1), (3, 1), (9, 1), (1, 5), (3, 3)):
        n = int(np.prod(shape))
        ref = np.arange(1, n + 1, dtype=np.float32).reshape(shape)  # exact in 16 bits
        s = vk.empty_shared(shape, dt, device="vulkan:0")
        s[:] = to16(ref)
        # as B of gemm (eye @ s) and as A (s @ eye): exact products of small integers
        got = vk.gemm(to16(np.eye(shape[0])), s, device="vulkan:0")
        np.testing.assert_array_equal(got, ref, err_msg="eye @ shared %s" % (shape,))
        got = vk.gemm(s, to16(np.eye(shape[1])), device="vulkan:0")
        np.testing.assert_array_equal(got, ref, err_msg="shared %s @ eye" % (shape,))
    # a view one element in: starts at 2 mod 4 and, 34 elements long, ends at 2 mod 4
    s = vk.empty_shared(35, dt, device="vulkan:0")
    s[:] = to16(np.arange(1, 36))
    v = s[1:].reshape(2, 17)
    got = vk.gemm(to16(np.eye(2)), v, device="vulkan:0")
    np.testing.assert_array_equal(got, np.arange(2, 36, dtype=np.float32).reshape(2, 17))


def test_vulkan_kernel_reads_last_odd_f16_word_of_shared_array(vk):
    """A raw kernel reading an odd-length f16 shared array as 32-bit words (two
    elements each, as the built-in kernels do) and writing f16 elements into another:
    the last element, in a word the binding covered only in part, was read as 0."""
    for n in (1, 3, 35, 37):
        x = vk.empty_shared(n, np.float16, device="vulkan:0")
        y = vk.empty_shared(n, np.float16, device="vulkan:0")
        x[:] = np.arange(1, n + 1)
        y[:] = -1
        vk.kernel(F16_DOUBLE, x, y, lang="glsl", grid=1, device="vulkan:0",
                  args=[{"tensor": 0}, {"tensor": 1}, {"u32": n}])
        np.testing.assert_array_equal(y, 2 * np.arange(1, n + 1), err_msg="n=%d" % n)
        np.testing.assert_array_equal(x, np.arange(1, n + 1))


# ---- J2: a raw kernel's bindings and push constants are what args pass (vulkan) --------

AXPY2 = """#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) buffer Y { float y[]; };
layout(push_constant) uniform P { uint n; float a; } p;
void main() { uint i = gl_GlobalInvocationID.x; if (i < p.n) y[i] = p.a * x[i]; }
"""


def test_vulkan_kernel_bindings_must_match_args(vk):
    """A shader using bindings 0 and 1 ran with fewer tensors in args (a pipeline
    layout without the bindings the shader uses: undefined behaviour in Vulkan), and
    silently wrote nothing."""
    x = np.arange(10, dtype=np.float32)
    y = np.zeros(10, np.float32)
    scal = [{"u32": 10}, {"f32": 3.0}]
    with pytest.raises(dspk.InvalidArgument, match="binding 0, but args pass no tensor"):
        vk.kernel(AXPY2, x, y, lang="glsl", grid=1, device="vulkan:0", args=scal)
    with pytest.raises(dspk.InvalidArgument, match="binding 1, but args pass 1 tensor"):
        vk.kernel(AXPY2, x, y, lang="glsl", grid=1, device="vulkan:0",
                  args=[{"tensor": 0}] + scal)
    # the push-constant block (8 bytes) beyond the scalars passed (4)
    with pytest.raises(dspk.InvalidArgument, match="push-constant block is 8 bytes"):
        vk.kernel(AXPY2, x, y, lang="glsl", grid=1, device="vulkan:0",
                  args=[{"tensor": 0}, {"tensor": 1}, {"u32": 10}])
    r = vk.kernel(AXPY2, x, y, lang="glsl", grid=1, device="vulkan:0",
                  args=[{"tensor": 0}, {"tensor": 1}] + scal)
    np.testing.assert_array_equal(r[1], 3 * x)
    # more tensors than the shader uses, and a binding it declares but never uses: fine
    unused = AXPY2.replace("void main()", "layout(std430, binding = 5) buffer Z "
                                          "{ float z[]; };\nvoid main()")
    r = vk.kernel(unused, x, y, lang="glsl", grid=1, device="vulkan:0",
                  args=[{"tensor": 0}, {"tensor": 1}, {"tensor": 0}] + scal)
    np.testing.assert_array_equal(r[1], 3 * x)
    # another descriptor set, a uniform buffer: refused, naming them
    other = AXPY2.replace("binding = 1", "set = 1, binding = 1")
    with pytest.raises(dspk.InvalidArgument, match="descriptor set 1"):
        vk.kernel(other, x, y, lang="glsl", grid=1, device="vulkan:0",
                  args=[{"tensor": 0}, {"tensor": 1}] + scal)
    ubo = AXPY2.replace("std430, binding = 0) buffer X", "std140, binding = 0) uniform X"
                        ).replace("float x[]", "vec4 x[4]").replace("* x[i]", "* x[i / 4][i % 4]")
    with pytest.raises(dspk.InvalidArgument, match="uniform buffer at set 0, binding 0"):
        vk.kernel(ubo, x, y, lang="glsl", grid=1, device="vulkan:0",
                  args=[{"tensor": 0}, {"tensor": 1}] + scal)


PC_MATRIX = """#version 450
layout(local_size_x = 1) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform P { %s m; };
void main() { for (int c = 0; c < %d; c++) for (int r = 0; r < %d; r++) x[c * %d + r] = m[c][r]; }
"""


@pytest.mark.parametrize("decl,cols,rows", [
    ("mat3", 3, 3), ("layout(row_major) mat3", 3, 3), ("mat2x3", 2, 3),
    ("layout(row_major) mat3x2", 3, 2), ("mat4x3", 4, 3)])
def test_vulkan_kernel_push_constant_matrix(vk, decl, cols, rows):
    """A matrix in the push-constant block takes MatrixStride bytes per column (per row
    when row-major), 16 for a vec3 in std430: `mat3 m` with 9 f32 scalars ran and read
    m[2][2] as 0 from bytes never pushed.  Too few scalars are refused, naming the
    block's size; enough run and read each element where std430 puts it."""
    src = PC_MATRIX % (decl, cols, rows, rows)
    row_major = "row_major" in decl
    major, minor = (rows, cols) if row_major else (cols, rows)
    size = (major - 1) * 16 + minor * 4  # std430: vectors of 3 or 4 floats 16 apart
    x = np.zeros(cols * rows, np.float32)
    with pytest.raises(dspk.InvalidArgument,
                       match="push-constant block is %d bytes, the scalars of args fill %d"
                       % (size, size - 4)):
        vk.kernel(src, x, lang="glsl", grid=1, device="vulkan:0",
                  args=[{"tensor": 0}] + [{"f32": 1.0}] * (size // 4 - 1))
    pushed = np.arange(1, size // 4 + 1, dtype=np.float32)
    r = vk.kernel(src, x, lang="glsl", grid=1, device="vulkan:0",
                  args=[{"tensor": 0}] + [{"f32": float(v)} for v in pushed])
    # the pushed floats as major vectors 4 floats apart, the first `minor` of each
    stored = np.pad(pushed, (0, major * 4 - pushed.size)).reshape(major, 4)[:, :minor]
    m = stored.T if row_major else stored  # m[c][r]
    np.testing.assert_array_equal(r[0], m.reshape(-1))


# ---- K: numbers that cannot be represented -------------------------------------------

@pytest.mark.parametrize("call,name", [
    (lambda c: c.gemm(np.ones((2, 2)), np.ones((2, 2)), alpha=10**400), "alpha"),
    (lambda c: c.gemm(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), beta=-10**400),
     "beta"),
    (lambda c: c.map("scale", np.ones(2), alpha=np.longdouble("1e4000")), "alpha"),
    # the same values on f32 ops (rounded here to f32: numpy's isinf on an int beyond
    # 64 bits raised a bare TypeError; a longdouble beyond float64 came back as ERANGE
    # naming 1.797e308, a value the caller never passed)
    (lambda c: c.gemm(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32),
                      alpha=10**400), "alpha"),
    (lambda c: c.gemm(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32),
                      np.ones((2, 2), np.float32), beta=-10**400), "beta"),
    (lambda c: c.map("scale", np.ones(2, np.float32), alpha=2**1024), "alpha"),
    (lambda c: c.map("scale", np.ones(2, np.float32),
                     alpha=fractions.Fraction(10**400, 3)), "alpha"),
    (lambda c: c.map("scale", np.ones(2, np.complex64), alpha=np.longdouble("1e4000")),
     "alpha"),
    (lambda c: c.submit("map", "scale", np.ones(2, np.float32), alpha=10**400), "alpha"),
    (lambda c: c.reduce(np.ones(2), axes=2**64), "axes"),
    (lambda c: c.reduce(np.ones((2, 2)), axes=[0, -2**70]), r"axes\[1\]"),
    (lambda c: c.kernel("x", np.ones(2), lang="glsl", grid=2**64), "grid"),
    (lambda c: c.kernel("x", np.ones(2), lang="glsl", grid=1, block=[1, 2**70]),
     r"block\[1\]"),
    (lambda c: c.kernel("x", np.ones(2), lang="glsl", grid=1, shared=2**64), "shared"),
])
def test_numbers_beyond_the_wire(client, call, name):
    """alpha=10**400 raised a bare OverflowError; an int beyond 64 bits elsewhere an
    InvalidArgument that did not name the parameter."""
    with pytest.raises(dspk.InvalidArgument, match="^EINVAL: " + name + ": "):
        call(client)
    assert client.ping() >= 0


def test_kernel_float_argument_beyond_float64_is_a_range_error(client):
    with pytest.raises(dspk.RangeError, match=r"^ERANGE: options.args\[0\]: 1e\+400 is out of f64 "):
        client.kernel("x", np.ones(2), lang="glsl", grid=1, args=[{"f64": 10**400}])


def test_timeout_beyond_float_waits_for_ever(daemon):
    with dspk.connect(daemon.socket, timeout=10**400) as c:
        assert c.timeout is None
        f = c.submit("reduce", np.ones(3))
        assert f.result(10**400) == 3.0


def test_future_wait_timeout_of_another_type_or_nan(client):
    """result('1') raised a bare "'>' not supported between 'str' and 'int'" from inside
    the client (outside probe 13, C) and result(nan) a TimeoutError at once: a
    TypeError / ValueError naming the timeout, whether the future is done or not."""
    f = client.submit("reduce", np.ones(3))
    for wait in (f.result, f.exception):
        with pytest.raises(TypeError, match="timeout: seconds .* not str"):
            wait("1")
        with pytest.raises(ValueError, match="timeout: NaN"):
            wait(float("nan"))
        with pytest.raises(ValueError, match="timeout: NaN"):
            wait(np.float32("nan"))
    assert f.result(TIMEOUT) == 3.0
    assert f.result(np.float32(1)) == 3.0 and f.exception(fractions.Fraction(1, 2)) is None
    assert f.result(True) == 3.0 and f.result(-1) == 3.0  # real numbers all
    with pytest.raises(TypeError, match="not str"):
        f.result("1")


def test_pending_future_wait_timeout_of_any_real_type(fresh_daemon):
    """result(timeout)/exception(timeout) of a pending future refused a numpy float32 or
    float16 and a Fraction with a TypeError "... cannot be interpreted as an integer"
    from inside the wait (a lock's acquire() takes a float or an int only), though a
    done future took them (outside probe 15, C, 2).  Now any real number is a number of
    seconds whether the future is done or not: on a future kept pending (its daemon
    stopped), each of these times out, and the future completes once it goes on."""
    import concurrent.futures
    import signal
    c = dspk.connect(fresh_daemon.socket, timeout=TIMEOUT)
    os.kill(fresh_daemon.proc.pid, signal.SIGSTOP)
    try:
        f = c.submit("reduce", np.ones(3))
        for t in (np.float32(0.01), np.float16(0.01), np.float64(0.01),
                  fractions.Fraction(1, 100), np.int8(0), 0, -fractions.Fraction(10 ** 400),
                  -10 ** 400, -np.inf, False):
            for wait in (f.result, f.exception):
                with pytest.raises(concurrent.futures.TimeoutError):
                    wait(t)
        assert not f.done()
    finally:
        os.kill(fresh_daemon.proc.pid, signal.SIGCONT)
    assert f.result(fractions.Fraction(10 ** 400)) == 3.0  # beyond any wait: for ever
    assert f.exception(np.float32(TIMEOUT)) is None
    c.close()


# ---- L: a view of a shared array off its item size ------------------------------------

def test_shared_view_off_its_item_size(client):
    """s[1:5].view(np.float64) of a float32 shared array starts 4 bytes into it: sent
    as a reference the daemon refused it (offset not a multiple of 8)."""
    s = client.empty_shared(8, np.float32)
    s[:] = np.arange(8)
    v = s[1:5].view(np.float64)
    assert client.reduce(v) == v.sum()
    np.testing.assert_array_equal(client.map("scale", v, alpha=1.0), v)
    # As out= it cannot be written there: refused before anything is sent.
    o = client.empty_shared(10, np.float32)
    with pytest.raises(dspk.InvalidArgument, match="not a multiple of its item size"):
        client.map("scale", np.ones(2), out=o[1:5].view(np.float64))
    # Aligned views still go by reference.
    assert client.map("scale", np.ones(2), alpha=3.0, out=o[2:6].view(np.float64)) \
        is not None
    np.testing.assert_array_equal(o[2:6].view(np.float64), [3, 3])


# ---- M: max_elements before materialising -----------------------------------------

def test_broadcast_operand_beyond_max_elements(client):
    """A broadcast view of 2^40 elements was copied by the client first: numpy's
    MemoryError (or gigabytes allocated) instead of dspk.LimitExceeded."""
    x = np.broadcast_to(np.float32(1), (1 << 40,))
    with pytest.raises(dspk.LimitExceeded, match="input 0: 1099511627776 elements"):
        client.reduce(x)
    with pytest.raises(dspk.LimitExceeded, match="array: 1099511627776 elements"):
        client.to_device(x)
    with pytest.raises(dspk.LimitExceeded):
        client.submit("map", "add", np.ones(2, np.float32), x)


def test_operand_elements_against_the_daemons_limit():
    d = Daemon(["--max-elements", "1000"])
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            assert c.limits["max_elements"] == 1000
            assert c.reduce(np.broadcast_to(np.float32(2), (1000,))) == 2000
            with pytest.raises(dspk.LimitExceeded, match="1001 elements, more than the "
                                                         "daemon's max_elements"):
                c.reduce(np.broadcast_to(np.float32(2), (1001,)))
    finally:
        d.stop()


# ---- no bare OSError from connect() and the other public methods -----------------------

@pytest.mark.parametrize("free", [0, 1])
def test_connect_out_of_file_descriptors(daemon, free):
    """With no descriptor for the socket, connect() raised a bare OSError (EMFILE),
    while one step later (the wake-up pipe, now a socket pair) the same was
    dspk.LimitExceeded.  Now both are dspk.LimitExceeded, and nothing is left open."""
    with _no_descriptors(8) as dups:
        for _ in range(free):
            os.close(dups.pop())
        with pytest.raises(dspk.LimitExceeded, match="open file limit"):
            dspk.connect(daemon.socket, timeout=TIMEOUT)
        got = _take_descriptors(dups)  # nothing left open: the free ones are free again
        assert len(got) == free
    with dspk.connect(daemon.socket, timeout=TIMEOUT) as c:
        assert c.ping() > 0


def test_no_thread_to_be_had(daemon, monkeypatch):
    """Where no thread can be started (RuntimeError "can't start new thread"), submit()
    raised that RuntimeError after its request was sent (the reader thread), and the
    future was lost.  Now the future is returned and its result() reads the connection
    itself; a submit() that needs the worker thread raises dspk.LimitExceeded, having
    sent nothing."""
    from dspk import _client

    def refuse(fn, *args):  # the reader's and the worker's threads
        raise RuntimeError("can't start new thread")
    with dspk.connect(daemon.socket, timeout=TIMEOUT) as c:
        monkeypatch.setattr(_client, "_launch", refuse)
        f = c.submit("reduce", np.ones(5))
        assert f.result(TIMEOUT) == 5
        assert f.exception(TIMEOUT) is None
        c._limits["max_message"] = 64 << 10  # the operand is now staged: the worker's
        with pytest.raises(dspk.LimitExceeded, match="no thread"):
            c.submit("reduce", np.ones(1 << 14))
        monkeypatch.undo()
        assert c.submit("reduce", np.ones(1 << 14)).result(TIMEOUT) == 1 << 14
        assert [x for x in c.status()["clients"] if x["self"]][0]["buffers"] == 0


def test_malformed_answer_is_a_protocol_error(tmp_path):
    """An answer without the result the client decodes failed the future with the
    decoder's IndexError or KeyError; now dspk.ProtocolError."""
    from test_client import FakeDaemon
    fake = FakeDaemon(str(tmp_path / "fake.sock"))
    c = dspk.connect(fake.path, timeout=TIMEOUT)
    try:
        f = c.submit("map", "abs", np.ones(2, np.float32))
        while not fake.requests:
            assert fake.got.wait(TIMEOUT)
            fake.got.clear()
        fake.send([1, fake.requests[0][1], None, {"device": "cpu:0", "time_us": 1}])
        assert isinstance(f.exception(TIMEOUT), dspk.ProtocolError), f.exception()
    finally:
        c.close()
        fake.close()


def test_a_device_array_of_another_connection(daemon):
    """A DeviceArray of another client passed to an op (its buffer id names no buffer,
    or another one, on this connection) was refused with a bare "a DeviceArray of
    another connection" naming no operand (out=: "must be a DeviceArray of this
    connection").  Now refused before anything is sent, naming the operand and its
    other connection, for every op's operands, as out=, and in submit() (also one the
    worker would stage, checked as its arguments are taken)."""
    x = np.arange(8, dtype=np.float32)
    with dspk.connect(daemon.socket, timeout=TIMEOUT) as c, \
            dspk.connect(daemon.socket, timeout=TIMEOUT) as other:
        d = other.to_device(x)
        m = other.to_device(np.ones((8, 8), np.float32))
        o = other.empty(8, np.float32)
        sent = c._next_id
        calls = [
            ("input 0", lambda: c.reduce(d)),
            ("input 1", lambda: c.map("add", x, d)),
            ("input 1", lambda: c.gemm(np.ones((8, 8), np.float32), m)),
            ("input 2", lambda: c.gemm(np.ones((8, 8), np.float32),
                                       np.ones((8, 8), np.float32), m)),
            ("input 1", lambda: c.fir(x, d)),
            ("input 0", lambda: c.contract("ij,jk->ik", m, np.ones((8, 8), np.float32))),
            ("input 1", lambda: c.kernel("void main() {}", x, d, lang="glsl", grid=1)),
            ("out=", lambda: c.map("abs", x, out=o)),
            ("input 0", lambda: c.submit("reduce", d)),
            ("out=", lambda: c.submit("map", "abs", x, out=o)),
            # a large plain operand beside it: the submit() would go to the worker
            ("input 1", lambda: c.submit("map", "add", np.ones(8 << 20, np.float32), d)),
        ]
        for what, call in calls:
            with pytest.raises(dspk.InvalidArgument) as e:
                call()
            assert e.value.message.startswith(what + ": a DeviceArray of another "
                                              "connection"), e.value.message
            assert not isinstance(e.value, dspk.NoBuffer)
        assert not c._pending
        assert c._next_id == sent, "a request was sent"
        mine = [x for x in c.status()["clients"] if x["self"]][0]
        assert mine["buffers"] == 0
        # both still work, and the arrays with their own client
        assert other.reduce(d) == 28
        np.testing.assert_array_equal(c.map("abs", -x), x)
