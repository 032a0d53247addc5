#!/usr/bin/env bash
# The main job: installs what it needs, then evaluates the embedded small CPU model (SmolLM2-135M)
# on a few built-in Math and DocVQA tasks and writes one HTML report of both.
#   bash scripts/run_main.sh                 # both environments, 2 tasks each
#   bash scripts/run_main.sh --limit 3       # extra arguments go to both `agent-envs eval` calls
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY=${PYTHON:-python3}
out=${AGENT_ENVS_MAIN_OUT:-runs/main-$(date +%Y%m%d-%H%M%S)}
# lockstep + one padded batch per turn: the episodes of a run decode together (repeatable, since
# lockstep groups are the same every time), about twice the tokens/s of one request at a time
export AGENT_ENVS_BATCH_DECODE=1
for env in MATH-ReAct-v0 DocVQA-CLI-v0; do
  "$PY" -m agent_envs.cli eval --env "$env" --limit 2 --mode lockstep --out "$out/$env" "$@"
done
"$PY" -m agent_envs.cli report "$out/MATH-ReAct-v0" "$out/DocVQA-CLI-v0" --out "$out/report.html" >/dev/null
echo "[agent-envs] report of both environments: $out/report.html"
