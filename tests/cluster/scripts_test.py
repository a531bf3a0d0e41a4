#!/usr/bin/env python3
"""cluster.scripts: the packaged Slurm prolog and epilog (build/packaging/slurm/) on their
own, with a stand-in dspk-submit that prints its arguments (docs/cluster.md):

- installed in a tree (LIBEXECDIR/dspk/slurm, BINDIR/dspk-submit, as configured) they run
  that tree's dspk-submit also when slurm.conf names a link to them at another depth
  (Prolog=/etc/slurm/prolog.d/*: absolute, relative and chained links); a copy of a script
  elsewhere finds none and says so (exit 127), as does a DSPK_SUBMIT that is no executable
  file (the message names the variable); the epilog without a daemon runs that tree's
  dspkd (SBINDIR/dspkd, a stand-in that records its arguments) with DSPK_DSPKD_OPTIONS,
  --socket SOCKET and --end-job, or DSPK_DSPKD's;
- the map file's # starts a comment anywhere on a line (`0 UUID#card A` maps 0 to UUID),
  a CR at a line's end is dropped; a line of the index with no UUID (only a comment) fails
  naming FILE:LINE, also before a good line, and two lines giving it two UUIDs fail naming
  both (exit 1); a copy's messages name the tree's paths without ".."; every other line
  must be "INDEX UUID" (a decimal index without a leading zero, dspkd's UUID syntax,
  nothing more), else the prolog fails naming it (strict_map);
- dspk-submit failing: one line, the script and the job first, a GPU named by its index
  (submit_fails);
- an exit 0 counts only with its answer for the job: dspk-submit's JSON, and dspkd
  --end-job's line as the last on its stdout (answers);
- SLURM_JOB_ID (and the prolog's SLURM_JOB_UID) unset or empty, or a SLURM_JOB_ID that
  is no job id (abc, 0, 05, " 5", 2^64): exit 2 with the scripts' own line, before
  dspk-submit or dspkd runs;
- DSPK_PROLOG_TIMEOUT / DSPK_EPILOG_TIMEOUT take whole seconds from 1 (unset or empty:
  120); 0, fractions, suffixes, signs and values over 999999999 are refused with one line
  (exit 2) before dspk-submit runs.
The timeouts themselves run out in cluster.epilog (a listener that never answers).  Needs
neither root, Slurm nor a daemon.

    scripts_test.py --build BUILD_DIR --libexecdir FULL_LIBEXECDIR --bindir FULL_BINDIR
                    --sbindir FULL_SBINDIR
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from dspk_rpc import check  # noqa: E402

TIMEOUT = 60
ARGS_DIR = None  # main() sets it: where the stand-in dspk-submit writes its arguments
# The stand-in dspk-submit: its arguments, a line each, in $FAKE_ARGS (run() reads them
# into p.args), and on stdout the answer dspk-submit --json prints for them, which the
# scripts require: job.register's or job.end's for the job (and uid) of the arguments.
# FAKE_ANSWER, when set, is printed instead; FAKE_FAIL, when set, is printed on stderr
# instead and the exit status is FAKE_RC (dspk-submit failing).
FAKE = r"""#!/bin/sh
for a; do printf '%s\n' "$a"; done > "$FAKE_ARGS"
if [ -n "${FAKE_ANSWER+set}" ]; then printf '%s' "$FAKE_ANSWER"; exit 0; fi
if [ -n "${FAKE_FAIL+set}" ]; then printf '%s' "$FAKE_FAIL" >&2; exit "$FAKE_RC"; fi
job= uid= sub= prev=
for a; do
  case $prev in --job) job=$a ;; --uid) uid=$a ;; esac
  case $a in register | end) sub=$a ;; esac
  prev=$a
done
if [ "$sub" = register ]; then
  printf '{"job":%s,"uid":%s,"devices":["cpu:0"]}\n' "$job" "$uid"
else
  printf '{"job":%s,"ended":false}\n' "$job"
fi
"""
# The stand-in dspkd: its socket variable and arguments, a line each, in PATH.args.
FAKE_DSPKD = ("#!/bin/sh\nprintf '%s\\n' \"$DSPK_SOCKET\" \"$@\" > \"$0.args\"\n"
              "echo warned >&2\necho 'Slurm job 7 (uid 1000): ended in /x.jobs'\n")
UUID = ["5c1e0d3a-0000-4000-8000-00000000000%d" % i for i in range(4)]


def run(path, **env):
    """path with slurmd's environment: Slurm's variables, no DSPK_SUBMIT (a variable
    given as None is unset)."""
    e = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_UID": "1000",
         "SLURM_JOB_GPUS": "", "DSPK_GPU_MAP": "/nonexistent"}
    e.update(env)
    e = {k: v for k, v in e.items() if v is not None}
    e["FAKE_ARGS"] = os.path.join(ARGS_DIR, "submit.args")
    try:
        os.unlink(e["FAKE_ARGS"])
    except FileNotFoundError:
        pass
    p = subprocess.run([path], capture_output=True, text=True, timeout=TIMEOUT, env=e)
    try:
        with open(e["FAKE_ARGS"]) as f:
            p.args = f.read().splitlines()
    except FileNotFoundError:
        p.args = None  # the stand-in dspk-submit did not run
    return p


def tree(a, tmp):
    """An installed tree under tmp/root: the built scripts and the stand-in dspk-submit, at
    the build's LIBEXECDIR/dspk/slurm and BINDIR (absolute: CMAKE_INSTALL_FULL_*)."""
    sdir = os.path.join(tmp, "root", a.libexecdir.lstrip("/"), "dspk", "slurm")
    bdir = os.path.join(tmp, "root", a.bindir.lstrip("/"))
    sbin = os.path.join(tmp, "root", a.sbindir.lstrip("/"))
    os.makedirs(sdir)
    os.makedirs(bdir)
    os.makedirs(sbin, exist_ok=True)
    with open(os.path.join(sbin, "dspkd"), "w") as f:
        f.write(FAKE_DSPKD)
    os.chmod(os.path.join(sbin, "dspkd"), 0o755)
    for s in ("prolog", "epilog"):
        shutil.copy2(os.path.join(a.build, "packaging", "slurm", s), os.path.join(sdir, s))
    with open(os.path.join(bdir, "dspk-submit"), "w") as f:
        f.write(FAKE)
    os.chmod(os.path.join(bdir, "dspk-submit"), 0o755)
    return sdir


def links(a, sdir, tmp, sock, fake):
    # Absolute links at another depth, a relative one, and a link to a link.
    etc = os.path.join(tmp, "etc", "slurm")
    deep = os.path.join(tmp, "opt", "slurm", "site", "etc", "epilog.d")
    for d in (etc + "/prolog.d", etc + "/epilog.d", deep):
        os.makedirs(d)
    os.symlink(os.path.join(sdir, "prolog"), etc + "/prolog.d/50-dspk")
    os.symlink(os.path.relpath(os.path.join(sdir, "epilog"), deep), deep + "/50-dspk")
    os.symlink(deep + "/50-dspk", etc + "/epilog.d/50-dspk")
    want = ["--socket", sock, "job", "register", "--job", "7", "--uid", "1000", "--devices", "",
            "--json"]
    p = run(etc + "/prolog.d/50-dspk", DSPK_SOCKET=sock)
    check(p.returncode == 0 and p.args == want and p.stderr == "" and
          p.stdout == '{"job":7,"uid":1000,"devices":["cpu:0"]}\n',
          "the prolog through a link runs its tree's dspk-submit: %r" % (p,))
    want = ["--socket", sock, "job", "end", "--job", "7", "--json"]
    for path in (deep + "/50-dspk", etc + "/epilog.d/50-dspk"):
        p = run(path, DSPK_SOCKET=sock)
        check(p.returncode == 0 and p.args == want and p.stderr == "" and
              p.stdout == '{"job":7,"ended":false}\n',
              "the epilog through %s: %r" % (os.path.relpath(path, tmp), p))
    # No daemon (no socket file): the epilog through a link runs its tree's dspkd, with
    # DSPK_DSPKD_OPTIONS' words, then --socket SOCKET, before --end-job; DSPK_DSPKD names
    # another.
    none = os.path.join(tmp, "none.sock")
    p = run(etc + "/epilog.d/50-dspk", DSPK_SOCKET=none,
            DSPK_DSPKD_OPTIONS="--config /etc/x.conf  --job-state /var/lib/j*")
    check(p.returncode == 0 and p.stdout == "" and p.stderr == "warned\ndspk epilog: job 7: no "
          "dspkd listens on %s (no socket file); dspkd --end-job: Slurm job 7 (uid 1000): "
          "ended in /x.jobs\n" % none and
          open(fake + ".args").read().splitlines() ==
          [none, "--config", "/etc/x.conf", "--job-state", "/var/lib/j*", "--socket", none,
           "--end-job", "7"],
          "the epilog without a daemon runs its tree's dspkd --end-job: %r" % (p,))
    other = os.path.join(tmp, "other-dspkd")
    shutil.copy2(fake, other)
    p = run(etc + "/epilog.d/50-dspk", DSPK_SOCKET=none, DSPK_DSPKD=other)
    check(p.returncode == 0 and open(other + ".args").read().splitlines() ==
          [none, "--socket", none, "--end-job", "7"], "DSPK_DSPKD: %r" % (p,))
    p = run(etc + "/epilog.d/50-dspk", DSPK_SOCKET=none, DSPK_DSPKD=other + "-typo")
    check(p.returncode == 1 and p.stdout == "" and len(p.stderr.splitlines()) == 1 and
          "no executable dspkd at %s-typo (named by DSPK_DSPKD)" % other in p.stderr,
          "DSPK_DSPKD naming nothing: %r" % (p,))
    # A copy has no tree of its own: it says where it looked (the path without "..").
    for s in ("prolog", "epilog"):
        copy = os.path.join(etc, s + ".d", "copy")
        shutil.copy2(os.path.join(sdir, s), copy)
        p = run(copy, DSPK_SOCKET=sock)
        lines = p.stderr.splitlines()
        up = a.libexecdir + "/dspk/slurm"
        bindir, sbindir = (os.path.normpath(os.path.join(etc, s + ".d", os.path.relpath(d, up)))
                           for d in (a.bindir, a.sbindir))
        check(p.returncode == 127 and p.stdout == "" and len(lines) == 1 and
              lines[0] == "dspk %s: job 7: no executable dspk-submit at %s/dspk-submit (the "
              "one of this script's tree; DSPK_SUBMIT names another)" % (s, bindir),
              "a copy of the %s: %r" % (s, p))
        if s == "epilog":
            # With DSPK_SUBMIT only, while no daemon listens: no dspkd (DSPK_DSPKD).
            submit = os.path.join(tmp, "root", a.bindir.lstrip("/"), "dspk-submit")
            p = run(copy, DSPK_SOCKET=none, DSPK_SUBMIT=submit)
            check(p.returncode == 1 and p.stdout == "" and
                  ("there is no executable dspkd at %s/dspkd (the one of this script's "
                   "tree; DSPK_DSPKD names another)" % sbindir) in p.stderr,
                  "a copy of the epilog, DSPK_SUBMIT set, no daemon: %r" % (p,))
        # DSPK_SUBMIT naming a file that is not executable, or no file.
        plain = os.path.join(tmp, "not-executable")
        open(plain, "w").close()
        for bad in (plain, os.path.join(tmp, "none")):
            p = run(os.path.join(sdir, s), DSPK_SOCKET=sock, DSPK_SUBMIT=bad)
            # The message names the variable that gave the path, not the tree.
            check(p.returncode == 127 and p.stdout == "" and p.stderr ==
                  "dspk %s: job 7: no executable dspk-submit at %s (named by DSPK_SUBMIT)\n"
                  % (s, bad), "DSPK_SUBMIT=%s: %r" % (bad, p))


def gpu_map(sdir, tmp, sock):
    path = os.path.join(tmp, "slurm-gpus")
    with open(path, "w", newline="") as f:
        f.write("# index uuid\n"
                "0 %s#card A\n"
                "1 %s # card B\n"
                "#2 ffff\n"
                "2\tGPU-%s\r\n"
                "3 %s#\n"
                "63 # not yet\n" % (UUID[0], UUID[1], UUID[2].upper(), UUID[3]))
    p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, DSPK_GPU_MAP=path,
            SLURM_JOB_GPUS="0,1,2,3")
    out = p.args or []
    devices = out[out.index("--devices") + 1] if "--devices" in out else None
    check(p.returncode == 0 and devices == ",".join([UUID[0], UUID[1], "GPU-" + UUID[2].upper(),
                                                     UUID[3]]),
          "# starts a comment anywhere, a CR is dropped: %r" % (p,))
    p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, DSPK_GPU_MAP=path,
            SLURM_JOB_GPUS="0,63")
    check(p.returncode == 1 and p.stdout == "" and
          p.stderr == 'dspk prolog: job 7: %s:7: GPU index 63 without a UUID (expected "INDEX '
          'UUID")\n' % path, "an index with only a comment has no UUID: %r" % (p,))
    p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, DSPK_GPU_MAP=path,
            SLURM_JOB_GPUS="5")
    check(p.returncode == 1 and p.stdout == "" and
          p.stderr == 'dspk prolog: job 7: no UUID for GPU index 5 (add "5 UUID" to %s)\n' % path,
          "an index not in the map: %r" % (p,))
    # A map that is not a regular file it can read, or that DSPK_GPU_MAP names but is not
    # there, fails the prolog saying so: it was awk's "read error (Is a directory)" and
    # "add ... to DIR", or "add ... to" a file that does not exist (outside probe 15 F6).
    # A job without GPUs does not look at it.
    mapdir = os.path.join(tmp, "mapdir")
    os.mkdir(mapdir)
    fifo = os.path.join(tmp, "map.fifo")
    os.mkfifo(fifo)
    missing = os.path.join(tmp, "missing.map")
    for where, err in ((mapdir, "the GPU map %s is not a regular file (directory)" % mapdir),
                       (fifo, "the GPU map %s is not a regular file (fifo)" % fifo),
                       (missing, "the GPU map %s (named by DSPK_GPU_MAP) does not exist"
                        % missing)):
        p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, DSPK_GPU_MAP=where,
                SLURM_JOB_GPUS="0")
        check(p.returncode == 1 and p.stdout == "" and
              p.stderr == "dspk prolog: job 7: %s\n" % err, "map %s: %r" % (where, p))
        p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, DSPK_GPU_MAP=where,
                SLURM_JOB_GPUS="")
        check(p.returncode == 0, "map %s, no GPU: %r" % (where, p))
    if os.getuid() != 0:  # root reads any file
        with open(missing, "w") as f:
            f.write("0 %s\n" % UUID[0])
        os.chmod(missing, 0)
        p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, DSPK_GPU_MAP=missing,
                SLURM_JOB_GPUS="0")
        check(p.returncode == 1 and p.stderr == "dspk prolog: job 7: cannot read the GPU "
              "map %s\n" % missing, "an unreadable map: %r" % (p,))
        os.unlink(missing)
    # Every line of the index counts: one without a UUID is named (file:line) even when
    # a good one follows; two lines with two UUIDs are refused, both named; the same UUID
    # twice (another spelling) is one.
    for text, err in (("0\n0 %s\n" % UUID[0], ":1: GPU index 0 without a UUID (expected "
                       "\"INDEX UUID\")"),
                      ("0 %s\n0 %s\n" % (UUID[0], UUID[1]),
                       ":1 and %s:2: GPU index 0 has two UUIDs (%s and %s): keep the right line"
                       % (path, UUID[0], UUID[1])),
                      ("0 %s\n 0 GPU-%s\n" % (UUID[0], UUID[0].upper()), None)):
        with open(path, "w") as f:
            f.write(text)
        p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, DSPK_GPU_MAP=path,
                SLURM_JOB_GPUS="0")
        if err:
            check(p.returncode == 1 and p.stdout == "" and
                  p.stderr == "dspk prolog: job 7: %s%s\n" % (path, err), "%r: %r" % (text, p))
        else:
            out = p.args
            check(p.returncode == 0 and out[out.index("--devices") + 1] == UUID[0],
                  "%r: %r" % (text, p))


def strict_map(sdir, tmp, sock):
    """Every line of the map is "INDEX UUID" or fails the prolog naming it: an index is
    decimal digits without a leading zero (0x1, 1e0, 0.0, -0, +0 and 00 were read as
    numbers: 0x1 and 1e0 as index 1), a UUID hex digits and dashes after an optional
    GPU- (dspkd's rule), nothing after it but a comment (a second UUID was dropped: the
    first won) (outside probe 16 F3).  Any index the job has: a bad line fails it."""
    path = os.path.join(tmp, "strict-gpus")
    good = "1 %s\n" % UUID[1]
    for line, gpus, err in (
            ("0x1 %s" % UUID[0], "1", '"0x1" is no GPU index'),
            ("1e0 %s" % UUID[0], "1", '"1e0" is no GPU index'),
            ("0.0 %s" % UUID[0], "0", '"0.0" is no GPU index'),
            ("-0 %s" % UUID[0], "0", '"-0" is no GPU index'),
            ("+0 %s" % UUID[0], "0", '"+0" is no GPU index'),
            ("00 %s" % UUID[0], "0", '"00" is no GPU index'),
            ("01 %s" % UUID[0], "1", '"01" is no GPU index'),
            ("0 %s %s" % (UUID[0], UUID[2]), "0", "GPU index 0 has more than one UUID or word"),
            ("0 %s card-A" % UUID[0], "1", "GPU index 0 has more than one UUID or word"),
            ("0 zz%s" % UUID[0], "0", 'GPU index 0: "zz%s" is no GPU UUID' % UUID[0]),
            ("0 GPU-", "0", 'GPU index 0: "GPU-" is no GPU UUID'),
            ("0 ---", "0", 'GPU index 0: "---" is no GPU UUID'),
            ("0 " + "a" * 40, "0", 'GPU index 0: "%s" is no GPU UUID' % ("a" * 40))):
        with open(path, "w") as f:
            f.write(good + line + "  # a comment\n")
        p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, DSPK_GPU_MAP=path,
                SLURM_JOB_GPUS=gpus)
        check(p.returncode == 1 and p.stdout == "" and p.args is None and
              p.stderr.startswith("dspk prolog: job 7: %s:2: %s" % (path, err)) and
              len(p.stderr.splitlines()) == 1, "map line %r: %r" % (line, p))
    # Blanks: spaces and tabs, and a CR that ends the line (after its comment), nothing
    # else (docs/cluster.md; probe 17 F6: the rule was not written down).
    for line, ok in ((" \t0 \t %s\t \r" % UUID[0], True), ("0 %s # x\r" % UUID[0], True),
                     ("0 %s\r # x" % UUID[0], False), ("0 %s\x0b" % UUID[0], False),
                     ("0 %s\x0c" % UUID[0], False), ("0\r%s" % UUID[0], False),
                     ("0\x0c%s" % UUID[0], False), ("0\xa0%s" % UUID[0], False),
                     ("0 %s\r\r" % UUID[0], False), ("\x0c", False), (" \t\r", True)):
        with open(path, "w", newline="") as f:
            f.write(good + line + "\n")
        p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, DSPK_GPU_MAP=path,
                SLURM_JOB_GPUS="1")
        check((p.returncode == 0) == ok and (ok or p.stderr.startswith(
              "dspk prolog: job 7: %s:2: " % path)), "map line %r: %r" % (line, p))
    # The largest forms still pass: 39 hex digits, GPU- in any case, dashes anywhere.
    with open(path, "w") as f:
        f.write("0 %s\n10 gpu-%s\n" % ("a" * 39, UUID[1]))
    p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, DSPK_GPU_MAP=path,
            SLURM_JOB_GPUS="0,10")
    out = p.args or []
    check(p.returncode == 0 and out[out.index("--devices") + 1] == "a" * 39 + ",gpu-" + UUID[1],
          "good map lines: %r" % (p,))


def fake_smi(tmp, body):
    """A fake nvidia-smi (sh) in tmp/smibin; returns the PATH that finds it first.  It
    appends a line to tmp/smibin/calls each time it runs."""
    d = os.path.join(tmp, "smibin")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "nvidia-smi"), "w") as f:
        f.write("#!/bin/sh\necho \"$*\" >> %s/calls\n%s" % (d, body))
    os.chmod(os.path.join(d, "nvidia-smi"), 0o755)
    try:
        os.unlink(os.path.join(d, "calls"))
    except FileNotFoundError:
        pass
    return d + ":/usr/bin:/bin"


def smi_calls(tmp):
    try:
        with open(os.path.join(tmp, "smibin", "calls")) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def nvidia_smi(sdir, tmp, sock):
    """nvidia-smi's answer, for the indices the map file lacks, passes the map's checks:
    a UUID field that is no UUID ([N/A], 40 hex digits) fails the prolog (exit 1) naming
    nvidia-smi, the line, the index and the text, before dspk-submit runs (it was
    dspk-submit's usage error about --devices, exit 2: probe 17 F1)."""
    path = os.path.join(tmp, "smi-gpus")
    with open(path, "w") as f:
        f.write("0 %s\n" % UUID[0])
    prolog = os.path.join(sdir, "prolog")
    for out, err in (("0, [N/A]", '"[N/A]"'), ("0, " + "a" * 40, '"%s"' % ("a" * 40))):
        env = fake_smi(tmp, "echo '%s'\n" % out.replace("0, ", "1, "))
        p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS="0,1", PATH=env)
        check(p.returncode == 1 and p.stdout == "" and p.args is None and
              p.stderr == "dspk prolog: job 7: nvidia-smi's line 1: GPU index 1: %s is no GPU "
              "UUID (expected hex digits and dashes, after an optional GPU- prefix)\n" % err,
              "nvidia-smi answering %r: %r" % (out, p))
    # Indices the file lacks come from nvidia-smi, asked once for all of them.
    env = fake_smi(tmp, "echo '0, GPU-%s'; echo '1, GPU-%s'; echo '2, GPU-%s'\n"
                   % (UUID[3], UUID[1], UUID[2]))
    p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS="0,1,2", PATH=env)
    out = p.args or []
    check(p.returncode == 0 and p.stderr == "" and out[out.index("--devices") + 1] ==
          "%s,GPU-%s,GPU-%s" % (UUID[0], UUID[1], UUID[2]) and
          smi_calls(tmp) == ["--query-gpu=index,uuid --format=csv,noheader"],
          "the map file, then nvidia-smi once: %r %r" % (p, smi_calls(tmp)))


def smi_fails(sdir, tmp, sock):
    """A failed nvidia-smi (exit status not 0) fails the prolog showing what it said (its
    stderr, else its stdout, as nvidia-smi writes its errors), its output never taken for
    a map; index lines the map file would refuse (two UUIDs for one index, index 00) fail
    it too (probe 17 F3: the output of an exit 3 registered the job, an exit 9's reason
    was dropped for "create a map file", the first of two UUIDs won, 00 was index 0)."""
    path = os.path.join(tmp, "smi-fails-gpus")
    with open(path, "w") as f:
        f.write("5 %s\n" % UUID[3])
    prolog = os.path.join(sdir, "prolog")
    tail = (", asked for the UUID of GPU index 0; the job is not registered (fix nvidia-smi, "
            "or map the index in %s)\n" % path)
    for body, said in (
            ("echo '0, GPU-%s'\nexit 3\n" % UUID[0], "exit 3: 0, GPU-%s" % UUID[0]),
            ("echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
             "driver.\"\necho\necho '  Make sure that the latest driver is installed.'\nexit 9\n",
             "exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
             "driver.; Make sure that the latest driver is installed."),
            ("echo '0, GPU-%s'\necho 'Failed to initialize NVML: Driver/library version "
             "mismatch' >&2\nexit 18\n" % UUID[0],
             "exit 18: Failed to initialize NVML: Driver/library version mismatch"),
            ("exit 2\n", "exit 2")):
        env = fake_smi(tmp, body)
        p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS="0", PATH=env)
        check(p.returncode == 1 and p.stdout == "" and p.args is None and
              p.stderr == "dspk prolog: job 7: nvidia-smi --query-gpu=index,uuid failed (%s)%s"
              % (said, tail), "nvidia-smi %r: %r" % (body, p))
    for body, err in (
            ("echo '0, GPU-%s'; echo '0, GPU-%s'\n" % (UUID[0], UUID[1]),
             "nvidia-smi's lines 1 and 2: GPU index 0 has two UUIDs (GPU-%s and GPU-%s): keep "
             "the right one" % (UUID[0], UUID[1])),
            ("echo '00, GPU-%s'\n" % UUID[0],
             "nvidia-smi's line 1: \"00\" is no GPU index (expected \"INDEX, UUID\", INDEX "
             "decimal digits without a leading zero)"),
            ("echo '0, GPU-%s, x'\n" % UUID[0],
             "nvidia-smi's line 1: GPU index 0 has more than one UUID or word after it "
             "(expected \"INDEX, UUID\")"),
            ("echo '0,'\n", "nvidia-smi's line 1: GPU index 0 without a UUID (expected "
             "\"INDEX, UUID\")")):
        env = fake_smi(tmp, body)
        p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS="0", PATH=env)
        check(p.returncode == 1 and p.stdout == "" and p.args is None and
              p.stderr == "dspk prolog: job 7: %s\n" % err, "nvidia-smi %r: %r" % (body, p))


def smi_hangs(sdir, tmp, sock):
    """DSPK_PROLOG_TIMEOUT bounds nvidia-smi too: one that never answers (it opens a FIFO
    no one writes) fails the prolog with exit 124 and one line naming it, and is killed
    (probe 17 F2: the prolog hung with it).  The test waits on the prolog's exit."""
    fifo = os.path.join(tmp, "smi.fifo")
    os.mkfifo(fifo)
    pidf = os.path.join(tmp, "smi.pid")
    env = fake_smi(tmp, "echo $$ > %s\nexec cat %s\n" % (pidf, fifo))
    path = os.path.join(tmp, "smi-hangs-gpus")
    with open(path, "w") as f:
        f.write("5 %s\n" % UUID[0])
    p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, DSPK_GPU_MAP=path, PATH=env,
            SLURM_JOB_GPUS="0", DSPK_PROLOG_TIMEOUT="1")
    check(p.returncode == 124 and p.stdout == "" and p.args is None and
          p.stderr == "dspk prolog: job 7: no answer from nvidia-smi within 1 s "
          "(DSPK_PROLOG_TIMEOUT), asked for the UUID of GPU index 0; the job is not "
          "registered\n", "a hung nvidia-smi: %r" % (p,))
    with open(pidf) as f:
        pid = int(f.read())
    try:
        os.kill(pid, 0)
        gone = False
    except ProcessLookupError:
        gone = True
    check(gone, "the hung nvidia-smi (pid %d) is killed" % pid)


def dead(pid):
    """Whether process pid is gone (or a zombie, killed and waiting for its reaper)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def smi_child(sdir, tmp, sock):
    """The timeout bounds all of a command the prolog or epilog runs, its children
    included (probe 18 F2, F3): an nvidia-smi that leaves a child holding its standard
    output (or error) open no longer holds the prolog until that child ends (it waited for
    the end of the pipe, past the timeout), and the child is killed; a command that
    ignores SIGTERM is killed a second after the timeout and the prolog's or epilog's
    message stays one line (the shell added "Killed").  Each child blocks on a FIFO no one
    writes, for good: the prolog returns only through the fix (the test waits on its
    exit, within run()'s bound)."""
    fifo = os.path.join(tmp, "child.fifo")
    os.mkfifo(fifo)
    pidf = os.path.join(tmp, "child.pids")
    path = os.path.join(tmp, "smi-child-gpus")
    with open(path, "w") as f:
        f.write("5 %s\n" % UUID[3])
    prolog = os.path.join(sdir, "prolog")
    tail = (", asked for the UUID of GPU index 0; the job is not registered (fix nvidia-smi, "
            "or map the index in %s)\n" % path)
    hung = ("dspk prolog: job 7: no answer from nvidia-smi within 1 s (DSPK_PROLOG_TIMEOUT), "
            "asked for the UUID of GPU index 0; the job is not registered\n")
    cases = (
        # A child holding stdout; nvidia-smi answers and exits 0.
        ("cat %s & echo $! >> %s\necho '0, GPU-%s'\n" % (fifo, pidf, UUID[0]), "60", 0, ""),
        # A child holding stderr; nvidia-smi fails.
        ("cat %s >/dev/null & echo $! >> %s\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n"
         % (fifo, pidf), "60", 1,
         "dspk prolog: job 7: nvidia-smi --query-gpu=index,uuid failed (exit 9: NVIDIA-SMI "
         "has failed)" + tail),
        # nvidia-smi hangs with its child: both killed at the timeout.
        ("cat %s & echo $! >> %s\necho $$ >> %s\nexec cat %s\n" % (fifo, pidf, pidf, fifo),
         "1", 124, hung),
        # Both ignore SIGTERM: SIGKILL a second later, and still one line.
        ("trap '' TERM\ncat %s & echo $! >> %s\necho $$ >> %s\nexec cat %s\n"
         % (fifo, pidf, pidf, fifo), "1", 124, hung))
    for body, tmo, rc, err in cases:
        if os.path.exists(pidf):
            os.unlink(pidf)
        env = fake_smi(tmp, body)
        p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, PATH=env, SLURM_JOB_GPUS="0",
                DSPK_PROLOG_TIMEOUT=tmo)
        out = p.args or []
        check(p.returncode == rc and p.stderr == err and
              (out[out.index("--devices") + 1] == "GPU-" + UUID[0] if rc == 0 else
               p.args is None), "nvidia-smi %r: %r" % (body, p))
        with open(pidf) as f:
            pids = [int(x) for x in f.read().split()]
        check(pids and all(dead(x) for x in pids),
              "nvidia-smi %r: its processes %r are killed" % (body, pids))
    # dspk-submit (the prolog's and the epilog's) that ignores SIGTERM and leaves a child
    # holding its output: exit 124, one line, every process killed.
    fake = os.path.join(tmp, "hung-submit")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\ntrap '' TERM\ncat %s & echo $! >> %s\necho $$ >> %s\n"
                "exec cat %s\n" % (fifo, pidf, pidf, fifo))
    os.chmod(fake, 0o755)
    for s, why in (("prolog", "the job is not registered"),
                   ("epilog", "the job's work may still be in the daemon")):
        if os.path.exists(pidf):
            os.unlink(pidf)
        p = run(os.path.join(sdir, s), DSPK_SOCKET=sock, DSPK_SUBMIT=fake,
                **{"DSPK_%s_TIMEOUT" % s.upper(): "1"})
        check(p.returncode == 124 and p.stdout == "" and
              p.stderr == "dspk %s: job 7: no answer from dspkd on %s within 1 s (DSPK_%s_"
              "TIMEOUT); %s\n" % (s, sock, s.upper(), why), "%s, a hung dspk-submit: %r"
              % (s, p))
        with open(pidf) as f:
            pids = [int(x) for x in f.read().split()]
        check(len(pids) == 2 and all(dead(x) for x in pids),
              "%s: the hung dspk-submit's processes %r are killed" % (s, pids))
    # dspkd --end-job (the epilog without a daemon) likewise: exit 124 with one line.
    if os.path.exists(pidf):
        os.unlink(pidf)
    none = os.path.join(tmp, "none.sock")
    p = run(os.path.join(sdir, "epilog"), DSPK_SOCKET=none, DSPK_DSPKD=fake,
            DSPK_EPILOG_TIMEOUT="1")
    with open(pidf) as f:
        pids = [int(x) for x in f.read().split()]
    check(p.returncode == 124 and p.stdout == "" and
          p.stderr == "dspk epilog: job 7: no dspkd listens on %s (no socket file), and %s "
          "--end-job did not finish within 1 s (DSPK_EPILOG_TIMEOUT): whether the job is "
          "registered in its state file is not known; end it before dspkd serves again "
          "(dspkd --socket %s --end-job 7, with the daemon's other options), or through the "
          "daemon once it listens (dspk-submit job end --job 7)\n" % (none, fake, none) and
          len(pids) == 2 and all(dead(x) for x in pids), "a hung dspkd --end-job: %r %r"
          % (p, pids))


def one_deadline(sdir, tmp, sock):
    """DSPK_PROLOG_TIMEOUT bounds the whole prolog, not each command it runs (probe 19
    G1): an nvidia-smi that answers after 3 s of 4 leaves dspk-submit the second that
    is left, and a dspk-submit that never answers is killed then, so that the prolog ends
    within the timeout plus the 2 s docs/cluster.md allows (each command had the whole
    timeout: 7 s for 4).  The bound is checked with the margin's slack; the stand-in
    dspk-submit blocks on a FIFO no one writes, for good."""
    import time
    fifo = os.path.join(tmp, "deadline.fifo")
    os.mkfifo(fifo)
    fake = os.path.join(tmp, "deadline-submit")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\nexec cat %s\n" % fifo)
    os.chmod(fake, 0o755)
    path = os.path.join(tmp, "deadline-gpus")
    with open(path, "w") as f:
        f.write("5 %s\n" % UUID[0])
    env = fake_smi(tmp, "sleep 3\necho '0, GPU-%s'\n" % UUID[1])
    t0 = time.monotonic()
    p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, DSPK_GPU_MAP=path, PATH=env,
            SLURM_JOB_GPUS="0", DSPK_SUBMIT=fake, DSPK_PROLOG_TIMEOUT="4")
    took = time.monotonic() - t0
    check(p.returncode == 124 and p.stdout == "" and
          p.stderr == "dspk prolog: job 7: no answer from dspkd on %s within 4 s "
          "(DSPK_PROLOG_TIMEOUT); the job is not registered\n" % sock and
          smi_calls(tmp) == ["--query-gpu=index,uuid --format=csv,noheader"],
          "a slow nvidia-smi, a hung dspk-submit: %r" % (p,))
    check(4 - 0.05 <= took <= 4 + 2, "DSPK_PROLOG_TIMEOUT=4: the prolog took %.2f s" % took)


def not_socket(sdir, tmp, fake):
    """The epilog with something other than a socket at the socket path says what is there,
    in the words of dspkd and dspk-submit (proto/sockpath.c's dspk__file_kind), then ends
    the job in the state file as without a daemon: it said "no socket file" of a regular
    file (probe 18 F4).  Links are followed; one to nothing is no socket file."""
    base = os.path.join(tmp, "notsock")
    os.mkdir(base)
    reg = os.path.join(base, "reg.sock")
    open(reg, "w").close()
    os.mkdir(os.path.join(base, "dir.sock"))
    os.mkfifo(os.path.join(base, "fifo.sock"))
    os.symlink("/dev/null", os.path.join(base, "chr.sock"))
    os.symlink("reg.sock", os.path.join(base, "link.sock"))
    os.symlink("nothing", os.path.join(base, "dangling.sock"))
    for name, said in (("reg", "a regular file, not a socket"),
                       ("dir", "a directory, not a socket"),
                       ("fifo", "a FIFO, not a socket"),
                       ("chr", "a character device, not a socket"),
                       ("link", "a regular file, not a socket"),
                       ("dangling", "no socket file")):
        path = os.path.join(base, name + ".sock")
        p = run(os.path.join(sdir, "epilog"), DSPK_SOCKET=path)
        check(p.returncode == 0 and p.stdout == "" and p.args is None and
              p.stderr == "warned\ndspk epilog: job 7: no dspkd listens on %s (%s); dspkd "
              "--end-job: Slurm job 7 (uid 1000): ended in /x.jobs\n" % (path, said) and
              open(fake + ".args").read().splitlines() ==
              [path, "--socket", path, "--end-job", "7"],
              "the epilog with %s at the socket path: %r" % (name, p))


def one_uuid(sdir, tmp, sock):
    """One UUID under two indices (a line copied and its index changed) fails the prolog
    of a job with either index, naming both lines, in the map file and in nvidia-smi's
    answer, and across them (probe 17 F4: a job given index 1 got index 0's GPU)."""
    path = os.path.join(tmp, "one-uuid-gpus")
    prolog = os.path.join(sdir, "prolog")
    with open(path, "w") as f:
        f.write("0 %s\n2 %s\n1 GPU-%s\n" % (UUID[0], UUID[2], UUID[0].upper()))
    for gpus in ("1", "0", "0,1", "2,1"):
        p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS=gpus)
        check(p.returncode == 1 and p.stdout == "" and p.args is None and
              p.stderr == "dspk prolog: job 7: %s:1 and %s:3: GPU indices 0 and 1 have one UUID "
              "(%s and GPU-%s): keep the right line\n" % (path, path, UUID[0], UUID[0].upper()),
              "SLURM_JOB_GPUS=%s, one UUID under 0 and 1: %r" % (gpus, p))
    p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS="2")
    check(p.returncode == 0 and p.args[p.args.index("--devices") + 1] == UUID[2],
          "an index whose UUID is its own: %r" % (p,))
    with open(path, "w") as f:
        f.write("5 %s\n" % UUID[3])
    env = fake_smi(tmp, "echo '0, GPU-%s'; echo '1, GPU-%s'\n" % (UUID[0], UUID[0]))
    p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS="1", PATH=env)
    check(p.returncode == 1 and p.args is None and
          p.stderr == "dspk prolog: job 7: nvidia-smi's lines 1 and 2: GPU indices 0 and 1 have "
          "one UUID (GPU-%s and GPU-%s): keep the right one\n" % (UUID[0], UUID[0]),
          "nvidia-smi, one UUID under 0 and 1: %r" % (p,))
    # The map file's index 5 and nvidia-smi's index 1, one UUID.
    env = fake_smi(tmp, "echo '1, GPU-%s'\n" % UUID[3])
    p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS="5,1", PATH=env)
    check(p.returncode == 1 and p.args is None and
          p.stderr == "dspk prolog: job 7: GPU indices 5 and 1 have one UUID (%s from the map "
          "%s, GPU-%s from nvidia-smi): two GPUs cannot be one; fix the map\n"
          % (UUID[3], path, UUID[3]), "the map file and nvidia-smi, one UUID: %r" % (p,))


# Texts and how the scripts' messages quote them (dspk.conf(5)'s rule, the same as
# dspkd's for its configuration file), written out by hand.
QUOTED = (
    (b"0\x1b[2J", "0\\x1b[2J"),                  # ESC
    (b"\x0c", "\\x0c"),                           # form feed
    (b"\x7f0", "\\x7f0"),                         # DEL
    (b"\xef\xbb\xbf0", "\\ufeff0"),                # a byte order mark
    (b"0\xe2\x80\x8b", "0\\u200b"),                # zero-width space
    (b"0\xe2\x80\xae1", "0\\u202e1"),              # right-to-left override
    (b"\xc2\x850", "\\u00850"),                    # C1 NEXT LINE
    (b"\xc2\xa00", "\\u00a00"),                    # no-break space
    (b"0\\u200b", "0\\\\u200b"),                  # a backslash typed
    (b"\xff0", "\\xff0"),                         # no UTF-8
    (b"\xcc\x810", "\\u03010"),                    # a combining mark on nothing
    (b"e\xcc\x81", "e\xcc\x81"),                    # one on a letter: as it is
    (b"\xc3\xa9", "\xc3\xa9"),                       # a letter: as it is
    (b"\xf3\xa0\x80\x81", "\\U000e0001"),           # a tag, above U+FFFF
)


def quoting(sdir, tmp, sock):
    """Text from outside in the prolog's messages (a map file's line, nvidia-smi's error,
    the map's path) is quoted by dspk.conf(5)'s rule: control characters, bytes that are
    no UTF-8 and characters that print as nothing escaped (probe 17 F5: ESC and FF were
    written raw, a BOM too)."""
    path = os.path.join(tmp, "quoted-gpus")
    prolog = os.path.join(sdir, "prolog")
    for raw, shown in QUOTED:
        with open(path, "wb") as f:
            f.write(raw + b" %s\n" % UUID[0].encode())
        p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS="0")
        check(p.returncode == 1 and p.args is None and p.stderr == 'dspk prolog: job 7: %s:1: '
              '"%s" is no GPU index (expected "INDEX UUID", INDEX decimal digits without a '
              'leading zero)\n' % (path, shown.encode("latin-1").decode("utf-8")),
              "a map line %r: %r" % (raw, p))
        if raw.startswith(b"\xcc"):  # after the UUID's last digit it has a base
            shown = raw.decode("latin-1")
        with open(path, "wb") as f:
            f.write(b"0 %s%s\n" % (UUID[0].encode(), raw))
        p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS="0")
        check(p.returncode == 1 and p.args is None and p.stderr == 'dspk prolog: job 7: %s:1: '
              'GPU index 0: "%s%s" is no GPU UUID (expected hex digits and dashes, after an '
              'optional GPU- prefix)\n' % (path, UUID[0], shown.encode("latin-1").decode("utf-8")),
              "a map UUID ending %r: %r" % (raw, p))
    # nvidia-smi's error, and a map path named by DSPK_GPU_MAP.
    env = fake_smi(tmp, "printf 'no\\033[2Jdriver\\n' >&2; exit 9\n")
    with open(path, "w") as f:
        f.write("5 %s\n" % UUID[3])
    p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS="0", PATH=env)
    check(p.returncode == 1 and "failed (exit 9: no\\x1b[2Jdriver), asked" in p.stderr,
          "nvidia-smi's error quoted: %r" % (p,))
    odd = os.path.join(tmp, "a\nb\\n\x1b.map")
    p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=odd, SLURM_JOB_GPUS="0")
    check(p.returncode == 1 and p.stderr == "dspk prolog: job 7: the GPU map %s/a\\nb\\\\n"
          "\\x1b.map (named by DSPK_GPU_MAP) does not exist\n" % tmp,
          "a map path quoted: %r" % (p,))


def job_gpus(sdir, tmp, sock):
    """SLURM_JOB_GPUS (else CUDA_VISIBLE_DEVICES) must be what Slurm sends: GPU indices,
    decimal without a leading zero, separated by commas, each once; anything else is exit
    2 with one line saying so and what Slurm sends, never "add \"00 UUID\" to FILE", a
    line the map's rule refuses (probe 17 F7); more than 64 GPUs is exit 1."""
    path = os.path.join(tmp, "job-gpus")
    with open(path, "w") as f:
        f.write("".join("%d %s\n" % (k, UUID[k]) for k in range(4)))
    prolog = os.path.join(sdir, "prolog")
    for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        for val, why in (("00", 'item 1 "00" is no GPU index'),
                         ("0-1", 'item 1 "0-1" is no GPU index'),
                         ("1,01", 'item 2 "01" is no GPU index'),
                         ("0,,1", 'item 2 "" is no GPU index'),
                         ("0,", 'item 2 "" is no GPU index'),
                         ("0, 1", 'item 2 " 1" is no GPU index'),
                         ("GPU-%s" % UUID[0], 'item 1 "GPU-%s" is no GPU index' % UUID[0]),
                         ("0\x1b", 'item 1 "0\\x1b" is no GPU index'),
                         ("1,0,1", "item 3 repeats GPU index 1")):
            env = {var: val}
            if var == "CUDA_VISIBLE_DEVICES":
                env["SLURM_JOB_GPUS"] = None
            p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, **env)
            check(p.returncode == 2 and p.stdout == "" and p.args is None and
                  p.stderr == "dspk prolog: job 7: %s is '%s': %s (Slurm sends the job's GPU "
                  "indices as decimal numbers without a leading zero, separated by commas: "
                  "0,1,3)\n" % (var, val.replace("\x1b", "\\x1b"), why),
                  "%s=%r: %r" % (var, val, p))
    p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS="3,0")
    check(p.returncode == 0 and p.args[p.args.index("--devices") + 1] ==
          "%s,%s" % (UUID[3], UUID[0]), "SLURM_JOB_GPUS=3,0: %r" % (p,))
    p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path,
            SLURM_JOB_GPUS=",".join(str(k) for k in range(65)))
    check(p.returncode == 1 and p.args is None and p.stderr == "dspk prolog: job 7: "
          "SLURM_JOB_GPUS lists 65 GPUs; dspkd registers at most 64 a job: the job is not "
          "registered\n", "65 GPUs: %r" % (p,))


def answers(sdir, tmp, sock, fake):
    """An exit 0 is taken only with the answer for the job (outside probe 16 F1):
    dspk-submit's JSON (job.register's for the prolog, job.end's for the epilog), and,
    without a daemon, dspkd --end-job's line about the job as the last on its stdout.
    Without it (a DSPK_SUBMIT or DSPK_DSPKD that is not the real one, /bin/true, or
    dspkd --version's line) the script exits 1 saying so."""
    for ans in ("", "ok\n", '{"job":8,"uid":1000,"devices":[]}\n', '{"job":7,"ended":false}\n'
                '{"job":7,"ended":false}\n', '{"job":70,"ended":false}\n',
                '{"job":7,"uid":1000,"devices":["cpu:0"]}\nmore\n'):
        p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, FAKE_ANSWER=ans)
        check(p.returncode == 1 and p.stdout == ans and p.stderr.endswith(
              "exited 0 without job.register's answer for job 7 on standard output (is "
              "DSPK_SUBMIT dspk-submit?): the job is not registered\n"),
              "prolog, dspk-submit answering %r: %r" % (ans, p))
        p = run(os.path.join(sdir, "epilog"), DSPK_SOCKET=sock, FAKE_ANSWER=ans)
        check(p.returncode == 1 and p.stdout == ans and p.stderr.endswith(
              "exited 0 without job.end's answer for job 7 on standard output (is DSPK_SUBMIT "
              "dspk-submit?): the job may still be registered and its work in the daemon\n"),
              "epilog, dspk-submit answering %r: %r" % (ans, p))
    for ans in ('{"job":7,"ended":true,"connections":0,"inflight":0,"buffers":0}\n',
                '{"job":7,"ended":false}\n'):
        p = run(os.path.join(sdir, "epilog"), DSPK_SOCKET=sock, FAKE_ANSWER=ans)
        check(p.returncode == 0 and p.stdout == ans and p.stderr == "",
              "epilog, dspk-submit answering %r: %r" % (ans, p))
    # Without a daemon: stand-in dspkds that exit 0 (or 4) with another last line.
    none = os.path.join(tmp, "none.sock")
    bad = os.path.join(tmp, "bad-dspkd")
    for rc, out in ((0, ""), (0, "dspkd 0.1.0 (protocol 1)"),
                    (0, "Slurm job 7 (uid 1000): ended in /x.jobs\ndspkd 0.1.0 (protocol 1)"),
                    (0, "Slurm job 8 (uid 1000): ended in /x.jobs"),
                    (0, "Slurm job 70: had ended already in /x.jobs"),
                    (0, "Slurm job 7 (uid 1000): ended in x.jobs"),
                    (0, "Slurm job 7: no state file /x.jobs: nothing is registered there"),
                    (4, "Slurm job 7 (uid 1000): ended in /x.jobs"),
                    (4, "Usage: dspkd [OPTION]...")):
        with open(bad, "w") as f:
            f.write("#!/bin/sh\n%sexit %d\n" % ("printf '%%s\\n' '%s'\n" % out if out else "",
                                                rc))
        os.chmod(bad, 0o755)
        p = run(os.path.join(sdir, "epilog"), DSPK_SOCKET=none, DSPK_DSPKD=bad)
        check(p.returncode == 1 and p.stdout == "" and
              ("%s --end-job exited %d without the line that says what it did with job 7"
               % (bad, rc)) in p.stderr and "it did not end the job" in p.stderr and
              p.stderr.startswith(out + "\n" if out else "dspk epilog"),
              "a dspkd exiting %d with %r: %r" % (rc, out, p))
    p = run(os.path.join(sdir, "epilog"), DSPK_SOCKET=none, DSPK_DSPKD="/bin/true")
    check(p.returncode == 1 and "/bin/true --end-job exited 0 without the line" in p.stderr,
          "DSPK_DSPKD=/bin/true: %r" % (p,))
    # Each line --end-job has for exit 0 and 4 is taken.
    for rc, out in ((0, "Slurm job 7 (uid 1000): ended in /x.jobs"),
                    (0, "Slurm job 7: not registered in /x.jobs; recorded there as ended"),
                    (0, "Slurm job 7: had ended already in /x.jobs"),
                    (4, "Slurm job 7: no state file /x.jobs (no directory /x): nothing is "
                        "registered there")):
        with open(bad, "w") as f:
            f.write("#!/bin/sh\nprintf '%%s\\n' '%s'\nexit %d\n" % (out, rc))
        p = run(os.path.join(sdir, "epilog"), DSPK_SOCKET=none, DSPK_DSPKD=bad)
        check(p.returncode == 0 and p.stdout == "" and p.stderr.startswith(
              "dspk epilog: job 7: no dspkd listens on %s (no socket file); dspkd --end-job: %s"
              % (none, out)), "a dspkd exiting %d with %r: %r" % (rc, out, p))


def submit_fails(sdir, tmp, sock, submit):
    """When dspk-submit itself fails, the script's one line names the script and the job
    (`dspk prolog: job N: `) before what dspk-submit said, and says what it means for the
    job; the prolog names a GPU by its index and where its UUID came from (the map file,
    nvidia-smi), not by dspk-submit's `--devices item K` (probe 21 F2); the exit status is
    dspk-submit's."""
    path = os.path.join(tmp, "fail-gpus")
    with open(path, "w") as f:
        f.write("1 %s\n3 %s\n" % (UUID[1], UUID[3]))
    prolog, epilog = os.path.join(sdir, "prolog"), os.path.join(sdir, "epilog")
    nodev = "dspk-submit: job: ENODEV: --devices item %d: no device of this daemon has the UUID %s\n"
    env = fake_smi(tmp, "echo '0, GPU-%s'; echo '2, GPU-%s'\n" % (UUID[0], UUID[2]))
    for gpus, item, want in (("1,3", 2, "GPU index 3 (its UUID from the map %s)" % path),
                             ("3,1", 1, "GPU index 3 (its UUID from the map %s)" % path),
                             ("1,2", 2, "GPU index 2 (its UUID from nvidia-smi)"),
                             ("1,3", 7, "--devices item 7")):
        by_index = {"1": UUID[1], "2": "GPU-" + UUID[2], "3": UUID[3]}
        uuid = by_index[gpus.split(",")[item - 1]] if item <= 2 else UUID[0]
        p = run(prolog, DSPK_SOCKET=sock, DSPK_GPU_MAP=path, SLURM_JOB_GPUS=gpus, PATH=env,
                FAKE_FAIL=nodev % (item, uuid), FAKE_RC="1")
        check(p.returncode == 1 and p.stdout == "" and p.stderr ==
              "dspk prolog: job 7: dspk-submit: job: ENODEV: %s: no device of this daemon has "
              "the UUID %s; the job is not registered\n" % (want, uuid),
              "prolog, SLURM_JOB_GPUS=%s, dspk-submit naming item %d: %r" % (gpus, item, p))
    conn = ("dspk-submit: job: ECONNECT: cannot connect to %s: Permission denied; is dspkd "
            "running?\n" % sock)
    for fail, rc, said in ((conn, "1", conn.strip()),
                           ("two\n\nlines\n", "3", "two; lines"),
                           ("", "1", "%s exited 1 without a message" % submit)):
        p = run(prolog, DSPK_SOCKET=sock, FAKE_FAIL=fail, FAKE_RC=rc)
        check(p.returncode == int(rc) and p.stdout == "" and p.stderr ==
              "dspk prolog: job 7: %s; the job is not registered\n" % said,
              "prolog, dspk-submit failing with %r: %r" % (fail, p))
        p = run(epilog, DSPK_SOCKET=sock, FAKE_FAIL=fail, FAKE_RC=rc)
        check(p.returncode == int(rc) and p.stdout == "" and p.stderr ==
              "dspk epilog: job 7: %s; the job may still be registered and its work in the "
              "daemon\n" % said, "epilog, dspk-submit failing with %r: %r" % (fail, p))
    # A SLURM_JOB_UID that is no uid: dspk-submit's usage error (exit 2), its --uid named.
    p = run(prolog, DSPK_SOCKET=sock, SLURM_JOB_UID="-1", FAKE_RC="2",
            FAKE_FAIL="dspk-submit: job: EINVAL: bad --uid '-1' (want a uid)\n")
    check(p.returncode == 2 and p.stderr == "dspk prolog: job 7: dspk-submit: job: EINVAL: bad "
          "--uid (SLURM_JOB_UID) '-1' (want a uid); the job is not registered\n",
          "prolog, a bad SLURM_JOB_UID: %r" % (p,))


def variables(sdir, sock):
    """Slurm's variables unset or empty: exit 2 with the script's own one line."""
    for s in ("prolog", "epilog"):
        for val, said in ((None, "not set"), ("", "empty")):
            p = run(os.path.join(sdir, s), DSPK_SOCKET=sock, SLURM_JOB_ID=val)
            check(p.returncode == 2 and p.stdout == "" and
                  p.stderr == "dspk %s: SLURM_JOB_ID is %s\n" % (s, said),
                  "%s, SLURM_JOB_ID %r: %r" % (s, val, p))
    # A SLURM_JOB_ID that is no job id (dspkd --end-job's rule: digits, from 1 to 2^64-1,
    # no leading zero, no blanks): exit 2 with one line before anything else, with a
    # daemon (a socket) or without one (the epilog would run dspkd --end-job).
    for s in ("prolog", "epilog"):
        for val in ("abc", "0", "00", "05", " 5", "5 ", "+5", "-5", "1e3", "5\n",
                    "18446744073709551616", "99999999999999999999", "184467440737095516150"):
            for where in (sock, "/nonexistent"):
                p = run(os.path.join(sdir, s), DSPK_SOCKET=where, SLURM_JOB_ID=val)
                # Quoted as dspk.conf(5) says: the newline as \n (probe 17 F5).
                check(p.returncode == 2 and p.stdout == "" and
                      p.stderr == "dspk %s: SLURM_JOB_ID is '%s': expected a Slurm job id "
                      "(decimal digits from 1 to 18446744073709551615, without a leading "
                      "zero)\n" % (s, val.replace("\n", "\\n")),
                      "%s, SLURM_JOB_ID %r: %r" % (s, val, p))
        p = run(os.path.join(sdir, s), DSPK_SOCKET=sock, SLURM_JOB_ID="18446744073709551615")
        check(p.returncode == 0 and "18446744073709551615" in p.args,
              "%s, the largest job id: %r" % (s, p))
    for val, said in ((None, "not set"), ("", "empty")):
        p = run(os.path.join(sdir, "prolog"), DSPK_SOCKET=sock, SLURM_JOB_UID=val)
        check(p.returncode == 2 and p.stdout == "" and
              p.stderr == "dspk prolog: job 7: SLURM_JOB_UID is %s\n" % said,
              "SLURM_JOB_UID %r: %r" % (val, p))


def timeouts(sdir, sock):
    for s in ("prolog", "epilog"):
        var = "DSPK_%s_TIMEOUT" % s.upper()
        for bad in ("0", "000", "abc", "1.5", "2m", "-1", "+5", " 5", "1000000000"):
            # The epilog checks before it looks for the socket: none here.
            p = run(os.path.join(sdir, s), DSPK_SOCKET=sock if s == "prolog" else "/nonexistent",
                    **{var: bad})
            check(p.returncode == 2 and p.stdout == "" and
                  p.stderr == "dspk %s: job 7: %s is '%s': expected whole seconds from 1 to "
                  "999999999 (unset or empty: 120)\n" % (s, var, bad),
                  "%s=%r is refused: %r" % (var, bad, p))
        for good in ("", "1", "007", "999999999"):
            p = run(os.path.join(sdir, s), DSPK_SOCKET=sock, **{var: good})
            check(p.returncode == 0 and p.stderr == "" and "--json" in p.args,
                  "%s=%r is taken: %r" % (var, good, p))


def main():
    ap = argparse.ArgumentParser()
    for opt in ("--build", "--libexecdir", "--bindir", "--sbindir"):
        ap.add_argument(opt, required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dspk-scripts-", dir="/tmp")
    global ARGS_DIR
    ARGS_DIR = tmp
    srv = None
    try:
        sdir = tree(a, tmp)
        # A socket file, so that the epilog calls dspk-submit (nothing connects to it).
        sock = os.path.join(tmp, "s.sock")
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(sock)
        links(a, sdir, tmp, sock, os.path.join(tmp, "root", a.sbindir.lstrip("/"), "dspkd"))
        gpu_map(sdir, tmp, sock)
        strict_map(sdir, tmp, sock)
        nvidia_smi(sdir, tmp, sock)
        smi_fails(sdir, tmp, sock)
        smi_hangs(sdir, tmp, sock)
        smi_child(sdir, tmp, sock)
        one_deadline(sdir, tmp, sock)
        one_uuid(sdir, tmp, sock)
        quoting(sdir, tmp, sock)
        job_gpus(sdir, tmp, sock)
        answers(sdir, tmp, sock, os.path.join(tmp, "root", a.sbindir.lstrip("/"), "dspkd"))
        submit_fails(sdir, tmp, sock, os.path.join(tmp, "root", a.bindir.lstrip("/"),
                                                   "dspk-submit"))
        not_socket(sdir, tmp, os.path.join(tmp, "root", a.sbindir.lstrip("/"), "dspkd"))
        timeouts(sdir, sock)
        variables(sdir, sock)
        print("ok scripts")
    finally:
        if srv:
            srv.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
