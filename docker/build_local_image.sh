#!/usr/bin/env bash
# Build the agent-envs image from this machine's own files with `docker import` (no base image
# is pulled), for hosts that cannot reach an image registry.  Equivalent to the top-level
# Dockerfile: bash + core utilities, tesseract, python with numpy/sympy/Pillow/pytesseract, and
# this repository installed (`agent-envs` is the entrypoint; working directory /, no /workspace,
# as there).  HOME is /tmp because this root filesystem has no home folder.  Needs the package's
# dependencies installed in the running python3.  The docker CLI honours DOCKER_HOST.
#
# usage: docker/build_local_image.sh [TAG ...]   (default: agent-envs:latest agent-envs-sandbox:latest)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
tags=("$@")
[ ${#tags[@]} -gt 0 ] || tags=(agent-envs:latest agent-envs-sandbox:latest)
prefix="$(python3 -c 'import sys; print(sys.base_prefix)')"

python3 "$here/local_rootfs.py" --with-package "$repo" | docker import \
  --change "ENV PATH=$prefix/bin:/usr/local/bin:/usr/bin:/bin" \
  --change 'ENV HOME=/tmp' \
  --change 'ENV PIP_NO_INDEX=1' \
  --change 'ENV PYTHONUNBUFFERED=1' \
  --change 'ENTRYPOINT ["agent-envs"]' \
  - "${tags[0]}"
for tag in "${tags[@]:1}"; do
  docker tag "${tags[0]}" "$tag"
done
echo "built ${tags[*]}"
