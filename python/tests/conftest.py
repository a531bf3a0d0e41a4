"""pytest fixtures: a real dspkd on a temporary socket.

The daemon is $DSPKD (the ctest passes the one it built); each fixture starts it with
--foreground --ready-fd and waits for READY (never a sleep), and stops it with SIGTERM
expecting exit status 0.  Extra flags for every daemon: $DSPKD_ARGS.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from typing import Iterator, List, Optional

import pytest

# The daemon helpers of the repository's other end-to-end tests: tests/common,
# named by $DSPK_TESTS_COMMON where these tests run from a copy of python/
# (tests/python/run.sh).
sys.path.insert(0, os.environ.get("DSPK_TESTS_COMMON") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "common"))
import dspk_daemon  # noqa: E402

TIMEOUT = 60.0

# A fake daemon's hello limits: every limit protocol.md's table of results has for
# hello (each required: the client refuses an answer without one).
LIMITS = {"max_message": 1 << 20, "max_depth": 16, "max_objects": 65536, "max_rank": 8,
          "max_elements": 1 << 31, "max_inflight": 1024, "max_unsent": 64 << 20,
          "max_buffers": 4096, "max_clients": 256, "cpu_memory_quota": 1 << 34}


class Daemon:
    """A dspkd of the tests on its own socket."""

    def __init__(self, extra: Optional[List[str]] = None) -> None:
        exe = os.environ.get("DSPKD")
        if not exe:
            pytest.fail("set DSPKD to the dspkd binary (the ctest python.* does)")
        self.dir = tempfile.mkdtemp(prefix="dspk-py-")
        self.socket = os.path.join(self.dir, "dspkd.sock")
        self.logpath = os.path.join(self.dir, "dspkd.log")
        extra = list(extra or []) + shlex.split(os.environ.get("DSPKD_ARGS", ""))
        with open(self.logpath, "w") as log:
            self.proc = dspk_daemon.start(dspk_daemon.cmdline(exe, self.socket, extra), TIMEOUT,
                                          stderr=log, stdout=log)
        if not self.proc:
            pytest.fail("dspkd did not become ready:\n" + self.log())

    def log(self) -> str:
        with open(self.logpath) as f:
            return f.read()

    def stop(self, expect_rc: Optional[int] = 0) -> None:
        rc = dspk_daemon.stop(self.proc, TIMEOUT)
        if rc is None:
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
