#!/usr/bin/env bash
# Build a Debian bookworm base image that stands in for python:3.11-slim-bookworm, for hosts
# that reach Debian's package mirror but no image registry (CI).  `docker build` of the real
# Dockerfile then runs on it unchanged:
#
#   docker/debian_base.sh                      # tags agent-envs-base:bookworm
#   DOCKER_BUILDKIT=0 docker build --network host --build-arg BASE=agent-envs-base:bookworm \
#     -t agent-envs -t agent-envs-sandbox:latest .
#
# The root filesystem comes from `debootstrap --variant=minbase bookworm` plus Debian's python3
# (3.11, as in the official image) and a virtual environment at /opt/python first on PATH, so
# that the Dockerfile's `pip install` and `pip uninstall pip` work as they do on the official
# image (Debian's own python refuses pip installs into the system).  This host's extra CA
# certificates (/usr/local/share/ca-certificates) are trusted inside, and the venv's pip uses the
# system bundle, so pip works behind a TLS-intercepting egress proxy that the host trusts.
#
# Cost: debootstrap downloads about 40 MB; the tarball is cached under $AGENT_ENVS_CACHE
# (default ~/.cache/agent-envs) keyed by this script and the host's extra certificates, and the
# import is skipped when the daemon already has the tag.  Needs root (debootstrap, chroot).
# DEBIAN_MIRROR overrides debootstrap's default mirror.  The docker CLI honours DOCKER_HOST.
#
# usage: docker/debian_base.sh [TAG]
set -euo pipefail
# debootstrap's steps inside the new root (the packages' scripts: ca-certificates' calls mktemp) take
# this environment with them; a TMPDIR of the host's (a test worker's own) does not exist in there
unset TMPDIR
tag="${1:-agent-envs-base:bookworm}"
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "[debian_base] $tag already present"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "[debian_base] debootstrap missing (apt-get install debootstrap)" >&2; exit 1; }

cache="${AGENT_ENVS_CACHE:-$HOME/.cache/agent-envs}"
certs=(/usr/local/share/ca-certificates/*.crt)
[ -e "${certs[0]}" ] || certs=()
key="$(cat "$0" ${certs[@]+"${certs[@]}"} | sha256sum | cut -c1-16)"
tarball="$cache/debian-bookworm-base-$key.tar.gz"

mkdir -p "$cache"
# one builder at a time (agent_envs/core/cache.py's rule: a lock file beside what is built, the result
# renamed into place complete); a second caller waits, then finds the tarball made
exec {lock}>"$cache/debian-bookworm-base.lock"
flock "$lock"
if [ ! -s "$tarball" ]; then
  work="$(mktemp -d /tmp/ae-debootstrap-XXXXXX)"
  trap 'rm -rf --one-file-system "$work"' EXIT
  root="$work/rootfs"
  echo "[debian_base] debootstrap bookworm into $root (a few minutes)"
  # in its own mount namespace: the /proc and /sys it mounts in the target go away with it
  unshare --mount --propagation private debootstrap --variant=minbase \
    --include=python3,python3-venv,ca-certificates bookworm "$root" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} \
    >"$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
  if [ ${#certs[@]} -gt 0 ]; then
    cp "${certs[@]}" "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null
  fi
  chroot "$root" python3 -m venv /opt/python
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$root/opt/python/pip.conf"
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/tmp/*
  tar -C "$root" --numeric-owner -czf "$work/rootfs.tar.gz" .
  mv "$work/rootfs.tar.gz" "$tarball.$$" && mv "$tarball.$$" "$tarball"  # atomic within the cache
  echo "[debian_base] cached $tarball ($(du -h "$tarball" | cut -f1))"
  find "$cache" -maxdepth 1 -name 'debian-bookworm-base-*.tar.gz' ! -name "${tarball##*/}" -delete  # stale keys
fi
flock -u "$lock"

docker import \
  --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  "$tarball" "$tag" >/dev/null
echo "[debian_base] imported $tag from $tarball"
