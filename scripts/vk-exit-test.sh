#!/usr/bin/env bash
# The exit test of issue 6 §5: start dspkd with the Vulkan backend N times,
# keep several clients submitting raw GLSL kernels that are all different
# (so the runner is busy compiling and creating pipelines), wait for the
# first kernel to complete, then 100-500 ms later end the
# daemon mid-work and check how it ended:
#   term    SIGTERM: must exit 0
#   atexit  exit(3) called from the loop (DSPKD_TEST_EXIT=atexit, SIGHUP):
#           must exit 3 (the exit handler closes the devices in order)
#   fatal   a fatal error path (DSPKD_TEST_EXIT=fatal, SIGHUP): must exit 1
# Any other status (134 = abort, 139 = segfault), a daemon still alive 30 s
# later (a hang), or a run in which no kernel completed before the stop (the
# daemon was not working: nothing was tested) is a failure.  dspk-submit
# must be runnable (libdspkclient.so beside it or on LD_LIBRARY_PATH).  On lavapipe nothing crashes either way: the
# race it guards against is the NVIDIA driver's (../repro/vk-exit-race).
#
#   scripts/vk-exit-test.sh [-n RUNS] [-m term|atexit|fatal|all] [-b BUILD_DIR]
#                           [-d DEVICE] [-o LOG_DIR] [-t SECONDS] [-v]
# -t stops starting new runs of a mode after SECONDS (the summary then says
# how many ran); -v prints one line per run.
set -uo pipefail
runs=100 mode=term build=build dev=vulkan:0 logs= budget=0 verbose=0
while getopts "n:m:b:d:o:t:v" o; do
  case $o in
    n) runs=$OPTARG ;; m) mode=$OPTARG ;; b) build=$OPTARG ;; d) dev=$OPTARG ;;
    o) logs=$OPTARG ;; t) budget=$OPTARG ;; v) verbose=1 ;; *) exit 2 ;;
  esac
done
dspkd=$build/daemon/dspkd
submit=$build/client/submit/dspk-submit
[ -x "$dspkd" ] && [ -x "$submit" ] || { echo "no $dspkd or $submit" >&2; exit 2; }
tmp=$(mktemp -d /tmp/vk-exit.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
[ -n "$logs" ] && mkdir -p "$logs"
[ "$mode" = all ] && modes="term atexit fatal" || modes=$mode

# Unique kernels: each client writes its own sources as it goes.
client() { # id run
  local id=$1 run=$2 i=0
  while [ ! -e "$tmp/stop" ]; do
    i=$((i + 1))
    local f="$tmp/k.$id.$i.comp"
    cat > "$f" <<GLSL
#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
void main() { uint i = gl_GlobalInvocationID.x; x[i] = x[i] * float($run) + float($id * 100000 + $i); }
GLSL
    "$submit" -S "$tmp/s.sock" kernel "$f" --lang glsl --entry main --grid 1 --block 64 \
      --device "$dev" zeros:f32:64 >/dev/null 2>&1 && echo >> "$tmp/done.$id"
    rm -f "$f"
  done
}

total_fail=0
for m in $modes; do
  case $m in term) want=0 ;; atexit) want=3 ;; fatal) want=1 ;; *) echo "bad mode $m" >&2; exit 2 ;; esac
  ok=0 aborts=0 hangs=0 other=0 nowork=0 notready=0 done_runs=0 start=$SECONDS
  for run in $(seq 1 "$runs"); do
    if [ "$budget" -gt 0 ] && [ $((SECONDS - start)) -ge "$budget" ]; then break; fi
    t0=$(date +%s.%N)
    rm -f "$tmp/stop" "$tmp/s.sock" "$tmp"/done.*
    log="$tmp/dspkd.log"
    if [ "$m" = term ]; then
      "$dspkd" --socket "$tmp/s.sock" --backends vulkan --foreground --config "" >"$log" 2>&1 &
    else
      DSPKD_TEST_EXIT=$m "$dspkd" --socket "$tmp/s.sock" --backends vulkan --foreground \
        --config "" >"$log" 2>&1 &
    fi
    pid=$!
    for _ in $(seq 1 300); do
      "$submit" -S "$tmp/s.sock" ping >/dev/null 2>&1 && break
      kill -0 $pid 2>/dev/null || break
      sleep 0.05
    done
    if ! "$submit" -S "$tmp/s.sock" ping >/dev/null 2>&1; then
      notready=$((notready + 1))
    fi
    cpids=()
    for c in 1 2 3 4; do client $c $run & cpids+=($!); done
    # Mid-work: once the first kernel has completed (the runner is then
    # compiling and creating pipelines for the next ones), plus 100..500 ms.
    for _ in $(seq 1 600); do
      [ -n "$(find "$tmp" -name 'done.*' -size +0c 2>/dev/null)" ] && break
      kill -0 $pid 2>/dev/null || break
      sleep 0.05
    done
    sleep "0.$(( (RANDOM % 5) + 1 ))"
    if [ "$m" = term ]; then kill -TERM $pid; else kill -HUP $pid; fi
    st=
    for _ in $(seq 1 300); do
      if ! kill -0 $pid 2>/dev/null; then wait $pid; st=$?; break; fi
      sleep 0.1
    done
    if [ -z "$st" ]; then
      hangs=$((hangs + 1))
      kill -KILL $pid 2>/dev/null
      wait $pid 2>/dev/null
      st=hang
    fi
    touch "$tmp/stop"
    wait "${cpids[@]}" 2>/dev/null
    kdone=$(cat "$tmp"/done.* 2>/dev/null | wc -l)
    if [ "$st" = "$want" ] && [ "$kdone" -gt 0 ]; then
      ok=$((ok + 1))
    elif [ "$st" = 134 ] || [ "$st" = 139 ] || [ "$st" = 136 ]; then
      aborts=$((aborts + 1))
    elif [ "$st" = "$want" ]; then
      nowork=$((nowork + 1))
    elif [ "$st" != hang ]; then
      other=$((other + 1))
    fi
    done_runs=$((done_runs + 1))
    [ "$verbose" = 1 ] && echo "  $m run $run: status $st, $kdone kernels done ($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s)"
    if [ -n "$logs" ] && [ "$st" != "$want" ]; then
      cp "$log" "$logs/dspkd.$m.$run.status-$st.log"
    fi
    [ -n "$logs" ] && [ "$run" = 1 ] && cp "$log" "$logs/dspkd.$m.first.log"
  done
  echo "vk-exit-test mode=$m device=$dev: $ok/$done_runs exited $want; aborts=$aborts hangs=$hangs other=$other no_work=$nowork not_ready=$notready"
  [ "$ok" = "$done_runs" ] || total_fail=1
done
exit $total_fail
