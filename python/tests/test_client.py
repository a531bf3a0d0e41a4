"""The connection: discovery, info calls, errors, DeviceArrays, futures, threads, a
daemon that goes away, and the message-size limit."""
from __future__ import annotations

import concurrent.futures
import os
import signal
import threading

import numpy as np
import pytest

import dspk
from conftest import LIMITS, TIMEOUT, Daemon

RNG = np.random.default_rng(7)


def f32(*shape):
    return RNG.uniform(-1, 1, shape).astype(np.float32)


# ---- connecting -------------------------------------------------------------------

def test_default_socket(monkeypatch):
    monkeypatch.setenv("DSPK_SOCKET", "/x/y.sock")
    assert dspk.default_socket() == "/x/y.sock"
    monkeypatch.delenv("DSPK_SOCKET")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    want = "/run/dspk/dspkd.sock" if os.geteuid() == 0 else "/run/user/1234/dspk/dspkd.sock"
    assert dspk.default_socket() == want
    # In a Slurm job: the node's daemon, whatever XDG_RUNTIME_DIR sbatch carried over.
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert dspk.default_socket() == "/run/dspk/dspkd.sock"
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert dspk.default_socket() == "/run/dspk/dspkd.sock"


def test_default_socket_empty_variables_are_unset(monkeypatch, tmp_path):
    """An empty $DSPK_SOCKET is as unset (the default socket), and so is an empty
    $SLURM_JOB_ID (no job: $XDG_RUNTIME_DIR's socket), as libdspkclient, dspk-submit
    and dspkd take them; python.md and protocol.md said "if set" (probe 18 C8: the
    docs were wrong, the behaviour is pinned here).  connect() with an empty
    $DSPK_SOCKET tries the default, never the empty path."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("DSPK_SOCKET", "")
    monkeypatch.setenv("SLURM_JOB_ID", "")
    want = os.path.join(str(tmp_path), "dspk", "dspkd.sock")
    assert dspk.default_socket() == want
    with pytest.raises(dspk.ConnectError) as ei:
        dspk.connect()
    assert ei.value.message.startswith("cannot connect to dspkd at %s: " % want)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert dspk.default_socket() == "/run/dspk/dspkd.sock"


def test_default_socket_relative_xdg(monkeypatch):
    """A relative XDG_RUNTIME_DIR is ignored, as the XDG Base Directory spec asks: it
    was used, the path then depending on the working directory (probe round 13).  As
    a user other than root, which the rule is for."""
    monkeypatch.delenv("DSPK_SOCKET", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for rel in ("run/user/1000", "./x", "~/x"):
        monkeypatch.setenv("XDG_RUNTIME_DIR", rel)
        assert dspk.default_socket() == "/run/dspk/dspkd.sock"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert dspk.default_socket() == "/run/user/1000/dspk/dspkd.sock"


def test_the_error_classes_are_declared_for_type_checkers():
    """`from ._errors import *` with a stub whose __all__ had no value hid every error
    class from mypy ("Module has no attribute ShapeError").  Now the stub lists
    __all__ literally, every name is declared in it, and the package imports each by
    name: checked here as a type checker reads the files (no mypy needed)."""
    import ast
    pkg = os.path.dirname(os.path.abspath(dspk.__file__))
    from dspk import _errors
    with open(os.path.join(pkg, "_errors.pyi")) as f:
        stub = ast.parse(f.read())
    declared, listed = set(), None
    for node in stub.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            declared.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id == "__all__":
                assert node.value is not None, "the stub's __all__ has no value"
                listed = ast.literal_eval(node.value)
    assert listed == list(_errors.__all__)
    assert set(listed) <= declared, set(listed) - declared
    with open(os.path.join(pkg, "__init__.py")) as f:
        init = ast.parse(f.read())
    imported = set()
    for node in init.body:
        if isinstance(node, ast.ImportFrom) and node.module == "_errors":
            assert all(a.name != "*" for a in node.names), "a star import of _errors"
            imported |= {a.asname or a.name for a in node.names}
    assert set(listed) <= imported, set(listed) - imported
    assert set(listed) <= set(dspk.__all__)
    for name in listed:
        assert getattr(dspk, name) is getattr(_errors, name)


@pytest.mark.parametrize("var, value, job", [
    ("SLURM_JOB_ID", "99999999999999999999", None),    # beyond 2^64-1: no job id
    ("SLURM_JOB_ID", "043", None),
    ("DSPK_JOB", "", None),                            # empty: as unset
    ("DSPK_JOB", "18446744073709551615", 18446744073709551615),
])
def test_the_job_of_the_environment(var, value, job, monkeypatch):
    """$SLURM_JOB_ID beyond 2^64-1 made hello unpackable: connect() failed with "an
    argument cannot be sent: Integer value out of range".  A $SLURM_JOB_ID that is no
    job id names none, as in libdspkclient."""
    from dspk import _client
    monkeypatch.delenv("DSPK_JOB", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv(var, value)
    assert _client._env_job() == (job or 0)


@pytest.mark.parametrize("value", ["18446744073709551616", "043", " 43", "43x", "+4", "-1",
                                   "0", "\u00e9", "\u0661", "\uff11", "1\udcff"])
def test_a_malformed_dspk_job_is_refused(daemon, value, monkeypatch):
    """A $DSPK_JOB that is set, not empty and no Slurm job id was ignored (with no
    fallback to $SLURM_JOB_ID): the client ran outside the job it named, and a
    GPU's EPERM then advised setting $SLURM_JOB_ID.  libdspkclient and dspk-submit
    refuse it; so does connect() now, naming it, before connecting."""
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("DSPK_JOB", value)
    with pytest.raises(dspk.InvalidArgument) as e:
        dspk.connect(daemon.socket, timeout=TIMEOUT)
    assert e.value.message.startswith("$DSPK_JOB ") and "is not a Slurm job id" in e.value.message
    # shown as repr() shows it, as the other messages show text (it was escaped twice:
    # '\\xc3\\xa9', backslashes and all)
    assert e.value.message.startswith("$DSPK_JOB %r is not" % value), e.value.message


def test_the_default_name_of_a_script_whose_file_name_is_no_utf8(daemon, tmp_path):
    """A script named caf\\xe9.py (Latin-1; sys.argv[0] holds the surrogate escape
    \\udce9) died in connect() with a bare UnicodeEncodeError.  Its default name now
    has U+FFFD for the byte, as the daemon does for client strings."""
    import subprocess
    import sys
    script = os.path.join(os.fsencode(str(tmp_path)), b"caf\xe9.py")
    with open(script, "w") as f:
        f.write("import sys, dspk\n"
                "with dspk.connect(sys.argv[1], timeout=%r) as c:\n"
                "    me = [x for x in c.status()['clients'] if x['self']][0]\n"
                "    print(ascii(c.name), ascii(me['name']))\n" % TIMEOUT)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(dspk.__file__)))
    env = dict(os.environ, PYTHONPATH=pkg, LC_ALL="C.UTF-8")
    out = subprocess.run([sys.executable, script, daemon.socket], env=env,
                         capture_output=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    assert out.stdout.decode().split() == ["'python:caf\\ufffd.py'"] * 2


def test_slurm_job_claim(daemon, monkeypatch):
    """hello names the Slurm job of $SLURM_JOB_ID ($DSPK_JOB wins): with two jobs of this
    uid registered, only the claim decides the connection's job (docs/cluster.md)."""
    if os.geteuid() != 0:
        pytest.skip("registering jobs needs an admin of the daemon (root)")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("DSPK_JOB", raising=False)
    with dspk.connect(daemon.socket) as admin:
        for job in (4242, 4243):
            admin._call("job.register", {"job": job, "uid": 0, "devices": []})
        try:
            monkeypatch.setenv("SLURM_JOB_ID", "4243")
            with dspk.connect(daemon.socket) as c:
                assert [d["backend"] for d in c.devices()] == ["cpu"]
                me = [x for x in c.status()["clients"] if x["self"]]
                assert me[0]["job"] == 4243
            monkeypatch.setenv("DSPK_JOB", "4999")   # not registered here
            with dspk.connect(daemon.socket) as c:
                with pytest.raises(dspk.PermissionDenied):
                    c.devices()
        finally:
            for job in (4242, 4243):
                admin._call("job.end", {"job": job})


def test_connect_from_environment(daemon, monkeypatch):
    monkeypatch.setenv("DSPK_SOCKET", daemon.socket)
    with dspk.connect(name="from-env") as c:
        assert c.socket_path == daemon.socket
        me = [x for x in c.status()["clients"] if x["self"]]
        assert len(me) == 1 and me[0]["name"] == "from-env"
        assert c.limits["max_message"] > 0 and c.daemon_version
        # Read-only: the client goes by them (an edited max_message sent a message
        # the daemon refused, and it closed the connection).
        with pytest.raises(TypeError):
            c.limits["max_message"] = 1 << 30
        assert c.ping() > 0
        assert repr(c) == "Client(socket=%r, client_id=%d)" % (daemon.socket, c.client_id)
    assert repr(c).endswith(", closed)")
    assert c.closed
    with pytest.raises(dspk.Closed):
        c.ping()


def test_connect_error(tmp_path):
    with pytest.raises(dspk.ConnectError) as e:
        dspk.connect(str(tmp_path / "none.sock"))
    assert e.value.code == -16 and "none.sock" in e.value.message
    assert isinstance(e.value, ConnectionError)


def test_connect_to_an_abstract_socket(tmp_path, monkeypatch):
    """A daemon that socket activation passes an abstract socket (ListenStream=@name,
    systemd.md) is reached by connect("@name") and by $DSPK_SOCKET=@name: a leading
    '@' names the abstract namespace (python.md), as for libdspkclient and dspk-submit.
    It was taken as a file path ("No such file or directory"; probe 17, E 1)."""
    import dspk_daemon
    name = "dspk-py-abstract-%d" % os.getpid()
    args = [os.environ["DSPKD"], "--foreground", "--config", "", "--backends", "cpu",
            "--no-cache", "--log-level", "info"]
    proc = dspk_daemon.activate(args, "@" + name, TIMEOUT,
                                env={"RUNTIME_DIRECTORY": str(tmp_path)})
    if proc is None:
        pytest.skip("systemd-socket-activate missing")
    try:
        with dspk.connect("@" + name, name="abstract", timeout=TIMEOUT) as c:
            assert c.socket_path == "@" + name
            assert c.ping() > 0
            assert c.status()["daemon"]["socket"] == "@" + name
            x = np.arange(6, dtype=np.float32)
            np.testing.assert_array_equal(c.map("add", x, x), x + x)
        monkeypatch.setenv("DSPK_SOCKET", "@" + name)
        with dspk.connect(timeout=TIMEOUT) as c:
            assert c.ping() > 0
        monkeypatch.delenv("DSPK_SOCKET")
        # Nothing listens on another name: the error says which form was taken.
        with pytest.raises(dspk.ConnectError) as e:
            dspk.connect("@" + name + "-none")
        assert e.value.message == (
            "cannot connect to dspkd at @%s-none: no daemon listens on this abstract name "
            "(an abstract socket: a leading '@' names the abstract namespace)" % name)
        with pytest.raises(dspk.InvalidArgument) as e:
            dspk.connect("@")
        assert "abstract socket name after '@' is empty" in e.value.message
        # "./@x" is the file @x, never the abstract name.
        with pytest.raises(dspk.ConnectError) as e:
            dspk.connect("./@" + name)
        assert e.value.message.endswith(": No such file or directory"), e.value.message
    finally:
        rc = dspk_daemon.stop(proc, TIMEOUT)
        log = proc.stderr.read().decode()
    assert rc == 0, log
    assert "info: listening on @%s (socket activation)" % name in log, log


def test_connect_to_a_path_that_is_no_socket_or_too_long(tmp_path, monkeypatch, daemon):
    """connect() gave bare OS strings where libdspkclient and dspk-submit explain: a
    regular file or a directory was "Connection refused" (as if no daemon ran), a path
    longer than a Unix socket address was ECONNECT "AF_UNIX path too long" (outside
    probe 15, C, 4).  Now what is there is named, as dspk-submit names it (cli.md),
    and a path of more than 107 bytes is dspk.LimitExceeded (ELIMIT) naming where it
    came from, before any socket is made."""
    regular = tmp_path / "regular"
    regular.write_bytes(b"")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((regular, "a regular file"), (tmp_path, "a directory"),
                       (fifo, "a FIFO")):
        with pytest.raises(dspk.ConnectError) as e:
            dspk.connect(str(path))
        assert e.value.message.endswith(
            "; %s is %s, not a socket: check connect()'s socket and $DSPK_SOCKET"
            % (path, kind)), e.value.message
    with pytest.raises(dspk.ConnectError) as e:  # nothing there: no such hint
        dspk.connect(str(tmp_path / "none.sock"))
    assert "not a socket" not in e.value.message
    # 107 bytes is the most a socket address holds (sun_path less its NUL): a link
    # of that length to the daemon's socket connects; one byte more is ELIMIT.
    base = str(tmp_path) + "/"
    fits = base + "l" * (107 - len(os.fsencode(base)))
    os.symlink(daemon.socket, fits)
    with dspk.connect(fits, timeout=TIMEOUT) as c:
        assert c.ping() > 0
    long = fits + "x"
    fds = len(os.listdir("/proc/self/fd"))
    for how, whence in (("socket", "socket="), ("env", "$DSPK_SOCKET")):
        if how == "env":
            monkeypatch.setenv("DSPK_SOCKET", long)
        with pytest.raises(dspk.LimitExceeded) as e:
            dspk.connect(long if how == "socket" else None)
        assert e.value.name == "ELIMIT"
        assert e.value.message == ("cannot connect to dspkd at %s: socket path from %s "
                                   "longer than 107 bytes (108 bytes)" % (long, whence))
    assert len(os.listdir("/proc/self/fd")) == fds


def test_ping_devices_status(client):
    assert 0 < client.ping() < TIMEOUT
    client.ping(b"\x00abc" * 1000)
    client.ping(os.urandom(200000))  # large data goes to the socket uncopied
    devs = client.devices()
    assert [d["id"] for d in devs] == ["cpu:0"] and devs[0]["backend"] == "cpu"
    alld = client.devices(all=True)
    assert alld[0]["id"] == "cpu:0"
    assert all("reason" in d for d in alld[1:])  # backends not selected by --backends
    st = client.status()
    assert st["daemon"]["socket"] == client.socket_path
    assert any(c["self"] and c["name"] == "pytest" for c in st["clients"])


# ---- errors -----------------------------------------------------------------------

def test_errors(client):
    with pytest.raises(dspk.ShapeError) as e:
        client.gemm(f32(3, 4), f32(5, 6))
    err = e.value
    assert (err.code, err.name) == (-8, "ESHAPE") and "K=" in err.message
    assert isinstance(err, dspk.Error) and isinstance(err, ValueError)
    assert str(err).startswith("ESHAPE: ")
    with pytest.raises(dspk.NoDevice):
        client.gemm(f32(2, 2), f32(2, 2), device="nope:7")
    with pytest.raises(dspk.InvalidArgument):
        client.map("frobnicate", f32(3))
    with pytest.raises(dspk.DtypeError):  # refused here, before sending
        client.map("exp", np.arange(4))
    with pytest.raises(dspk.InvalidArgument):
        client.submit("nosuchop", f32(2))
    client.ping()  # the connection stays usable after every error


def test_error_stubs_match_the_classes():
    """_errors.pyi (what type checkers see) declares exactly the classes that
    _errors.py makes from its table, with the same bases."""
    import ast
    import dspk._errors as mod
    stub = ast.parse(open(os.path.splitext(mod.__file__)[0] + ".pyi").read())
    declared = {c.name: [ast.unparse(b) for b in c.bases]
                for c in stub.body if isinstance(c, ast.ClassDef)}
    made = {n: [b.__name__ for b in getattr(mod, n).__bases__]
            for n in mod.__all__ if isinstance(getattr(mod, n), type)}
    assert declared == made
    funcs = {f.name for f in stub.body
             if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")}
    assert funcs == {n for n in mod.__all__ if not isinstance(getattr(mod, n), type)}


def test_empty_shared_is_an_ndarray(client):
    """empty_shared is supported now (tests/test_shared.py has the rest)."""
    a = client.empty_shared((4, 4), np.float32)
    assert type(a) is np.ndarray and a.shape == (4, 4) and a.dtype == np.float32
    a[:] = 1
    assert client.reduce(a) == 16


# ---- DeviceArrays -----------------------------------------------------------------

def test_device_arrays(client):
    a, b = f32(64, 32), f32(32, 48)
    da, db = client.to_device(a), client.to_device(b, device="cpu:0")
    assert da.device == "cpu:0" and da.shape == (64, 32) and da.dtype == np.float32
    np.testing.assert_array_equal(da.numpy(), a)
    out = client.empty((64, 48), np.float32)
    got = client.gemm(da, db, out=out)
    assert got is out
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-5)
    # mixing a DeviceArray and a numpy operand, and chaining results on the device
    out2 = client.empty((64, 48), np.float32)
    client.map("scale", out, alpha=2.0, out=out2)
    np.testing.assert_allclose(client.map("add", out2, a @ b), 3 * (a @ b), rtol=1e-4,
                               atol=1e-5)
    for d in (da, db, out, out2):
        d.free()
    da.free()  # a second free() of the same object does nothing
    with pytest.raises(dspk.NoBuffer):
        da.numpy()
    with client.to_device(np.arange(10, dtype=np.complex128)) as dc:
        np.testing.assert_allclose(client.fft(dc), np.fft.fft(np.arange(10)), atol=1e-12)


def test_device_array_dtypes(client):
    for x in (f32(5, 3), f32(4).astype(np.float64), (f32(6) + 1j).astype(np.complex64),
              (f32(2, 2) + 1j).astype(np.complex128), f32(9).astype(np.float16),
              dspk.to_bfloat16(f32(3, 3)), f32(3).astype(">f4")):
        with client.to_device(x) as d:
            back = d.numpy()
            assert back.dtype == (x.dtype.newbyteorder("<") if x.dtype.byteorder == ">"
                                  else x.dtype)
            np.testing.assert_array_equal(back.view(np.uint8), np.ascontiguousarray(
                x.astype(back.dtype)).view(np.uint8))


def test_small_max_message_chunks_and_stages():
    """With --max-message 1 MiB, to_device/numpy() go in chunks below the limit, a
    task whose operands do not fit in one message stages them through buffers, and a
    result too large for one answer comes back through a temporary buffer."""
    d = Daemon(["--max-message", str(1 << 20)])
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            assert c.max_message == 1 << 20
            c.shared_threshold = 0  # the socket's path (shared temporaries: test_shared)
            x = f32(3 * 1024 * 1024 // 4 + 5)      # 3 MiB + 20 bytes
            with c.to_device(x) as dx:
                np.testing.assert_array_equal(dx.numpy(), x)
            a, b = f32(600, 300), f32(300, 200)    # 720 KB + 240 KB > 1 MiB together
            np.testing.assert_allclose(c.gemm(a, b), a @ b, rtol=1e-4, atol=1e-4)
            big = f32(512, 512)                    # each operand alone is 1 MiB
            # Results above max_message - 1024 bytes cannot come back inline
            # (protocol.md, Limits): they go through a temporary buffer, read in pieces.
            np.testing.assert_allclose(c.map("add", big, big), 2 * big)
            g = c.gemm(f32(700, 3), f32(3, 900))   # 2.5 MB from small operands
            assert g.shape == (700, 900)
            x = (f32(3, 70000) + 1j).astype(np.complex64)
            np.testing.assert_allclose(c.fft(x), np.fft.fft(x), rtol=1e-3, atol=1e-2)
            e = c.contract("i,j->ij", f32(600), f32(600))
            assert e.shape == (600, 600)
            np.testing.assert_allclose(c.reduce(big, "sum", axes=0), big.sum(0), rtol=1e-4,
                                       atol=1e-4)
            futs = [c.submit("map", "scale", big, alpha=float(k)) for k in range(4)]
            for k, f in enumerate(futs):
                np.testing.assert_allclose(f.result(TIMEOUT), k * big)
            with pytest.raises(dspk.ShapeError):   # errors of a staged task reach the caller
                c.map("add", big, f32(512, 511))
            with c.empty(big.shape, np.float32) as out:
                assert c.map("add", big, big, out=out) is out
                np.testing.assert_allclose(out.numpy(), 2 * big)
            me = [x for x in c.status()["clients"] if x["self"]][0]
            assert me["buffers"] == 0  # temporaries freed
            c.ping()
    finally:
        d.stop()


def test_staging_asks_for_the_devices_once_per_connection(monkeypatch):
    """A staged operand on device "any" is staged on the device the "any" rule picks by
    the daemon's devices: asked once per connection (a daemon's devices do not change
    while it runs), not before every call (probe 20 C3: one devices request per gemm,
    sync or submit()).  A Timeout of that devices call names the op it is a step of."""
    sent = []
    start = dspk.Client._start

    def spy(self, method, *args, **kwargs):
        sent.append(method)
        return start(self, method, *args, **kwargs)
    monkeypatch.setattr(dspk.Client, "_start", spy)
    d = Daemon(["--max-message", "64K"])
    try:
        a = f32(300, 300)                          # 360 KB: staged
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            c.shared_threshold = 0
            for _ in range(3):
                np.testing.assert_allclose(c.gemm(a, a), a @ a, rtol=1e-4, atol=1e-3)
            np.testing.assert_allclose(c.submit("gemm", a, a).result(TIMEOUT), a @ a,
                                       rtol=1e-4, atol=1e-3)
            assert sent.count("devices") == 1, sent
            assert sent.count("task.run") == 4
        with dspk.connect(d.socket, timeout=0.2) as c:
            c.shared_threshold = 0
            os.kill(d.proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(dspk.Timeout) as ei:
                    c.gemm(a, a)
            finally:
                os.kill(d.proc.pid, signal.SIGCONT)
            assert ei.value.message.startswith(
                "gemm: the devices call that tells where its operands go: devices "
                "(request "), ei.value.message
            c.timeout = TIMEOUT
            c.ping()
    finally:
        d.stop()


def test_tiny_max_message_pieces():
    """dspkd takes a max_message from 64 bytes.  buffer.write pieces were
    max(1, max_message - 4096) bytes: one request per byte at 4096 or less (100 KB
    did not finish in 30 s).  Now each piece carries max_message - 64 bytes (the
    request's framing is at most 64) and each read max_message - 64 (protocol.md); at
    64 no piece could carry data: dspk.LimitExceeded before anything is sent."""
    for mm in (1024, 4095, 4096):
        d = Daemon(["--max-message", str(mm)])
        try:
            with dspk.connect(d.socket, timeout=TIMEOUT) as c:
                assert c.max_message == mm
                c.shared_threshold = 0
                sent = []
                orig = c._start

                def spy(method, args, *a, **k):
                    sent.append((method, len(args.get("data", b"")) if method ==
                                 "buffer.write" else args.get("size")))
                    return orig(method, args, *a, **k)

                c._start = spy
                x = np.arange(4096, dtype=np.float32)  # 16 KiB
                with c.to_device(x) as dx:
                    writes = [n for m, n in sent if m == "buffer.write"]
                    assert len(writes) == -(-x.nbytes // (mm - 64)), writes[:4]
                    assert max(writes) == mm - 64
                    np.testing.assert_array_equal(dx.numpy(), x)
                reads = [n for m, n in sent if m == "buffer.read"]
                assert max(reads) == mm - 64 and sum(reads) == x.nbytes
                c._start = orig
                y = np.arange(25600, dtype=np.float32)  # 100 KiB, as reported
                with c.to_device(y) as dy:
                    np.testing.assert_array_equal(dy.numpy(), y)
                c.ping()
        finally:
            d.stop()
    d = Daemon(["--max-message", "64"])
    try:
        with dspk.connect(d.socket, name="t", timeout=TIMEOUT) as c:
            assert c.max_message == 64
            c.shared_threshold = 0
            with pytest.raises(dspk.LimitExceeded, match="leaves no room"):
                c.to_device(np.ones(4, np.float32))
            assert c.ping() > 0  # nothing was sent: the connection is usable
            me = [x for x in c.status()["clients"] if x["self"]][0]
            assert me["buffers"] == 0  # the array's buffer was freed
    finally:
        d.stop()


# ---- futures ----------------------------------------------------------------------

def test_many_futures_in_flight(client):
    xs = [f32(8, 8) for _ in range(300)]
    futs = [client.submit("gemm", x, x) for x in xs]
    futs += [client.submit("fft", x.astype(np.complex64)) for x in xs[:50]]
    done, pending = concurrent.futures.wait(futs, timeout=TIMEOUT)
    assert not pending
    for x, f in zip(xs, futs):
        np.testing.assert_allclose(f.result(), x @ x, rtol=1e-4, atol=1e-5)
    for x, f in zip(xs, futs[300:]):
        np.testing.assert_allclose(f.result(), np.fft.fft(x), rtol=1e-4, atol=1e-4)
    assert len({f.msgid for f in futs}) == len(futs)
    # operands the op refuses: raised by submit() itself, nothing sent
    with pytest.raises(dspk.ShapeError, match="gemm: A has K=3"):
        client.submit("gemm", f32(2, 3), f32(4, 5))
    # an error of the daemon's (a label of two sizes) fails its own future only
    bad = client.submit("contract", "ij,jk->ik", f32(2, 3), f32(4, 5))
    good = client.submit("map", "scale", f32(3), alpha=0.0)
    assert isinstance(bad.exception(TIMEOUT), dspk.ShapeError)
    assert not good.result(TIMEOUT).any()


def test_future_callbacks_without_waiting(client):
    """Futures complete with no thread waiting on them (the reader thread reads)."""
    hit = threading.Event()
    fut = client.submit("map", "add", f32(100), f32(100))
    fut.add_done_callback(lambda f: hit.set())
    assert hit.wait(TIMEOUT)


def test_progress_callback(tmp_path):
    """task.progress reaches the callback before the result (a gemm on vulkan:0 is
    autotuned on its first run, as in tests/daemon's progress group)."""
    d = Daemon(["--backends", "cpu,vulkan", "--cache", str(tmp_path / "cache.db")])
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            if "vulkan:0" not in [x["id"] for x in c.devices()]:
                pytest.skip("no vulkan:0 device here")
            seen = []
            a = f32(256, 256)
            fut = c.submit("gemm", a, a, device="vulkan:0",
                           progress=lambda what, frac: seen.append((what, frac, fut.done())))
            y = fut.result(TIMEOUT)
            n = len(seen)
            assert n > 0, "no task.progress for an autotuned gemm"
            assert all(isinstance(w, str) and w and 0.0 <= f <= 1.0 and not done
                       for w, f, done in seen)
            np.testing.assert_allclose(y, a @ a, rtol=1e-3, atol=1e-3)
            c.ping()  # nothing about that task arrives after its result
            assert len(seen) == n
    finally:
        d.stop()


def test_cancel(client):
    # Queue many tasks and cancel the last: either canceled by the daemon or finished.
    xs = [f32(200, 200) for _ in range(30)]
    futs = [client.submit("gemm", x, x) for x in xs]
    last = futs[-1]
    if client.cancel(last):
        with pytest.raises(dspk.Canceled):
            last.result(TIMEOUT)
    for f in futs[:-1]:
        f.result(TIMEOUT)


@pytest.mark.parametrize("where", ["sent", "with the worker"])
def test_a_canceled_future_is_done_for_wait_and_as_completed(tmp_path, where):
    """future.cancel() made the future cancelled() and done(), but never told the
    waiters of concurrent.futures.wait() and as_completed() (the executor's
    set_running_or_notify_cancel() does that): they waited for ever.  Now a canceled
    TaskFuture is done for them at once: one whose task was sent (the fake daemon never
    answers it), and one of a submit() still with the client's worker (its operand is
    above max_message: the worker waits for a buffer.create that is never answered)."""
    fake = FakeDaemon(str(tmp_path / "fake.sock"))
    c = dspk.connect(fake.path, timeout=TIMEOUT)
    try:
        x = f32(4) if where == "sent" else np.ones(1 << 19, np.float32)  # 2 MiB > 1 MiB
        futs = [c.submit("map", "abs", x, device="cpu:0") for _ in range(3)]
        assert fake.got.wait(TIMEOUT)
        assert (futs[0]._job is None) == (where == "sent")
        assert futs[-1].cancel() and futs[-1].cancel()
        assert futs[-1].cancelled() and futs[-1].done()
        with pytest.raises(concurrent.futures.CancelledError):
            futs[-1].result(0)
        done, not_done = concurrent.futures.wait(futs, timeout=0)
        assert done == {futs[-1]} and not_done == set(futs[:-1])
        done, _ = concurrent.futures.wait(futs, timeout=TIMEOUT,
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        assert done == {futs[-1]}
        got = concurrent.futures.as_completed(futs, timeout=TIMEOUT)
        assert next(got) is futs[-1]
        # canceled while as_completed() waits: it wakes (a thread cancels them)
        t = threading.Thread(target=lambda: [f.cancel() for f in futs[:-1]])
        t.start()
        assert set(got) == set(futs[:-1])
        t.join(TIMEOUT)
        assert all(f.cancelled() for f in futs)
    finally:
        c.close()
        fake.close()


# ---- threads ----------------------------------------------------------------------

def test_threads_share_one_client(client):
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            for i in range(40):
                a = rng.standard_normal((16, 16)).astype(np.float32)
                k = (seed + i) % 4
                if k == 0:
                    np.testing.assert_allclose(client.gemm(a, a), a @ a, rtol=1e-4, atol=1e-4)
                elif k == 1:
                    np.testing.assert_allclose(client.reduce(a, "sum", 0), a.sum(0),
                                               rtol=1e-4, atol=1e-4)
                elif k == 2:
                    client.ping()
                else:
                    with client.to_device(a) as d:
                        np.testing.assert_array_equal(d.numpy(), a)
                    f = client.submit("map", "scale", a, alpha=3.0)
                    np.testing.assert_allclose(f.result(TIMEOUT), 3 * a, rtol=1e-6)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]


# ---- a daemon that goes away ------------------------------------------------------

def test_daemon_killed_mid_call(fresh_daemon):
    c = dspk.connect(fresh_daemon.socket, timeout=TIMEOUT)
    a = f32(1024, 1024)
    futs = [c.submit("gemm", a, a) for _ in range(20)]
    result = {}

    def sync_call():
        try:
            result["v"] = c.gemm(a, a)
        except dspk.Error as e:
            result["e"] = e

    futs[0].result(TIMEOUT)  # the daemon is busy with the rest
    t = threading.Thread(target=sync_call)
    t.start()
    fresh_daemon.proc.send_signal(signal.SIGKILL)
    fresh_daemon.proc.wait()
    t.join(TIMEOUT)
    assert not t.is_alive(), "a call hung after the daemon died"
    assert isinstance(result.get("e"), dspk.Closed)
    outcomes = [f.exception(TIMEOUT) for f in futs]
    assert isinstance(outcomes[-1], dspk.Closed)
    assert all(e is None or isinstance(e, dspk.Closed) for e in outcomes)
    with pytest.raises(dspk.Closed):
        c.ping()
    c.close()


def test_daemon_stopped_mid_call(fresh_daemon):
    """SIGTERM: queued requests get ESHUTDOWN, running ones finish, then the
    connection closes; every call ends."""
    c = dspk.connect(fresh_daemon.socket, timeout=TIMEOUT)
    a = f32(512, 512)
    futs = [c.submit("gemm", a, a) for _ in range(40)]
    # submit() waits for no socket: its requests may still be with the client's
    # writer or worker thread.  A synchronous call is sent after them all.
    assert c.ping() > 0 and all(f.sent or f.done() for f in futs)
    futs[0].result(TIMEOUT)
    fresh_daemon.proc.send_signal(signal.SIGTERM)
    for f in futs:
        e = f.exception(TIMEOUT)
        assert e is None or isinstance(e, (dspk.Shutdown, dspk.Closed, dspk.Canceled)), e
    assert any(isinstance(f.exception(), dspk.Shutdown) for f in futs) or \
        all(f.exception() is None for f in futs)
    assert fresh_daemon.proc.wait(TIMEOUT) == 0
    with pytest.raises(dspk.Closed):
        c.ping()
    c.close()


# ---- against a scripted fake daemon --------------------------------------------------

class FakeDaemon:
    """Accepts one connection, answers hello, then does what the test says."""

    def __init__(self, path):
        import socket as s
        self.srv = s.socket(s.AF_UNIX, s.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(1)
        self.path = path
        self.conn = None
        self.requests = []
        self.got = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        import msgpack
        self.conn, _ = self.srv.accept()
        up = msgpack.Unpacker(raw=False)
        while True:
            try:
                data = self.conn.recv(1 << 16)
            except OSError:  # close() closed it between its shutdown and this recv
                return
            if not data:
                return
            up.feed(data)
            for m in up:
                if m[2] == "hello":
                    self.conn.sendall(msgpack.packb([1, m[1], None, {
                        "protocol": 1, "daemon": "fake", "server": "dspkd", "client_id": 1,
                        "limits": dict(LIMITS)}]))
                else:
                    self.requests.append(m)
                    self.got.set()

    def send(self, msg):
        import msgpack
        self.conn.sendall(msgpack.packb(msg))

    def close(self):
        import socket as s
        if self.conn is not None:
            self.conn.shutdown(s.SHUT_RDWR)
            self.conn.close()
        self.srv.close()


def test_timeout_then_closed(tmp_path):
    fake = FakeDaemon(str(tmp_path / "fake.sock"))
    c = dspk.connect(fake.path, timeout=0.3)
    assert c.daemon_version == "fake" and c.max_message == 1 << 20
    with pytest.raises(dspk.Timeout) as e:
        c.ping()               # never answered
    assert e.value.code == -21 and isinstance(e.value, TimeoutError)
    fut = c.submit("map", "abs", f32(4))
    assert fake.got.wait(TIMEOUT)
    fake.close()               # the "daemon" goes away: the future ends, no hang
    assert isinstance(fut.exception(TIMEOUT), dspk.Closed)
    c.close()


def test_buffer_answered_after_a_timeout_is_freed(tmp_path):
    """to_device (buffer.create) that timed out left the daemon's buffer, answered later,
    the connection's until it closed: the caller has no DeviceArray to free."""
    fake = FakeDaemon(str(tmp_path / "fake.sock"))
    c = dspk.connect(fake.path, timeout=0.3)
    with pytest.raises(dspk.Timeout):
        c.to_device(f32(4), "cpu:0")
    c.timeout = TIMEOUT  # the rest waits on this test's answers, not on the clock
    assert fake.got.wait(TIMEOUT)
    create = fake.requests[-1]
    assert create[2] == "buffer.create"
    fake.send([1, create[1], None, {"buffer": 77, "device": "cpu:0", "size": 16}])
    fut = c.submit("map", "abs", f32(2))  # its wait reads the late answer first
    while not any(m[2] == "map" or m[2] == "task.run" for m in fake.requests[1:]):
        assert fake.got.wait(TIMEOUT)
        fake.got.clear()
    # the task.run itself: the buffer.free of the orphan may follow it at once, when
    # the reader files the late answer right after the map was sent
    run = next(m for m in fake.requests[1:] if m[2] in ("map", "task.run"))
    out = {"dtype": "f32", "shape": [2], "data": np.zeros(2, np.float32).tobytes()}
    fake.send([1, run[1], None, {"device": "cpu:0", "outputs": [out], "time_us": 1}])
    fut.result(TIMEOUT)
    fake.got.clear()
    c.submit("map", "abs", f32(2))  # the next request frees the orphan first
    while not any(m[2] == "buffer.free" for m in fake.requests):
        assert fake.got.wait(TIMEOUT)
        fake.got.clear()
    frees = [m for m in fake.requests if m[2] == "buffer.free"]
    assert frees[0][3] == [{"buffer": 77}], frees
    fake.close()
    c.close()


def test_connect_arguments_at_the_edges(tmp_path, daemon):
    """timeout=inf raised OverflowError, a name with a lone surrogate UnicodeEncodeError
    (not dspk errors), and socket="" connected to the default socket."""
    for t in (float("inf"), 1e10):
        with dspk.connect(daemon.socket, timeout=t) as c:
            assert c.timeout is None
            c.ping()
    with pytest.raises(dspk.InvalidArgument, match="name: not valid Unicode"):
        dspk.connect(daemon.socket, name="\udcff")
    for empty in ("", b""):
        with pytest.raises(dspk.ConnectError):
            dspk.connect(empty)


def test_free_after_the_client_closed(daemon):
    """A DeviceArray's free() after its client closed raised dspk.Closed; the buffer went
    with the connection, so it does nothing."""
    c = dspk.connect(daemon.socket, timeout=TIMEOUT)
    d = c.to_device(f32(4))
    c.close()
    d.free()
    d.free()


def test_two_threads_free_one_device_array(daemon, monkeypatch):
    """Two threads free() one DeviceArray while the first waits for the submit()s before
    it (probe 23 G1: both got past the check during that wait and the second buffer.free
    was dspk.NoBuffer): the second does nothing, one buffer.free is sent, the buffer is
    gone; a first free() interrupted in that wait leaves the array free-able."""
    c = dspk.connect(daemon.socket, timeout=TIMEOUT)
    try:
        waiting, go = threading.Event(), threading.Event()
        real = c._after_jobs
        frees = []

        def after_jobs(what):
            frees.append(what)
            waiting.set()
            assert go.wait(TIMEOUT)
            return real(what)
        monkeypatch.setattr(c, "_after_jobs", after_jobs)
        d = c.to_device(f32(4))
        errors = []

        def first():
            try:
                d.free()
            except BaseException as e:  # noqa: B036
                errors.append(e)
        t = threading.Thread(target=first)
        t.start()
        assert waiting.wait(TIMEOUT)
        d.free()  # while the first waits: nothing, no error
        go.set()
        t.join(TIMEOUT)
        assert not t.is_alive() and errors == [] and frees == ["buffer.free"]
        mine = [x for x in c.status()["clients"] if x.get("self")]
        assert len(mine) == 1 and mine[0]["buffers"] == 0, mine
        with pytest.raises(dspk.NoBuffer):
            c.reduce(d)

        # Interrupted in the wait: not freed, and a later free() frees it.
        class Stop(Exception):
            pass

        def interrupted(what):
            raise Stop()
        x = f32(4)
        e = c.to_device(x)
        monkeypatch.setattr(c, "_after_jobs", interrupted)
        with pytest.raises(Stop):
            e.free()
        monkeypatch.setattr(c, "_after_jobs", real)
        assert abs(float(c.reduce(e)) - float(x.sum())) <= 1e-6
        e.free()
        with pytest.raises(dspk.NoBuffer):
            c.reduce(e)
    finally:
        c.close()


def test_protocol_error_before_close(tmp_path):
    fake = FakeDaemon(str(tmp_path / "fake.sock"))
    c = dspk.connect(fake.path, timeout=TIMEOUT)
    fut = c.submit("map", "abs", f32(4))
    assert fake.got.wait(TIMEOUT)
    fake.send([2, "protocol.error", [{"code": -4, "name": "ELIMIT", "message": "too big"}]])
    fake.close()
    e = fut.exception(TIMEOUT)
    assert isinstance(e, dspk.LimitExceeded) and e.message == "too big"
    with pytest.raises(dspk.LimitExceeded):
        c.ping()
    c.close()


def test_answers_out_of_order_and_progress(tmp_path):
    """Answers are matched by msgid in any order; progress goes to its own future."""
    fake = FakeDaemon(str(tmp_path / "fake.sock"))
    c = dspk.connect(fake.path, timeout=TIMEOUT)
    seen = {0: [], 1: []}
    futs = [c.submit("map", "abs", f32(2), progress=lambda w, f, i=i: seen[i].append((w, f)))
            for i in range(2)]
    while len(fake.requests) < 2:
        assert fake.got.wait(TIMEOUT)
        fake.got.clear()
    ids = [m[1] for m in fake.requests]
    out = {"dtype": "f32", "shape": [2], "data": np.array([1, 2], np.float32).tobytes()}
    fake.send([2, "task.progress", [{"msgid": ids[1], "what": "autotune x", "fraction": 0.5}]])
    fake.send([1, ids[1], None, {"device": "cpu:0", "outputs": [out], "time_us": 1}])
    fake.send([1, ids[0], {"code": -8, "name": "ESHAPE", "message": "A axis 0"}, None])
    np.testing.assert_array_equal(futs[1].result(TIMEOUT), [1, 2])
    assert isinstance(futs[0].exception(TIMEOUT), dspk.ShapeError)
    assert seen == {0: [], 1: [("autotune x", 0.5)]}
    fake.close()
    c.close()


def test_read_received_in_place(client):
    """A large buffer.read answer goes from the socket straight into the array returned
    (no unpacking, no bytes object), pipelined pieces and other answers around it too."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal(1 << 20).astype(np.float32)        # 4 MiB
    taken = []
    orig = client._take_direct

    def spy(*a):
        r = orig(*a)
        taken.append(r)
        return r

    client._take_direct = spy
    try:
        with client.to_device(x) as d:
            np.testing.assert_array_equal(d.numpy(), x)
            assert len(taken) == 1
            # reads and pings pipelined from several threads: each answer where it belongs
            def work(k):
                for _ in range(3):
                    client.ping()
                    np.testing.assert_array_equal(d.numpy(), x)
            ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            futs = client._start_reads(d.buffer, 0, np.empty(x.nbytes, np.uint8), True)
            for f in futs:
                f.result(TIMEOUT)
        assert len(taken) >= 2
        assert not client._direct
    finally:
        client._take_direct = orig


def test_attributes_the_client_goes_by_are_read_only_or_checked(daemon):
    """The attributes the client reads back were plain writable fields: d.buffer = ...
    read another buffer, d.client = ... passed another connection's buffer id as this
    one's, d.shape = ... overran the buffer, c.timeout = "abc" gave a bare TypeError in
    a later call and c.shared_threshold = -5 was taken.  Now they are read-only, but
    for c.timeout and c.shared_threshold (settable, checked as connect() checks)."""
    with dspk.connect(daemon.socket, timeout=TIMEOUT) as c:
        d = c.to_device(np.arange(4, dtype=np.float32))
        f = c.submit("reduce", np.ones(4))
        assert f.result(TIMEOUT) == 4
        for obj, names in ((c, "name client_id daemon_version limits max_message closed"),
                           (d, "shape dtype device buffer client nbytes"),
                           (f, "msgid")):
            for name in names.split():
                before = getattr(obj, name)
                with pytest.raises(AttributeError):
                    setattr(obj, name, 1)
                assert getattr(obj, name) == before
        for bad in ("abc", -5, 0, float("nan"), True):
            with pytest.raises(dspk.InvalidArgument, match="timeout"):
                c.timeout = bad
        assert c.timeout == TIMEOUT
        for bad in ("abc", -5, 1.5, True):
            with pytest.raises(dspk.InvalidArgument, match="shared_threshold"):
                c.shared_threshold = bad
        c.timeout = 10 ** 400
        assert c.timeout is None
        c.timeout = TIMEOUT
        c.shared_threshold = 0
        assert c.shared_threshold == 0
        assert c.ping() > 0 and d.numpy().tolist() == [0, 1, 2, 3]


def test_every_public_attribute_of_every_public_class_is_read_only(daemon):
    """A DeviceArray's offset and size_bytes, a future's sent and a client's
    socket_path were still plain writable fields, and the client went by them: after
    d.offset = 16, numpy() read at offset 16 (outside probe 15, C, 3); dspk.DTYPES, by
    which answers are decoded, was a plain dict.  Now every public attribute of a
    Client, a DeviceArray and a TaskFuture that is not a method raises AttributeError
    on assignment (and on deletion), but c.timeout and c.shared_threshold (checked
    setters): found by dir(), so that an attribute added later is checked too."""
    import inspect
    with dspk.connect(daemon.socket, timeout=TIMEOUT) as c:
        d = c.to_device(np.arange(4, dtype=np.float32))
        f = c.submit("reduce", np.ones(4))
        assert f.result(TIMEOUT) == 4
        settable = {(dspk.Client, "timeout"), (dspk.Client, "shared_threshold")}
        seen = set()
        for obj, cls in ((c, dspk.Client), (d, dspk.DeviceArray), (f, dspk.TaskFuture)):
            for name in dir(obj):
                value = getattr(obj, name)
                if name.startswith("_") or inspect.ismethod(value) or \
                        (cls, name) in settable:
                    continue
                seen.add(name)
                for change in (lambda: setattr(obj, name, 16),
                               lambda: object.__setattr__(obj, name, 16),
                               lambda: delattr(obj, name)):
                    with pytest.raises(AttributeError):
                        change()
                assert getattr(obj, name) == value
        assert {"socket_path", "offset", "size_bytes", "sent", "msgid", "buffer"} <= seen
        assert d.offset == 0 and d.size_bytes == 16 and f.sent
        assert c.socket_path == daemon.socket
        with pytest.raises(TypeError):
            dspk.DTYPES["f32"] = np.dtype(np.float64)  # type: ignore[index]
        assert dspk.DTYPES["f32"] == np.float32
        assert d.numpy().tolist() == [0, 1, 2, 3]


def test_docstrings_name_the_threads_and_rules_python_md_names():
    """Client.submit's docstring said progress runs "from the thread reading the
    connection", and empty_shared's that any C-contiguous slice copies nothing, also as
    out= (probe 17 C1, C2): neither is what the client does (docs/python.md: callbacks
    on the dspk-callbacks thread; a view referenced only when little-endian and at a
    multiple of its item size).  Every docstring that names the thread a callback
    runs on names dspk-callbacks."""
    import inspect as _inspect
    docs = {}
    for cls in (dspk.Client, dspk.TaskFuture, dspk.DeviceArray):
        for name, member in vars(cls).items():
            doc = _inspect.getdoc(getattr(cls, name))
            if doc and not name.startswith("_"):
                docs["%s.%s" % (cls.__name__, name)] = " ".join(doc.split())
    for where, doc in docs.items():
        assert "from the thread reading" not in doc, where
        if "progress" in doc and "thread" in doc or "done-callback" in doc:
            assert "dspk-callbacks" in doc, where
    sub = docs["Client.submit"]
    assert "dspk-callbacks" in sub and "never submit()" in sub
    shared = docs["Client.empty_shared"]
    for rule in ("C-contiguous", "little-endian", "multiple of its own item size",
                 "big-endian", "sent as a copy", "dspk.InvalidArgument"):
        assert rule in shared, rule


def test_a_connection_the_daemon_refuses_names_the_socket():
    """A real daemon's refusal past max_clients (python.md "Errors": LimitExceeded from
    connect()) starts with `connect() to dspkd at PATH: ` as python.md "Connecting"
    says for every error of hello (probe 18 C1: the refusal came without it)."""
    d = Daemon(["--max-clients", "1"])
    clients = []
    try:
        with pytest.raises(dspk.LimitExceeded) as ei:
            for _ in range(64):  # max_clients, and the daemon's slots kept for admins
                clients.append(dspk.connect(d.socket, timeout=TIMEOUT))
        assert ei.value.message.startswith("connect() to dspkd at %s: " % d.socket), \
            ei.value.message
        assert "max_clients" in ei.value.message
    finally:
        for c in clients:
            c.close()
        d.stop()


def test_the_exports_are_python_md_names():
    """dspk.__all__ is exactly python.md's "Names" list, and each is there with a
    docstring where it is a class or function (probe 18 C6: error_from and numpy
    dtype aliases float32... were exported undocumented)."""
    import re
    md = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                      "python.md")
    if not os.path.exists(md):  # a copy of python/ alone (tests/python/run.sh)
        md = os.path.join(os.environ.get("DSPK_TESTS_COMMON", ""), "..", "..", "docs",
                          "python.md")
    if not os.path.exists(md):
        pytest.skip("docs/python.md not found from here")
    text = open(md).read()
    section = text.split("\n## Names\n", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", section.split("numpy's own")[0])
    assert sorted(named) == sorted(dspk.__all__), \
        (set(named) ^ set(dspk.__all__))
    assert len(set(dspk.__all__)) == len(dspk.__all__)
    for name in dspk.__all__:
        assert hasattr(dspk, name), name
    for name in ("float32", "float64", "complex64", "complex128", "float16"):
        assert not hasattr(dspk, name), name


def test_every_public_member_has_a_docstring_and_empty_its_documented_signature():
    """Client.max_message had no docstring; empty()'s dtype default is documented as
    the code has it (probe 18 C6)."""
    import inspect
    for cls in (dspk.Client, dspk.DeviceArray, dspk.TaskFuture):
        for name, member in vars(cls).items():
            if name.startswith("_"):
                continue
            doc = member.fget.__doc__ if isinstance(member, property) else \
                getattr(member, "__doc__", None)
            assert doc and doc.strip(), "%s.%s has no docstring" % (cls.__name__, name)
    sig = inspect.signature(dspk.Client.empty)
    assert sig.parameters["dtype"].default is np.float32
    assert sig.parameters["device"].default == "any"


def test_task_future_refuses_the_executor_side_non_callables_and_pickle(client):
    """A TaskFuture is completed by its client only: set_result() on a pending one made
    result() return 42 and dropped the daemon's answer, set_running_or_notify_cancel()
    made it running (python.md: never running); add_done_callback(5) was taken and
    only logged a TypeError later; pickle named an internal '_FutureLock' (probe 18
    C7).  Now each is refused at once, and the future still completes with the
    daemon's answer."""
    import copy
    import pickle
    x = np.arange(4, dtype=np.float32)
    f = client.submit("map", "scale", x, alpha=2.0)
    for call in (lambda: f.set_result(42), lambda: f.set_exception(ValueError("x")),
                 f.set_running_or_notify_cancel):
        with pytest.raises(dspk.NotSupported, match=r"TaskFuture\.set_"):
            call()
    assert not f.running()
    with pytest.raises(TypeError, match="add_done_callback: fn must be callable, got int 5"):
        f.add_done_callback(5)
    for how in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot pickle or copy a dspk.TaskFuture"):
            how(f)
    np.testing.assert_array_equal(f.result(TIMEOUT), 2 * x)  # the daemon's answer
    with pytest.raises(dspk.NotSupported):
        f.set_result(42)
    np.testing.assert_array_equal(f.result(TIMEOUT), 2 * x)
    # canceling still tells concurrent.futures.wait(), as before
    g = client.submit("map", "scale", np.ones(1 << 16, np.float32), alpha=3.0)
    g.cancel()
    done, _ = concurrent.futures.wait([g], timeout=TIMEOUT)
    assert g in done


def _cyclic_garbage_of_dspk():
    """What a garbage collection finds unreachable that is the client's: its objects
    (futures, jobs, temporaries, leases...) and frames of its code (an exception's
    traceback kept in a cycle)."""
    import collections
    import gc
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = collections.Counter(
            type(o).__name__ if type(o).__module__.startswith("dspk") else
            "frame " + o.f_code.co_name
            for o in gc.garbage
            if type(o).__module__.startswith("dspk") or
            (type(o).__name__ == "frame" and os.sep + "dspk" + os.sep in
             o.f_code.co_filename))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()
    return dict(found)


def test_dropped_futures_results_and_errors_leave_no_reference_cycles(client):
    """With the cyclic garbage collector off, what the caller drops (futures of
    submit(), lent results, errors) is freed by reference counting alone: nothing of
    the client's is left in a reference cycle, so lent temporaries and daemon buffers
    go back at once (python.md "Lent results").  A deferred submit()'s future and its
    job held each other, a future the callback that follows it, a send that waited
    for room its socket error (holding the request's future), an operand refused its
    error (holding the operands): each kept futures, lent results and buffers until a
    garbage collection, and with threads mixing calls and submit() later results
    were copied instead of lent (probe 22 C3)."""
    import gc
    from dspk._client import _Lent
    big = np.arange(1 << 19, dtype=np.float64)  # 4 MiB: staged or lent
    small = np.ones(64)
    was = gc.isenabled()
    gc.disable()
    try:
        _cyclic_garbage_of_dspk()
        for thr in (0, 64, 1 << 16):
            client.shared_threshold = thr
            for x in (small, big):
                f = client.submit("map", "scale", x, alpha=2.0)
                np.testing.assert_array_equal(f.result(), 2 * x)
                del f
                fs = [client.submit("map", "add", x, x) for _ in range(5)]
                concurrent.futures.wait(fs)
                del fs
                f = client.submit("map", "add", x, x)
                f.cancel()
                del f
                r = client.map("scale", x, alpha=3.0)
                np.testing.assert_array_equal(r, 3 * x)
                with pytest.raises(dspk.ShapeError):
                    client.gemm(r.reshape(-1, 2), r.reshape(-1, 2))  # refused here
                with pytest.raises(dspk.ShapeError):
                    client.submit("fir", r, np.ones(0))  # refused here, a lent operand
                del r
                f = client.submit("map", "add", x, x)
                client.cancel(f)  # canceled in the daemon, or done first
                e = f.exception(TIMEOUT)
                assert e is None or isinstance(e, dspk.Canceled), e
                del f, e
                client.ping()
                assert _cyclic_garbage_of_dspk() == {}, (thr, x.size)
        client.shared_threshold = 64
        errors = []

        def work(k):
            try:
                for _ in range(10):
                    x = small * k
                    r = client.map("scale", x, alpha=1.0)
                    np.testing.assert_array_equal(r, x)
                    np.testing.assert_array_equal(client.submit("map", "add", x, x)
                                                  .result(TIMEOUT), 2 * x)
                    client.submit("map", "add", big, big)  # dropped at once
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        ts = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(TIMEOUT)
        assert not errors, errors
        client.ping()
        assert _cyclic_garbage_of_dspk() == {}
        # nothing of ours alive: no temporary is still lent, and the next result is
        client.ping()
        lent = [t for t in client._temps if isinstance(t.held, _Lent)]
        assert lent == [], lent
        r = client.map("scale", small, alpha=1.0)
        assert type(r.base).__name__ == "_Lease"
    finally:
        if was:
            gc.enable()


def _lent_now(c):
    from dspk._client import _Lent
    return [t for t in c._temps if isinstance(t.held, _Lent) and t.held() is not None]


def _gone(refs):
    """Whether every one of the weak references ``refs`` is dead, waiting for it while
    a thread of the client that has just ended the call (the reader or callbacks
    thread that settled its future, the writer thread of a submit()) is on its way
    out: what a reference cycle holds never dies, the cyclic collector being off."""
    import time
    deadline = time.monotonic() + 10
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        time.sleep(0.001)
    return [type(r()).__name__ for r in refs if r() is not None]


def _fails_leaving_nothing(c, call, want=dspk.Error, settle=None):
    """``call(big, lent)`` (a 4 MiB operand and a lent result, made here; a plain one
    with no shared memory) raises
    ``want``; once the caller drops the error and the operands, with the cyclic
    garbage collector off, the operands are gone, the lent result's temporary is
    lent no more, and no object or frame of the client's is cyclic garbage.
    ``settle()`` runs once the error is caught (the daemon made to answer what it
    holds, which keeps a lent operand lent until then)."""
    import weakref
    big = np.arange(1 << 19, dtype=np.float64)  # 4 MiB: staged or lent
    lent = c.map("scale", big, alpha=1.0)
    assert (type(lent.base).__name__ == "_Lease") == (c.shared_threshold > 0)
    refs = [weakref.ref(big), weakref.ref(lent)] + \
        ([weakref.ref(lent.base)] if lent.base is not None else [])
    caught = None
    try:
        call(big, lent)
    except want as e:
        caught = weakref.ref(e)
    assert caught is not None, "no %s" % want.__name__
    if settle is not None:
        settle()
    del big, lent
    assert _gone(refs + [caught]) == []
    assert _cyclic_garbage_of_dspk() == {}


_FAILING_CALLS = {
    # the daemon's errors, synchronous
    "reduce axes": lambda c, x, r: c.reduce(r, axes=[5]),
    "reduce axes (operand)": lambda c, x, r: c.reduce(x, axes=[5]),
    "contract subscripts": lambda c, x, r: c.contract("ij,jk->iz", x.reshape(512, -1),
                                                      r.reshape(-1, 512)),
    "device": lambda c, x, r: c.map("add", x, r, device="cpu:7"),
    "fir out": lambda c, x, r: c.fir(x, r[:8], device="vulkan:9"),
    # the client's own
    "gemm shape": lambda c, x, r: c.gemm(x.reshape(512, -1), r.reshape(512, -1)),
    # submit(): result() and exception() of a failing task, and the future dropped
    "submit result": lambda c, x, r: c.submit("reduce", r, axes=[5]).result(TIMEOUT),
    "submit exception": lambda c, x, r: _raise(
        c.submit("map", "add", x, r, device="cpu:7").exception(TIMEOUT)),
    "submit dropped": lambda c, x, r: (c.submit("contract", "ij,jk->iz", x.reshape(512, -1),
                                                r.reshape(-1, 512)), c.ping(),
                                       c.reduce(r, axes=[7])),
}


def _raise(e):
    try:
        raise e
    finally:
        e = None  # this frame, in e's traceback, holding e: a cycle of the test's


@pytest.mark.parametrize("shared", [0, 64])
def test_failing_calls_leave_no_reference_cycles(client, shared):
    """An error a call raises (the daemon's, the client's own, one re-raised from a
    submit() future) holds the call's frames in its traceback; they held the future
    that held the error, so the error, the frames and every operand they held (a
    4 MiB array, a lent result whose temporary stayed lent) were a reference cycle,
    kept until a garbage collection: memory grew by the operands, and once four lent
    results were held that way later results were copied (probe 22 C2).  With the
    cyclic garbage collector off, dropping the error and the operands frees them."""
    import gc
    was = gc.isenabled()
    gc.disable()
    try:
        client.shared_threshold = shared
        client.ping()
        _cyclic_garbage_of_dspk()
        for name, call in _FAILING_CALLS.items():
            _fails_leaving_nothing(client, lambda x, r: call(client, x, r))
            client.ping()
            assert _lent_now(client) == [], name
        r = client.map("scale", np.ones(1 << 16), alpha=1.0)
        assert (type(r.base).__name__ == "_Lease") == (shared > 0)  # none held: lent
    finally:
        if was:
            gc.enable()


def test_timeouts_and_a_lost_connection_leave_no_reference_cycles(fresh_daemon):
    """The same for dspk.Timeout (a daemon that answers nothing) and dspk.Closed (a
    daemon killed while a synchronous call and a submit() wait; calls after it)."""
    import gc
    import weakref
    was = gc.isenabled()
    gc.disable()
    try:
        c = dspk.connect(fresh_daemon.socket, timeout=TIMEOUT)
        c.shared_threshold = 64
        c.ping()
        _cyclic_garbage_of_dspk()
        pid = fresh_daemon.proc.pid
        try:
            c.timeout = 0.2

            def resume():
                os.kill(pid, signal.SIGCONT)
                c.timeout = TIMEOUT
                c.ping()

            _fails_leaving_nothing(c, lambda x, r: (os.kill(pid, signal.SIGSTOP),
                                                    c.map("add", x, r)), dspk.Timeout, resume)
            c.timeout = TIMEOUT
            started = threading.Event()
            out = {}

            def sync_call(x, r):
                started.set()
                try:
                    c.map("add", x, r)
                except dspk.Closed as e:
                    out["e"] = type(e)

            def lose(x, r):
                os.kill(pid, signal.SIGSTOP)
                f = [c.submit("map", "add", x, r)]  # (a local holding the future
                # that raises through this frame would be a cycle of the test's)
                t = threading.Thread(target=sync_call, args=(x, r))
                t.start()
                started.wait(TIMEOUT)
                fresh_daemon.proc.send_signal(signal.SIGKILL)
                fresh_daemon.proc.wait()
                t.join(TIMEOUT)
                assert out.get("e") is dspk.Closed
                f.pop().result(TIMEOUT)

            _fails_leaving_nothing(c, lose, dspk.Closed)
        finally:
            if fresh_daemon.proc.poll() is None:
                os.kill(pid, signal.SIGCONT)
        x = np.ones(1 << 19)
        ref = weakref.ref(x)
        with pytest.raises(dspk.Closed):
            c.map("add", x, x)
        del x
        assert ref() is None
        with pytest.raises(dspk.Closed):
            c.submit("map", "add", np.ones(4), np.ones(4)).result(TIMEOUT)
        assert _cyclic_garbage_of_dspk() == {}
        c.close()
        assert _cyclic_garbage_of_dspk() == {}
    finally:
        if was:
            gc.enable()
