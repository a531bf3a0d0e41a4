#!/bin/sh
# The README's second command, also run by CI (.ci/run): installs missing
# packages, builds with -Werror and runs the whole test suite, then builds
# the Debian packages and tests them installed (tests/install/debs.sh), then
# builds again with AddressSanitizer + UBSan and runs the suite again, then
# runs every fuzzer of tests/fuzz for a bounded time (scripts/fuzz.sh).  GPU tests
# (ctest label "gpu") need a GPU and run with scripts/gpu-suite.sh instead.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
"$here/scripts/build.sh" "$here/build"
(cd "$here/build" && ctest --output-on-failure -j"$jobs" -LE gpu)
# The Debian packages: built, installed with apt, used, purged (needs root;
# CI runs as root on a fresh machine).
pkg_note=""
if [ "$(id -u)" -eq 0 ]; then
  sh "$here/tests/install/debs.sh" "$here/build-deb"
else
  pkg_note=" (except tests/install/debs.sh and the Slurm cluster test, which need root)"
  echo "scripts/test.sh: not root: the package test tests/install/debs.sh did not run," \
       "nor the Slurm cluster test (ctest -L slurm: reported as not run)" >&2
fi
"$here/scripts/build.sh" "$here/build-asan" -DDSPK_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
(cd "$here/build-asan" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
   UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
   ctest --output-on-failure -j"$jobs" -LE 'gpu|noasan')
# libFuzzer harnesses (tests/fuzz) under clang + ASan/UBSan, each for a
# bounded time (DSPK_FUZZ_SECONDS, 30 by default): any finding fails CI.
"$here/scripts/fuzz.sh"
echo "all tests passed$pkg_note"
