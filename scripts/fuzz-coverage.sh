#!/bin/sh
# Line coverage that the fuzz corpora reach: builds the harnesses of
# tests/fuzz with clang's source-based coverage in build-fuzz-cov/ (or
# $DSPK_FUZZ_COV_DIR), runs each once over its seed corpus plus what
# scripts/fuzz.sh found (build-fuzz/fuzz-corpus/<name>), and prints
# llvm-cov's report for the files each harness targets.  Needs llvm (for
# llvm-profdata and llvm-cov).  Not part of CI; docs/security.md quotes it.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${DSPK_FUZZ_COV_DIR:-"$here/build-fuzz-cov"}
found=${DSPK_FUZZ_DIR:-"$here/build-fuzz"}/fuzz-corpus
prof=$(command -v llvm-profdata || command -v llvm-profdata-14)
cov=$(command -v llvm-cov || command -v llvm-cov-14)
flags="-fprofile-instr-generate -fcoverage-mapping"
CC=clang cmake -S "$here" -B "$dir" -DDSPK_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug \
  -DDSPK_WITH_CUDA=OFF -DDSPK_WITH_VULKAN=OFF -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$dir" -j"$(nproc)" --target fuzz_all >/dev/null
names=${*:-$(cd "$here/tests/fuzz" && ls fuzz_*.c | sed 's/\.c$//')}
for name in $names; do
  short=${name#fuzz_}
  case $short in
    frame) files="proto/frame.c" ;;
    msg|tensor) files="proto/codec.c proto/frame.c proto/dtype.c" ;;
    npy) files="client/submit/npy.c" ;;
    config) files="daemon/config.c" ;;
    op_infer) files="backends/op.c backends/op_dtype.c proto/codec.c" ;;
    *) files="" ;;
  esac
  dirs=""
  for d in "$here/tests/fuzz/corpus/$short" "$found/$short"; do
    [ -d "$d" ] && dirs="$dirs $d"
  done
  rm -f "$dir/$name.profraw"
  # shellcheck disable=SC2086
  LLVM_PROFILE_FILE="$dir/$name.profraw" ASAN_OPTIONS=detect_leaks=0 \
    "$dir/tests/fuzz/$name" -runs=0 $dirs >/dev/null 2>&1
  "$prof" merge -sparse "$dir/$name.profraw" -o "$dir/$name.profdata"
  # shellcheck disable=SC2086
  echo "== $name ($(find $dirs -type f | wc -l) corpus inputs)"
  # shellcheck disable=SC2086
  (cd "$here" && "$cov" report "$dir/tests/fuzz/$name" -instr-profile="$dir/$name.profdata" \
     $files | grep -v '^-')
done
