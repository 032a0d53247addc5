#!/usr/bin/env bash
# The house's walls and style (docs/architecture.md): ruff (lint and format) over the whole tree, mypy
# (strict on core, protocol, sandbox, envs, tools and policy; scripts/, benchmarks/ and examples/
# checked too, not strictly) and import-linter's layer contracts, all configured in pyproject.toml.
# Each must report zero findings; the first that does not fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
echo "[checks] ruff check"
$PY -m ruff check .
echo "[checks] ruff format --check"
$PY -m ruff format --check .
echo "[checks] mypy"
$PY -m mypy
# the scripts run from their folders (sys.path: scripts/, tests/ for docker_daemon); the package they
# import is checked above, so its findings are not repeated here
echo "[checks] mypy scripts benchmarks examples"
MYPYPATH=tests $PY -m mypy --follow-imports=silent scripts benchmarks examples
echo "[checks] import-linter"
# pyproject's contracts, the lists of environment folders taken from the registry (scripts/lint_imports.py)
PYTHONPATH=$PWD $PY scripts/lint_imports.py
