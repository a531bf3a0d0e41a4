#!/bin/sh
# Builds the libFuzzer harnesses of tests/fuzz with clang, ASan and UBSan in
# build-fuzz/ (or $DSPK_FUZZ_DIR) and runs each for a bounded time
# (DSPK_FUZZ_SECONDS, default 30) from its seed corpus.  Fails on the first
# crash, leak, sanitizer report or broken oracle; the input that caused it
# is left in the build directory's fuzz-artifacts/ and the command to
# reproduce it is printed.  New inputs the fuzzers find go to a scratch
# corpus in the build directory, never into tests/fuzz/corpus.
#   sh scripts/fuzz.sh                 # every harness, 30 s each
#   sh scripts/fuzz.sh fuzz_frame      # one harness
#   DSPK_FUZZ_SECONDS=600 sh scripts/fuzz.sh
# Called by scripts/test.sh (CI).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${DSPK_FUZZ_DIR:-"$here/build-fuzz"}
secs=${DSPK_FUZZ_SECONDS:-30}
"$here/scripts/deps.sh"
# Debug keeps assert() on; -O1 roughly doubles the executions per second.
CC=${DSPK_FUZZ_CC:-clang} cmake -S "$here" -B "$dir" -DDSPK_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS=-O1 -DDSPK_WITH_CUDA=OFF \
  -DDSPK_WITH_VULKAN=OFF >/dev/null
cmake --build "$dir" -j"$(nproc)" --target fuzz_all
names=${*:-$(cd "$here/tests/fuzz" && ls fuzz_*.c | sed 's/\.c$//')}
mkdir -p "$dir/fuzz-artifacts"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}
for name in $names; do
  short=${name#fuzz_}
  seed="$here/tests/fuzz/corpus/$short"
  work="$dir/fuzz-corpus/$short"
  mkdir -p "$work"
  [ -d "$seed" ] || seed=""
  log="$dir/fuzz-artifacts/$name.log"
  echo "fuzz.sh: $name for ${secs}s" >&2
  if ! "$dir/tests/fuzz/$name" -max_total_time="$secs" -print_final_stats=1 \
       -artifact_prefix="$dir/fuzz-artifacts/$name-" -rss_limit_mb=2048 \
       -timeout=10 "$work" $seed >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz.sh: $name FAILED; reproduce with: $dir/tests/fuzz/$name $dir/fuzz-artifacts/$name-*" >&2
    exit 1
  fi
  # The last status line: executions, coverage (cov: edges, ft: features).
  grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 | sed "s/^/fuzz.sh: $name: /" >&2 || true
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" |
    tr '\n' ' ' | sed "s/^/fuzz.sh: $name: /; s/\$/\n/" >&2 || true
done
echo "fuzz.sh: every harness ran ${secs}s without a finding" >&2
