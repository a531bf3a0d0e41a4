#!/bin/sh
# Installs the Debian packages dspk needs to build and test.  Idempotent: when
# every package is present it only asks dpkg and returns at once.
set -eu
PKGS="build-essential cmake pkg-config git libuv1-dev libmsgpack-dev libsqlite3-dev
libopenblas-dev libfftw3-dev libsystemd-dev libinih-dev libcmocka-dev python3
python3-numpy python3-msgpack python3-venv python3-pip python3-setuptools python3-wheel
python3-pytest libvulkan-dev mesa-vulkan-drivers vulkan-validationlayers glslang-dev spirv-tools spirv-headers
glslang-tools unicode-data libvkfft-dev systemd libzip-dev scdoc man-db file dpkg-dev clang
libclang-rt-14-dev libmicrohttpd-dev libamdhip64-dev libhiprtc-builtins5
python3-prometheus-client tmux python3-yaml
slurmctld slurmd slurm-client munge"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "deps.sh: installing:$missing" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
