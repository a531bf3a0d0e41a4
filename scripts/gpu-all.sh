#!/bin/bash
# Everything that needs a GPU, in one go, one step after the other: the CUDA
# and Vulkan GPU tests (Slurm job allocations by UUID included), the CUDA suite's benchmarks (scripts/gpu-suite.sh
# bench), the staging and Vulkan benchmarks, then the Vulkan exit test
# (scripts/vk-exit-test.sh, 100 runs of each mode, the three modes at once).
# Logs go to OUTDIR/logs, packed into OUTDIR/logs.tgz at the end.  On the
# GPU machine (docs/performance.md), the staged Debian packages are unpacked
# first when .device/unpack-debs.sh is there.
#
#   scripts/gpu-all.sh [BUILD_DIR] [OUTDIR] [STEP...]
#
# With STEP names (test_cuda_gpu gpu_smoke gpu_jobs conformance shm_gpu test_vulkan
# test_coopmat validation gpu_suite staging bench_vulkan bench_fft vkexit) only those
# run: a machine that limits one command to 10 minutes takes the whole set in
# two or three calls.
B=${1:-build}
OUT=${2:-gpu-out}
shift 2 2>/dev/null || shift $#
ONLY=" $* "
want() { [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $1 "* ]]; }
if [ -f .device/unpack-debs.sh ]; then
  . .device/unpack-debs.sh .device/debs
  export PYTHONPATH=/opt/debdeps/usr/lib/python3/dist-packages
fi
# The Khronos validation layer for the validation step, where its Debian
# package was staged beside the others (.device/vvl): unpacked the same way.
if ls .device/vvl/*.deb > /dev/null 2>&1; then
  for f in .device/vvl/*.deb; do dpkg -x "$f" /opt/debdeps; done
  export VK_LAYER_PATH=/opt/debdeps/usr/share/vulkan/explicit_layer.d
  export LD_LIBRARY_PATH=/opt/debdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# The kernel workers of a build tree copied elsewhere (the GPU machine gets
# a copy): the path compiled into the backends is the build machine's.
for w in cuda hip; do
  v=DSPK_$(echo $w | tr a-z A-Z)_WORKER
  if [ -z "${!v:-}" ] && [ -x "$B/backends/$w/dspk-$w-worker" ]; then
    export "$v=$(realpath "$B/backends/$w/dspk-$w-worker")"
  fi
done
# ...and its libdspkclient (the run path points into the build machine's tree).
export LD_LIBRARY_PATH="$(realpath "$B/client")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
L=$OUT/logs
mkdir -p "$L"
nvidia-smi -L; date -u
step() {
  local name=$1 lim=$2 t0=$SECONDS
  shift 2
  want "$name" || return 0
  timeout "$lim" "$@" > "$L/$name.log" 2>&1
  echo "== $name rc=$? $((SECONDS - t0))s"
}
step test_cuda_gpu 240 "$B/tests/cuda/test_cuda_gpu"
step gpu_smoke 120 python3 tests/daemon/gpu_smoke.py --dspkd "$B/daemon/dspkd"
# Slurm job allocations by UUID on real GPUs: nvidia-smi's UUIDs name the cuda
# devices, cuda and vulkan twins of one GPU allowed together (docs/cluster.md).
step gpu_jobs 120 python3 tests/cluster/gpu_jobs.py --dspkd "$B/daemon/dspkd"
# The protocol cases that hold "on every backend", with cuda:0 among them.
step conformance 180 env DSPK_TEST_BACKENDS=cpu,vulkan,cuda python3 tests/proto/conformance.py \
  --dspkd "$B/daemon/dspkd" gemm_blas degenerate nan_extremes half_close cancel_done fft_nonfinite fft_normal_accuracy fft_large_rows \
  fir_rows fir_blocks contract_one_operand_labels contract_nonfinite_sums contract_subnormal_sums \
  contract_one_product sums_and_infinities vulkan_max_tensor gemm_running_overflow fir_subnormal
step shm_gpu 180 python3 tests/daemon/shm_gpu.py --dspkd "$B/daemon/dspkd"
step test_vulkan 300 "$B/tests/vulkan/test_vulkan"
step test_coopmat 120 "$B/tests/vulkan/test_coopmat"
# dspkd's Vulkan calls under the Khronos validation layer (exit 77: no layer).
step validation 300 python3 tests/vulkan/validation.py --dspkd "$B/daemon/dspkd"
step gpu_suite 420 scripts/gpu-suite.sh "$B" "$L/cuda" bench
step staging 60 "$B/bench/cuda_staging/bench_cuda_staging"
step bench_vulkan 150 "$B/bench/vulkan/bench_vulkan"
step bench_fft 90 "$B/bench/vulkan/bench_vulkan" fft
date -u
want vkexit && for m in term fatal atexit; do
  (scripts/vk-exit-test.sh -n 100 -m $m -b "$B" -d "vulkan:${EXITDEV:-0}" -o "$L/vkexit-$m" \
     -t 240 > "$L/vkexit-$m.txt" 2>&1
   echo "rc=$?" >> "$L/vkexit-$m.txt") &
done
wait
date -u
cat "$L"/vkexit-*.txt 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
