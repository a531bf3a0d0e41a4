#!/bin/sh
# The data-path benchmarks of docs/performance.md ("Data path and per-task
# overhead", issues 12 and 13) in one run, on cpu:0:
#   bench_datapath (C client vs raw socket, memcpy, in-process libraries),
#   bench_numpy.py (reduce vs numpy, fresh dspk-submit vs a numpy script),
#   bench/python/bench_python.py (Python client vs numpy and the C client),
#   bench_fresh.py (wall and CPU time of fresh dspk-submit processes: ping,
#     gemm 64^2, reduce / map abs / map add / gemm on 1024^2 f32 .npy files),
# then the plots (python3-matplotlib) into docs/.
#   sh scripts/bench-datapath.sh [BUILD_DIR [ROUNDS]]
# Writes the tables to stdout and BUILD_DIR/bench-datapath/ (samples, plots).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
b=${1:-"$here/build"}
rounds=${2:-7}
cmake --build "$b" --target dspkd dspk-submit bench_datapath >/dev/null
out="$b/bench-datapath"
mkdir -p "$out"
py=/usr/bin/python3
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -m), $(nproc) cpus," \
     "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
"$b/bench/datapath/bench_datapath" "$b/daemon/dspkd" "$rounds" "$out/samples.json"
echo
$py "$here/bench/datapath/bench_numpy.py" --dspkd "$b/daemon/dspkd" \
    --submit "$b/client/submit/dspk-submit" --reps "$rounds" --json "$out/numpy.json"
echo
$py "$here/bench/python/bench_python.py" --dspkd "$b/daemon/dspkd" \
    --submit "$b/client/submit/dspk-submit" --reps "$rounds"
echo
$py "$here/bench/datapath/bench_fresh.py" --dspkd "$b/daemon/dspkd" \
    --submit "$b/client/submit/dspk-submit" --reps $((rounds < 15 ? 15 : rounds)) \
    --json "$out/fresh.json"
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
if $py -c 'import matplotlib' 2>/dev/null; then
  $py "$here/bench/datapath/plot.py" "$out/samples.json" "$out"
  echo "# plots: $out/perf-transfers.png $out/perf-gemm.png (copy to docs/ to publish)"
fi
