#!/usr/bin/env bash
# The main job: installs what it needs, then evaluates the embedded small CPU model on built-in data.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m agent_envs.cli eval "$@"   # same as `agent-envs eval`
