#!/usr/bin/python3
"""Runs the real dspkd under the seccomp filter that the installed
dspkd.service asks systemd for, and checks that it starts and serves tasks
(gemm, fft, map through dspk-submit on cpu:0, vulkan:0, and cuda:0
and hip:0 where present) and stops with
exit 0.  The filter comes from the unit's SystemCallFilter= lines (groups
expanded with `systemd-analyze syscall-filter`), SystemCallErrorNumber=,
SystemCallArchitectures=native and RestrictAddressFamilies=AF_UNIX, applied
by seccomp_run (raw BPF); PID 1 is not systemd here, so systemd-run is not
an option.  A unit that filters a syscall dspkd or its libraries make
without SystemCallErrorNumber= kills dspkd with SIGSYS (the unit of
2026-12 denied @resources: OpenBLAS calls mbind at start).

    seccomp_unit.py --unit DSPKD.SERVICE --dspkd PATH --submit PATH
                    --seccomp-run PATH --cc COMPILER

Exits 77 when systemd-analyze is missing.  Needs python3-numpy."""
import argparse
import errno
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import dspk_daemon  # noqa: E402


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def unit_settings(path):
    """The [Service] lines that shape the filter, in order."""
    lines = []
    for raw in open(path):
        line = raw.strip()
        if line.startswith("#") or "=" not in line:
            continue
        key, val = line.split("=", 1)
        lines.append((key.strip(), val.strip()))
    return lines


_groups = {}


def expand(name):
    """A syscall name or @group, as a set of names (groups recursively)."""
    if not name.startswith("@"):
        return {name}
    if name not in _groups:
        out = subprocess.run(["systemd-analyze", "syscall-filter", name],
                             capture_output=True, text=True, check=True).stdout
        names = set()
        for line in out.splitlines()[1:]:
            w = line.strip()
            if not w or w.startswith("#"):
                continue
            names |= expand(w)
        _groups[name] = names
    return _groups[name]


def syscall_numbers(cc):
    out = subprocess.run([cc, "-dM", "-E", "-x", "c", "-"], input="#include <sys/syscall.h>\n",
                         capture_output=True, text=True, check=True).stdout
    nrs = {}
    for m in re.finditer(r"^#define __NR_(\w+) (\d+)$", out, re.M):
        nrs[m.group(1)] = int(m.group(2))
    return nrs


def filter_args(unit, cc):
    allow, mode, action, afunix = None, None, "kill", False
    for key, val in unit_settings(unit):
        if key == "SystemCallFilter":
            if val == "":
                allow, mode = None, None
                continue
            deny = val.startswith("~")
            names = set()
            for w in val.lstrip("~").split():
                names |= expand(w)
            if mode is None:
                mode = "deny" if deny else "allow"
                allow = set() if deny else expand("@default") | names
                if deny:
                    allow = names  # the deny list
                continue
            if (mode == "allow") == (not deny):
                allow |= names
            else:
                allow -= names
        elif key == "SystemCallErrorNumber":
            action = "kill" if val in ("", "kill") else str(getattr(errno, val))
        elif key == "RestrictAddressFamilies":
            afunix = val == "AF_UNIX"
    if mode != "allow":
        fail("the unit has no SystemCallFilter= allow list (this test expects one)")
    nrs = syscall_numbers(cc)
    listed = sorted({nrs[n] for n in allow if n in nrs})
    return [action, ",".join(map(str, listed))] + (["--af-unix"] if afunix else [])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", required=True)
    ap.add_argument("--dspkd", required=True)
    ap.add_argument("--submit", required=True)
    ap.add_argument("--seccomp-run", required=True)
    ap.add_argument("--cc", required=True)
    a = ap.parse_args()
    if not shutil.which("systemd-analyze"):
        print("systemd-analyze missing")
        return 77
    sargs = filter_args(a.unit, a.cc)
    print("filter: action %s, %d syscalls allowed%s" % (
        sargs[0], sargs[1].count(",") + 1, ", AF_UNIX only" if len(sargs) > 2 else ""))
    tmp = tempfile.mkdtemp(prefix="dspk-seccomp-")
    try:
        sock = os.path.join(tmp, "s.sock")
        log = open(os.path.join(tmp, "dspkd.log"), "w+")
        # Every backend: cpu and vulkan (lavapipe in CI), cuda and hip where
        # this host has them (one asked for without a device is a warning).
        cmd = [a.seccomp_run] + sargs + ["--"] + dspk_daemon.cmdline(
            a.dspkd, sock, backends="cpu,vulkan,cuda,hip")
        proc = dspk_daemon.start(cmd, 60, stdout=log, stderr=subprocess.STDOUT)
        if proc is None:
            log.seek(0)
            fail("dspkd did not become ready under the unit's filter; log:\n" + log.read()[-4000:])
        rng = np.random.default_rng(7)
        A = rng.standard_normal((8, 5)).astype(np.float32)
        B = rng.standard_normal((5, 6)).astype(np.float32)
        X = (rng.standard_normal(16) + 1j * rng.standard_normal(16)).astype(np.complex64)
        for name, v in (("a", A), ("b", B), ("x", X)):
            np.save(os.path.join(tmp, name + ".npy"), v)
        p = lambda n: os.path.join(tmp, n)  # noqa: E731
        devs = ["cpu:0"]
        out = subprocess.run([a.submit, "--socket", sock, "devices"], capture_output=True,
                             text=True, timeout=60).stdout
        for dev in ("vulkan:0", "cuda:0", "hip:0"):
            if re.search(r"\b%s\b" % re.escape(dev), out):
                devs.append(dev)
        if "vulkan:0" not in devs:
            print("no vulkan:0 device")
        cases = [("gemm", ["gemm", p("a.npy"), p("b.npy")], A.astype(np.float64) @ B),
                 ("fft", ["fft", p("x.npy")], np.fft.fft(X.astype(np.complex128))),
                 ("map", ["map", "add", p("a.npy"), p("a.npy")], 2.0 * A)]
        for dev in devs:
            for what, args, ref in cases:
                o = p("out.npy")
                if os.path.exists(o):
                    os.unlink(o)
                r = subprocess.run([a.submit, "--socket", sock] + args + ["--device", dev, "-o", o],
                                   capture_output=True, text=True, timeout=120)
                if r.returncode != 0:
                    log.seek(0)
                    fail("%s on %s: exit %d: %s\ndspkd log:\n%s" % (
                        what, dev, r.returncode, r.stderr, log.read()[-4000:]))
                got = np.load(o)
                err = np.max(np.abs(got - ref)) / max(1.0, np.max(np.abs(ref)))
                if err > 1e-4:
                    fail("%s on %s: max relative error %g" % (what, dev, err))
                print("%s on %s: ok" % (what, dev))
        rc = dspk_daemon.stop(proc, 60)
        if rc != 0:
            log.seek(0)
            fail("dspkd exit status %s (159 or -31: SIGSYS); log:\n%s" % (rc, log.read()[-4000:]))
        print("dspkd under the unit's seccomp filter: ok")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
