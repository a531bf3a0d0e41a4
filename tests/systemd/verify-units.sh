#!/bin/sh
# Checks the unit files with systemd-analyze verify.  verify exits 0 on
# unknown keys and typos, so any output at all is a failure.  Also checks
# that systemd-sysusers accepts the sysusers.d entry (in a scratch root).
set -u
units=$1 src=$2
command -v systemd-analyze >/dev/null || { echo "systemd-analyze missing"; exit 77; }
out=$(cd "$units" && systemd-analyze verify ./dspkd.service ./dspkd.socket 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
  echo "systemd-analyze verify (rc=$rc) said:"; echo "$out"; exit 1
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/etc"
: >"$root/etc/passwd"; : >"$root/etc/group"
out=$(systemd-sysusers --root="$root" "$src/systemd/dspk.sysusers" 2>&1)
rc=$?
if [ $rc -ne 0 ] || ! grep -q '^dspk:' "$root/etc/passwd"; then
  echo "systemd-sysusers (rc=$rc) said:"; echo "$out"; exit 1
fi
echo "units verified"
