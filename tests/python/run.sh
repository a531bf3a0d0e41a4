#!/bin/sh
# The Python client's tests as a user would run them: a fresh venv (with Debian's numpy
# and msgpack from the system site-packages), `pip install` of python/ offline, then
# pytest against the dspkd under test.
#   run.sh PYTHON3 DSPKD WORKDIR
set -eu
py=$1 dspkd=$2 work=$3
src=$(cd "$(dirname "$0")/../../python" && pwd)
common=$(cd "$(dirname "$0")/../common" && pwd)  # the daemon helpers of conftest.py
rm -rf "$work"
mkdir -p "$work"
cp -R "$src" "$work/src"   # pip builds in the tree it installs: keep python/ clean
# ...and without a build left in python/ by an earlier pip install there: the copy's
# files all get the time of the copy, so setuptools could take build/lib's old
# modules as up to date and install them instead of the sources.
rm -rf "$work/src/build" "$work/src"/*.egg-info
"$py" -m venv --system-site-packages --without-pip "$work/venv"
"$work/venv/bin/python" -m pip install -q --no-build-isolation --no-index "$work/src"
cd "$work"                 # so `import dspk` finds the installed package only
"$work/venv/bin/python" -c 'import dspk, sys; sys.exit(0 if "/venv/" in dspk.__file__
else "dspk imported from " + dspk.__file__)'
DSPK_TESTS_COMMON=$common DSPKD=$dspkd exec "$work/venv/bin/python" -m pytest -q -p no:cacheprovider \
  -o console_output_style=classic "$work/src/tests"
