"""The connection's life around futures, interruptions and temporaries: waiting on a
future from a callback, a future canceled while its result is staged, KeyboardInterrupt
in the middle of a message, and buffers freed by garbage collection while the client is
idle.  Interruptions are injected at known points (a stopped daemon, a socket wrapper
that raises after a recv), never timed against the daemon's work."""
from __future__ import annotations

import errno
import gc
import os
import select
import signal
import sys
import threading
import types

import msgpack
import numpy as np
import pytest

import dspk
from conftest import TIMEOUT, Daemon
from test_client import FakeDaemon

RNG = np.random.default_rng(11)


def mine(c):
    """This connection's entry of the daemon's status."""
    return [x for x in c.status()["clients"] if x["self"]][0]


class InterruptingSocket:
    """Wraps a client's socket: the k-th recv_into that takes bytes, or the first
    sendmsg once ``block_send`` is set, does what the test says."""

    def __init__(self, sock):
        self._s = sock
        self.recv_left = 0          # raise KeyboardInterrupt after this many data recvs
        self.block_send = None      # (entered, go): events around the next sendmsg
        self.sent = []              # frames' first bytes, as sent

    def __getattr__(self, name):
        return getattr(self._s, name)

    def recv_into(self, *args):
        n = self._s.recv_into(*args)
        if self.recv_left and n > 0:
            self.recv_left -= 1
            if not self.recv_left:
                raise KeyboardInterrupt  # the bytes are taken: the worst moment
        return n

    def sendmsg(self, views, *args):
        if self.block_send is not None:
            entered, go = self.block_send
            self.block_send = None
            entered.set()
            assert go.wait(TIMEOUT)
        n = self._s.sendmsg(views, *args)
        self.sent.append(b"".join(bytes(v) for v in views)[:n])
        return n


# ---- E: waiting on a future from a callback ------------------------------------------

def test_future_result_inside_a_done_callback(client):
    """A done-callback runs on the thread reading the connection; result() of another
    future there waited for that very thread, for ever.  Now it reads the connection
    itself, as a synchronous call there does."""
    got = {}
    done = threading.Event()

    def cb(fut):
        try:
            got["result"] = client.submit("reduce", np.ones(3)).result(10)
            got["exception"] = client.submit("reduce", np.ones(3), "bad").exception(10)
            got["sync"] = client.reduce(np.ones(4))
        except BaseException as e:  # noqa: BLE001 - reported below
            got["error"] = e
        finally:
            done.set()

    f = client.submit("map", "add", np.ones(8), np.ones(8))
    f.add_done_callback(cb)
    assert done.wait(TIMEOUT)
    assert "error" not in got, got.get("error")
    assert got["result"] == 3.0 and got["sync"] == 4.0
    assert isinstance(got["exception"], dspk.InvalidArgument)
    np.testing.assert_array_equal(f.result(), 2 * np.ones(8))


@pytest.mark.parametrize("exc", [SystemExit, KeyboardInterrupt])
def test_callback_base_exceptions_stay_in_the_callback(tmp_path, exc):
    """A done-callback or progress callback raising SystemExit or KeyboardInterrupt
    killed the dspk-reader thread (later callbacks of that future never ran, other
    pending futures never completed) and its exception surfaced in a later, unrelated
    call.  Now it ends that callback only (python.md, Futures)."""
    fake = FakeDaemon(str(tmp_path / "fake.sock"))
    c = dspk.connect(fake.path, timeout=TIMEOUT)
    try:
        threads = []
        later = threading.Event()

        def progress(what, frac):
            threads.append(threading.current_thread().name)
            raise exc("progress")

        def callback(f):
            threads.append(threading.current_thread().name)
            raise exc("callback")

        f1 = c.submit("map", "abs", np.ones(2, np.float32), progress=progress)
        f2 = c.submit("map", "abs", np.ones(2, np.float32))
        while len(fake.requests) < 2:
            assert fake.got.wait(TIMEOUT)
            fake.got.clear()
        f1.add_done_callback(callback)        # f1 is pending: nothing was answered
        f1.add_done_callback(lambda f: later.set())
        ids = [m[1] for m in fake.requests]
        out = {"dtype": "f32", "shape": [2], "data": np.array([1, 2], np.float32).tobytes()}
        fake.send([2, "task.progress", [{"msgid": ids[0], "what": "x", "fraction": 0.5}]])
        fake.send([1, ids[0], None, {"device": "cpu:0", "outputs": [out], "time_us": 1}])
        assert later.wait(10), "a later done-callback of the same future did not run"
        # f2's answer comes after the callbacks raised: the reader must still read.
        fake.send([1, ids[1], None, {"device": "cpu:0", "outputs": [out], "time_us": 1}])
        np.testing.assert_array_equal(f2.result(10), [1, 2])
        np.testing.assert_array_equal(f1.result(10), [1, 2])
        assert threads == ["dspk-callbacks", "dspk-callbacks"]
        # A later call neither hangs nor gets the callbacks' exceptions.
        f3 = c.submit("map", "abs", np.ones(2, np.float32))
        while len(fake.requests) < 3:
            assert fake.got.wait(TIMEOUT)
            fake.got.clear()
        fake.send([1, fake.requests[2][1], None,
                   {"device": "cpu:0", "outputs": [out], "time_us": 1}])
        np.testing.assert_array_equal(f3.result(10), [1, 2])
    finally:
        c.close()
        fake.close()


# ---- F: a staged result canceled -------------------------------------------------------

def test_canceled_staged_result_frees_its_temporary(monkeypatch):
    """A result larger than max_message goes into a temporary buffer; canceling its
    future left that buffer to the connection for good."""
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "0")  # the socket's path only
    d = Daemon(["--max-message", "256K"])
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            a = np.ones((300, 2), np.float32)
            b = np.ones((2, 300), np.float32)  # a 360 KB result
            for _ in range(5):
                f = c.submit("gemm", a, b)
                f.cancel()
            assert mine(c)["buffers"] == 0
            for _ in range(3):
                np.testing.assert_array_equal(c.submit("gemm", a, b).result(TIMEOUT), a @ b)
            assert mine(c)["buffers"] == 0
    finally:
        d.stop()


# ---- G: KeyboardInterrupt in the middle of a message -------------------------------

@pytest.fixture()
def alarm_interrupts():
    def on_alarm(*_):
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGALRM, on_alarm)
    yield lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def test_interrupt_cutting_a_request_closes_the_connection(fresh_daemon, monkeypatch,
                                                           alarm_interrupts):
    """Ctrl-C while a request was half written left the stream inside it: the next
    request was swallowed as its rest and its call hung.  Now dspk.Closed."""
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "0")
    c = dspk.connect(fresh_daemon.socket, timeout=TIMEOUT)
    x = np.ones((1024, 1024))  # 8 MiB: far more than the socket's buffer
    os.kill(fresh_daemon.proc.pid, signal.SIGSTOP)
    try:
        alarm_interrupts(0.3)
        with pytest.raises(KeyboardInterrupt):
            c.reduce(x)
    finally:
        os.kill(fresh_daemon.proc.pid, signal.SIGCONT)
    with pytest.raises(dspk.Closed, match="cut after .* by KeyboardInterrupt"):
        c.ping()
    c.close()
    with dspk.connect(fresh_daemon.socket, timeout=TIMEOUT) as c2:
        assert c2.reduce(x) == x.size


def test_interrupt_while_waiting_keeps_the_connection(fresh_daemon, alarm_interrupts):
    """Ctrl-C while waiting for an answer cuts nothing: the connection stays usable
    (the abandoned answer is dropped when it comes)."""
    c = dspk.connect(fresh_daemon.socket, timeout=TIMEOUT)
    os.kill(fresh_daemon.proc.pid, signal.SIGSTOP)
    try:
        alarm_interrupts(0.2)
        with pytest.raises(KeyboardInterrupt):
            c.reduce(np.ones(5))  # sent whole; the daemon cannot answer
    finally:
        os.kill(fresh_daemon.proc.pid, signal.SIGCONT)
    assert c.reduce(np.ones(6)) == 6.0
    c.ping()
    c.close()


@pytest.mark.parametrize("nth", [1, 2])
def test_interrupt_while_reading_an_answer_closes_the_connection(client, nth):
    """An exception after bytes of an answer were taken from the socket (a signal
    handler's KeyboardInterrupt) lost them: later calls hung or failed with msgpack's
    errors.  One that comes out of the receive call itself, as here (the wrapper's
    recv_into took bytes and raises), leaves how many unknown: the connection is
    closed, dspk.Closed at once.  (One that comes as the real call returns cuts
    nothing: test_interrupt_points.py.)"""
    x = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: read in place, several recvs
    d = client.to_device(x, "cpu:0")
    sock = InterruptingSocket(client._sock)
    client._sock = sock
    sock.recv_left = nth
    with pytest.raises(KeyboardInterrupt):
        d.numpy()
    with pytest.raises(dspk.Closed, match="KeyboardInterrupt while an answer was being read"):
        client.ping()
    with pytest.raises(dspk.Closed):
        client.submit("reduce", np.ones(3)).result(TIMEOUT)


class Boom(Exception):
    """What a signal handler of the caller's raises."""


class HandlerSocket:
    """Wraps a client's socket: recv_into, once it took bytes, or sendmsg, before
    sending anything, runs ``handler`` as a signal handler runs while the process is
    in (or returns from) that system call: an exception it raises comes out of the
    call, from the handler's own frame."""

    def __init__(self, sock, handler, where):
        self._s = sock
        self.handler = handler
        self.where = where

    def __getattr__(self, name):
        return getattr(self._s, name)

    def recv_into(self, *args):
        n = self._s.recv_into(*args)
        if self.where == "recv" and n > 0:
            self.where = None
            self.handler()
        return n

    def sendmsg(self, *args):
        if self.where == "send":
            self.where = None
            self.handler()
        return self._s.sendmsg(*args)


@pytest.mark.parametrize("exc", [Boom("mine"), TimeoutError("my own deadline"),
                                 ValueError("mine"), ConnectionResetError("mine")])
@pytest.mark.parametrize("where", ["recv", "send"])
def test_a_signal_handlers_exception_propagates_as_it_is(client, exc, where):
    """An exception a signal handler raised while an answer was being received was
    taken for undecodable data (dspk.Closed "undecodable data ... (Boom: )"), and an
    OSError one (TimeoutError) raised while sending for a lost connection (dspk.Closed
    "connection to dspkd lost while sending").  python.md: it propagates as it is;
    the connection is closed when a message was cut (bytes of an answer taken, or a
    send system call interrupted), so later calls raise dspk.Closed naming it."""
    x = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: read in place, several recvs
    d = client.to_device(x, "cpu:0")

    def handler():
        raise exc

    client._sock = HandlerSocket(client._sock, handler, where)
    with pytest.raises(type(exc)) as e:
        d.numpy()
    assert e.value is exc
    with pytest.raises(dspk.Closed, match=type(exc).__name__):
        client.ping()


def test_a_signal_handlers_exception_while_waiting_to_send(client, monkeypatch):
    """A handler's TimeoutError raised while the client waits (poll) for room to send
    cut nothing: it propagates as it is and the connection stays usable."""
    import dspk._client as impl
    real_poll = impl.select.poll

    class Poll:
        def __init__(self):
            self.p = real_poll()

        def register(self, *a):
            self.p.register(*a)

        def poll(self, *a):
            raise TimeoutError("my own deadline")

    class Full:
        """A socket whose first sendmsg finds no room (as a daemon that reads no more)."""

        def __init__(self, sock):
            self._s = sock
            self.full = True

        def __getattr__(self, name):
            return getattr(self._s, name)

        def sendmsg(self, *args):
            if self.full:
                self.full = False
                monkeypatch.setattr(impl.select, "poll", Poll)
                # EAGAIN as the socket's own sendmsg raises it: its traceback ends in
                # the client's frame that called it, not in a handler's.
                raise BlockingIOError(errno.EAGAIN, "full").with_traceback(
                    types.TracebackType(None, sys._getframe(1), 0, 0))
            return self._s.sendmsg(*args)

    real = client._sock
    client._sock = Full(real)
    with pytest.raises(TimeoutError, match="my own deadline") as e:
        client.ping(b"x" * 100)
    assert not isinstance(e.value, dspk.Error)
    monkeypatch.setattr(impl.select, "poll", real_poll)
    client._sock = real
    assert client.ping(b"y") >= 0 and not client.closed


def test_undecodable_answer_is_closed_not_a_msgpack_error(tmp_path):
    """An answer msgpack cannot decode as the protocol's (an int map key) escaped as
    msgpack's ValueError and killed the reader; now every call ends with Closed."""
    fake = FakeDaemon(str(tmp_path / "fake.sock"))
    c = dspk.connect(fake.path, timeout=TIMEOUT)
    fut = c.submit("reduce", np.ones(3))
    assert fake.got.wait(TIMEOUT)
    fake.send([1, fake.requests[-1][1], None, {1: 2}])
    assert isinstance(fut.exception(10), dspk.Closed)
    with pytest.raises(dspk.Closed, match="undecodable data"):
        c.ping()
    fake.close()
    c.close()


# ---- J: collected shared arrays freed at once ----------------------------------------

def test_collected_shared_array_is_freed_while_idle(daemon):
    """The buffer.free of a collected shared array waited for the client's next
    request: an idle client kept the daemon's buffer (and memory) for ever."""
    with dspk.connect(daemon.socket, name="holder", timeout=TIMEOUT) as c, \
            dspk.connect(daemon.socket, name="watcher", timeout=TIMEOUT) as watch:
        def held():
            return [x["buffers"] for x in watch.status()["clients"]
                    if x["id"] == c.client_id][0]
        a = c.empty_shared((1 << 18,), np.float32)
        a[:] = 1
        assert held() == 1
        del a
        gc.collect()
        assert not c._dead_shared
        # The daemon's answer to that buffer.free (msgid 0) says it is done; nothing
        # else was asked on this connection.
        r, _, _ = select.select([c._sock], [], [], TIMEOUT)
        assert r
        assert held() == 0


def test_collected_while_another_thread_sends(client):
    """Collected while another thread holds the send lock: that thread sends the
    buffer.free when it lets the lock go, not the next request."""
    a = client.empty_shared(1000, np.float32)
    sock = InterruptingSocket(client._sock)
    client._sock = sock
    entered, go = threading.Event(), threading.Event()
    sock.block_send = (entered, go)
    t = threading.Thread(target=client.ping)
    t.start()
    assert entered.wait(TIMEOUT)        # the ping holds the send lock
    buf = [b for b in client._shared][-1]
    del a
    gc.collect()
    # could not send: queued (the collected array's _SharedRef, holding its buffer)
    assert [getattr(x, "buffer", x) for x in client._dead_shared] == [buf]
    go.set()
    t.join(TIMEOUT)
    assert not t.is_alive()
    assert client._dead_shared == []
    frees = [msgpack.unpackb(f) for f in sock.sent if b"buffer.free" in f]
    assert frees == [[0, 0, "buffer.free", [{"buffer": buf}]]]


def test_done_callback_added_to_a_done_future(client, caplog):
    """python.md said an exception of a done-callback added to a future already done
    propagates from add_done_callback(); it is logged, as concurrent.futures does, and
    only a BaseException that is no Exception propagates (the docs say so now)."""
    f = client.submit("reduce", np.ones(4))
    assert f.result(TIMEOUT) == 4

    def boom(_):
        raise ValueError("from the callback")

    def stop(_):
        raise KeyboardInterrupt()
    with caplog.at_level("ERROR", logger="concurrent.futures"):
        f.add_done_callback(boom)    # returns normally
    assert any("from the callback" in (r.exc_text or "") or
               (r.exc_info and "from the callback" in str(r.exc_info[1]))
               for r in caplog.records), caplog.records
    with pytest.raises(KeyboardInterrupt):
        f.add_done_callback(stop)
