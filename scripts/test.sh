#!/bin/sh
# The README's second command, also run by CI (.ci/run): installs missing
# packages, builds with -Werror and runs the whole test suite, then builds
# again with AddressSanitizer + UBSan and runs the suite again.  GPU tests
# (ctest label "gpu") need a GPU and run with scripts/gpu-suite.sh instead.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
"$here/scripts/build.sh" "$here/build"
(cd "$here/build" && ctest --output-on-failure -j"$jobs" -LE gpu)
"$here/scripts/build.sh" "$here/build-asan" -DDSPK_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
(cd "$here/build-asan" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
   UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
   ctest --output-on-failure -j"$jobs" -LE 'gpu|noasan')
echo "all tests passed"
