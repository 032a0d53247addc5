# Source on the H200 host, in the checkout's root, once every upload folder was placed
# (docs/scaling.md#gpu-host-staging: scripts/gpu_uploads.sh here, `bash .gpu/uK/place.sh` in one call per
# folder there): vLLM, Ray and agent-envs' runtime dependencies installed into /tmp/site, the environment
# for this checkout, and a Qwen3-4B-shaped config folder at /tmp/m4b for load_format="dummy"
# (scripts/es_lowrank_check.py --model /tmp/m4b --load-format dummy; the benchmarks build their own), and the
# compile caches of an earlier host unpacked where one was uploaded.
source /tmp/stage/activate.sh && source /tmp/stage-ray/activate.sh
# an earlier host's compile caches, where an upload folder placed them in /tmp/caches (scripts/gpu_caches.sh)
bash scripts/gpu_caches.sh unpack
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=WARNING
python3 - <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "scripts")
from gpu_engine import QWEN3_4B, dense_qwen3
dense_qwen3(Path("/tmp/stage-ray/tokenizer"), QWEN3_4B, Path("/tmp/m4b"))
PY
