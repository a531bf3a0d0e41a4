#!/bin/sh
# install.docs: the man pages describe what the binaries do.  Every key of
# the configuration table in daemon/config.c is in dspk.conf(5) (the scdoc
# source) and in the example systemd/dspkd.conf, and what each says a reload
# does with it agrees with the table (reload_lists.py), and each commented value
# there is dspkd's default (conf_defaults.py, with security.md's flags and the
# admins' extra connections); every long option of
# `dspkd --help` is in dspkd(8); every command of `dspk-submit --help` is
# in dspk-submit(1) (generated from docs/cli.md); the generated pages render
# without a groff warning; and the unit's Documentation= names pages that
# exist; no file of the tree keeps a merge conflict's markers.  Usage: docs.sh BUILD SRC DSPKD DSPK_SUBMIT
set -eu
build=$1 src=$2 dspkd=$3 submit=$4
bad=0
fail() { echo "FAIL: $*" >&2; bad=1; }

# Keys: the rows {"section", "key", K_... of daemon/config.c's table.
keys=$(sed -n 's/^ *{"\([a-z_]*\)", "\([a-z_]*\)", K_.*/\1.\2/p' "$src/daemon/config.c")
[ "$(echo "$keys" | wc -l)" -ge 10 ] || fail "read only $(echo "$keys" | wc -l) keys from config.c"
for sk in $keys; do
  section=${sk%%.*} key=${sk#*.}
  # Under its own section heading; scdoc escapes _ as \_ in the source.
  awk -v s="# [$section]" -v k="$key" '
    BEGIN {gsub(/_/, "\\_", k); k = "*" k "* = "}
    $0 == s {on = 1; next} /^# / {on = 0} on && index($0, k) {found = 1}
    END {exit !found}' "$src/man/dspk.conf.5.scd" ||
    fail "dspk.conf(5) does not describe $key in [$section]"
  grep -q "^#\{0,1\}$key =\( \|$\)" "$src/systemd/dspkd.conf" ||
    fail "systemd/dspkd.conf has no line for $key"
done

# Which keys a reload applies and which wait for the next start: config.c's
# table against the example file's header, dspk.conf(5) and docs/admin.md.
python3 "$src/tests/install/reload_lists.py" "$src" || fail "the reload lists disagree"

# The shipped dspkd.conf's commented values are dspkd's defaults (--help), a
# computed default shows its computation; security.md says which limits are
# flags; the admins' extra connections are said wherever the limits are.
python3 "$src/tests/install/conf_defaults.py" "$src" "$dspkd" ||
  fail "the documented settings disagree with dspkd"

# Options of dspkd.
for opt in $("$dspkd" --help | grep -o -- '--[a-z][a-z-]*' | sort -u); do
  grep -q -- "\*$opt\*" "$src/man/dspkd.8.scd" || fail "dspkd(8) does not describe $opt"
done

# The default socket is stated in the same words, root's before the user's,
# in --help, dspkd(8), dspk.conf(5) and the shipped file (probe 23 H L2: the
# three gave three orders, and dspk.conf(5) had root's alone).  Compared
# with the pages' markup (* _ \), the file's "# " and line breaks taken out.
flat() { sed 's/^# \{0,1\}//' "$@" | tr -s ' \n\t' '   ' | tr -d '*_\\'; }
sock=$("$dspkd" --help | tr -s ' \n' '  ' |
       sed -n 's/.*--socket PATH listen here (default \([^()]*\)).*/\1/p')
case $sock in
  '$DSPK_SOCKET, else /run/dspk/dspkd.sock as root, else $XDG_RUNTIME_DIR/dspk/dspkd.sock') ;;
  *) fail "dspkd --help gives the default socket as '$sock', not in the order dspkd takes it" ;;
esac
sockflat=$(printf '%s' "$sock" | tr -d '_')
for f in man/dspkd.8.scd man/dspk.conf.5.scd systemd/dspkd.conf; do
  flat "$src/$f" | grep -qF -- "$sockflat" ||
    fail "$f does not give the default socket as dspkd --help does: $sock"
done

# The raw-kernel compile's time limit is said as what it is, wall-clock time
# (kcompile.h; RLIMIT_CPU only backs it), wherever it is stated, and the
# internal --kernel-compile is said to be one (probe 23 H: "5 s", and an
# option "dspkd --kernel-compile" that --help does not list).
ks=$(sed -n 's/^#define DSPK__KCOMPILE_TIME_S \([0-9]*\)$/\1/p' "$src/backends/common/kcompile.h")
[ -n "$ks" ] || fail "no DSPK__KCOMPILE_TIME_S in backends/common/kcompile.h"
for f in docs/admin.md docs/security.md docs/protocol.md man/dspkd.8.scd; do
  flat "$src/$f" | grep -qF "$ks s of wall-clock time" ||
    fail "$f does not say the raw-kernel compile's $ks s are wall-clock time"
  if flat "$src/$f" | grep -qF -- "--kernel-compile" &&
     ! flat "$src/$f" | grep -qF "internal mode"; then
    fail "$f names dspkd --kernel-compile without saying it is an internal mode"
  fi
done

# The configuration file dspkd reads by default (its --help names it) is the
# one dspkd(8) and dspk.conf(5) name, as built (the sysconfdir of the build:
# /etc/dspk in the Debian packages).
conf=$("$dspkd" --help | tr -s ' \n' '  ' | sed -n 's/.*(default \([^ ]*dspkd\.conf\) when it exists.*/\1/p')
[ -n "$conf" ] || fail "dspkd --help does not name its default configuration file"
for page in man8/dspkd.8 man5/dspk.conf.5; do
  [ -f "$build/man/$page" ] || continue
  if ! sed 's/\\&//g' "$build/man/$page" | grep -qF "$conf"; then
    fail "$page does not name $conf"
  fi
  if sed 's/\\&//g' "$build/man/$page" | grep -v 'Debian packages' | grep -F 'dspk/dspkd.conf' |
       grep -qvF "$conf"; then
    fail "$page names another configuration file than $conf"
  fi
done

# Commands of dspk-submit.
cmds=$("$submit" --help | awk '/^Commands:/ {on = 1; next} on && /^  [a-z]/ {print $1}')
[ -n "$cmds" ] || fail "no commands in dspk-submit --help"
page=$build/man/man1/dspk-submit.1
for c in $cmds; do
  grep -q "^\.SS $c\b\|^\.SS \"$c\b" "$page" || fail "dspk-submit(1) has no section for $c"
done

# The pages render cleanly, and Documentation= names them.
for p in man1/dspk-submit.1 man5/dspk.conf.5 man8/dspkd.8; do
  [ -s "$build/man/$p" ] || { fail "$p not generated"; continue; }
  warn=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$build/man/$p" 2>&1 >/dev/null)
  [ -z "$warn" ] || fail "$p: $warn"
done
# dspk-submit(1) renders cli.md's examples and text as written (md2scd.py).
if [ -s "$page" ]; then
  LC_ALL=C.UTF-8 MANWIDTH=1000 man -l "$page" 2>/dev/null | col -b > "$build/man/dspk-submit.1.txt"
  python3 "$src/tests/install/man_render.py" "$src/docs/cli.md" "$build/man/dspk-submit.1.txt" ||
    fail "dspk-submit(1) does not render docs/cli.md as written"
fi
for ref in $(sed -n 's/^Documentation=//p' "$src/systemd/dspkd.service.in" "$src/systemd/dspkd.socket"); do
  case $ref in
    man:*) name=${ref#man:} page=${name%(*} sec=${name#*(} sec=${sec%)}
           [ -s "$build/man/man$sec/$page.$sec" ] || fail "Documentation=$ref: no such page" ;;
    *) fail "Documentation=$ref is not a man page" ;;
  esac
done
[ $bad -eq 0 ] && echo "docs: ok"
# No merge left half done: a conflict marker at the start of a line of any
# source, document or page (dspk.conf(5) shipped one).
conflicts=$(grep -rIlE '^(<{7}|>{7})( |$)|^={7}$' "$src" --exclude-dir=.git \
  --exclude-dir='build*' --exclude-dir=.device --exclude-dir='.gl' || true)
[ -z "$conflicts" ] || fail "merge conflict markers in: $conflicts"

exit $bad
