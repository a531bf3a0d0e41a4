#!/bin/sh
# install.prefix: `cmake --install BUILD --prefix P` writes nothing outside
# P (every path of install_manifest.txt, and a listing of the scratch
# directory), DESTDIR=D puts everything under D; an install to /usr under
# DESTDIR puts the units in systemd's directories (pkg-config systemd) and
# the configuration in /etc.  The
# installed tree runs from any prefix: it is moved elsewhere, then
# P/bin/dspk-submit --help runs, resolves libdspkclient from P (not the build
# tree), pkg-config finds dspkclient there, the man pages and the bash
# completion are there, and tests/install/consumer (find_package(dspk),
# dspk::client) builds against it and runs a gemm on the installed dspkd.
# Usage: prefix.sh BUILD SRC
set -eu
build=$1 src=$2
tmp=$(mktemp -d)
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Every installed path (the manifest) must lie under $1.
check_manifest() {
  under=$1
  [ -s "$build/install_manifest.txt" ] || fail "no install_manifest.txt"
  out=$(grep -v "^$under/" "$build/install_manifest.txt" || true)
  [ -z "$out" ] || fail "installed outside $under: $out"
}

# 0. A test build (DSPK_TEST_HOOKS: its programs obey test-only variables) is not
# installed: cmake --install stops with a message and writes nothing, unless
# DSPK_INSTALL_TEST_BUILD=1 (the rest of this script installs it on purpose).
if grep -q '^DSPK_TEST_HOOKS:BOOL=ON$' "$build/CMakeCache.txt"; then
  mkdir "$tmp/refused"
  out=$(env -u DSPK_INSTALL_TEST_BUILD cmake --install "$build" --prefix "$tmp/refused/p" 2>&1) &&
    fail "a test build was installed without DSPK_INSTALL_TEST_BUILD=1"
  case $out in *"this is a test build"*"-DBUILD_TESTING=OFF"*) ;;
    *) fail "the refused install does not say why: $out" ;; esac
  [ -z "$(ls -A "$tmp/refused")" ] || fail "the refused install wrote: $(find "$tmp/refused")"
  export DSPK_INSTALL_TEST_BUILD=1
fi

# 1. --prefix P.
mkdir "$tmp/scratch"
cmake --install "$build" --prefix "$tmp/scratch/p" >/dev/null
check_manifest "$tmp/scratch/p"
[ "$(ls -A "$tmp/scratch")" = p ] || fail "cmake --install wrote next to the prefix"
for f in bin/dspk-submit sbin/dspkd lib/systemd/system/dspkd.service \
         lib/systemd/system/dspkd.socket lib/sysusers.d/dspk.conf lib/tmpfiles.d/dspk.conf \
         etc/dspk/dspkd.conf share/man/man8/dspkd.8 share/man/man5/dspk.conf.5 \
         share/man/man1/dspk-submit.1 share/bash-completion/completions/dspk-submit \
         share/doc/dspkd/admin.md lib/cmake/dspk/dspkConfig.cmake include/dspk/dspk.h \
         share/doc/dspkd/cluster.md share/doc/dspkd/examples/dspkd-daemonset.yaml \
         libexec/dspk/slurm/prolog libexec/dspk/slurm/epilog share/dspk/protocol.json; do
  [ -f "$tmp/scratch/p/$f" ] || fail "missing $f under the prefix"
done
# The Slurm prolog runs the dspk-submit of its own tree (here it cannot reach a
# daemon: ECONNECT from that dspk-submit); the epilog without a socket does nothing.
out=$(SLURM_JOB_ID=7 SLURM_JOB_UID=0 DSPK_SOCKET=$tmp/none.sock \
      "$tmp/scratch/p/libexec/dspk/slurm/prolog" 2>&1) && fail "prolog without a daemon succeeded"
case $out in *"dspk-submit: job: ECONNECT"*) ;; *) fail "prolog: $out" ;; esac
SLURM_JOB_ID=7 DSPK_SOCKET=$tmp/none.sock "$tmp/scratch/p/libexec/dspk/slurm/epilog" ||
  fail "epilog without a daemon socket failed"
grep -q "^ExecStart=$tmp/scratch/p/sbin/dspkd " "$tmp/scratch/p/lib/systemd/system/dspkd.service" ||
  fail "ExecStart does not name the installed dspkd"
# The unit names the configuration file this dspkd reads (its --help's
# default, fixed at configure time), and has ConfigurationDirectory= (which
# only makes directories under /etc) only when that file is in /etc/dspk.
conf=$("$tmp/scratch/p/sbin/dspkd" --help | tr -s ' \n' '  ' | sed -n 's/.*(default \(\/[^ ]*\/dspk\/dspkd\.conf\) when it exists.*/\1/p')
[ -n "$conf" ] || fail "dspkd --help names no default configuration file"
unit=$tmp/scratch/p/lib/systemd/system/dspkd.service
grep -q "^# Reads $conf when it exists" "$unit" || fail "the unit does not name $conf: $(grep -n Reads "$unit")"
if [ "$conf" = /etc/dspk/dspkd.conf ]; then
  grep -q '^ConfigurationDirectory=dspk$' "$unit" || fail "no ConfigurationDirectory=dspk for /etc/dspk"
else
  ! grep -q '^ConfigurationDirectory=' "$unit" || fail "ConfigurationDirectory= names /etc/dspk, $conf is read"
fi
# The unit makes the directories with the modes tmpfiles.d gives them (its
# comment says "the same way"): RuntimeDirectory= 0755 (systemd's default),
# CacheDirectory= 0750.
tmpf=$tmp/scratch/p/lib/tmpfiles.d/dspk.conf
grep -q '^d /var/cache/dspk 0750 ' "$tmpf" && grep -q '^CacheDirectoryMode=0750$' "$unit" ||
  fail "CacheDirectory= mode differs from tmpfiles.d: $(grep -n Cache "$unit" "$tmpf")"
grep -q '^d /run/dspk 0755 ' "$tmpf" && ! grep -q '^RuntimeDirectoryMode=' "$unit" ||
  fail "RuntimeDirectory= mode differs from tmpfiles.d"
# The installed units verify clean, as docs/systemd.md says to check them: the
# prefix's man pages on man's path (MANPATH=P/share/man: , the colon keeps
# the system's), since verify runs man for each Documentation= page.
if command -v systemd-analyze >/dev/null && command -v man >/dev/null; then
  out=$(MANPATH="$tmp/scratch/p/share/man:" systemd-analyze verify \
        "$tmp/scratch/p/lib/systemd/system/dspkd.service" \
        "$tmp/scratch/p/lib/systemd/system/dspkd.socket" 2>&1) ||
    fail "systemd-analyze verify of the installed units failed: $out"
  [ -z "$out" ] || fail "systemd-analyze verify of the installed units said: $out"
fi

# The files under DESTDIR $1 must be exactly the manifest's (which names
# them without DESTDIR): then nothing was written outside DESTDIR.
check_destdir() {
  (cd "$1" && find . -type f -o -type l) | sed 's|^\.||' | sort >"$tmp/found"
  sort "$build/install_manifest.txt" >"$tmp/manifest"
  cmp -s "$tmp/found" "$tmp/manifest" ||
    fail "DESTDIR=$1: files differ from the manifest: $(diff "$tmp/manifest" "$tmp/found")"
}

# 2. DESTDIR with another prefix: everything under DESTDIR/prefix.
DESTDIR="$tmp/dest" cmake --install "$build" --prefix /opt/dspk >/dev/null
check_manifest /opt/dspk
check_destdir "$tmp/dest"

# 3. DESTDIR with /usr: the units where systemd looks, nothing outside DESTDIR.
unitdir=$(pkg-config --variable=systemdsystemunitdir systemd 2>/dev/null || echo /lib/systemd/system)
sysusersdir=$(pkg-config --variable=sysusersdir systemd 2>/dev/null || echo /usr/lib/sysusers.d)
DESTDIR="$tmp/usr" cmake --install "$build" --prefix /usr >/dev/null
check_destdir "$tmp/usr"
out=$(grep -v -e '^/usr/' -e "^$unitdir/" -e '^/etc/dspk/' "$build/install_manifest.txt" || true)
[ -z "$out" ] || fail "installed to /usr, outside /usr, $unitdir and /etc/dspk: $out"
[ -f "$tmp/usr/etc/dspk/dspkd.conf" ] || fail "no DESTDIR/etc/dspk/dspkd.conf"
[ -f "$tmp/usr$unitdir/dspkd.socket" ] || fail "no dspkd.socket in DESTDIR$unitdir"
[ -f "$tmp/usr$sysusersdir/dspk.conf" ] || fail "no dspk.conf in DESTDIR$sysusersdir"
grep -q '^ExecStart=/usr/sbin/dspkd ' "$tmp/usr$unitdir/dspkd.service" || fail "ExecStart not /usr/sbin/dspkd"

# 4. The tree runs from anywhere: move it, then run it.
mv "$tmp/scratch/p" "$tmp/moved"
p=$tmp/moved
unset LD_LIBRARY_PATH
"$p/bin/dspk-submit" --help >"$tmp/help" || fail "$p/bin/dspk-submit --help failed"
grep -q '^usage: dspk-submit' "$tmp/help" || fail "unexpected --help output"
lib=$(realpath "$(ldd "$p/bin/dspk-submit" | awk '$1 ~ /^libdspkclient/ {print $3}')")
[ "$lib" = "$(realpath "$p/lib/libdspkclient.so.0")" ] || fail "libdspkclient resolved to '$lib', not $p/lib"
"$p/sbin/dspkd" --version >/dev/null || fail "installed dspkd --version failed"
inc=$(PKG_CONFIG_PATH="$p/lib/pkgconfig" pkg-config --cflags-only-I dspkclient | sed 's/^-I//; s/ *$//')
[ "$(realpath "$inc")" = "$p/include" ] || fail "pkg-config --cflags dspkclient: '$inc'"
# Where no other package's .pc is found (no libmsgpack-dev: the -dev package
# does not need it), pkg-config still answers: dspkclient.pc requires no
# package (it had Requires.private: msgpack, which pkg-config resolves even
# for --cflags, and failed).
PKG_CONFIG_LIBDIR="$p/lib/pkgconfig" PKG_CONFIG_PATH="" pkg-config --cflags --libs dspkclient \
  >"$tmp/pc.out" 2>&1 || fail "pkg-config dspkclient without msgpack.pc: $(cat "$tmp/pc.out")"
grep -q '^Requires' "$p/lib/pkgconfig/dspkclient.pc" && fail "dspkclient.pc requires: $(grep '^Requires' "$p/lib/pkgconfig/dspkclient.pc")"
MANPATH="$p/share/man" man -w dspkd >/dev/null || fail "man dspkd not found"

# 5. A find_package(dspk) consumer against the installed prefix.
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$p" \
      -DCMAKE_BUILD_TYPE=Release >"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; fail "consumer configure"; }
cmake --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; fail "consumer build"; }
lib=$(realpath "$(ldd "$tmp/consumer/consumer" | awk '$1 ~ /^libdspkclient/ {print $3}')")
[ "$lib" = "$(realpath "$p/lib/libdspkclient.so.0")" ] || fail "consumer's libdspkclient is '$lib'"
"$tmp/consumer/consumer" | grep -q 'consumer ok' || fail "consumer (no daemon) failed"

# ... and against the installed dspkd (started on a private socket; its
# --ready-fd line says when it listens).
mkfifo "$tmp/ready"
"$p/sbin/dspkd" --foreground --config "" --no-cache --backends cpu \
    --socket "$tmp/d.sock" --ready-fd 3 3>"$tmp/ready" 2>"$tmp/dspkd.log" &
pid=$!
read -r line <"$tmp/ready" || true
[ "$line" = READY ] || { cat "$tmp/dspkd.log"; fail "installed dspkd did not start"; }
"$tmp/consumer/consumer" "$tmp/d.sock" || fail "consumer gemm against the installed dspkd"
kill "$pid"
wait "$pid" || fail "dspkd exited with status $? at SIGTERM"
pid=""
echo "install to a prefix: ok"
