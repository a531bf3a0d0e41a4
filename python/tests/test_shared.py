"""Shared-memory buffers (protocol.md "Shared memory"): Client.empty_shared and the raw
buffer.import / buffer.share methods, against a real daemon and numpy."""
from __future__ import annotations

import array
import errno
import fcntl
import gc
import mmap
import os
import select
import socket
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import pytest

import dspk
from conftest import TIMEOUT

SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


class Raw:
    """A bare protocol connection that can pass file descriptors."""

    def __init__(self, path: str) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.up = msgpack.Unpacker(raw=False)
        self.fds: list = []
        self.id = 0

    def send(self, method, args=None, fds=None):
        self.id += 1
        frame = msgpack.packb([0, self.id, method, [args] if args is not None else []],
                              use_bin_type=True)
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        self.s.sendmsg([frame], anc)
        return self.id

    def recv(self):
        while True:
            for msg in self.up:
                return msg
            data, anc, _, _ = self.s.recvmsg(1 << 20, socket.CMSG_SPACE(16 * 4))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(payload[:len(payload) - len(payload) % 4])
                    self.fds.extend(a)
            if not data:
                return None
            self.up.feed(data)

    def call(self, method, args=None, fds=None):
        msgid = self.send(method, args, fds)
        msg = self.recv()
        assert msg is not None and msg[0] == 1 and msg[1] == msgid, msg
        return msg[2], msg[3]

    def close(self):
        self.s.close()
        for fd in self.fds:
            os.close(fd)


def memfd(size: int, seals: int = SEALS) -> int:
    fd = os.memfd_create("t", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def task(buf: int, shape, dtype="f32", off=0):
    return {"buffer": buf, "offset": off, "dtype": dtype, "shape": list(shape)}


@pytest.fixture()
def raw(daemon):
    r = Raw(daemon.socket)
    yield r
    r.close()


# ---- Client.empty_shared ---------------------------------------------------------

def test_shared_memory_past_the_file_size_limit(client):
    """A memfd is a file: shared memory past RLIMIT_FSIZE is dspk.LimitExceeded naming
    the limit, as libdspkclient's DSPK_ELIMIT (probe 20 D4: it was dspk.IOFailure
    "File too large"), and an operand of the automatic path that cannot have its
    temporary crosses the socket instead (CPython ignores SIGXFSZ)."""
    import resource
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    x = np.arange(1 << 19, dtype=np.float32)  # 2 MiB: above the 1 MiB threshold
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, old[1]))
    try:
        with pytest.raises(dspk.LimitExceeded) as ei:
            client.empty_shared((1 << 18,), np.float32)
        assert ei.value.message == ("shared memory of 1048576 bytes: more than this "
                                    "process's file size limit (RLIMIT_FSIZE, 65536 bytes)")
        got = client.map("scale", x, alpha=2.0, device="cpu:0")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
    np.testing.assert_array_equal(got, x * 2)


@pytest.mark.parametrize("err,exc,says", [
    (errno.ENOSYS, dspk.NotSupported, "shared memory is unavailable on this system "
                                      "(memfd_create: Function not implemented)"),
    (errno.EPERM, dspk.PermissionDenied, "shared memory is unavailable to this process "
                                         "(memfd_create: Operation not permitted; "),
    (errno.EACCES, dspk.PermissionDenied, "shared memory is unavailable to this process "
                                          "(memfd_create: Permission denied; ")])
def test_no_memfd_is_said_so(client, monkeypatch, err, exc, says):
    """Where this process can have no memfd (a kernel without memfd_create, a seccomp
    filter that says ENOSYS or EPERM; here os.memfd_create made to fail so), an
    empty_shared is dspk.NotSupported or dspk.PermissionDenied saying that shared
    memory is unavailable, in libdspkclient's words and codes (probe 23 B3: the bare
    "shared memory: memfd_create: Function not implemented"); the automatic path's
    operand and result cross the socket instead."""
    def no_memfd(*args: object) -> int:
        raise OSError(err, os.strerror(err))
    monkeypatch.setattr(os, "memfd_create", no_memfd)
    with pytest.raises(exc) as ei:
        client.empty_shared((1024,), np.float32)
    assert ei.value.message.startswith(says)
    x = np.arange(1 << 19, dtype=np.float32)  # 2 MiB: above the 1 MiB threshold
    np.testing.assert_array_equal(client.map("scale", x, alpha=2.0, device="cpu:0"), x * 2)


def test_shared_operands_and_out_against_numpy(client):
    rng = np.random.default_rng(1)
    a = client.empty_shared((96, 80), np.float32)
    b = client.empty_shared((80, 72), np.float32)
    out = client.empty_shared((96, 72), np.float32)
    a[:] = rng.standard_normal(a.shape)
    b[:] = rng.standard_normal(b.shape)
    res = client.gemm(a, b, out=out)
    assert res is out
    np.testing.assert_allclose(out, a @ b, rtol=2e-5, atol=2e-4)
    # a slice of a shared array is a reference too (offset into the buffer)
    np.testing.assert_allclose(client.reduce(a[10:20]), a[10:20].sum(), rtol=1e-4)
    # shared and plain operands mix; fft of a shared complex array
    x = client.empty_shared(4096, np.complex64)
    x[:] = rng.standard_normal(4096) + 1j * rng.standard_normal(4096)
    np.testing.assert_allclose(client.fft(x), np.fft.fft(x), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(client.map("add", a, np.ones_like(a)), a + 1, rtol=1e-6)


def _shmem_thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            text = f.read()
    except OSError:
        return "never"
    return text[text.index("[") + 1:text.index("]")] if "[" in text else "never"


def _pmd_mapped_kb(addr: int) -> int:
    """ShmemPmdMapped of the mapping of this process that holds addr (-1: none)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("ShmemPmdMapped:"):
                return int(line.split()[1])
    return -1


def test_shared_arrays_get_huge_pages_where_advised(client):
    # shmem_enabled "advise": the mapping asks before its first fault, so the
    # pages are 2 MiB ones (4 KiB pages made gemm on shared arrays slower)
    mode = _shmem_thp_mode()
    if mode in ("never", "deny"):
        pytest.skip(f"shmem_enabled is {mode} here: no huge pages to check")
    a = client.empty_shared((4 << 20,), np.float32)
    a[:] = 1.0
    assert _pmd_mapped_kb(a.__array_interface__["data"][0]) >= 2048


def test_shared_out_is_written_in_place(client):
    """The daemon writes the result into the array's own pages: nothing is read back."""
    x = client.empty_shared(1 << 16, np.float64)
    x[:] = np.arange(x.size)
    out = client.empty_shared(1 << 16, np.float64)
    out[:] = -1
    addr = out.__array_interface__["data"][0]
    reads = []
    orig = client._start

    def spy(method, *a, **k):
        reads.append(method)
        return orig(method, *a, **k)

    client._start = spy
    try:
        res = client.map("scale", x, alpha=3.0, out=out)
    finally:
        client._start = orig
    assert res is out and np.shares_memory(res, out)
    assert res.__array_interface__["data"][0] == addr
    assert reads == ["task.run"]  # no buffer.read, no buffer.write
    np.testing.assert_array_equal(out, 3.0 * np.arange(x.size))


def test_shared_out_overlapping_operands(client):
    """out= over the operands' own bytes: as if every operand were read first (on cpu:0 a
    gemm writing over its A gave zeros, a map one element ahead of its input read what it
    had written)."""
    rng = np.random.default_rng(7)
    m = client.empty_shared((3, 64, 64), np.float64)
    m[:] = rng.standard_normal(m.shape)
    a, b = m[0].copy(), m[1].copy()
    assert client.gemm(m[0], m[1], out=m[0]) is not None
    np.testing.assert_allclose(m[0], a @ b, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(m[1], b)
    v = client.empty_shared(1000, np.float32)
    v[:] = np.arange(1000)
    client.map("scale", v[:999], alpha=2.0, out=v[1:])
    np.testing.assert_array_equal(v[1:], 2.0 * np.arange(999, dtype=np.float32))
    x = rng.standard_normal(500)
    h = rng.standard_normal(40)
    s = client.empty_shared(540, np.float64)
    s[:500], s[500:] = x, h
    client.fir(s[:500], s[500:], out=s[:500])
    np.testing.assert_allclose(s[:500], np.convolve(x, h)[:500], rtol=1e-9, atol=1e-9)


def test_shared_operand_sends_no_data(client):
    """A 16 MiB operand in a shared array: the request frame is a few hundred bytes."""
    a = client.empty_shared((2048, 2048), np.float32)
    a[:] = 1.0
    sent = []
    orig = client._send_chunks

    def spy(chunks, fds=None, mark=None, *rest):
        sent.append(sum(memoryview(c).nbytes for c in chunks))
        return orig(chunks, fds, mark, *rest)

    client._send_chunks = spy
    try:
        total = client.reduce(a)
    finally:
        client._send_chunks = orig
    assert total == pytest.approx(2048 * 2048)
    assert len(sent) == 1 and sent[0] < 512, sent
    # the same array inline (a copy, the automatic shared path off) is the whole 16 MiB
    sent.clear()
    client.shared_threshold = 0
    client._send_chunks = spy
    try:
        client.reduce(np.array(a))
    finally:
        client._send_chunks = orig
    assert sum(sent) > a.nbytes


# ---- the automatic shared-memory path (plain numpy operands) ----------------------

def _spy_sends(client):
    sent = []
    orig = client._send_chunks

    def spy(chunks, fds=None, mark=None, *rest):
        sent.append(sum(memoryview(c).nbytes for c in chunks))
        return orig(chunks, fds, mark, *rest)

    client._send_chunks = spy
    return sent, orig


def test_auto_shared_large_operands_and_result(client):
    """Plain numpy operands and results of at least shared_threshold bytes (1 MiB)
    travel through reused shared temporaries, not the socket: every frame sent is
    small, results equal numpy's, and the second call imports nothing new."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((640, 512)).astype(np.float32)     # 1.25 MiB
    b = rng.standard_normal((512, 768)).astype(np.float32)     # 1.5 MiB, result 1.9 MiB
    x = (rng.standard_normal(1 << 17) + 1j * rng.standard_normal(1 << 17)).astype(np.complex64)
    assert client.shared_threshold == 1 << 20
    sent, orig = _spy_sends(client)
    try:
        np.testing.assert_allclose(client.gemm(a, b), a @ b, rtol=2e-4, atol=2e-3)
        first = len(sent)
        got = client.gemm(a, b)
        np.testing.assert_allclose(client.fft(x), np.fft.fft(x), rtol=1e-3, atol=1e-2)
    finally:
        client._send_chunks = orig
    assert max(sent) < 4096, sent
    # first call: devices (may "any" use shared memory?), 3 buffer.import, the task;
    # then gemm and fft: their tasks only
    assert first == 5 and len(sent) - first == 2, sent
    np.testing.assert_allclose(got, a @ b, rtol=2e-4, atol=2e-3)
    # the caller's to write (a view of a temporary lent to it, no other task's) ...
    assert got.flags.writeable and not got.flags.owndata
    got[:] = 0  # ... and writing it leaves the next result alone
    np.testing.assert_allclose(client.gemm(a, b), a @ b, rtol=2e-4, atol=2e-3)
    # below the threshold, and with the path off: inline, as before
    small = rng.standard_normal((64, 64)).astype(np.float32)
    sent, orig = _spy_sends(client)
    client.shared_threshold = 0
    try:
        np.testing.assert_allclose(client.gemm(a, b), a @ b, rtol=2e-4, atol=2e-3)
        np.testing.assert_allclose(client.map("abs", small), np.abs(small))
    finally:
        client._send_chunks = orig
    assert sum(sent) > a.nbytes + b.nbytes


def test_wide_copy_splits_and_large_operands_round_trip(client):
    """Copies of 8 MiB and more into and out of temporaries are split over threads:
    every split copies every byte and nothing past its end; a 12 MiB + 12 bytes map
    through temporaries gives numpy's result."""
    from dspk._client import _copy_wide
    rng = np.random.default_rng(11)
    src = rng.integers(0, 256, (17 << 20) + 67, dtype=np.uint8)
    for n in (1, 4095, (8 << 20) - 1, 8 << 20, (12 << 20) + 4097, (17 << 20) + 3):
        for threads in range(0, 7):
            dst = np.full(n + 64, 0xa5, np.uint8)
            _copy_wide(dst[:n], src[:n], threads)
            assert np.array_equal(dst[:n], src[:n]), (n, threads)
            assert (dst[n:] == 0xa5).all(), (n, threads)
    x = rng.standard_normal((3 << 20) + 3).astype(np.float32)
    sent, orig = _spy_sends(client)
    try:
        got = client.map("abs", x, device="cpu:0")
    finally:
        client._send_chunks = orig
    assert max(sent) < 4096, sent  # through temporaries, not the socket
    assert np.array_equal(got, np.abs(x))


def test_auto_shared_threshold_from_environment(daemon, monkeypatch):
    import dspk
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "2M")
    with dspk.connect(daemon.socket) as c:
        assert c.shared_threshold == 2 << 20
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "0")
    with dspk.connect(daemon.socket) as c:
        assert c.shared_threshold == 0
        x = np.arange(1 << 19, dtype=np.float32)
        assert c.reduce(x) == pytest.approx(float(x.sum(dtype=np.float64)), rel=1e-6)
        assert not c._temps


def test_auto_shared_futures_do_not_share_temporaries(client):
    """Many large tasks in flight: each holds its own temporaries until answered."""
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal(1 << 19).astype(np.float32) for _ in range(8)]
    futs = [client.submit("map", "scale", x, alpha=float(i + 1)) for i, x in enumerate(xs)]
    for i, (f, x) in enumerate(zip(futs, xs)):
        np.testing.assert_array_equal(f.result(timeout=60), x * np.float32(i + 1))
    assert len(client._temps) <= 16
    # reused afterwards: the same tasks import nothing new
    n = len(client._temps)
    for i, x in enumerate(xs[:3]):
        np.testing.assert_array_equal(client.map("scale", x, alpha=2.0), x * np.float32(2))
    assert len(client._temps) <= max(n, 6)


def test_shared_buffer_freed_with_array(client):
    def nbufs():
        me = [c for c in client.status()["clients"] if c["self"]]
        return me[0]["buffers"]

    before = nbufs()
    a = client.empty_shared(1000, np.float32)
    assert nbufs() == before + 1
    del a
    gc.collect()
    assert nbufs() == before  # buffer.free went before status on the same connection


@pytest.mark.parametrize("shape", [0, (2, 0), (0, 3, 4)])
def test_shared_array_of_zero_elements_is_a_shared_array(client, shape):
    """python.md (Shared arrays): zero elements give a 0-size numpy array that is a
    shared array like any other (one daemon buffer of one byte behind it, buffer.import
    refusing 0 bytes), so that code written for any batch size works at 0: it is out=
    of a 0-size result (returned as itself), and it goes when collected (probe 20
    F2: this was undocumented)."""
    def nbufs():
        return [c for c in client.status()["clients"] if c["self"]][0]["buffers"]

    before = nbufs()
    x = client.empty_shared(shape, np.float64)
    want = (shape,) if isinstance(shape, int) else shape
    assert type(x) is np.ndarray and x.shape == want and x.dtype == np.float64
    assert x.size == 0 and x.nbytes == 0
    assert nbufs() == before + 1
    r = client.map("abs", np.zeros(want, np.float64), out=x)
    assert r is x
    np.testing.assert_array_equal(client.map("abs", x), np.zeros(want))  # an operand
    del x, r
    gc.collect()
    assert nbufs() == before


def test_shared_out_wrong_shape_is_reported(client):
    a = client.empty_shared((8, 8), np.float32)
    a[:] = 1
    out = client.empty_shared((4, 4), np.float32)
    with pytest.raises(dspk.Error):   # the 8x8 result does not fit: ERANGE
        client.gemm(a, a, out=out)
    big = client.empty_shared(64, np.float32)
    with pytest.raises(dspk.InvalidArgument):  # fits, but is not the result's shape
        client.gemm(a, a, out=big)


class _SendSpy:
    """The client's socket, recording the first bytes of each sendmsg that carries
    descriptors (everything else passes through)."""

    def __init__(self, sock):
        self._s = sock
        self.heads = []

    def __getattr__(self, name):
        return getattr(self._s, name)

    def sendmsg(self, buffers, anc=(), *rest):
        if anc:
            head = b""
            for b in buffers:
                head += bytes(memoryview(b).cast("B")[:64 - len(head)])
                if len(head) >= 64:
                    break
            self.heads.append(head)
        # The client polls on EAGAIN; raised from here it would look like a signal
        # handler's exception (the client's _foreign): wait here instead.
        while True:
            try:
                return self._s.sendmsg(buffers, anc, *rest)
            except BlockingIOError:
                select.select([], [self._s], [])


def _is_import_frame_start(head):
    u = msgpack.Unpacker(raw=False)
    u.feed(head)
    try:
        return (u.read_array_header() == 4 and u.unpack() == 0 and
                isinstance(u.unpack(), int) and u.unpack() == "buffer.import")
    except Exception:  # noqa: BLE001 - not a request frame at the start
        return False


def test_import_frame_starts_the_sendmsg_of_its_descriptor(client):
    """protocol.md, Passing descriptors: the kernel gives a sendmsg's descriptors to the
    first part of its data only (about 36 KiB), so the buffer.import frame must start the
    call that carries its descriptor, also when big requests went just before or are
    being sent by another thread: each descriptor goes with the import frame first, and
    every import succeeds (a descriptor sent with the tail of a big request would be
    stray: EINVAL)."""
    spy = _SendSpy(client._sock)
    client._sock = spy
    big = np.arange(8 << 20, dtype=np.float32)  # 32 MiB inline
    try:
        # pipelined: a big request in flight, then imports
        client.shared_threshold = 0
        fut = client.submit("reduce", big)
        a = client.empty_shared(1024, np.float32)
        a[:] = 1
        assert client.reduce(a) == 1024
        assert fut.result() == pytest.approx(float(big.sum(dtype=np.float64)), rel=1e-5)
        # another thread sending big requests while this one imports
        stop = threading.Event()
        errors = []

        def sender():
            try:
                while not stop.is_set():
                    client.to_device(big).free()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
        t = threading.Thread(target=sender)
        t.start()
        try:
            arrays = [client.empty_shared(1024, np.float32) for _ in range(16)]
        finally:
            stop.set()
            t.join()
        assert not errors, errors
        del arrays
        # the automatic path: big operands through temporaries imported meanwhile
        client.shared_threshold = 1 << 20
        futs = [client.submit("reduce", big) for _ in range(3)]
        for f in futs:
            assert f.result() == pytest.approx(float(big.sum(dtype=np.float64)), rel=1e-5)
    finally:
        client._sock = spy._s
    assert len(spy.heads) >= 17, len(spy.heads)
    bad = [h for h in spy.heads if not _is_import_frame_start(h)]
    assert not bad, bad


def test_concurrent_writes_do_not_crash(client):
    """A client writing its shared operand while tasks read it: undefined results for
    those tasks, never a crash; the next task is exact."""
    a = client.empty_shared((512, 512), np.float32)
    a[:] = 1
    stop = threading.Event()

    def scribble():
        v = 0.0
        while not stop.is_set():
            a[:] = v
            v += 1

    t = threading.Thread(target=scribble)
    t.start()
    try:
        for _ in range(20):
            client.gemm(a, a)
    finally:
        stop.set()
        t.join()
    a[:] = 2
    np.testing.assert_allclose(client.gemm(a, a), np.full((512, 512), 4 * 512), rtol=1e-6)


def test_client_exits_mid_task(daemon, client):
    """A client that exits with a task in flight on its shared buffers: the buffers go
    when the task ends, the daemon keeps serving."""
    code = r"""
import os, sys, numpy as np, dspk
c = dspk.connect(sys.argv[1])
a = c.empty_shared((1024, 1024), np.float32); a[:] = 1
for _ in range(4):
    c.submit("gemm", a, a)
print("sent", flush=True)
os._exit(0)
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", code, daemon.socket], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "sent" in p.stdout, p.stderr
    deadline = time.monotonic() + 30
    while True:
        st = client.status()
        if st["daemon"]["connections"] == 1:
            break
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    assert [c["buffers"] for c in st["clients"]] == [0] or \
        all(c["self"] for c in st["clients"])
    for dev in st["devices"]:
        assert dev["stats"]["pool_bytes_in_use"] == 0, dev
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(client.gemm(a, a.T), a @ a.T)


def test_staged_path_on_cpu():
    """The path of a device that cannot use the pages in place (cuda): a block of its own,
    one copy in before each task and one out after it (DSPKD_TEST_SHM_STAGED=1 forces it on
    the cpu).  Results must be in the client's pages when the answer comes."""
    from conftest import Daemon
    old = os.environ.get("DSPKD_TEST_SHM_STAGED")
    os.environ["DSPKD_TEST_SHM_STAGED"] = "1"
    try:
        d = Daemon()
    finally:
        if old is None:
            del os.environ["DSPKD_TEST_SHM_STAGED"]
        else:
            os.environ["DSPKD_TEST_SHM_STAGED"] = old
    try:
        with dspk.connect(d.socket, timeout=60) as c:
            rng = np.random.default_rng(4)
            a = c.empty_shared((100, 70), np.float64)
            b = c.empty_shared((70, 90), np.float64)
            big = c.empty_shared((300, 90), np.float64)
            a[:] = rng.standard_normal(a.shape)
            b[:] = rng.standard_normal(b.shape)
            big[:] = -7
            out = big[100:200]  # a slice: the result goes at an offset
            assert c.gemm(a, b, out=out) is out
            np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-12)
            assert (big[:100] == -7).all() and (big[200:] == -7).all()  # only its bytes
            a[:] = 2.0  # between tasks: the next copy in sees it
            np.testing.assert_allclose(c.gemm(a, b), 2.0 * np.ones((100, 70)) @ b,
                                       rtol=1e-12)
            np.testing.assert_allclose(c.reduce(out), out.sum(),
                                       rtol=1e-9)
    finally:
        d.stop()


# ---- the raw methods -------------------------------------------------------------

def test_import_checks(raw):
    """Unsealed, undersized, not a memfd, no fd: EINVAL with a message that says why."""
    fd = memfd(4096, seals=0)
    err, _ = raw.call("buffer.import", {"size": 4096}, [fd])
    assert err["name"] == "EINVAL" and "F_SEAL_SHRINK" in err["message"]
    os.close(fd)
    fd = memfd(4096)
    err, _ = raw.call("buffer.import", {"size": 8192}, [fd])
    assert err["name"] == "EINVAL" and "fewer than size" in err["message"]
    err, _ = raw.call("buffer.import", {"size": 0}, [fd])
    assert err["name"] == "EINVAL"
    os.close(fd)
    r, w = os.pipe()
    err, _ = raw.call("buffer.import", {"size": 16}, [r])
    assert err["name"] == "EINVAL" and "not a memfd" in err["message"]
    os.close(r)
    os.close(w)
    err, _ = raw.call("buffer.import", {"size": 16})
    assert err["name"] == "EINVAL" and "no file descriptor" in err["message"]
    fd = memfd(4096, seals=fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE)
    err, _ = raw.call("buffer.import", {"size": 4096}, [fd])
    assert err["name"] == "EINVAL" and "read-write" in err["message"]
    os.close(fd)
    err, res = raw.call("ping")
    assert err is None


def test_import_truncation_refused_and_unmap(raw):
    """The client cannot shrink a sealed memfd; it may unmap and close its side at once
    (the daemon holds its own mapping)."""
    n = 1 << 20
    fd = memfd(4 * n, seals=fcntl.F_SEAL_SHRINK)  # growing stays allowed
    mm = mmap.mmap(fd, 4 * n)
    data = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    np.frombuffer(mm, np.float32)[:] = data
    err, res = raw.call("buffer.import", {"size": 4 * n}, [fd])
    assert err is None, err
    buf = res["buffer"]
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 4096)
    os.ftruncate(fd, 8 * n)  # grow: fine, the daemon's mapping stays 4 MiB
    mm.close()
    os.close(fd)
    err, res = raw.call("task.run", {"op": "reduce", "device": "cpu:0",
                                     "inputs": [task(buf, [n])]})
    assert err is None, err
    got = np.frombuffer(res["outputs"][0]["data"], np.float32)[0]
    assert got == pytest.approx(float(data.astype(np.float64).sum()), rel=1e-4, abs=1e-2)
    err, res = raw.call("buffer.read", {"buffer": buf, "offset": 16, "size": 64})
    assert err is None and res["data"] == data.tobytes()[16:80]
    assert raw.call("buffer.free", {"buffer": buf})[0] is None


def test_share_maps_the_daemons_memfd(raw):
    n = 1 << 16
    err, res = raw.call("buffer.share", {"size": 4 * n})
    assert err is None, err
    assert len(raw.fds) == 1
    fd = raw.fds.pop()
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 4096)
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 8 * n)
    buf = res["buffer"]
    mm = mmap.mmap(fd, 4 * n)
    x = np.frombuffer(mm, np.float32)
    x[:] = np.arange(n, dtype=np.float32)
    # the daemon writes the result into the same pages, the client sees it
    err, r2 = raw.call("task.run", {"op": "map", "device": "cpu:0",
                                    "inputs": [task(buf, [n // 2])],
                                    "options": {"fn": "scale", "alpha": 2.0},
                                    "outputs": [{"buffer": buf, "offset": 2 * n}]})
    assert err is None, err
    np.testing.assert_array_equal(x[n // 2:], 2 * np.arange(n // 2, dtype=np.float32))
    del x
    mm.close()
    os.close(fd)
    assert raw.call("buffer.free", {"buffer": buf})[0] is None


def test_stray_fds_are_closed(raw):
    """An fd sent with another request is closed, never taken by a later import."""
    fd = memfd(4096)
    err, _ = raw.call("ping", {}, [fd])
    assert err is None
    err, _ = raw.call("buffer.import", {"size": 4096})
    assert err["name"] == "EINVAL" and "no file descriptor" in err["message"]
    os.close(fd)


def test_too_many_fds_close_the_connection(raw):
    fds = [memfd(4096) for _ in range(9)]
    raw.send("ping", {}, fds)
    msg = raw.recv()
    assert msg is not None and msg[0] == 2 and msg[1] == "protocol.error"
    assert msg[2][0]["name"] == "ELIMIT"
    assert raw.recv() is None
    for fd in fds:
        os.close(fd)


@pytest.mark.parametrize("limit", [1, 2])
def test_auto_shared_falls_back_to_the_socket(limit):
    """When the daemon refuses another buffer (max_buffers), large operands and results
    go through the socket instead: the op still succeeds."""
    import dspk
    from conftest import Daemon
    d = Daemon(["--max-buffers", str(limit)])
    try:
        with dspk.connect(d.socket) as c:
            rng = np.random.default_rng(7)
            a = rng.standard_normal((600, 512)).astype(np.float32)   # 1.2 MiB
            b = rng.standard_normal((512, 700)).astype(np.float32)   # 1.4 MiB, result 1.6 MiB
            for _ in range(2):
                np.testing.assert_allclose(c.gemm(a, b), a @ b, rtol=2e-4, atol=2e-3)
            assert len(c._temps) <= limit
    finally:
        d.stop()


def test_idle_temporaries_are_bounded_and_yield_to_allocations():
    """Idle shared temporaries are the user's daemon buffers: after one op on 20 MiB
    operands they held 40 MiB of a 64 MiB max_user_memory, so a 32 MiB to_device() of
    the same connection, and an empty() of another connection of the same user, were
    refused ELIMIT although the user held no buffer.  Now a temporary beyond the bound
    is freed once its task is answered, and an allocation refused for a limit frees the
    idle ones and is tried once more (python.md, the automatic shared-memory path)."""
    from conftest import Daemon
    d = Daemon(["--max-user-memory", "64M"])
    mine = lambda c: [x for x in c.status()["clients"] if x["self"]][0]  # noqa: E731
    try:
        with dspk.connect(d.socket) as c, dspk.connect(d.socket) as c2:
            x = np.arange(5 << 20, dtype=np.float32)                # 20 MiB
            np.testing.assert_array_equal(c.map("scale", x, alpha=2.0, device="cpu:0"),
                                          2 * x)
            assert mine(c)["buffers"] == 0 and mine(c)["buffer_bytes"] == 0
            c2.empty(8 << 20, np.float32, device="cpu:0").free()    # 32 MiB
            with c.to_device(np.ones(8 << 20, np.float32), device="cpu:0") as e:
                assert e.nbytes == 32 << 20
            # Small temporaries are kept (here 2 of 4 MiB) ...
            y = np.arange(1 << 20, dtype=np.float32)                 # 4 MiB
            np.testing.assert_array_equal(c.map("scale", y, alpha=3.0, device="cpu:0"),
                                          3 * y)
            assert mine(c)["buffers"] == 2 and mine(c)["buffer_bytes"] == 8 << 20
            # ... and yield to an allocation the quota refuses with them.
            z = np.arange(15 << 20, dtype=np.float32)                # 60 MiB
            with c.to_device(z, device="cpu:0") as e:
                np.testing.assert_array_equal(e.numpy(), z)
                assert mine(c)["buffers"] == 1
            # A shared array, or a temporary, refused for the quota likewise.
            np.testing.assert_array_equal(c.map("scale", y, alpha=3.0, device="cpu:0"),
                                          3 * y)
            s = c.empty_shared(15 << 20, np.float32)
            assert mine(c)["buffers"] == 1
            del s
            gc.collect()
    finally:
        d.stop()


@pytest.mark.parametrize("how", ["submit-map", "submit-reduce", "sync-no-temporary"])
def test_idle_temporaries_never_fail_a_task_the_quota_takes_without_them(how):
    """Under a 64 MiB max_user_memory, a task on 20 MiB operands (60 MiB inline with its
    result) runs on a fresh connection; after a small op left 8 MiB of idle shared
    temporaries, submit() of it was refused ELIMIT for the client's own cache (the
    synchronous call freed the cache and sent it again, but only where its task took
    temporaries itself).  Now submit() frees the idle temporaries before its task goes
    when the two together pass the quota, and a synchronous call refused ELIMIT while
    the connection holds idle temporaries frees them and is sent once more (python.md,
    the automatic shared-memory path; probe 18 C2)."""
    from conftest import Daemon
    d = Daemon(["--max-user-memory", "64M"])
    mine = lambda c: [x for x in c.status()["clients"] if x["self"]][0]  # noqa: E731
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            y = np.arange(1 << 20, dtype=np.float32)                # 4 MiB
            np.testing.assert_array_equal(c.map("add", y, y), y + y)
            assert mine(c)["buffers"] == 2 and mine(c)["buffer_bytes"] == 8 << 20
            x = np.arange(5 << 20, dtype=np.float32)                # 20 MiB
            if how == "submit-map":
                got = c.submit("map", "add", x, x).result(TIMEOUT)
                np.testing.assert_array_equal(got, x + x)
            elif how == "submit-reduce":
                z = np.ones(15 << 20, np.float32)                   # 60 MiB, inline
                assert c.submit("reduce", z).result(TIMEOUT) == z.size
            else:
                c.shared_threshold = 1 << 30  # the task takes no temporary of its own
                np.testing.assert_array_equal(c.map("add", x, x), x + x)
            assert mine(c)["buffers"] == 0
            # The cache fills again afterwards, as before.
            np.testing.assert_array_equal(c.map("add", y, y, device="cpu:0"), y + y)
    finally:
        d.stop()


@pytest.mark.parametrize("case", ["result-temporary-refused", "task-refused"])
def test_the_fallback_is_not_failed_by_the_ops_own_temporaries(case):
    """Near a quota the shared path failed an op that the socket's path runs: the
    operands' temporaries (whole 2 MiB each) held the quota, so when the result's
    temporary was refused the result's inline memory was refused too (map: ELIMIT), or
    the task itself was (gemm with a small result).  Now the op's temporaries are freed
    and it goes through the socket (python.md: "the op is not failed for it")."""
    from conftest import Daemon
    d = Daemon(["--max-user-memory", "64M"])
    mine = lambda c: [x for x in c.status()["clients"] if x["self"]][0]  # noqa: E731
    try:
        with dspk.connect(d.socket) as hog, dspk.connect(d.socket) as c:
            c.shared_threshold = 1 << 20
            if case == "result-temporary-refused":
                hog.empty(15 << 20, np.float32, device="cpu:0")            # 60 MiB held
                x = np.arange(1 << 18, dtype=np.float32)                   # 1 MiB
                np.testing.assert_array_equal(c.map("add", x, x), x + x)   # 3 MiB inline
            else:
                hog.empty((61 << 20) // 4 + (1 << 17), np.float32, device="cpu:0")
                a = np.ones((1024, 256), np.float32)      # 1 MiB: a 2 MiB temporary
                b = np.ones((256, 200), np.float32)       # 200 KiB, result 800 KiB
                np.testing.assert_array_equal(c.gemm(a, b), a @ b)  # 2 MiB inline
            assert mine(c)["buffers"] == 0  # and no temporary left holding the quota
    finally:
        d.stop()


def test_idle_temporaries_sized_by_the_quota():
    """The bound on idle temporaries follows the connection's memory quota on cpu:0
    (hello's cpu_memory_quota): under the default quota (half the host's memory) a
    task on 20 MiB operands keeps its two 20 MiB temporaries for the next task (a
    stream of such tasks imports and faults in nothing new); under 64 MiB
    (test_idle_temporaries_are_bounded_and_yield_to_allocations) it keeps none."""
    from conftest import Daemon
    d = Daemon([])
    mine = lambda c: [x for x in c.status()["clients"] if x["self"]][0]  # noqa: E731
    try:
        with dspk.connect(d.socket) as c:
            quota = c.limits["cpu_memory_quota"]
            assert isinstance(quota, int) and quota >= 128 << 20
            x = np.arange(5 << 20, dtype=np.float32)                # 20 MiB
            for k in (2.0, 3.0):
                np.testing.assert_array_equal(c.map("scale", x, alpha=k, device="cpu:0"),
                                              k * x)
                assert mine(c)["buffers"] == 2 and mine(c)["buffer_bytes"] == 40 << 20
            ids = sorted(t.buffer for t in c._temps)
            np.testing.assert_array_equal(c.map("scale", x, alpha=4.0, device="cpu:0"), 4 * x)
            assert sorted(t.buffer for t in c._temps) == ids  # the same two again
        d2 = Daemon(["--max-user-memory", "64M"])
        try:
            with dspk.connect(d2.socket) as c:
                assert c.limits["cpu_memory_quota"] == 64 << 20
        finally:
            d2.stop()
    finally:
        d.stop()


def test_idle_temporaries_yield_to_max_buffers():
    """The same with max_buffers: the idle temporaries kept are at most an eighth of
    it, and a buffer.create or buffer.import refused ELIMIT frees them and is tried
    again."""
    from conftest import Daemon
    d = Daemon(["--max-buffers", "16"])
    try:
        with dspk.connect(d.socket) as c:
            y = np.arange(1 << 20, dtype=np.float32)                 # 4 MiB
            for _ in range(2):
                np.testing.assert_array_equal(c.map("scale", y, alpha=3.0, device="cpu:0"),
                                              3 * y)
            assert len(c._temps) == 2
            keep = [c.empty_shared(4) for _ in range(14)]           # 14 + 2 idle = 16
            more = c.empty(4)                                        # ELIMIT, then again
            keep.append(c.empty_shared(4))
            assert len(c._temps) == 0 and more.nbytes == 16
    finally:
        d.stop()


@pytest.mark.parametrize("make", ["empty_shared", "empty"])
def test_a_shape_the_daemon_refuses_is_refused_before_any_buffer(make):
    """empty_shared((2^62, 2^62, 0)) raised numpy's bare ValueError and leaked the
    buffer imported for it, and empty() of it gave a DeviceArray every use of which
    was ELIMIT.  protocol.md (Tensors): the product of the dimensions with each 0
    counted as 1, times the item size, beyond 2^63-1 bytes is ELIMIT; so are a rank
    above max_rank and more than max_elements elements: refused at creation."""
    from conftest import Daemon
    d = Daemon(["--max-elements", "1000"])
    try:
        with dspk.connect(d.socket) as c:
            fn = getattr(c, make)
            for shape, dt in [((1 << 62, 1 << 62, 0), np.float32),
                              ((0, 1 << 61), np.float32),           # 2^63 bytes
                              ((1 << 63, 0), np.float16)]:            # beyond int64
                with pytest.raises(dspk.LimitExceeded):
                    fn(shape, dt)
            # A DeviceArray no op could take is refused too; a shared array is numpy
            # memory whose views (other shapes) are the operands: made.
            for shape in [(1,) * 9, (1001,)]:                       # max_rank, max_elements
                if make == "empty":
                    with pytest.raises(dspk.LimitExceeded):
                        fn(shape, np.float32)
                else:
                    a = fn(shape, np.float32)
                    a[...] = 1
                    assert c.reduce(a.reshape(-1)[:1000]) == min(a.size, 1000)
                    del a
                    gc.collect()
            # the daemon agrees: a tensor of that shape is its ELIMIT
            with pytest.raises(dspk.LimitExceeded):
                c.reduce(np.ones(1001, np.float32))
            assert [x for x in c.status()["clients"] if x["self"]][0]["buffers"] == 0
            ok = fn((1 << 20, 1 << 20, 0), np.float32)               # 2^42 bytes spanned
            assert ok.shape == (1 << 20, 1 << 20, 0) and ok.nbytes == 0
            assert fn((1000,), np.float32).shape == (1000,)
    finally:
        d.stop()


F32 = np.float32
BAD_OPERANDS = [
    (lambda c, o: c.gemm(np.ones((3, 4), F32), np.ones((5, 6), F32), out=o), (2, 2), F32),
    (lambda c, o: c.gemm(np.ones((3, 4), F32), np.ones((4, 2), F32), np.ones((3, 3), F32),
                         out=o), (3, 2), F32),
    (lambda c, o: c.gemm(np.ones((2, 2), np.float16), np.ones((2, 2), F32), out=o),
     (2, 2), np.float64),
    (lambda c, o: c.contract("ij,jk->ik", np.ones((3, 4), F32), np.ones((5, 6), F32),
                             out=o), (2, 2), F32),
    (lambda c, o: c.contract("...j,jk->...k", np.ones((3, 4), F32), np.ones((4, 2), F32),
                             out=o), (3, 2), F32),
    (lambda c, o: c.contract("ii,ik->k", np.ones((3, 3), F32), np.ones((3, 2), F32),
                             out=o), (2,), F32),
    (lambda c, o: c.contract("ij,jk" + " " * 60 + "->ik", np.ones((3, 4), F32),
                             np.ones((4, 6), F32), out=o), (2, 2), F32),
    (lambda c, o: c.map("frob", np.ones(4, F32), out=o), (4,), F32),
    (lambda c, o: c.map("scale", np.ones(4, F32), np.ones(4, F32), out=o), (4,), F32),
    (lambda c, o: c.reduce(np.ones(4, np.complex64), "max", out=o), (), np.complex64),
    (lambda c, o: c.reduce(np.ones((4, 0), F32), "max", 1, out=o), (4,), F32),
    (lambda c, o: c.fft(np.ones(8, F32), inverse=True, out=o), (5,), np.complex64),
    (lambda c, o: c.fft(np.ones((2, 0), np.complex64), out=o), (2, 0), np.complex64),
    (lambda c, o: c.fir(np.ones(8, F32), np.ones(0, F32), out=o), (4,), F32),
]


@pytest.mark.parametrize("i", range(len(BAD_OPERANDS)))
@pytest.mark.parametrize("kind", ["device", "shared"])
def test_out_leaves_invalid_operands_to_the_daemon(client, i, kind):
    """With out=, operands the daemon refuses got the client's own out= error (a
    RangeError about a made-up result shape, or InvalidArgument) instead of the
    daemon's ShapeError, DtypeError or InvalidArgument that the call without out=
    gets.  python.md: for operands the daemon refuses, its answer decides; out= is
    not written."""
    call, shape, dt = BAD_OPERANDS[i]
    with pytest.raises(dspk.Error) as plain:
        call(client, None)
    assert not isinstance(plain.value, dspk.RangeError)
    if kind == "device":
        o = client.empty(shape, dt, device="cpu:0")
        before = o.numpy()
    else:
        o = client.empty_shared(shape, dt)
        o[...] = 7
        before = o.copy()
    with pytest.raises(dspk.Error) as e:
        call(client, o)
    assert type(e.value) is type(plain.value), (e.value, plain.value)
    assert e.value.message == plain.value.message
    after = o.numpy() if kind == "device" else o
    np.testing.assert_array_equal(after, before)


def _memfd_maps():
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "memfd:" in line)


def test_close_unmaps_idle_temporaries(daemon):
    """close() left the automatic path's idle shared temporaries mapped (and their
    pages resident) until the Client object was collected: two 16 MiB memfds per
    closed client; dspk_close unmaps libdspkclient's at once."""
    x = np.arange(1 << 22, dtype=np.float32)  # 16 MiB: above the shared threshold
    # Mappings of earlier tests' clients go when the collector finds them: none may
    # go meanwhile (CI counted 10 after the task, 11 before).
    gc.collect()
    gc.disable()
    try:
        before = _memfd_maps()
        c = dspk.connect(daemon.socket, timeout=TIMEOUT)
        y = c.map("scale", x, alpha=2.0, device="cpu:0")
        np.testing.assert_array_equal(y, 2 * x)
        del y
        assert _memfd_maps() > before  # the temporaries, kept idle for the next task
        c.close()
        assert _memfd_maps() == before  # with c still referenced
    finally:
        gc.enable()
    c.close()


def test_a_pinned_operand_on_another_device_is_named(tmp_path):
    """A cpu:0 shared array passed with device="vulkan:0" got the daemon's "the task
    asks for vulkan:0 but its buffers are on cpu:0", naming neither the operand nor
    device= (probe 17 C4), and DeviceArrays or shared arrays of two devices in one
    task the daemon's "outputs[0]: buffer 9 is on vulkan:0, another operand is on
    cpu:0".  Now dspk.InvalidArgument before anything is sent, naming the operand
    (or out=), its device and device= (or the other operand); the connection stays
    usable."""
    from conftest import Daemon
    d = Daemon(["--backends", "cpu,vulkan", "--no-cache"])
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            s = c.empty_shared(4, np.float32)
            s[:] = 1
            x = np.ones(4, np.float32)
            dc = c.to_device(x, device="cpu:0")
            oc = c.empty(4, np.float32, device="cpu:0")
            for call, what in [
                    (lambda: c.map("add", x, s, device="vulkan:0"),
                     r"input 1 \(a shared array\) is on cpu:0, but device='vulkan:0'"),
                    (lambda: c.map("add", s, x, device="vulkan:0"),
                     r"input 0 \(a shared array\) is on cpu:0, but device='vulkan:0'"),
                    (lambda: c.reduce(dc, device="vulkan:0"),
                     r"input 0 \(a DeviceArray\) is on cpu:0, but device='vulkan:0'"),
                    (lambda: c.map("scale", x, out=oc, device="vulkan:0"),
                     r"out= \(a DeviceArray\) is on cpu:0, but device='vulkan:0'"),
                    (lambda: c.map("scale", x, out=s, device="vulkan:0"),
                     r"out= \(a shared array\) is on cpu:0, but device='vulkan:0'"),
                    (lambda: c.submit("map", "add", dc, x, device="vulkan:0"),
                     r"input 0 \(a DeviceArray\) is on cpu:0, but device='vulkan:0'")]:
                with pytest.raises(dspk.InvalidArgument, match=r"^EINVAL: %s: a DeviceArray "
                                   r"or a shared array pins the task to its own device "
                                   r"\(pass device='cpu:0', or \"any\"\)$" % what):
                    call()
            assert c.map("add", x, s, device="cpu:0")[0] == 2.0  # its own device: fine
            if "vulkan:0" in [v["id"] for v in c.devices()]:
                sv = c.empty_shared(4, np.float32, device="vulkan:0")
                dv = c.to_device(x, device="vulkan:0")
                for call, what in [
                        (lambda: c.map("add", dv, s),
                         r"input 1 \(a shared array\) is on cpu:0, but input 0 \(a "
                         r"DeviceArray\) is on vulkan:0"),
                        (lambda: c.map("add", s, sv),
                         r"input 1 \(a shared array\) is on vulkan:0, but input 0 \(a "
                         r"shared array\) is on cpu:0"),
                        (lambda: c.map("scale", dv, out=oc),
                         r"input 0 \(a DeviceArray\) is on vulkan:0, but out= \(a "
                         r"DeviceArray\) is on cpu:0")]:
                    with pytest.raises(dspk.InvalidArgument, match=r"^EINVAL: %s: the "
                                       r"operands and out= of one task must be on one "
                                       r"device$" % what):
                        call()
                sv[:] = 2
                np.testing.assert_array_equal(c.map("add", dv, sv), np.full(4, 3.0))
            assert c.ping() > 0
    finally:
        d.stop()


@pytest.mark.parametrize("bad", [np.ones(4, np.float32), [0.0] * 4, np.float32(1.0),
                                 (1, 2, 3, 4), "out", 5, bytearray(16)],
                         ids=["ndarray", "list", "numpy-scalar", "tuple", "str", "int",
                              "bytearray"])
@pytest.mark.parametrize("how", ["call", "submit"])
def test_one_out_refusal_for_every_wrong_type(client, bad, how):
    """out= of a type that takes no result: one message for every type, naming every
    type accepted (a list or a numpy scalar said "must be a DeviceArray of this
    connection", as if a shared array were not taken; probe 18 C5)."""
    x = np.ones(4, np.float32)
    with pytest.raises(dspk.InvalidArgument) as ei:
        if how == "call":
            client.map("scale", x, alpha=2.0, out=bad)
        else:
            client.submit("map", "scale", x, alpha=2.0, out=bad)
    assert ei.value.message.startswith(
        "out= must be a DeviceArray or a shared array (Client.empty_shared, or a "
        "C-contiguous slice of one) of this connection, got "), ei.value.message
    client.ping()


# ---- large results lent their temporary (no copy) ----------------------------------

def _lent_temp(c, arr):
    """The shared temporary whose mapping holds ``arr``'s bytes, or None."""
    addr = arr.__array_interface__["data"][0]
    for t in c._temps:
        base = t.view.__array_interface__["data"][0] if t.view is not None else None
        if base is not None and base <= addr and addr + arr.nbytes <= base + t.size:
            return t
    return None


def test_large_result_is_lent_its_temporary_not_copied(client):
    """A large result on cpu:0 is a view of the shared temporary the daemon wrote it
    into (no copy, as libdspkclient lends its temporaries): writable, not mistaken for
    a shared array; the temporary is given to no other task while the result or a
    view of it lives, and taken back once they are collected."""
    from dspk._client import _Lent, _in_mapping
    rng = np.random.default_rng(21)
    x = (rng.standard_normal(1 << 18) + 1j * rng.standard_normal(1 << 18)).astype(np.complex64)
    want = np.fft.fft(x)
    got = client.fft(x)  # 2 MiB
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-2)
    t = _lent_temp(client, got)
    assert t is not None and isinstance(t.held, _Lent) and t.busy  # in its mapping
    assert got.flags.writeable and got.flags.c_contiguous and not _in_mapping(got)
    assert client._shared_ref(got) is None  # not an empty_shared array
    view = got[1 << 17:]  # 1 MiB: an operand through a temporary too
    del got
    gc.collect()
    kept = view.copy()
    sent, orig = _spy_sends(client)
    try:
        others = [client.fft(x) for _ in range(2)]  # and operands through temporaries
        again = client.fft(view)  # the lent view as an operand: read in place
    finally:
        client._send_chunks = orig
    assert max(sent) < 4096, sent
    assert np.array_equal(view, kept)  # its temporary was nobody else's
    assert t.busy and isinstance(t.held, _Lent)
    assert all(_lent_temp(client, o) not in (None, t) for o in others)
    np.testing.assert_allclose(again, np.fft.fft(kept), rtol=1e-3, atol=1e-1)
    # writing the result changes nothing of another
    others[0][:] = 0
    np.testing.assert_allclose(others[1], want, rtol=1e-3, atol=1e-2)
    del view, others, again
    gc.collect()
    client.ping()  # the next request takes the collected results' temporaries back
    assert not any(x.busy for x in client._temps)
    assert not any(isinstance(x.held, _Lent) for x in client._temps)
    got = client.fft(x)
    assert _lent_temp(client, got) is not None  # the same temporaries, reused
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-2)


def test_lent_results_are_bounded_then_copied(client):
    """At most four temporaries are lent to results alive (SHM_LENT_MAX); the next
    results are copied out (their own memory); a lent one given back is lent again."""
    from dspk._client import _TEMP_LENT_MAX, _Lent
    assert _TEMP_LENT_MAX == 4
    x = np.arange(1 << 19, dtype=np.float32)  # 2 MiB
    rs = [client.map("scale", x, alpha=float(i + 1), device="cpu:0") for i in range(6)]
    for i, r in enumerate(rs):
        np.testing.assert_array_equal(r, x * np.float32(i + 1))
    assert [r.flags.owndata for r in rs] == [False] * 4 + [True] * 2
    assert [_lent_temp(client, r) is not None for r in rs[:4]] == [True] * 4
    assert sum(1 for t in client._temps if isinstance(t.held, _Lent)) == 4
    del rs[0]
    gc.collect()
    r = client.map("scale", x, alpha=7.0, device="cpu:0")
    assert not r.flags.owndata and _lent_temp(client, r) is not None
    np.testing.assert_array_equal(r, x * np.float32(7))
    for i, r in enumerate(rs[:3]):  # the kept ones are as they were
        np.testing.assert_array_equal(r, x * np.float32(i + 2))


def test_lent_result_of_a_future_and_out_are_as_documented(client):
    """A submit() future's large result is lent likewise (kept while the future or the
    array lives); a result into out= is the shared array passed, nothing lent."""
    from dspk._client import _Lent
    x = np.arange(1 << 19, dtype=np.float32)
    client.map("scale", x, alpha=1.0, device="cpu:0")  # idle temporaries for submit()
    gc.collect()
    fut = client.submit("map", "scale", x, alpha=3.0, device="cpu:0")
    r = fut.result(TIMEOUT)
    np.testing.assert_array_equal(r, 3 * x)
    t = _lent_temp(client, r)
    assert t is not None and isinstance(t.held, _Lent)
    del fut
    client.map("scale", x, alpha=5.0, device="cpu:0")
    np.testing.assert_array_equal(r, 3 * x)
    s = client.empty_shared(x.shape, np.float32)
    assert client.map("scale", x, alpha=2.0, out=s) is s
    np.testing.assert_array_equal(s, 2 * x)
    del r
    gc.collect()
    client.ping()
    assert not any(isinstance(x.held, _Lent) for x in client._temps)


def test_close_keeps_lent_results_and_unmaps_them_once_collected(daemon):
    """close() with lent results alive: they stay readable and writable (their
    mapping lives on with them, the daemon's buffers freed with the connection); the
    mapping goes once the last of them is collected."""
    x = np.arange(1 << 22, dtype=np.float32)  # 16 MiB
    gc.collect()
    before = _memfd_maps()
    c = dspk.connect(daemon.socket, timeout=TIMEOUT)
    y = c.map("scale", x, alpha=2.0, device="cpu:0")
    v = y[5:]
    del y
    assert _lent_temp(c, v) is not None
    c.close()
    assert not c._temps
    assert _memfd_maps() == before + 1  # the lent one's, and only it
    np.testing.assert_array_equal(v, 2 * x[5:])
    v[:] = 1
    assert v.sum() == v.size
    del v
    gc.collect()
    assert _memfd_maps() == before


def test_lent_results_from_many_threads_stay_their_own(client):
    """Threads running ops at once, each keeping some of its large results: no result
    is overwritten by another task, and never more than four temporaries are lent."""
    import threading
    from dspk._client import _Lent
    x = np.arange(1 << 19, dtype=np.float32)
    errors, most = [], [0]

    def run(k):
        try:
            kept = []
            for i in range(12):
                a = float(k * 100 + i)
                kept.append((a, client.map("scale", x, alpha=a, device="cpu:0")))
                if i % 3:
                    kept.pop(0)
                with client._temp_lock:
                    n = sum(1 for t in client._temps
                            if isinstance(t.held, _Lent) and t.held() is not None)
                most[0] = max(most[0], n)
            for a, r in kept:
                np.testing.assert_array_equal(r, x * np.float32(a))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not errors, errors
    assert 1 <= most[0] <= 4, most


def test_lent_result_base_is_the_clients_lease(client):
    """python.md "Lent results": a lent result's ``base`` is the client's lease object
    (which holds the mapping), for result dtypes of each kind (f32, c64, f64, c128: no
    op makes f16 or bf16); a view of it has the result as its base, as numpy makes
    views (probe 21 C1)."""
    from dspk._client import _Lease, _Lent
    rng = np.random.default_rng(17)
    x = np.arange(1 << 19, dtype=np.float32)  # 2 MiB
    z = (rng.standard_normal(1 << 17) + 1j * rng.standard_normal(1 << 17)).astype(np.complex64)
    d = rng.standard_normal((512, 2, 512))  # 4 MiB, reduced over axis 1: 2 MiB
    w = z.astype(np.complex128)
    rs = [client.map("scale", x, alpha=2.0, device="cpu:0"),
          client.fft(z, device="cpu:0"),
          client.reduce(d, "sum", 1, device="cpu:0"),
          client.map("scale", w, alpha=2.0, device="cpu:0")]
    for r, dt in zip(rs, [np.float32, np.complex64, np.float64, np.complex128]):
        t = _lent_temp(client, r)
        assert t is not None and isinstance(t.held, _Lent)
        assert r.dtype == np.dtype(dt) and r.flags.c_contiguous and r.flags.writeable
        assert not r.flags.owndata
        assert type(r.base) is _Lease and r.base is t.held()
        v = r[3:]
        assert v.base is r and v.base.base is t.held()
    np.testing.assert_array_equal(rs[0], 2 * x)
    np.testing.assert_allclose(rs[1], np.fft.fft(z), rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(rs[2], d.sum(axis=1), rtol=1e-12)
    np.testing.assert_array_equal(rs[3], 2 * w)


def test_lent_lease_shared_mapping_and_temporaries_refuse_pickle_and_copy(client):
    """A lent result's ``base`` (the _Lease), its mapping, a shared array's mapping and
    the client's temporaries refuse pickle, copy.copy and copy.deepcopy with TypeError,
    as DeviceArray, Client and TaskFuture do (python.md "Lent results").  They were
    copied: a pickle or deepcopy carried the raw address of the mapping (np.asarray
    of it once the mapping was gone, or in another process: SIGSEGV), and an array
    made from copy.copy(lease) did not keep the temporary lent, so the next result
    was written into it (probe 22 C1, C2).  The arrays themselves pickle and copy
    their data, as any numpy array."""
    import copy
    import pickle
    from dspk._client import _Lease, _Mapping, _memory_owner
    x = np.arange(1 << 19, dtype=np.float32)  # 2 MiB: lent
    r = client.map("scale", x, alpha=2.0, device="cpu:0")
    t = _lent_temp(client, r)
    assert t is not None and type(r.base) is _Lease
    s = client.empty_shared(16, np.float64)
    s[:] = 1.5
    owner = _memory_owner(s)
    assert type(owner) is _Mapping
    things = [r.base, r.base.region, owner, owner.region, t, t.held()]
    for obj in things:
        for how in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match="cannot pickle or copy a dspk "):
                how(obj)
    with pytest.raises(TypeError, match=r"dspk _Lease \(a lent result's lease"):
        copy.copy(r.base)
    # the arrays: copies of their data, the result still lent and intact
    for arr, want in ((r, 2 * x), (s, np.full(16, 1.5))):
        for back in (pickle.loads(pickle.dumps(arr)), copy.copy(arr), copy.deepcopy(arr),
                     copy.deepcopy([arr])[0]):
            assert not np.shares_memory(back, arr)
            np.testing.assert_array_equal(back, want)
    assert _lent_temp(client, r) is t and t.held() is r.base
    again = client.map("scale", x, alpha=5.0, device="cpu:0")
    assert not np.shares_memory(again, r)
    np.testing.assert_array_equal(r, 2 * x)
    np.testing.assert_array_equal(again, 5 * x)


def _reachable_attributes(root, depth=3):
    """(path, object) for each object reachable from ``root`` through attributes (its
    slots and ``__dict__``, and any other name dir() lists), ``depth`` steps at most;
    numbers, strings and methods left out."""
    import types
    seen, out, todo = {id(root)}, [], [("base", root, 0)]
    while todo:
        path, obj, d = todo.pop()
        out.append((path, obj))
        if d == depth:
            continue
        for name in dir(obj):
            if name in ("__class__", "__doc__", "__module__", "__slots__"):
                continue
            try:
                v = getattr(obj, name)
            except Exception:  # noqa: BLE001 - an attribute that cannot be read
                continue
            if isinstance(v, (int, float, str, bytes, type, types.MethodType,
                              types.BuiltinMethodType, types.MethodWrapperType,
                              types.FunctionType)) or v is None or id(v) in seen:
                continue
            seen.add(id(v))
            todo.append(("%s.%s" % (path, name), v, d + 1))
    return out


def test_no_attribute_of_a_lent_result_exports_its_memory_without_the_lease(client):
    """Every object reachable from a lent result's base that gives an array or a
    buffer of the temporary's bytes keeps the temporary lent: ``np.asarray`` of the
    lease's mapping (``A.base.mm``) was a view whose base was that mapping, not the
    lease, so once the result was dropped the next op's result was written into it
    (probe 22 C2).  The lease's mapping now exports nothing; the lease is the only
    way to the bytes."""
    import gc
    from dspk._client import _is_lent
    x = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: lent
    r = client.map("scale", x, alpha=2.0, device="cpu:0")
    assert _lent_temp(client, r) is not None
    views = []
    for path, obj in _reachable_attributes(r.base):
        for how in (np.asarray, memoryview, lambda o: np.frombuffer(o, np.uint8)):
            try:
                v = np.asarray(how(obj))
            except Exception:  # noqa: BLE001 - exports nothing: fine
                continue
            if v.dtype != object and np.shares_memory(v, r):
                assert _is_lent(v), path  # a view of the lease: keeps it lent
                views.append((path, v.view(np.uint8)[:8 * 4].view(np.float64)))
    assert [p for p, _ in views] and all(p == "base" for p, _ in views), views
    del r, obj, v
    gc.collect()
    again = client.map("scale", x, alpha=5.0, device="cpu:0")
    for path, v in views:
        assert not np.shares_memory(v, again), path
        np.testing.assert_array_equal(v, 2 * x[:4])
    np.testing.assert_array_equal(again, 5 * x)


def test_every_connection_bound_class_refuses_pickle_and_copy():
    """Each class of the client whose objects hold mapped memory, a daemon buffer, a
    request, a lock or a thread of a connection refuses pickle and copy (probe 22
    C1): the mixin is there, and a bare object of each says so."""
    import copy
    import pickle
    from dspk import _client as C
    for name in ("_Region", "_Mapping", "_Lease", "_Temp", "_TempList", "_Staged", "_Claim", "_Job",
                 "_Call", "_Direct", "_SendLock", "_Runner", "_Held"):
        cls = getattr(C, name)
        assert issubclass(cls, C._Uncopyable), name
        obj = cls.__new__(cls)
        for how in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match="cannot pickle or copy a dspk %s " % name):
                how(obj)
    # the weak references and the futures' lock are refused by CPython itself
    for obj in (C._Lent(C._Claim(), None), C._FutureLock()):
        for how in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError):
                how(obj)


def _lent_refusal():
    return ("out= must be a DeviceArray or a shared array (Client.empty_shared, or a "
            "C-contiguous slice of one) of this connection, got a lent result (a view of "
            "a shared temporary the client lent to an op's result, not an empty_shared() "
            "array)")


@pytest.mark.parametrize("how", ["call", "submit"])
def test_out_refuses_a_lent_result_saying_so(daemon, client, how):
    """A lent result as out= is refused (python.md: it is not an empty_shared() array)
    with the real reason, not "a numpy array not in shared memory" (it is shared
    memory): so is every view of it (a slice, strided, reversed, read-only, through a
    memoryview), another client's, and one of a closed client; nothing is sent and
    the result stays as it was.  A plain numpy array is still "not in shared memory"
    (probe 21 C2)."""
    x = np.arange(1 << 19, dtype=np.float32)
    r = client.map("scale", x, alpha=2.0, device="cpu:0")
    assert _lent_temp(client, r) is not None
    ro = r[:8]
    ro.flags.writeable = False
    other = dspk.connect(daemon.socket, timeout=TIMEOUT)
    theirs = other.map("scale", x, alpha=2.0, device="cpu:0")
    closed = dspk.connect(daemon.socket, timeout=TIMEOUT)
    gone = closed.map("scale", x, alpha=2.0, device="cpu:0")
    closed.close()
    views = [r, r[8:16], r[::2], r[::-1], r.reshape(512, 1024).T, ro,
             np.asarray(memoryview(r)), theirs, gone]

    def call(**kw):
        if how == "call":
            return client.map("scale", np.ones(bad.shape, np.float32), alpha=3.0, **kw)
        return client.submit("map", "scale", np.ones(bad.shape, np.float32), alpha=3.0,
                             **kw)

    for bad in views:
        with pytest.raises(dspk.InvalidArgument) as ei:
            call(out=bad)
        assert ei.value.message == _lent_refusal(), ei.value.message
    np.testing.assert_array_equal(r, 2 * x)
    np.testing.assert_array_equal(theirs, 2 * x)
    bad = np.zeros(4, np.float32)
    with pytest.raises(dspk.InvalidArgument) as ei:
        call(out=bad)
    assert ei.value.message.endswith("got a numpy array not in shared memory"), \
        ei.value.message
    other.close()
    client.ping()


def _spy_tasks(client):
    """The inputs of every task.run the client starts (a list it appends to)."""
    seen = []
    orig = client._start

    def spy(method, args, *rest, **kw):
        if method == "task.run":
            seen.append([dict(t) for t in args["inputs"]])
        return orig(method, args, *rest, **kw)

    client._start = spy
    return seen


def test_lent_result_as_an_operand_is_read_in_place(daemon, client, monkeypatch):
    """python.md "Lent results": a lent result, or a C-contiguous view of it at a
    multiple of its item size, passed to a synchronous op on cpu:0 is sent as a
    reference to its temporary, whatever its size: nothing copied (no _copy_wide, no
    other temporary taken), small requests; the temporary stays lent.  submit(),
    another client's op and a view off its item size copy it as before."""
    import dspk._client as dc
    x = np.arange(1 << 19, dtype=np.float32)  # 2 MiB
    r = client.map("scale", x, alpha=2.0, device="cpu:0")
    t = _lent_temp(client, r)
    assert t is not None and isinstance(t.held, dc._Lent)
    copies = []
    real = dc._copy_wide

    def counting(dst, src, *rest):
        copies.append(src.nbytes)
        return real(dst, src, *rest)

    monkeypatch.setattr(dc, "_copy_wide", counting)
    seen = _spy_tasks(client)
    sent, orig = _spy_sends(client)
    n_temps = len(client._temps)
    try:
        total = client.reduce(r, device="cpu:0")          # the whole result, 2 MiB
        half = client.reduce(r[1 << 18:], device="cpu:0")  # a 1 MiB view, 1 MiB in
        small = client.reduce(r[4:20])                     # 64 bytes, "any" is cpu:0
        g = client.gemm(r[:1 << 16].reshape(256, 256), r[1 << 16:(1 << 16) + 256 * 64]
                        .reshape(256, 64), device="cpu:0")
    finally:
        client._send_chunks = orig
    assert copies == [], copies
    assert max(sent) < 4096, sent
    assert len(client._temps) == n_temps
    assert [[(i.get("buffer"), i.get("offset")) for i in ins] for ins in seen] == [
        [(t.buffer, 0)], [(t.buffer, 1 << 20)], [(t.buffer, 16)],
        [(t.buffer, 0), (t.buffer, 1 << 18)]], seen
    assert total == pytest.approx(float((2 * x).sum(dtype=np.float64)), rel=1e-5)
    assert half == pytest.approx(float((2 * x[1 << 18:]).sum(dtype=np.float64)), rel=1e-5)
    assert small == pytest.approx(float((2 * x[4:20]).sum()), rel=1e-6)
    a = (2 * x[:1 << 16]).reshape(256, 256).astype(np.float64)
    b = (2 * x[1 << 16:(1 << 16) + 256 * 64]).reshape(256, 64).astype(np.float64)
    np.testing.assert_allclose(g, a @ b, rtol=1e-5)
    assert t.busy and isinstance(t.held, dc._Lent) and t.held() is r.base
    np.testing.assert_array_equal(r, 2 * x)  # read, never written
    # Off its item size (4 bytes into float64 items): a copy, sent in the request.
    seen.clear()
    odd = r[1:2049].view(np.float64)
    client.map("abs", odd, device="cpu:0")
    assert "buffer" not in seen[0][0] and "data" in seen[0][0], seen
    # submit(): a copy (its caller may write the operand once submit() returns).
    seen.clear()
    fut = client.submit("reduce", r, device="cpu:0")
    r[:] = 0
    assert fut.result(TIMEOUT) == pytest.approx(float((2 * x).sum(dtype=np.float64)),
                                                rel=1e-5)
    assert seen and all(i.get("buffer") != t.buffer for ins in seen for i in ins), seen
    # Another client's op: ordinary memory there, copied.
    r[:] = 5
    with dspk.connect(daemon.socket, timeout=TIMEOUT) as other:
        assert other.reduce(r, device="cpu:0") == pytest.approx(5.0 * r.size)
    client.ping()


def test_a_task_reading_a_lent_result_keeps_it_lent_until_answered(client):
    """The task holds the lent temporary it reads until it is answered: a result
    dropped meanwhile (a call cut by an interruption, here a task sent and not
    waited for) does not give its temporary back to the idle ones, where another task
    could write it while this one reads; it goes back once the task is answered."""
    import weakref
    from dspk._client import _Lent
    x = np.arange(1 << 19, dtype=np.float32)
    r = client.map("scale", x, alpha=3.0, device="cpu:0")
    t = _lent_temp(client, r)
    assert t is not None and isinstance(t.held, _Lent)
    v = r[1 << 18:]
    seen = _spy_tasks(client)
    del r
    fut = client._op_reduce(v, device="cpu:0", shared=False)  # sent, not waited for
    assert seen == [[{"dtype": "f32", "shape": [1 << 18], "buffer": t.buffer,
                      "offset": 1 << 20}]], seen
    assert not fut.done()  # nothing reads the connection until result() does
    gone = weakref.ref(v)
    del v
    gc.collect()
    assert gone() is None  # the caller's arrays are all collected ...
    assert t.busy and t.held() is not None  # ... and the task still holds it lent
    assert fut.result(TIMEOUT) == pytest.approx(
        float((3 * x[1 << 18:]).sum(dtype=np.float64)), rel=1e-5)
    gc.collect()
    assert t.held() is None
    client.ping()  # the next request takes it back
    assert not t.busy
