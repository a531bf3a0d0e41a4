"""Defects of an outside probe: an out= view too small for the result, close() while
another thread waits to send, a client used after fork(), a staged kernel tensor with
device="any", a result beyond max_elements, NUL characters in paths and names, and a
refused connection that lost the daemon's reason (protocol.error) to EPIPE or ECONNRESET."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import dspk
from conftest import LIMITS, TIMEOUT, Daemon

DOUBLE = """#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform P { int n; } p;
void main() { uint i = gl_GlobalInvocationID.x; if (i < p.n) x[i] = 2.0 * x[i]; }
"""

F32 = np.float32


def mine(c):
    return [x for x in c.status()["clients"] if x["self"]][0]


# ---- out= smaller than the result: ERANGE before anything is written -----------------

# (call with out=, the number of float32/complex64 slots of the whole array it needs)
TOO_SMALL = [
    ("map", lambda c, o: c.map("scale", np.full(6, 5, F32), out=o)),
    ("map-abs", lambda c, o: c.map("abs", np.full(6, 1 + 1j, np.complex64), out=o)),
    ("gemm", lambda c, o: c.gemm(np.ones((4, 4), F32), np.ones((4, 2), F32), out=o)),
    ("gemm-f16", lambda c, o: c.gemm(np.ones((4, 4), np.float16),
                                     np.ones((4, 2), np.float16), out=o)),
    ("fir", lambda c, o: c.fir(np.ones(6, F32), np.ones(2, F32), out=o)),
    ("fft", lambda c, o: c.fft(np.ones(8, np.complex64), out=o)),
    ("rfft", lambda c, o: c.fft(np.ones(8, F32), out=o)),
    ("reduce", lambda c, o: c.reduce(np.ones((6, 3), F32), axes=1, out=o)),
    ("contract", lambda c, o: c.contract("ij,jk->ik", np.ones((2, 3), F32),
                                         np.ones((3, 3), F32), out=o)),
]


@pytest.mark.parametrize("name,call", TOO_SMALL, ids=[n for n, _ in TOO_SMALL])
def test_out_view_of_a_shared_array_too_small_is_erange(client, name, call):
    """out=a[0] of a (3, 4) shared array took a 6-element result: the daemon wrote
    a[1, :2] (outside the view) and the call then raised InvalidArgument "(its bytes
    were overwritten)".  Now ERANGE before anything is sent, the array untouched."""
    dt = np.complex64 if name in ("fft", "rfft") else F32  # abs of complex64: float32
    a = client.empty_shared((3, 4), dt)
    a[:] = -1
    with pytest.raises(dspk.RangeError, match="does not fit"):
        call(client, a[0, :2] if name in ("fft", "rfft") else a[0])
    np.testing.assert_array_equal(a, np.full((3, 4), -1, dt))
    assert client.ping() >= 0


@pytest.mark.parametrize("name,call", TOO_SMALL, ids=[n for n, _ in TOO_SMALL])
def test_out_device_array_inside_its_buffer_too_small_is_erange(client, name, call):
    """A DeviceArray at an offset inside a larger buffer: the same, bounded by its own
    bytes and not by the buffer's."""
    dt = np.complex64 if name in ("fft", "rfft") else F32
    whole = client.to_device(np.full((3, 4), -1, dt), device="cpu:0")
    view = dspk.DeviceArray(client, whole.buffer, whole.device,
                            (2,) if name in ("fft", "rfft") else (4,), whole.dtype,
                            offset=4 * whole.dtype.itemsize)
    with pytest.raises(dspk.RangeError, match="does not fit"):
        call(client, view)
    np.testing.assert_array_equal(whole.numpy(), np.full((3, 4), -1, dt))
    whole.free()


@pytest.mark.parametrize("name,call", TOO_SMALL, ids=[n for n, _ in TOO_SMALL])
def test_out_of_the_right_size_but_another_shape_or_dtype_is_refused_unwritten(
        client, name, call):
    """An out= that holds the result's bytes but has another shape or dtype was
    refused only after the daemon had written it.  Now InvalidArgument before
    anything is sent, for a shared array and a DeviceArray, the bytes untouched."""
    r = call(client, None)
    shapes = [(1,) + r.shape, (r.size,) if r.ndim != 1 else (r.size, 1)]
    others = [(shape, r.dtype) for shape in shapes]
    other_dt = np.float64 if r.dtype.itemsize == 4 else np.complex128
    if r.nbytes % 16 == 0:
        others.append(((r.nbytes // np.dtype(other_dt).itemsize,), np.dtype(other_dt)))
    for shape, dt in others:
        a = client.empty_shared(shape, dt)
        a.view(np.uint8)[:] = 0xA5
        with pytest.raises(dspk.InvalidArgument, match="out=: the result is"):
            call(client, a)
        assert (a.view(np.uint8) == 0xA5).all(), (name, shape, dt)
        d = client.to_device(np.full(shape, -1, dt), device="cpu:0")
        with pytest.raises(dspk.InvalidArgument, match="out=: the result is"):
            call(client, d)
        np.testing.assert_array_equal(d.numpy(), np.full(shape, -1, dt))
        d.free()
    assert client.ping() >= 0


def test_out_view_that_fits_is_written_alone(client):
    a = client.empty_shared((3, 4), F32)
    a[:] = -1
    r = client.map("scale", np.full(4, 5, F32), alpha=2.0, out=a[1])
    assert r is a[1] or np.shares_memory(r, a)
    expect = np.full((3, 4), -1, F32)
    expect[1] = 10
    np.testing.assert_array_equal(a, expect)
    b = client.empty_shared((3, 4), F32)
    b[:] = -1
    client.gemm(np.ones((2, 3), F32), np.ones((3, 2), F32), out=b[1].reshape(2, 2))
    expect = np.full((3, 4), -1, F32)
    expect[1] = 3
    np.testing.assert_array_equal(b, expect)


# ---- close() while another thread waits to send ------------------------------------

def test_close_wakes_a_thread_waiting_to_send(fresh_daemon, monkeypatch):
    """A daemon that stopped reading (SIGSTOP) and timeout=None: a thread sending a
    large request waited in select() for room, and close() from another thread waited
    for the send lock for ever.  Now close() returns at once and the sender gets
    dspk.Closed."""
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "0")  # through the socket
    c = dspk.connect(fresh_daemon.socket)             # waits for ever
    x = np.ones(4_000_000)                            # 32 MB: more than the socket holds
    res = []

    def sender():
        try:
            c.map("exp", x, device="cpu:0")
            res.append("answered")
        except BaseException as e:  # noqa: BLE001
            res.append(e)

    os.kill(fresh_daemon.proc.pid, signal.SIGSTOP)
    try:
        t = threading.Thread(target=sender, daemon=True)
        t.start()
        deadline = time.monotonic() + TIMEOUT
        while not any(f.f_code.co_name == "_write_locked"
                      for f in _frames(t.ident)):  # it waits for room to send
            assert time.monotonic() < deadline and t.is_alive(), res
            time.sleep(0.01)
        closer = threading.Thread(target=c.close, daemon=True)
        closer.start()
        closer.join(10)
        assert not closer.is_alive(), "close() is blocked"
        t.join(10)
        assert not t.is_alive(), "the sender is blocked"
        assert len(res) == 1 and isinstance(res[0], dspk.Closed), res
    finally:
        os.kill(fresh_daemon.proc.pid, signal.SIGCONT)
    with dspk.connect(fresh_daemon.socket, timeout=TIMEOUT) as c2:  # the daemon is fine
        assert c2.reduce(np.ones(3)) == 3


def _frames(ident):
    f = sys._current_frames().get(ident)
    while f is not None:
        yield f
        f = f.f_back


# ---- a client after fork() -----------------------------------------------------------

def _run_script(tmp_path, text: str, socket: str) -> subprocess.CompletedProcess:
    """Runs the Python script ``text`` with this dspk and the daemon's ``socket`` as its
    argument (a fork of its own, away from pytest's threads); it must exit 0."""
    script = tmp_path / "script.py"
    script.write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(dspk.__file__))] +
        [p for p in [os.environ.get("PYTHONPATH")] if p]))
    p = subprocess.run([sys.executable, str(script), socket], env=env,
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


FORK_SCRIPT = textwrap.dedent("""
    import gc, os, signal, sys, numpy as np, dspk
    c = dspk.connect(sys.argv[1], timeout=30)
    s = c.empty_shared((4,), np.float64); s[:] = 2
    d = c.to_device(np.ones(3))
    pending = c.submit("map", "exp", np.zeros(2))
    pending.result(30)
    late = c.submit("reduce", np.ones(4))
    before = [x for x in c.status()["clients"] if x["self"]][0]["buffers"]
    r, w = os.pipe()
    # Locks another thread of the parent may hold at the fork stay held in the child.
    c._lock.acquire(); c._temp_lock.acquire(); c._send_lock.mutex.acquire()
    c._send_lock.owner = "a writer of the parent's"
    pid = os.fork()
    if pid != 0:
        c._send_lock.owner = None
        c._lock.release(); c._temp_lock.release(); c._send_lock.mutex.release()
    if pid == 0:
        signal.alarm(20)  # a child that hangs dies rather than outlive the test
        os.close(r)
        try:
            c.map("exp", np.zeros(1 << 18), device="cpu:0")  # a shared temporary's size
            os.write(w, b"child call: answered")
        except dspk.Closed as e:
            os.write(w, ("child call: Closed " + e.message).encode())
        except BaseException as e:
            os.write(w, ("child call: " + type(e).__name__).encode())
        try:
            late.result(30)
            os.write(w, b"; future: answered")
        except dspk.Closed:
            os.write(w, b"; future: Closed")
        except BaseException as e:
            os.write(w, ("; future: " + type(e).__name__).encode())
        os.close(w)
        assert c.closed
        del s; gc.collect()     # the shared array's finalizer
        d.free()
        c.close()
        sys.exit(0)              # interpreter finalization: finalizers, __del__
    os.close(w)
    msg = b""
    while True:
        part = os.read(r, 4096)
        if not part:
            break
        msg += part
    msg = msg.decode()
    _, st = os.waitpid(pid, 0)
    print(msg)
    print("child exit", st)
    print("parent call", c.map("exp", np.zeros(2)).tolist(), float(late.result(30)))
    print("parent reduce", float(c.reduce(s)))
    print("parent devarray", d.numpy().tolist())
    after = [x for x in c.status()["clients"] if x["self"]][0]["buffers"]
    print("buffers", before, after)
    c.close()
""")


def test_a_forked_child_leaves_the_parents_connection_alone(daemon, tmp_path):
    """A child's close() or exit shut the parent's socket down (shutdown(SHUT_RDWR) on
    the shared socket), and a child dropping a shared array freed the parent's daemon
    buffer.  Now the client is unusable in the child (dspk.Closed naming fork) and
    the child's close, free and finalizers leave the connection and buffers alone."""
    p = _run_script(tmp_path, FORK_SCRIPT, daemon.socket)
    out = p.stdout.splitlines()
    assert out[0].startswith("child call: Closed") and "fork()" in out[0], out
    assert out[0].endswith("; future: Closed") or out[0].endswith("; future: answered"), out
    assert out[1] == "child exit 0", out
    assert out[2] == "parent call [1.0, 1.0] 4.0", out
    assert out[3] == "parent reduce 8.0", out
    assert out[4] == "parent devarray [1.0, 1.0, 1.0]", out
    b = out[5].split()
    assert b[1] == b[2], out  # no buffer of the parent freed by the child


SHARED_FORK_SCRIPT = textwrap.dedent("""
    import os, sys, numpy as np, dspk
    c = dspk.connect(sys.argv[1], timeout=30)
    s = c.empty_shared((4,), np.float64); s[:] = 1
    plain = np.ones(4)
    pid = os.fork()
    if pid == 0:
        s[:] = 42; plain[:] = 42  # the inherited arrays, written in the child
        os._exit(0)
    _, st = os.waitpid(pid, 0)
    print(st, s.tolist(), plain.tolist(), float(c.reduce(s)))
    c.close()
""")


def test_a_shared_array_stays_shared_with_a_forked_child(daemon, tmp_path):
    """python.md (fork): a shared array's memory is MAP_SHARED, not copy-on-write: a
    child's write to its inherited shared array is the parent's (and what the daemon
    reads), unlike a plain numpy array's."""
    p = _run_script(tmp_path, SHARED_FORK_SCRIPT, daemon.socket)
    assert p.stdout.split("\n")[0] == "0 [42.0, 42.0, 42.0, 42.0] [1.0, 1.0, 1.0, 1.0] 168.0", \
        p.stdout


# ---- kernel(device="any") with a tensor staged through a temporary ------------------

def test_kernel_any_stages_on_a_device_that_runs_its_language():
    """A tensor too large for one message was staged on the daemon's choice for a
    buffer, cpu:0, which pinned the task there: NotSupported "cpu:0 runs no raw
    kernels".  Now it is staged on a device that runs the kernel's language."""
    d = Daemon(["--backends", "cpu,vulkan", "--max-message", "256K"])
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            if not any("glsl" in (x.get("kernel_langs") or []) for x in c.devices()):
                pytest.skip("no device runs glsl here")
            x = np.arange(200000, dtype=F32)  # 800 KB > max_message
            r = c.kernel(DOUBLE, x, lang="glsl", grid=(200000 + 63) // 64,
                         args=[{"tensor": 0}, {"i32": 200000}])
            np.testing.assert_array_equal(r[0], 2 * x)
            assert mine(c)["buffers"] == 0
    finally:
        d.stop()


# ---- a result beyond max_elements ----------------------------------------------------

@pytest.mark.parametrize("device", ["cpu:0", "any"])
def test_result_beyond_max_elements_is_the_daemons_elimit(daemon, device):
    """gemm [n, 0] x [0, n] with n*n above max_elements: the client first made a
    temporary buffer for the result and reported that buffer's failure.  Now the
    daemon's ELIMIT naming max_elements (protocol.md), and no buffer is left."""
    with dspk.connect(daemon.socket, timeout=TIMEOUT) as c:
        most = c.limits["max_elements"]
        n = 1
        while n * n <= most:
            n *= 2
        with pytest.raises(dspk.LimitExceeded, match="max_elements"):
            c.gemm(np.ones((n, 0), F32), np.ones((0, n), F32), device=device)
        s = c.empty_shared(4, F32)
        with pytest.raises(dspk.LimitExceeded, match="max_elements"):
            c.gemm(np.ones((n, 0), F32), np.ones((0, n), F32), out=s)
        del s
        assert c.ping() >= 0


def test_result_beyond_a_small_max_elements():
    """The same through the shared temporaries of cpu:0, and a result at the limit."""
    d = Daemon(["--max-elements", "1000"])
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            c.shared_threshold = 1  # the shared temporary path too
            with pytest.raises(dspk.LimitExceeded, match="max_elements"):
                c.gemm(np.ones((40, 1), F32), np.ones((1, 40), F32), device="cpu:0")
            np.testing.assert_array_equal(
                c.gemm(np.ones((30, 1), F32), np.ones((1, 30), F32), device="cpu:0"),
                np.ones((30, 30)))
    finally:
        d.stop()


# ---- NUL characters ------------------------------------------------------------------

def test_nul_in_the_socket_path_or_name_is_invalid(daemon):
    """connect('/path\\0/other') connected to /path: the kernel takes a Unix socket
    path up to its first NUL."""
    for path in (daemon.socket + "\0/other", os.fsencode(daemon.socket) + b"\0x",
                 "\0" + daemon.socket):
        with pytest.raises(dspk.InvalidArgument, match="socket: .*NUL"):
            dspk.connect(path, timeout=TIMEOUT)
    with pytest.raises(dspk.InvalidArgument, match="name: .*NUL"):
        dspk.connect(daemon.socket, name="a\0b", timeout=TIMEOUT)
    with dspk.connect(daemon.socket, timeout=TIMEOUT) as c:
        for call in (lambda: c.map("exp", np.ones(2), device="cpu:0\0x"),
                     lambda: c.empty(2, device="cpu:0\0x"),
                     lambda: c.contract("ij,jk->ik\0", np.ones((2, 2)), np.ones((2, 2)))):
            with pytest.raises(dspk.InvalidArgument):
                call()


def test_sending_with_descriptors_beyond_fd_setsize(daemon, monkeypatch):
    """The wait for room to send used select(), which refuses descriptors of 1024 and
    above (ValueError, and the connection was cut): a process with many files open."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("RLIMIT_NOFILE below 1200")
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "0")  # through the socket
    if soft != resource.RLIM_INFINITY and soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    held = []
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        held.append(null)
        while held[-1] < 1100:
            held.append(os.dup(null))
        with dspk.connect(daemon.socket, timeout=TIMEOUT) as c:
            assert c._sock.fileno() >= 1024
            x = np.ones((1024, 1024))  # 8 MiB: more than the socket's buffer
            for _ in range(3):
                assert c.reduce(x) == x.size
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ---- a refusal by the daemon: its protocol.error, never Closed ------------------------
# The daemon used to close a refused connection at once: the hello's send failed
# with EPIPE (or the read with ECONNRESET) before the notice was read, and connect()
# raised Closed every time.  Now the daemon lets the client read the notice, and the
# client looks for it among the bytes queued when a send fails.

ADMIN_EXTRA_CONNS = 8


@contextlib.contextmanager
def admin_extra(d):
    """The connections an admin (root, or the daemon's own user: this test's uid) may
    open beyond max_user_clients (protocol.md, max_clients), held open so that the next
    one is refused."""
    cs = [dspk.connect(d.socket, timeout=TIMEOUT) for _ in range(ADMIN_EXTRA_CONNS)]
    try:
        yield cs
    finally:
        for c in cs:
            c.close()


def test_refused_by_max_user_clients_is_elimit_with_the_reason():
    # The count may include a refused connection still closing.
    d = Daemon(["--max-user-clients", "1"])
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as held, admin_extra(d):
            for _ in range(50):
                with pytest.raises(dspk.LimitExceeded,
                                   match=r"^ELIMIT: connect\(\) to dspkd at [^:]+: "
                                         r"this user has \d+ connections "
                                         r"already \(max_user_clients 1 and 8 more for "
                                         r"admins\)$"):
                    dspk.connect(d.socket, timeout=TIMEOUT)
            held.ping()
    finally:
        d.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="allow_users admits the daemon's own "
                    "user: the test acts as another one, which takes root")
def test_refused_by_allow_users_is_eperm_with_the_reason(tmp_path):
    conf = tmp_path / "allow.conf"
    conf.write_text("[policy]\nallow_users = 4242\n")
    d = Daemon(["--config", str(conf)])
    try:
        os.chmod(d.socket, 0o666)
        os.chmod(d.dir, 0o755)
        sock = d.socket

        def refusals():
            got = []
            for _ in range(50):
                try:
                    dspk.connect(sock, timeout=TIMEOUT).close()
                    got.append("connected")
                except dspk.Error as e:
                    got.append("%s %s" % (type(e).__name__, e))
            return got

        from conftest import dspk_daemon
        got = dspk_daemon.run_as(65534, 65534, refusals)
        want = "PermissionDenied EPERM: connect() to dspkd at %s: " \
               "permission denied: uid 65534 may not connect (root, " % sock + \
               "the daemon's own user (uid %d), allow_users and allow_groups in the [policy] " \
               "of dspkd.conf)" % os.geteuid()
        assert got == [want] * 50
    finally:
        d.stop()


def test_the_notice_is_read_after_a_failed_send(tmp_path):
    """A daemon that sent a protocol.error and closed before the client's next send
    (an older dspkd; one past its bound of lingering connections): the send fails with
    EPIPE, and the call raises the notice's error, not Closed."""
    import msgpack
    import select
    import socket
    path = str(tmp_path / "fake.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def fake():
        s, _ = srv.accept()
        u = msgpack.Unpacker(raw=False)
        while True:
            u.feed(s.recv(4096))
            msgs = list(u)
            if msgs:
                break
        s.sendall(msgpack.packb([1, msgs[0][1], None, {
            "protocol": 1, "daemon": "fake", "server": "fake", "client_id": 1,
            "limits": dict(LIMITS)}]))
        s.sendall(msgpack.packb([2, "protocol.error", [
            {"code": -4, "name": "ELIMIT", "message": "message longer than 10 bytes"}]]))
        s.close()

    t = threading.Thread(target=fake)
    t.start()
    try:
        c = dspk.connect(path, timeout=TIMEOUT)
        t.join()
        p = select.poll()  # the daemon's close has reached the client
        p.register(c._sock, select.POLLIN)
        assert p.poll(TIMEOUT * 1000)
        with pytest.raises(dspk.LimitExceeded, match="message longer than 10 bytes"):
            c.ping()
        with pytest.raises(dspk.LimitExceeded, match="message longer than 10 bytes"):
            c.ping()
        c.close()
    finally:
        t.join()
        srv.close()


def test_the_daemon_reads_a_refused_clients_hello_before_it_closes():
    """The daemon's side alone, on a raw socket: the hello sent at once after connecting
    is taken (never EPIPE: the daemon closed first), and the notice is followed by a
    clean end of stream (never ECONNRESET: the daemon closed with the hello unread)."""
    import msgpack
    import socket
    d = Daemon(["--max-user-clients", "1"])
    hello = msgpack.packb([0, 1, "hello", [{"version": 1, "client": "raw"}]])
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT), admin_extra(d):
            for _ in range(50):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(TIMEOUT)
                    s.connect(d.socket)
                    s.sendall(hello)
                    got = b""
                    while True:
                        b = s.recv(4096)
                        if not b:
                            break
                        got += b
                    u = msgpack.Unpacker(raw=False)
                    u.feed(got)
                    msgs = list(u)
                    assert len(msgs) == 1 and msgs[0][:2] == [2, "protocol.error"] and \
                        msgs[0][2][0]["name"] == "ELIMIT", msgs
    finally:
        d.stop()


def test_a_flood_of_refused_connects_holds_few_descriptors():
    """Refused connections linger until their client read the notice, at most 64 at
    once: 300 clients that read it and keep their sockets open cost the daemon no
    more than 64 descriptors, and it serves on."""
    import socket
    d = Daemon(["--max-user-clients", "1"])
    socks = []
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as held, admin_extra(d):
            fds = "/proc/%d/fd" % d.proc.pid
            base = len(os.listdir(fds))
            for _ in range(300):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(TIMEOUT)
                s.connect(d.socket)
                socks.append(s)
                got = b""
                while True:  # the notice, then the daemon's end of stream
                    b = s.recv(4096)
                    if not b:
                        break
                    got += b
                assert b"max_user_clients" in got
            n = len(os.listdir(fds))
            assert n <= base + 64, "%d descriptors, %d before the flood" % (n, base)
            held.ping()
        for s in socks:
            s.close()
        socks = []
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            c.ping()
    finally:
        for s in socks:
            s.close()
        d.stop()
