#!/bin/sh
# build.layers: the first target (ok.c, allowed includes) builds; every other
# (a layering violation) fails to compile, and fails because the header is
# not found.  Usage: layers.sh BUILD OK_TARGET VIOLATION_TARGET...
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
[ $bad -eq 0 ] && echo "layers: ok ($# violations refused)"
exit $bad
