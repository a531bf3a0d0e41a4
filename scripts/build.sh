#!/bin/sh
# Installs missing Debian packages and builds dspk into build/ (or $1).
# Extra arguments are passed to cmake's configure step.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-"$here/build"}
[ $# -gt 0 ] && shift
"$here/scripts/deps.sh"
cmake -S "$here" -B "$dir" -DDSPK_WERROR=ON "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
