#!/usr/bin/env python3
"""install.docs, the reload lists: which keys a reload applies and which take
effect at the next start, as daemon/config.c's table says (each row's reload
flag), is what the installed systemd/dspkd.conf's header, dspk.conf(5)
("Reload: yes/no" of each key, "All reload: yes" of a section) and
docs/admin.md say.  Usage: reload_lists.py SRC"""
import os
import re
import sys

src = sys.argv[1]
bad = []


def read(*p):
    with open(os.path.join(src, *p)) as f:
        return f.read()


table = re.search(r"static const struct key keys\[\] = \{(.*?)\n\};", read("daemon", "config.c"),
                  re.S).group(1)
table = re.sub(r"/\*.*?\*/", "", table, flags=re.S)
rows = re.findall(r'\{"(\w+)", "(\w+)", K_\w+, F\([^)]*\), [^,]+, [^,]+, (true|false),',
                  " ".join(table.split()))
if len(rows) < 20:
    sys.exit("FAIL: read only %d rows of config.c's table" % len(rows))
reload = {k for s, k, r in rows if r == "true"}
restart = {k for s, k, r in rows if r == "false"}
section = {k: s for s, k, r in rows}
daemon_reload = {k for k in reload if section[k] == "daemon"}
for s in ("limits", "policy"):
    if any(section[k] == s for k in restart):
        bad.append("config.c: a restart-only key in [%s]: the documents say all reload" % s)


def names(text):
    return set(re.findall(r"[a-z]+(?:_[a-z]+)+|\b(?:socket|cache|backends|foreground)\b",
                          text))


# systemd/dspkd.conf: its header comment (the lines before the first section).
head = " ".join(l.lstrip("# ") for l in read("systemd", "dspkd.conf").split("\n[")[0].splitlines())
m = re.search(r"and, of \[daemon\], (.*?) \(", head)
got = names(m.group(1)) if m else set()
if got != daemon_reload:
    bad.append("systemd/dspkd.conf header, reloaded [daemon] keys: %r, config.c: %r"
               % (sorted(got), sorted(daemon_reload)))
m = re.search(r"The other keys, (.*?), take effect at the next start", head)
got = names(m.group(1)) if m else set()
if got != restart:
    bad.append("systemd/dspkd.conf header, restart-only keys: %r, config.c: %r"
               % (sorted(got), sorted(restart)))

# docs/admin.md: "A reload applies ... `socket`, ... take effect at the next start".
admin = " ".join(read("docs", "admin.md").split())
m = re.search(r"A reload applies (.*?) to the running daemon without dropping clients\. (.*?) "
              r"take effect at the next start", admin)
if not m:
    bad.append("docs/admin.md: no sentence \"A reload applies ... take effect at the next start\"")
else:
    got = set(re.findall(r"`(\w+)`", m.group(2)))
    if got != restart:
        bad.append("docs/admin.md restart-only keys: %r, config.c: %r"
                   % (sorted(got), sorted(restart)))
    # The reloaded ones are named in prose there ("the log level"); dspk.conf(5)
    # is checked key by key below.

# dspk.conf(5): each key's entry says "Reload: yes|no", or its section "All reload: yes".
man = read("man", "dspk.conf.5.scd").replace("\\_", "_")
for part in re.split(r"\n# ", man)[1:]:
    sm = re.match(r"\[(\w+)\]", part)
    if not sm:
        continue
    all_yes = "All reload: yes" in part
    entries = re.split(r"\n(?=\*\w+\* = )", part)
    for e in entries[1:]:
        keys = re.findall(r"\*(\w+)\* = ", e.split("\n")[0])
        said = re.search(r"Reload: (yes|no)", e)
        for k in keys:
            if k not in section:
                continue
            want = "yes" if k in reload else "no"
            have = said.group(1) if said else ("yes" if all_yes else None)
            if have != want:
                bad.append("dspk.conf(5) %s: Reload: %s, config.c: %s" % (k, have, want))
for b in bad:
    print("FAIL: " + b, file=sys.stderr)
sys.exit(1 if bad else 0)
