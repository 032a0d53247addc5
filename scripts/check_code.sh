#!/usr/bin/env bash
# The house's walls and style (docs/architecture.md): ruff (lint and format), mypy (strict on core,
# protocol, sandbox and envs) and import-linter's layer contracts, all configured in pyproject.toml.
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
echo "[checks] import-linter"
PYTHONPATH=$PWD $PY -c "from importlinter.cli import lint_imports_command; lint_imports_command()" --no-cache
