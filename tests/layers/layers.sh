#!/bin/sh
# build.layers: the first target (ok.c, allowed includes) builds; every other
# (a layering violation) fails to compile, and fails because the header is
# not found; and dspkd's link line names each of our libraries once (no
# cycle).  Usage: layers.sh BUILD OK_TARGET VIOLATION_TARGET...
set -u
build=$1 ok=$2
shift 2
bad=0
out=$(cmake --build "$build" --target "$ok" 2>&1) ||
  { echo "$out"; echo "FAIL: $ok (allowed includes) does not build" >&2; bad=1; }
for t in "$@"; do
  if out=$(cmake --build "$build" --target "$t" 2>&1); then
    echo "FAIL: $t built: a layer could include another layer's internal header" >&2
    bad=1
  elif ! echo "$out" | grep -q "No such file or directory"; then
    echo "$out"
    echo "FAIL: $t failed for another reason than the missing header" >&2
    bad=1
  fi
done
# No link cycle: CMake resolves one between static libraries by repeating
# them on the link line, so each of ours appears once on dspkd's.
link=$build/daemon/CMakeFiles/dspkd.dir/link.txt
if [ ! -f "$link" ]; then
  echo "FAIL: no $link (a Makefile build is expected)" >&2
  bad=1
else
  dup=$(tr ' ' '\n' <"$link" | grep -E 'lib(dspk|dspkd)_[a-z_]*\.a$' | sed 's|.*/||' | sort |
        uniq -d)
  [ -z "$dup" ] || { echo "FAIL: a link cycle: repeated on dspkd's link line: $dup" >&2; bad=1; }
fi
[ $bad -eq 0 ] && echo "layers: ok ($# violations refused, no link cycle)"
exit $bad
