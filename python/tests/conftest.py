"""pytest fixtures: a real dspkd on a temporary socket.

The daemon is $DSPKD (the ctest passes the one it built); each fixture starts it with
--foreground --ready-fd and waits for READY (never a sleep), and stops it with SIGTERM
expecting exit status 0.  Extra flags for every daemon: $DSPKD_ARGS.
"""
from __future__ import annotations

import os
import select
import shlex
import shutil
import signal
import subprocess
import tempfile
from typing import Iterator, List, Optional

import pytest

TIMEOUT = 60.0


class Daemon:
    """A dspkd of the tests on its own socket."""

    def __init__(self, extra: Optional[List[str]] = None) -> None:
        exe = os.environ.get("DSPKD")
        if not exe:
            pytest.fail("set DSPKD to the dspkd binary (the ctest python.* does)")
        self.dir = tempfile.mkdtemp(prefix="dspk-py-")
        self.socket = os.path.join(self.dir, "dspkd.sock")
        self.logpath = os.path.join(self.dir, "dspkd.log")
        extra = list(extra or [])
        args = [exe, "--foreground", "--socket", self.socket, "--log-level", "debug"]
        if "--cache" not in extra:
            args += ["--no-cache"]  # never the user's ~/.cache
        if "--backends" not in extra:
            args += ["--backends", "cpu"]
        args += extra + shlex.split(os.environ.get("DSPKD_ARGS", ""))
        r, w = os.pipe()
        args += ["--ready-fd", str(w)]
        with open(self.logpath, "w") as log:
            self.proc = subprocess.Popen(args, pass_fds=[w], stderr=log, stdout=log)
        os.close(w)
        ready, _, _ = select.select([r], [], [], TIMEOUT)
        data = os.read(r, 16) if ready else b""
        os.close(r)
        if data != b"READY\n":
            self.proc.kill()
            self.proc.wait()
            pytest.fail("dspkd did not become ready:\n" + self.log())

    def log(self) -> str:
        with open(self.logpath) as f:
            return f.read()

    def stop(self, expect_rc: Optional[int] = 0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail("dspkd did not stop on SIGTERM:\n" + self.log())
        if expect_rc is not None and rc != expect_rc:
            pytest.fail("dspkd exited with %s:\n%s" % (rc, self.log()))
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """One cpu-only daemon shared by the tests that do not stop it."""
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture()
def client(daemon: Daemon):
    import dspk
    with dspk.connect(daemon.socket, name="pytest", timeout=TIMEOUT) as c:
        yield c


@pytest.fixture()
def fresh_daemon() -> Iterator[Daemon]:
    """A daemon of one test (it may be killed by the test)."""
    d = Daemon()
    yield d
    d.stop(expect_rc=None)
