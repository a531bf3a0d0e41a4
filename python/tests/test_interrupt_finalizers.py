"""Interruptions while a shared array is collected, and while a TaskFuture is waited on
inside concurrent.futures' own code (python.md, Interruptions).

As in test_interrupt_points, a profile function raises KeyboardInterrupt at the n-th
point where CPython runs a signal handler (a C call returning, a Python function
starting), here in the standard library's code on the path too (weakref.finalize,
threading.Condition, concurrent.futures.Future), for every n until the path runs
through uninterrupted.  A weakref.finalize callback's exception is swallowed by Python
("Exception ignored in: <finalize ...>"): there the buffer.free it owed was lost.  A
KeyboardInterrupt right after Condition.__enter__ took a future's lock left that lock
held for good, and the thread completing the future (reader, worker) blocked on it for
ever.
"""
from __future__ import annotations

import concurrent.futures
import gc
import os
import sys
import threading
import weakref

import numpy as np
import pytest

import dspk
from conftest import TIMEOUT

PKG = os.path.dirname(os.path.abspath(dspk.__file__))
WEAKREF_FILE = os.path.abspath(weakref.__file__)
THREADING_FILE = os.path.abspath(threading.__file__)
FUTURES_FILE = os.path.abspath(concurrent.futures._base.__file__)


class _Injected(KeyboardInterrupt):
    """The simulated signal handler's exception."""


def _interrupt_at(n, files):
    """A profile function raising _Injected at the n-th point (0-based) in ``files``
    where a signal handler could run: a C call returning, a Python function starting.
    Returns (the function, a list that counts the points)."""
    seen = [0]

    def prof(frame, event, arg):
        if event not in ("c_return", "call"):
            return
        if os.path.abspath(frame.f_code.co_filename) not in files:
            return
        seen[0] += 1
        if seen[0] == n + 1:
            raise _Injected()
    return prof, seen


def _held(c):
    """The daemon buffers of the connection."""
    return [x for x in c.status()["clients"] if x["self"]][0]["buffers"]


def test_an_interrupted_collection_of_a_shared_array_leaves_no_buffer(daemon):
    """Every point of a shared array's collection in turn: its buffer is freed by the
    next request, and the client works (before, the finalizer's own Python code could
    be cut: the buffer stayed for the connection's life)."""
    files = {WEAKREF_FILE, os.path.join(PKG, "_client.py")}
    c = dspk.connect(daemon.socket, timeout=TIMEOUT)
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        n = fired = 0
        while True:
            s = c.empty_shared(1024)
            s[:] = 1
            assert _held(c) == 1
            prof, seen = _interrupt_at(n, files)
            gc.disable()  # the collection is the del's alone
            sys.setprofile(prof)
            try:
                del s
            except _Injected:
                pass  # landed after the collection: it propagates
            finally:
                sys.setprofile(None)
                gc.enable()
            assert not c._send_lock.locked(), "the send lock stays held"
            assert c.ping(b"x", ) > 0
            assert _held(c) == 0, ("buffer left behind", n)
            assert not c._shared and not getattr(c, "_shared_refs", None)
            if seen[0] <= n:
                break  # the whole path ran: every point was tried
            fired += 1
            n += 1
        # the munmap of weakref.finalize's runs Python code: some points are there
        assert fired >= 2, fired
    finally:
        sys.unraisablehook = hook
        c.close()


def _as_completed(f):
    for _ in concurrent.futures.as_completed([f], 0.001):
        pass


@pytest.mark.parametrize("how", ["result", "exception", "wait", "as_completed"])
def test_a_future_completes_after_any_interrupted_wait(how):
    """A TaskFuture's wait (result(), exception(), concurrent.futures.wait() and
    as_completed()) interrupted at each point in turn (dspk's code, and
    concurrent.futures' and threading's under it), then completed by another thread:
    that thread never blocks for ever (before, an interruption right after
    Condition.__enter__ took the future's lock, or the lock of a waiter's Event,
    left it held, and set_result() waited for ever)."""
    files = {os.path.join(PKG, "_client.py"), THREADING_FILE, FUTURES_FILE}
    wait = {"result": lambda f: f.result(0.001),
            "exception": lambda f: f.exception(0.001),
            "wait": lambda f: concurrent.futures.wait([f], 0.001),
            "as_completed": _as_completed}[how]
    n = 0
    while True:
        f = dspk.TaskFuture()
        prof, seen = _interrupt_at(n, files)
        sys.setprofile(prof)
        try:
            wait(f)
        except (_Injected, concurrent.futures.TimeoutError):
            pass
        except RuntimeError:
            # threading.Condition.wait cut in the standard library's own waiter
            # (its Event): "release unlocked lock" chained to the interruption
            assert how in ("wait", "as_completed")
        finally:
            sys.setprofile(None)
        done = threading.Thread(target=f._finish, args=(n, None), daemon=True)
        done.start()
        done.join(TIMEOUT)
        assert not done.is_alive(), ("set_result() blocked", n)
        assert f.done() and f.result(TIMEOUT) == n
        if seen[0] <= n:
            break
        n += 1
    assert n > 3, n


def test_a_client_future_completes_after_any_interrupted_wait(daemon):
    """result() of a submit() interrupted at each point in turn: the future completes
    (by the reader thread, or by the next wait), and the client works."""
    files = {os.path.join(PKG, "_client.py"), THREADING_FILE, FUTURES_FILE}
    c = dspk.connect(daemon.socket, timeout=TIMEOUT)
    try:
        n = hit = 0
        a = np.ones(1000, np.float32)
        while True:
            f = c.submit("reduce", a)
            prof, seen = _interrupt_at(n, files)
            sys.setprofile(prof)
            try:
                f.result(TIMEOUT)
            except _Injected:
                hit += 1
            except dspk.Closed:
                c = dspk.connect(daemon.socket, timeout=TIMEOUT)  # a message was cut
                n += 1
                continue
            finally:
                sys.setprofile(None)
            assert f.result(TIMEOUT) == 1000, n
            assert c.ping() > 0
            if seen[0] <= n:
                break
            n += 1
        assert hit > 3, (hit, n)
    finally:
        c.close()


def test_a_call_interrupted_while_the_worker_runs_leaves_it_running():
    """A synchronous call made while submit()s are with the worker thread (a 64K
    max_message: the worker stages their operands), interrupted at each point in turn,
    the standard library's threading code included: the futures complete and the client
    works (before, an interruption right after Condition.__enter__ took the worker's
    lock (``with self._work_cond``) left it held, and the worker blocked for ever)."""
    from conftest import Daemon
    d = Daemon(["--max-message", "64K"])
    files = {os.path.join(PKG, "_client.py"), THREADING_FILE}
    c = dspk.connect(d.socket, timeout=TIMEOUT)
    try:
        big = np.ones((300, 300), np.float32)  # 360 KB: staged by the worker
        n = hit = 0
        while True:
            fs = [c.submit("map", "scale", big, alpha=2.0) for _ in range(3)]
            prof, seen = _interrupt_at(n, files)
            sys.setprofile(prof)
            try:
                c.ping()
            except _Injected:
                hit += 1
            except dspk.Closed:
                pass  # a message was cut: the connection is closed
            finally:
                sys.setprofile(None)
            try:
                for f in fs:
                    assert f.result(TIMEOUT)[0, 0] == 2.0
                assert c.ping() > 0
            except dspk.Closed:
                assert c.closed
                c = dspk.connect(d.socket, timeout=TIMEOUT)
            if seen[0] <= n:
                break
            n += 1
        assert hit > 10, (hit, n)
    finally:
        c.close()
        d.stop()
