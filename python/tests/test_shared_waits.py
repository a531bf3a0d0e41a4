"""The automatic shared-memory path and waiting: a dspk.Timeout making a shared
temporary ends the call (no fallback to the socket), submit() never waits for a
buffer.import of its own making, and a submit() whose operand or result needs a
temporary buffer (beyond max_message) is done by the client's worker thread."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import dspk
from conftest import TIMEOUT, Daemon


def test_a_timeout_making_a_shared_temporary_ends_the_call(fresh_daemon):
    """A daemon that answers nothing (SIGSTOP): the shared temporary's buffer.import
    timed out, the client fell back to sending the 2 MiB operand inline, which timed
    out again part-way and closed the connection (twice the timeout, the connection
    lost).  Now the call raises the import's dspk.Timeout and the connection stays
    usable."""
    c = dspk.connect(fresh_daemon.socket, timeout=1.0)
    c2 = dspk.connect(fresh_daemon.socket, timeout=1.0)
    big = np.ones(1 << 18)                    # 2 MiB: above the 1 MiB threshold
    os.kill(fresh_daemon.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(dspk.Timeout) as e:
            c.reduce(big, device="cpu:0")
        assert "closed" not in e.value.message, e.value.message
        assert not c.closed
        # device="any" on a client that has not asked yet whether "any" is cpu:0:
        # that devices call timed out, and the operand went inline all the same
        with pytest.raises(dspk.Timeout) as e:
            c2.reduce(big)
        assert "closed" not in e.value.message, e.value.message
        assert not c2.closed
    finally:
        os.kill(fresh_daemon.proc.pid, signal.SIGCONT)
    c2.timeout = TIMEOUT
    assert c2.reduce(big) == 1 << 18
    c2.close()
    c.timeout = TIMEOUT
    assert c.ping() > 0 and c.reduce(big, device="cpu:0") == 1 << 18
    c.close()


def test_submit_never_waits_for_a_shared_temporary(fresh_daemon, monkeypatch):
    """submit() with a large operand and no idle shared temporary made one, waiting
    for its buffer.import (queued behind the device's earlier tasks): against a daemon
    that answers nothing it raised dspk.Timeout.  Now it sends the operand in the
    request and returns at once; an idle temporary is still used."""
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "16K")
    c = dspk.connect(fresh_daemon.socket, timeout=2.0)
    sent, waits = [], []
    start, wait = c._start, c._wait
    monkeypatch.setattr(c, "_start", lambda method, *a, **k: (sent.append(method),
                                                                start(method, *a, **k))[1])
    monkeypatch.setattr(c, "_wait", lambda fut, *a: (waits.append(fut.msgid), wait(fut, *a))[1])
    x = np.ones(1 << 12)                          # 32 KiB: fits the socket's buffer
    os.kill(fresh_daemon.proc.pid, signal.SIGSTOP)
    try:
        # each waited for a buffer.import the daemon does not answer, then fell back
        f = c.submit("reduce", x, device="cpu:0")
        g = c.submit("map", "scale", x, alpha=3.0, device="cpu:0")  # a 32 KiB result
        assert sent == ["task.run", "task.run"] and not waits, (sent, waits)
        assert not c._temps                       # none made
    finally:
        os.kill(fresh_daemon.proc.pid, signal.SIGCONT)
    assert f.result(TIMEOUT) == 1 << 12
    np.testing.assert_array_equal(g.result(TIMEOUT), np.full(1 << 12, 3.0))
    # A synchronous call still makes temporaries; submit() then uses the idle ones.
    c.timeout = TIMEOUT
    assert c.reduce(x, device="cpu:0") == 1 << 12
    made = [t.buffer for t in c._temps]
    assert made
    h = c.submit("reduce", 2 * x, device="cpu:0")
    assert h.result(TIMEOUT) == 2 << 12
    assert sorted(t.buffer for t in c._temps) == sorted(made)
    c.close()


# ---- submit() and staged temporaries: the worker thread ------------------------------

BIG = 300000          # float64 elements: 2.4 MB, beyond a 1 MiB max_message (staged)


def _returns(fn, *args, **kwargs):
    """fn(*args, **kwargs) on another thread: (its value, whether it returned within
    10 s); a call that waits for the stopped daemon does not."""
    box, done = [], threading.Event()

    def go():
        try:
            box.append(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001
            box.append(e)
        done.set()
    threading.Thread(target=go, daemon=True).start()
    ok = done.wait(10)
    return (box[0] if box else None), ok


def _mine(c):
    return [x for x in c.status()["clients"] if x["self"]][0]


@pytest.fixture()
def small_message(monkeypatch):
    """A daemon whose max_message (1 MiB) stages a 2.4 MB operand or result; the
    socket's path only (no shared temporaries)."""
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "0")
    d = Daemon(["--max-message", "1M"])
    yield d
    os.kill(d.proc.pid, signal.SIGCONT)
    d.stop(expect_rc=None)


def test_submit_does_not_wait_for_a_staged_temporary(small_message):
    """An operand beyond max_message is staged (buffer.create, buffer.write) and a result
    beyond it needs a temporary buffer (buffer.create): submit() waited for those
    answers, which the daemon gives behind the device's earlier tasks, so against a
    stopped daemon it did not return.  Now the worker thread does them: submit()
    returns at once, and the futures complete once the daemon answers."""
    c = dspk.connect(small_message.socket, timeout=TIMEOUT)
    x = np.arange(BIG, dtype=np.float64)
    v = np.arange(600, dtype=np.float64)
    os.kill(small_message.proc.pid, signal.SIGSTOP)
    try:
        f, ok = _returns(c.submit, "map", "scale", x, alpha=2.0)
        assert ok and isinstance(f, dspk.TaskFuture), f
        g, ok = _returns(c.submit, "contract", "i,j->ij", v, v)   # a 2.9 MB result
        assert ok and isinstance(g, dspk.TaskFuture), g
        h, ok = _returns(c.submit, "reduce", np.ones(4))  # after them, in order
        assert ok and isinstance(h, dspk.TaskFuture), h
        assert not (f.done() or g.done() or h.done())
        x[:] = -1   # submit() took a copy: the caller may write its array at once
    finally:
        os.kill(small_message.proc.pid, signal.SIGCONT)
    np.testing.assert_array_equal(f.result(TIMEOUT), 2 * np.arange(BIG, dtype=np.float64))
    np.testing.assert_array_equal(g.result(TIMEOUT), np.outer(v, v))
    assert h.result(TIMEOUT) == 4
    assert f.msgid and g.msgid and h.msgid
    assert _mine(c)["buffers"] == 0   # the temporaries went
    c.close()


def test_submit_keeps_the_order_of_requests(small_message):
    """A submit() handed to the worker is sent before the requests made after it: a
    later submit() (inline), a DeviceArray's numpy() and free() follow its task."""
    with dspk.connect(small_message.socket, timeout=TIMEOUT) as c:
        x = np.arange(BIG, dtype=np.float64)
        for _ in range(3):
            o = c.empty(BIG, np.float64)
            f = c.submit("map", "scale", x, alpha=3.0, out=o)   # staged: the worker's
            g = c.submit("reduce", o, "max")                     # reads what f wrote
            np.testing.assert_array_equal(o.numpy(), 3 * x)      # a synchronous read
            assert g.result(TIMEOUT) == 3 * (BIG - 1)
            assert f.result(TIMEOUT) is o
            d = c.to_device(x)
            f = c.submit("map", "add", d, x)                     # x staged, d referenced
            d.free()                                             # after the task
            np.testing.assert_array_equal(f.result(TIMEOUT), 2 * x)
            o.free()
        assert _mine(c)["buffers"] == 0


def test_submit_failures_of_the_worker_go_to_the_future(monkeypatch):
    """A quota that refuses the temporary buffer raised dspk.LimitExceeded from submit()
    itself; now the future ends with it (and submit() returned it)."""
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "0")
    d = Daemon(["--max-message", "1M", "--max-user-memory", "1M"])
    try:
        with dspk.connect(d.socket, timeout=TIMEOUT) as c:
            f = c.submit("map", "scale", np.ones(BIG), alpha=2.0)
            g = c.submit("contract", "i,j->ij", np.ones(600), np.ones(600))
            assert isinstance(f.exception(TIMEOUT), dspk.LimitExceeded), f.exception()
            assert isinstance(g.exception(TIMEOUT), dspk.LimitExceeded), g.exception()
            assert c.submit("reduce", np.ones(4)).result(TIMEOUT) == 4  # usable
            # arguments are still checked by submit() itself
            with pytest.raises(dspk.InvalidArgument):
                c.submit("map", "scale", np.ones(BIG), alpha="2")
    finally:
        d.stop()


def test_close_ends_the_worker_futures(small_message):
    """close() with submit()s with the worker (the daemon stopped): it returns at once,
    and every one of their futures ends with dspk.Closed."""
    c = dspk.connect(small_message.socket)    # timeout=None: the worker waits for ever
    os.kill(small_message.proc.pid, signal.SIGSTOP)
    futs = []
    for args in [("map", "scale", np.ones(BIG))] * 3 + [("reduce", np.ones(4))]:
        f, ok = _returns(c.submit, *args)
        assert ok and isinstance(f, dspk.TaskFuture), f
        futs.append(f)
    _, ok = _returns(c.close)
    assert ok
    for f in futs:
        assert isinstance(f.exception(TIMEOUT), dspk.Closed), f.exception()
    with pytest.raises(dspk.Closed):
        c.submit("map", "scale", np.ones(BIG))


def test_exit_with_worker_futures_pending(small_message):
    """The interpreter's exit does not wait for the worker, which waits for a stopped
    daemon."""
    code = r"""
import sys, numpy as np, dspk
c = dspk.connect(sys.argv[1])
print("connected", flush=True)
sys.stdin.readline()
f = c.submit("map", "scale", np.ones(300000), alpha=2.0)
print("submitted", f.done(), flush=True)
"""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(dspk.__file__)))
    p = subprocess.Popen([sys.executable, "-c", code, small_message.socket],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline() == "connected\n"
        os.kill(small_message.proc.pid, signal.SIGSTOP)
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.wait(TIMEOUT) == 0
        assert p.stdout.read() == "submitted False\n"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_cancel_futures_with_the_worker(small_message):
    """Futures of submit()s the worker has not sent yet are canceled at once
    (future.cancel(), c.cancel()); no buffer is left behind."""
    c = dspk.connect(small_message.socket, timeout=TIMEOUT)
    x = np.ones(BIG)
    os.kill(small_message.proc.pid, signal.SIGSTOP)
    try:
        futs = []
        for _ in range(3):   # the first one the worker works on, the others queued
            f, ok = _returns(c.submit, "map", "scale", x, alpha=2.0)
            assert ok and isinstance(f, dspk.TaskFuture), f
            futs.append(f)
        assert futs[0].cancel() and futs[0].cancelled()
        assert c.cancel(futs[1]) is True
        assert isinstance(futs[1].exception(0), dspk.Canceled)
    finally:
        os.kill(small_message.proc.pid, signal.SIGCONT)
    np.testing.assert_array_equal(futs[2].result(TIMEOUT), 2 * x)
    assert c.cancel(futs[2]) is False     # done: nothing to cancel
    assert _mine(c)["buffers"] == 0       # after the worker's requests: none left
    c.close()


def test_submit_does_not_wait_for_the_devices_call(fresh_daemon, monkeypatch):
    """The first submit() of a connection with a large operand on device "any" asked
    the daemon whether "any" is cpu:0 (a devices call) and waited for the answer: against
    a stopped daemon it raised dspk.Timeout.  Now it sends that call without waiting,
    its operand goes through the socket, and later calls use the answer."""
    monkeypatch.setenv("DSPK_SHARED_THRESHOLD", "16K")
    c = dspk.connect(fresh_daemon.socket, timeout=2.0)
    x = np.ones(1 << 12)                          # 32 KiB: fits the socket's buffer
    os.kill(fresh_daemon.proc.pid, signal.SIGSTOP)
    try:
        f, ok = _returns(c.submit, "reduce", x)
        assert ok and isinstance(f, dspk.TaskFuture), f
        assert not c._temps
    finally:
        os.kill(fresh_daemon.proc.pid, signal.SIGCONT)
    assert f.result(TIMEOUT) == 1 << 12
    c.timeout = TIMEOUT
    assert c.reduce(x) == 1 << 12
    assert c._any_is_cpu is True                  # learnt from that answer
    c.close()
