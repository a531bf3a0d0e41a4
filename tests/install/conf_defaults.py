#!/usr/bin/env python3
"""install.docs, the documented settings against dspkd itself:

- every commented line "#key = value" of the shipped systemd/dspkd.conf shows
  the default `dspkd --help` gives for --key ("(default X)"), compared by
  value (10s = 10000 ms, 256M = 268435456), so that uncommenting it changes
  nothing, as the file's header says; a key whose default is computed or has
  no value ("(default: ...)" in --help) shows no value that would fix it: its
  line is an example marked so ("An example, not the default") or shows the
  computation ("leave the key out").  The paths (socket, cache, job_state)
  show the installed service's, as the header says.  (Probe 18 E4:
  "#max_user_clients = 64" fixed the quota, whose default follows
  max_clients.)  dspkd prints no effective configuration, so the defaults
  are --help's, which config.c's table writes;
- docs/security.md's limits table: each key of its first column is a flag of
  dspkd --help unless the page lists it as file-only, and a key it lists as
  file-only is no flag (probe 18 E3: it said every key was also a flag);
- the admins' extra connections (DSPKD_ADMIN_EXTRA_CONNS of daemon/dspkd.h)
  are said wherever the connection limits are documented for administrators:
  the shipped dspkd.conf, dspk.conf(5)'s max_clients and max_user_clients,
  docs/security.md's rows of both, docs/admin.md (probe 18 E2).

Usage: conf_defaults.py SRC DSPKD"""
import os
import re
import subprocess
import sys

src, dspkd = sys.argv[1], sys.argv[2]
bad = []


def read(*p):
    with open(os.path.join(src, *p)) as f:
        return f.read()


# ---- dspkd --help: each option's metavar and default -------------------------

helptext = subprocess.run([dspkd, "--help"], stdout=subprocess.PIPE, check=True,
                          timeout=30).stdout.decode()
options = {}  # "--max-clients" -> (metavar or None, description joined)
cur = None
for line in helptext.splitlines():
    m = re.match(r"  (?:-\w, )?(--[a-z][a-z-]*)(?: ([A-Z][A-Z|%:]*))?(?:  +|$)(.*)", line)
    if m:
        cur = m.group(1)
        options[cur] = [m.group(2), m.group(3)]
    elif cur and re.match(r" {10,}\S", line):
        options[cur][1] += " " + line.strip()
    else:
        cur = None
if len(options) < 30:
    sys.exit("FAIL: read only %d options of dspkd --help" % len(options))

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def value(kind, text):
    """text as what dspkd compares, by the option's metavar; None when it is
    not a value of that kind."""
    text = text.strip()
    if kind in ("SIZE", "SIZE|N%"):
        if kind == "SIZE|N%" and re.fullmatch(r"\d+%", text):
            return ("share", int(text[:-1]))
        m = re.fullmatch(r"(\d+)([KMGT]?)(?:iB)?", text)
        return ("bytes", int(m.group(1)) * UNITS[m.group(2)]) if m else None
    if kind == "MS":
        m = re.fullmatch(r"(\d+)(ms|s)?", text)
        return int(m.group(1)) * (1000 if m.group(2) == "s" else 1) if m else None
    if kind == "N":
        return int(text) if re.fullmatch(r"\d+", text) else None
    return text or None


conf = read("systemd", "dspkd.conf")
lines = conf.splitlines()
seen = 0
exceptions = {}  # key -> why its uncommented line would change something
for i, line in enumerate(lines):
    m = re.fullmatch(r"#([a-z_]+) =(?: (.*))?", line)
    if not m:
        continue
    seen += 1
    key, shown = m.group(1), m.group(2) or ""
    comment = []  # the comment block just above the line
    for j in range(i - 1, -1, -1):
        if not lines[j].startswith("# "):
            break
        comment.insert(0, lines[j][2:])
    example = "An example, not the default" in " ".join(comment)
    flag = "--" + key.replace("_", "-")
    if flag not in options:
        # A key of the file only ([policy]'s lists): their default is empty.
        if shown:
            bad.append("dspkd.conf: #%s = %s: no flag to compare with, and not empty"
                       % (key, shown))
        continue
    kind, desc = options[flag]
    if kind == "PATH":
        exceptions[key] = "the installed service's path"
        continue  # the installed service's paths, as the header says
    if kind is None:  # a flag without a value: a yes/no key, off unless given
        if shown != "no":
            bad.append("dspkd.conf: #%s = %s: the default is no" % (key, shown))
        continue
    d = re.search(r"\(default (\S+)\)$", desc)
    if d:
        if example:
            bad.append("dspkd.conf: #%s is marked an example, but %s has a default (%s)"
                       % (key, flag, d.group(1)))
        elif value(kind, shown) is None or value(kind, shown) != value(kind, d.group(1)):
            bad.append("dspkd.conf: #%s = %s, but dspkd --help says %s's default is %s"
                       % (key, shown, flag, d.group(1)))
        continue
    # A default with no value to write (computed, or off): "(default: ...)".
    exceptions[key] = "an example" if example else "a computation"
    if not re.search(r"\(default: [^)]*\)", desc):
        bad.append("dspkd --help: %s names no default" % flag)
    elif not example and "leave the key out" not in shown:
        bad.append("dspkd.conf: #%s = %s: %s's default is computed or has no value (%s), so "
                   "the line must be an example marked so, or show the computation and say "
                   "\"leave the key out\"" % (key, shown, flag,
                                              re.search(r"\(default: [^)]*\)", desc).group(0)))
    elif not example and value(kind, shown) is not None:
        bad.append("dspkd.conf: #%s = %s: a value that would fix a computed default"
                   % (key, shown))
if seen < 30:
    bad.append("dspkd.conf: read only %d commented keys" % seen)
# Each line whose uncommenting would change something is named as such where
# the promise "uncommenting a line changes nothing" is made: the file's header
# and dspk.conf(5)'s DESCRIPTION (probe 23 H: the page said it without the
# exceptions of socket, cache and job_state, true only for the service, and of
# the computed max_user_clients and max_user_maps).
header = " ".join(l[2:] for l in lines[:lines.index("[daemon]")] if l.startswith("# "))
page = read("man", "dspk.conf.5.scd").replace("\\_", "_")
para = [p for p in page.split("\n\n") if "uncommenting a line" in p]
if len(para) != 1:
    bad.append("dspk.conf(5): %d paragraphs say what uncommenting a line does, want 1"
               % len(para))
para = " ".join(" ".join(para).split())
if len(exceptions) < 7:
    bad.append("dspkd.conf: only %d lines that are no plain default: %s"
               % (len(exceptions), sorted(exceptions)))
for key, why in sorted(exceptions.items()):
    for where, text in (("dspkd.conf's header", header), ("dspk.conf(5), DESCRIPTION", para)):
        if not re.search(r"\b%s\b" % key, text):
            bad.append("%s promises that uncommenting a line changes nothing, but does not "
                       "name %s, whose line shows %s" % (where, key, why))

# ---- docs/security.md: which limits are flags ----------------------------------

sec = read("docs", "security.md")
part = sec[sec.index("## Limits and quotas"):]
part = part[:part.index("\n## ", 5)] if "\n## " in part[5:] else part
m = re.search(r"but for the `\[policy\]` lists\s+\(([^)]*): the file only, no flag\)", part)
file_only = set(re.findall(r"`([a-z_]+)`", m.group(1))) if m else set()
keys = set(re.findall(r"^#?([a-z_]+) =", conf, re.M))
rows = 0
for row in re.findall(r"^\| ([^|]*) \|", part, re.M):
    for key in re.findall(r"`([a-z_]+)`", row):
        if key not in keys:
            continue
        rows += 1
        flag = "--" + key.replace("_", "-")
        if key in file_only and flag in options:
            bad.append("security.md: %s is said to be the file's only, but dspkd has %s"
                       % (key, flag))
        if key not in file_only and flag not in options:
            bad.append("security.md: the limits table says %s is also the flag %s, which "
                       "dspkd --help does not have" % (key, flag))
if rows < 15:
    bad.append("security.md: read only %d keys of the limits table" % rows)

# ---- the admins' extra connections ----------------------------------------------

extra = int(re.search(r"#define DSPKD_ADMIN_EXTRA_CONNS (\d+)", read("daemon", "dspkd.h"))
            .group(1))
more = "may open %d more" % extra
man = read("man", "dspk.conf.5.scd")
for key in ("max\\_clients", "max\\_user\\_clients"):
    entry = re.search(r"^\*%s\* = _N_\n((?:\t.*\n)+)" % re.escape(key), man, re.M)
    if not entry or more not in " ".join(entry.group(1).split()):
        bad.append("dspk.conf(5): %s does not say an admin %s connections" % (key, more))
for key in ("max_clients", "max_user_clients"):
    row = re.search(r"^\| `%s` \|.*$" % key, sec, re.M)
    if not row or more not in row.group(0):
        bad.append("security.md: the %s row does not say an admin %s connections"
                   % (key, more))
block = conf[conf.index("#max_buffers"):conf.index("#max_user_partial")]
if more not in " ".join(block.replace("#", " ").split()):
    bad.append("dspkd.conf: max_clients/max_user_clients do not say an admin %s" % more)
if not re.search(r"admin %s than each" % more, " ".join(read("docs", "admin.md").split())):
    bad.append("admin.md: does not say an admin %s connections than each limit" % more)

for b in bad:
    print("FAIL: " + b)
sys.exit(1 if bad else 0)
