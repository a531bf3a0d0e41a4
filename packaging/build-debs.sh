#!/bin/sh
# Builds the Debian packages (dspkd, libdspkclient0, libdspkclient-dev,
# dspk-tools) into OUT (default BUILD/debs): configures BUILD (default
# build-deb) for the prefix /usr, builds what is installed, runs cpack.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-"$here/build-deb"}
out=${2:-"$dir/debs"}
"$here/scripts/deps.sh"
cmake -S "$here" -B "$dir" -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DDSPK_WERROR=ON -DBUILD_TESTING=OFF -DDSPK_TEST_HOOKS=OFF -DDSPK_INSTALL_RPATH=OFF -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON >/dev/null
# Only what the packages hold (not the benchmarks).
targets="dspkd dspkclient dspk-submit man dspk_protocol_json"
grep -q '^dspk-cuda-worker:' "$dir/Makefile" 2>/dev/null && targets="$targets dspk-cuda-worker"
grep -q '^dspk-hip-worker:' "$dir/Makefile" 2>/dev/null && targets="$targets dspk-hip-worker"
for t in $targets; do
  cmake --build "$dir" -j"$(nproc)" --target "$t"
done
rm -rf "$out"
(cd "$dir" && cpack -G DEB -B "$out" >/dev/null)
ls "$out"/*.deb
