"""The automatic shared-memory path and waiting: a dspk.Timeout making a shared
temporary ends the call (no fallback to the socket), and submit() never waits for a
buffer.import of its own making."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import dspk
from conftest import TIMEOUT


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
    monkeypatch.setattr(c, "_wait", lambda fut: (waits.append(fut.msgid), wait(fut))[1])
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
