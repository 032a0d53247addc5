#!/usr/bin/env bash
# Try the README's set-up command as a new user would: on a fresh Debian bookworm root file system
# (debootstrap, nothing of this machine's Python or packages in it), in a fresh clone of this
# repository's HEAD, as root.  Needs root, debootstrap and bwrap on this machine.
#   bash scripts/check_fresh_machine.sh DIR                       # bash scripts/run_main.sh in DIR/rootfs
#   bash scripts/check_fresh_machine.sh DIR bash scripts/run_tests.sh -x -q tests/test_cli.py
# The bootstrapped system (minbase + ca-certificates + git: what a user who cloned has) is kept as
# DIR/bookworm.tar, and every check unpacks it into a new DIR/rootfs and clones anew.
# The root file system is entered with bwrap as a container (its own mount and PID namespaces,
# this machine's network, /proc/sys writable as on any machine), not with chroot: the sandbox
# inside needs user namespaces, which the kernel refuses to a chrooted process.  This machine's extra CA certificates (an egress proxy
# that intercepts TLS) are trusted inside, as they would be on any machine behind that proxy.
set -euo pipefail
dir=$(realpath -m "${1:?usage: check_fresh_machine.sh DIR [COMMAND ...]}"); shift
[ $# -gt 0 ] || set -- bash scripts/run_main.sh
repo=$(cd "$(dirname "$0")/.." && pwd)
root="$dir/rootfs"
mkdir -p "$dir"
if [ ! -s "$dir/bookworm.tar" ]; then
  echo "[fresh] debootstrap bookworm"
  start=$(date +%s)
  rm -rf "$dir/bootstrap"
  unshare --mount --propagation private debootstrap --variant=minbase --include=ca-certificates,git bookworm \
    "$dir/bootstrap" >"$dir/debootstrap.log" 2>&1 || { tail -n 30 "$dir/debootstrap.log" >&2; exit 1; }
  tar -C "$dir/bootstrap" --numeric-owner -cf "$dir/bookworm.tar.$$" . && mv "$dir/bookworm.tar.$$" "$dir/bookworm.tar"
  rm -rf "$dir/bootstrap"
  echo "[fresh] debootstrap took $(( $(date +%s) - start )) s"
fi
rm -rf "$root" && mkdir -p "$root" && tar -C "$root" --numeric-owner -xf "$dir/bookworm.tar"
certs=(/usr/local/share/ca-certificates/*.crt)
if [ -e "${certs[0]}" ]; then
  cp "${certs[@]}" "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
git clone -q "$repo" "$root/root/agent-envs"
echo "[fresh] cloned $(git -C "$repo" rev-parse --short HEAD) into $root/root/agent-envs; running: $*"
start=$(date +%s)
set +e
# /proc/sys as on a machine: writable by root (bwrap's own /proc has it read-only)
bwrap --bind "$root" / --dev-bind /dev /dev --proc /proc --bind /proc/sys /proc/sys --ro-bind /sys /sys \
  --unshare-pid --die-with-parent \
  --clearenv --setenv HOME /root --setenv PATH /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --setenv LANG C.UTF-8 --setenv TERM dumb --chdir /root/agent-envs "$@"
rc=$?
set -e
echo "[fresh] exit status $rc after $(( $(date +%s) - start )) s"
exit "$rc"
