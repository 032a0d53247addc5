#!/usr/bin/env bash
# Try the README's set-up command as a new user would: on a fresh Debian bookworm root file system
# (debootstrap, nothing of this machine's Python or packages in it), in a fresh clone of this
# repository's HEAD, as root.  Needs root, debootstrap and util-linux (unshare, pivot_root) here.
#   bash scripts/check_fresh_machine.sh DIR                       # bash scripts/run_main.sh in DIR/rootfs
#   bash scripts/check_fresh_machine.sh DIR bash scripts/run_tests.sh -x -q tests/test_cli.py
# The bootstrapped system (minbase + ca-certificates + git: what a user who cloned has) is kept as
# DIR/bookworm.tar, and every check unpacks it into a new DIR/rootfs and clones anew.
# This machine's extra CA certificates (an egress proxy that intercepts TLS) are trusted inside,
# as they would be on any machine behind that proxy.
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
# A container as a machine would be one: its own mount and PID namespaces, the root switched with
# pivot_root (under chroot the kernel refuses the sandbox its user namespaces), no no_new_privs
# (bwrap as the container would set it), this machine's network.
unshare --mount --propagation private --pid --fork --kill-child /bin/bash -c '
  set -e
  root=$1; shift
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount --rbind /sys "$root/sys"
  mkdir -p "$root/.oldroot"
  cd "$root" && pivot_root . .oldroot && umount -l /.oldroot && rmdir /.oldroot
  cd /root/agent-envs
  exec /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 TERM=dumb "$@"' fresh "$root" "$@"
rc=$?
set -e
echo "[fresh] exit status $rc after $(( $(date +%s) - start )) s"
exit "$rc"
