# Source on the H200 host after .gpu/c1..c3 were copied into /tmp/stage (docs/scaling.md#gpu-host-staging),
# in a call that carries .gpu/c4 and .gpu/r2: vLLM and the .gpu/r2 wheels (gymnasium, ...) installed, the
# environment for this checkout, and a Qwen3-4B-shaped config folder at /tmp/m4b for load_format="dummy"
# (scripts/es_lowrank_check.py --model /tmp/m4b --load-format dummy; the benchmark builds its own).
cp .gpu/c4/* /tmp/stage/ && source /tmp/stage/activate.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/r2/*.whl 2>&1 | grep -v "already exists" | tail -2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=WARNING
python3 - <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "scripts")
from gpu_engine import QWEN3_4B, dense_qwen3
dense_qwen3(Path(".gpu/r2/tokenizer"), QWEN3_4B, Path("/tmp/m4b"))
PY
