#!/bin/sh
# The Debian packages on this machine, as an administrator meets them (a
# step of scripts/test.sh; needs root and a machine without dspk installed):
# builds them (packaging/build-debs.sh), installs them with apt, checks the
# dspk user and group, the directories, the conffile and the enabled socket
# (the sockets.target.wants link deb-systemd-helper makes; PID 1 need not be
# systemd) and that an upgrade keeps the administrator's conffile edit and
# socket state, then serves a task the way dspkd.socket does: systemd-socket-
# activate listens on /run/dspk/dspkd.sock and starts the installed
# /usr/sbin/dspkd as the dspk user on the first connection of the installed
# dspk-submit, whose gemm is checked against numpy, and of a program built
# with find_package(dspk) against libdspkclient-dev.  Finally the packages
# are purged and the machine is left as it was (the dspk user, kept by the
# package as Debian does, is removed when this test created it).
# Usage: debs.sh [BUILD_DIR]   (default build-deb)
set -eu
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-"$here/build-deb"}
pkgs="dspkd dspk-tools libdspkclient0 libdspkclient-dev"
fail() { echo "debs: FAIL: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || fail "needs root (it installs packages)"
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' &&
    fail "$p is installed already; this test would remove it"
done
had_user=no; getent passwd dspk >/dev/null && had_user=yes
had_group=no; getent group dspk >/dev/null && had_group=yes

# A python3 with numpy writes the inputs and checks the result (pyenv shims
# may hide the system one).
py=""
for c in /usr/bin/python3 python3; do
  if "$c" -c 'import numpy' 2>/dev/null; then py=$c; break; fi
done
[ -n "$py" ] || fail "no python3 with numpy (python3-numpy)"

tmp=$(mktemp -d)
chmod 755 "$tmp"   # apt's sandbox user reads the .deb files
pid="" catpid=""
cleanup() {
  set +e
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  [ -n "$catpid" ] && wait "$catpid" 2>/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $pkgs >/dev/null 2>&1 || true
  [ $had_user = no ] && getent passwd dspk >/dev/null && userdel dspk
  [ $had_group = no ] && getent group dspk >/dev/null && groupdel dspk
  # What the test's dspkd leaves in /run/dspk (the purge removes the state
  # file and its lock too, but not when the test stopped before it).
  rm -f /run/dspk/dspkd.sock /run/dspk/dspkd.jobs /run/dspk/dspkd.jobs.lock \
    /run/dspk/dspkd.jobs.tmp
  rmdir /run/dspk 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# 1. Build.
sh "$here/packaging/build-debs.sh" "$build" "$tmp/debs" >"$tmp/build.log" 2>&1 ||
  { tail -40 "$tmp/build.log"; fail "building the packages"; }
for p in $pkgs; do
  ls "$tmp/debs/${p}_"*.deb >/dev/null 2>&1 || fail "no $p package built"
done
dpkg-deb -f "$tmp/debs/dspk-tools_"*.deb Depends | grep -q 'libdspkclient0 (= ' ||
  fail "dspk-tools does not depend on libdspkclient0: $(dpkg-deb -f "$tmp/debs/dspk-tools_"*.deb Depends)"
dpkg-deb -f "$tmp/debs/dspk-tools_"*.deb Depends | grep -q 'libzip[0-9]' ||
  fail "dspk-tools does not depend on libzip (dspk-submit opens it for .npz): $(dpkg-deb -f "$tmp/debs/dspk-tools_"*.deb Depends)"
# The -dev package needs the library, not msgpack's headers: dspkclient.pc
# requires no package (it named msgpack in Requires.private).
dev_dep=$(dpkg-deb -f "$tmp/debs/libdspkclient-dev_"*.deb Depends)
case $dev_dep in
  *'libdspkclient0 (= '*) ;;
  *) fail "libdspkclient-dev does not depend on libdspkclient0: $dev_dep" ;;
esac
case $dev_dep in *msgpack*) fail "libdspkclient-dev depends on msgpack: $dev_dep" ;; esac
dpkg-deb -f "$tmp/debs/dspkd_"*.deb Depends | grep -q 'libuv1' ||
  fail "dspkd's Depends lack its libraries (dpkg-shlibdeps): $(dpkg-deb -f "$tmp/debs/dspkd_"*.deb Depends)"

# 2. Install with apt, as an administrator would.
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$tmp"/debs/*.deb >"$tmp/apt.log" 2>&1 ||
  { cat "$tmp/apt.log"; fail "apt-get install"; }
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" | grep -q 'ok installed' || fail "$p not installed"
done
getent passwd dspk >/dev/null || fail "no user dspk"
getent group dspk >/dev/null || fail "no group dspk"
[ "$(stat -c %U:%G /var/cache/dspk)" = dspk:dspk ] || fail "/var/cache/dspk: $(stat -c %U:%G /var/cache/dspk)"
[ "$(stat -c %U:%G /run/dspk)" = dspk:dspk ] || fail "/run/dspk: $(stat -c %U:%G /run/dspk)"
[ -L /etc/systemd/system/sockets.target.wants/dspkd.socket ] || fail "dspkd.socket not enabled"
unit=$(readlink /etc/systemd/system/sockets.target.wants/dspkd.socket)
[ -f "$unit" ] || fail "the enable link points at '$unit'"
grep -q '^ExecStart=/usr/sbin/dspkd ' "$(dirname "$unit")/dspkd.service" || fail "ExecStart is not /usr/sbin/dspkd"
dpkg-query -W -f='${Conffiles}' dspkd | grep -q '/etc/dspk/dspkd.conf' || fail "dspkd.conf is not a conffile"
man -w dspkd >/dev/null && man -w dspk.conf >/dev/null && man -w dspk-submit >/dev/null ||
  fail "man pages not installed"
[ -f /usr/share/bash-completion/completions/dspk-submit ] || fail "no bash completion"
/usr/bin/dspk-submit --version >/dev/null || fail "installed dspk-submit does not run"
# The Slurm prolog and epilog (dspk-tools; docs/cluster.md), and the prolog
# runs /usr/bin/dspk-submit (no daemon on this socket: its ECONNECT).
for s in prolog epilog; do
  [ -x /usr/libexec/dspk/slurm/$s ] || fail "no /usr/libexec/dspk/slurm/$s"
done
out=$(SLURM_JOB_ID=7 SLURM_JOB_UID=0 DSPK_SOCKET=$tmp/none.sock /usr/libexec/dspk/slurm/prolog 2>&1) ||
  true # it fails: no daemon there
case $out in *"dspk-submit: job: ECONNECT"*) ;; *) fail "installed prolog: $out" ;; esac
[ -f /usr/share/doc/dspkd/cluster.md ] || fail "no /usr/share/doc/dspkd/cluster.md"
# No test hook (proto/testhook.h) in what the packages install: the names
# of every DSPK_TEST_HOOK("...") in the tree, looked for in the binaries.
# The GPU runtime's hooks are named under each driver's prefix
# (DSPK__GPURT_HOOK(drv, "PLAN_CACHE"): DSPK_CUDA_PLAN_CACHE, DSPK_HIP_...).
hooks=$( (grep -rhoE 'DSPK_TEST_HOOK\("[A-Z_]+"\)' "$here/daemon" "$here/backends" "$here/cache" \
          "$here/client" "$here/proto" | sed 's/.*("\(.*\)")/\1/'
          for s in $(grep -rhoE 'DSPK__GPURT_HOOK\([a-z]+, "[A-Z_]+"\)' "$here/backends" |
                     sed 's/.*"\(.*\)")/\1/'); do
            echo "DSPK_CUDA_$s"; echo "DSPK_HIP_$s"
          done) | sort -u)
[ "$(echo "$hooks" | wc -w)" -ge 5 ] || fail "found only these test hooks in the source: $hooks"
for bin in /usr/sbin/dspkd /usr/bin/dspk-submit /usr/lib/*/libdspkclient.so.0 \
           /usr/libexec/dspk/dspk-cuda-worker /usr/libexec/dspk/dspk-hip-worker; do
  [ -e "$bin" ] || continue
  for h in $hooks; do
    ! grep -qa "$h" "$bin" || fail "$bin holds the test hook $h"
  done
done

# An upgrade (the package installed over itself: postinst configure with
# the old version) keeps the administrator's choices: an edited conffile,
# a disabled socket stays disabled, an enabled one enabled.
link=/etc/systemd/system/sockets.target.wants/dspkd.socket
echo '# edited by the administrator' >>/etc/dspk/dspkd.conf
# As an administrator does (systemctl works on the links without PID 1).
systemctl disable dspkd.socket >/dev/null 2>&1 || rm -f $link
[ -L $link ] && fail "systemctl disable left $link"
dpkg -i "$tmp"/debs/dspkd_*.deb >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log"; fail "upgrade"; }
grep -q '^# edited by the administrator' /etc/dspk/dspkd.conf || fail "upgrade replaced the edited dspkd.conf"
[ -L $link ] && fail "upgrade enabled a socket the administrator disabled"
systemctl enable dspkd.socket >/dev/null 2>&1 || ln -s "$unit" $link
dpkg -i "$tmp"/debs/dspkd_*.deb >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log"; fail "upgrade"; }
[ -L $link ] || fail "upgrade disabled the socket"

# The -dev package serves a find_package(dspk) project from the system
# directories (tests/install/consumer), and pkg-config.
cmake -S "$here/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_BUILD_TYPE=Release \
      >"$tmp/consumer.log" 2>&1 && cmake --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1 ||
  { cat "$tmp/consumer.log"; fail "consumer against the installed libdspkclient-dev"; }
ldd "$tmp/consumer/consumer" | grep -Eq 'libdspkclient.so.0 => (/usr)?/lib/' ||
  fail "consumer does not use the installed libdspkclient: $(ldd "$tmp/consumer/consumer")"
libs=$(pkg-config --libs dspkclient | sed 's/ *$//')
[ "$libs" = "-ldspkclient" ] || fail "pkg-config --libs dspkclient: '$libs'"

# 3. Serve a task as dspkd.socket would: systemd-socket-activate binds the
# configured socket (it says "Listening on" once it listens), starts dspkd
# as dspk (the unit's User=) at the first connection.
mkfifo "$tmp/err"
systemd-socket-activate -l /run/dspk/dspkd.sock -E CACHE_DIRECTORY=/var/cache/dspk \
    setpriv --reuid=dspk --regid=dspk --init-groups -- /usr/sbin/dspkd --foreground \
    --backends cpu 2>"$tmp/err" &
pid=$!
exec 4<"$tmp/err"
read -r first <&4 || true
cat <&4 >"$tmp/dspkd.log" &
catpid=$!
exec 4<&-
case $first in "Listening on /run/dspk/dspkd.sock"*) ;; *) fail "activator: '$first'" ;; esac
cd "$tmp"
"$py" -c "
import numpy as np
rng = np.random.default_rng(7)
np.save('a.npy', rng.standard_normal((33, 17)))
b = rng.standard_normal((17, 9))
np.save('b.npy', b)
np.savez_compressed('b.npz', w=b)"
/usr/bin/dspk-submit gemm a.npy b.npy -o c.npy --device cpu:0 >"$tmp/submit.out" ||
  { cat "$tmp/dspkd.log"; fail "dspk-submit gemm through /run/dspk/dspkd.sock"; }
"$py" -c "
import numpy as np, sys
a, b, c = (np.load(f) for f in ('a.npy', 'b.npy', 'c.npy'))
ref = [[sum(a[i, k] * b[k, j] for k in range(a.shape[1])) for j in range(b.shape[1])]
       for i in range(a.shape[0])]
sys.exit(0 if c.shape == (33, 9) and np.allclose(c, ref, rtol=1e-12, atol=1e-12) else 1)" ||
  fail "wrong gemm result"
# libzip is opened at run time for .npz (dlopen): the package must bring it.
/usr/bin/dspk-submit gemm a.npy b.npz:w -o cz.npy --device cpu:0 >"$tmp/submit.out" ||
  fail "dspk-submit gemm with an .npz input: $(cat "$tmp/submit.out")"
"$py" -c "
import numpy as np, sys
sys.exit(0 if np.allclose(np.load('c.npy'), np.load('cz.npy'), rtol=1e-12, atol=1e-12) else 1)" ||
  fail "gemm of the .npz input differs from the .npy one"
"$tmp/consumer/consumer" /run/dspk/dspkd.sock >"$tmp/consumer.out" ||
  { cat "$tmp/consumer.out"; fail "consumer's gemm through /run/dspk/dspkd.sock"; }
[ "$(ps -o user= -p "$pid")" = dspk ] || fail "dspkd runs as $(ps -o user= -p "$pid"), not dspk"
[ "$(stat -c %U /var/cache/dspk/cache.db)" = dspk ] || fail "no cache of dspk in /var/cache/dspk"
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
pid=""
wait "$catpid" || true
catpid=""
[ $rc -eq 0 ] || { cat "$tmp/dspkd.log"; fail "dspkd exited with $rc at SIGTERM"; }
rm -f /run/dspk/dspkd.sock   # the activator's; dspkd.socket's RemoveOnStop= would remove it

# 4. Purge: nothing of the packages is left.
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $pkgs >"$tmp/apt.log" 2>&1 ||
  { cat "$tmp/apt.log"; fail "apt-get purge"; }
for f in /usr/sbin/dspkd /usr/bin/dspk-submit /etc/dspk /var/cache/dspk \
         /etc/systemd/system/sockets.target.wants/dspkd.socket /etc/systemd/system/dspkd.socket \
         /usr/include/dspk /run/dspk /usr/libexec/dspk/slurm "$unit"; do
  [ -e "$f" ] || [ -L "$f" ] && fail "$f left after purge"
done
echo "debs: built, installed, served a gemm as dspk through /run/dspk/dspkd.sock, purged: ok"
