#!/bin/sh
# The README's first command: build dspk, start dspkd on the CPU backend with
# a per-user socket, submit a real task (a 64x48 @ 48x32 f32 gemm and an FFT)
# with dspk-submit, check and print the result, and stop the daemon.
# Inputs are written and results checked with Debian's python3-numpy
# (/usr/bin/python3: a pyenv python3 earlier in PATH may lack numpy).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/build.sh" "$here/build"
bin="$here/build"
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT INT TERM
export DSPK_SOCKET="$work/dspkd.sock"

# Start the daemon; it writes READY to fd 3 once it listens.
mkfifo "$work/ready"
"$bin/daemon/dspkd" --socket "$DSPK_SOCKET" --backends cpu --foreground \
  --cache "$work/cache.db" --ready-fd 3 3>"$work/ready" &
pid=$!
read -r line <"$work/ready"
echo "dspkd ($pid) $line on $DSPK_SOCKET"

"$bin/client/submit/dspk-submit" devices
/usr/bin/python3 - "$work" <<'PY'
import numpy as np, sys
rng = np.random.default_rng(1)
np.save(sys.argv[1] + "/a.npy", rng.standard_normal((64, 48), dtype=np.float32))
np.save(sys.argv[1] + "/b.npy", rng.standard_normal((48, 32), dtype=np.float32))
np.save(sys.argv[1] + "/x.npy", (rng.standard_normal(1024) + 1j * rng.standard_normal(1024)).astype(np.complex64))
PY
"$bin/client/submit/dspk-submit" gemm "$work/a.npy" "$work/b.npy" -o "$work/c.npy" --device cpu:0
"$bin/client/submit/dspk-submit" fft "$work/x.npy" -o "$work/y.npy" --device cpu:0
/usr/bin/python3 - "$work" <<'PY'
import numpy as np, sys
w = sys.argv[1]
a, b, c = np.load(w + "/a.npy"), np.load(w + "/b.npy"), np.load(w + "/c.npy")
x, y = np.load(w + "/x.npy"), np.load(w + "/y.npy")
print("gemm result", c.dtype, c.shape, "C[0,:4] =", c[0, :4])
print("gemm max |C - A@B| =", float(np.abs(c - a @ b).max()))
print("fft  max |Y - fft(X)| =", float(np.abs(y - np.fft.fft(x)).max()))
assert np.allclose(c, a @ b, atol=1e-4) and np.allclose(y, np.fft.fft(x), atol=1e-2)
PY
kill -TERM "$pid"
wait "$pid"
echo "dspkd stopped, exit status $?"
