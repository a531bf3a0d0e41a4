#!/usr/bin/env python3
"""cluster.docs: what docs/cluster.md tells a Slurm admin agrees with the sources.

- the node setup sets `job_required = yes` in `[policy]` (an INI block under "dspkd on every
  node"), a key of that section in daemon/config.c;
- the number of ended jobs the page says dspkd remembers is the size of the daemon's ring
  (DSPKD_ENDED_SLOTS in daemon/dspkd.h);
- the map file is written from `dspk-submit devices --all` (what shows every UUID to root
  with job_required = yes), an option docs/cli.md gives `devices`;
- the socket access paragraph does not offer allow_users/allow_groups as a way in;
- paths: the prolog's and epilog's comments name the Debian packages' paths, as cluster.md
  does (no configure-time @VAR@ there, which made a /usr/local build's comments disagree
  with the page), and the FILES of dspkd(8) and dspk.conf(5) name the Debian packages'
  configuration file beside the build's.

    docs_check.py SRC_DIR
"""
import configparser
import os
import re
import sys


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def section(page, title):
    i = page.index("\n## " + title + "\n")
    j = page.find("\n## ", i + 1)
    return page[i:j if j >= 0 else len(page)]


def main():
    src = sys.argv[1]
    read = lambda *p: open(os.path.join(src, *p)).read()  # noqa: E731
    page = read("docs", "cluster.md")
    config = read("daemon", "config.c")
    node = section(page, "dspkd on every node")
    blocks = re.findall(r"```ini\n(.*?)```", node, re.S)
    check(len(blocks) == 1, "one INI block in 'dspkd on every node': %d" % len(blocks))
    ini = configparser.ConfigParser()
    ini.read_string(blocks[0])
    check(ini.get("policy", "job_required", fallback=None) == "yes",
          "the node setup sets job_required = yes in [policy]: %r" % blocks[0])
    check('{"policy", "job_required", K_' in config, "job_required is a [policy] key")
    check(not re.search(r"or set `allow_(users|groups)`", node),
          "allow_users/allow_groups are not a way to open the socket")

    m = re.search(r"^#define DSPKD_ENDED_SLOTS (\d+)", read("daemon", "dspkd.h"), re.M)
    check(m is not None, "#define DSPKD_ENDED_SLOTS N in daemon/dspkd.h")
    n = int(m.group(1))
    said = re.findall(r"last (\d+) ended", page)
    check(said and all(int(x) == n for x in said),
          "cluster.md says dspkd knows the last %d ended jobs: %r" % (n, said))

    gpus = section(page, "GPU indices and UUIDs")
    check("   dspk-submit devices --all " in gpus,
          "the map file is written from dspk-submit devices --all")
    check(re.search(r"^dspk-submit \[--socket PATH\] devices \[--all\]", read("docs", "cli.md"),
                    re.M), "docs/cli.md: devices takes --all")
    for s in ("prolog", "epilog"):
        text = read("packaging", "slurm", "dspk-%s.in" % s)
        comments = "\n".join(l for l in text.splitlines() if l.startswith("#"))
        check("@" not in comments, "dspk-%s.in: no configure-time path in its comments" % s)
        check("%s=/usr/libexec/dspk/slurm/%s" % (s.capitalize(), s) in comments and
              "/usr/bin/dspk-submit" in comments and "From a source tree" in comments,
              "dspk-%s.in names the Debian paths and the prefix rule" % s)
        check("%s=/usr/libexec/dspk/slurm/%s" % (s.capitalize(), s) in page,
              "cluster.md: %s=/usr/libexec/dspk/slurm/%s" % (s.capitalize(), s))
    check("`PREFIX/libexec/dspk/slurm/`" in page and "From a source tree" in page,
          "cluster.md names the prefix rule")
    for man in ("dspkd.8.scd", "dspk.conf.5.scd"):
        files = read("man", man).split("\n# FILES\n")[1].split("\n# ")[0]
        check("in the Debian packages _/etc/dspk/dspkd.conf_" in files,
              "%s FILES: the Debian packages' configuration file" % man)
    print("cluster docs: ok (job_required, %d ended jobs, devices --all)" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
