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
mkdir -p "$out"
# lockstep + one padded batch per turn: a run's episodes decode together (repeatable: lockstep
# groups are the same every time).  The two evaluations run at once, one torch thread each, so
# each has a core and one's tool calls overlap the other's decoding.
export AGENT_ENVS_BATCH_DECODE=1 AGENT_ENVS_TORCH_THREADS=${AGENT_ENVS_TORCH_THREADS:-1}
envs=(MATH-ReAct-v0 DocVQA-CLI-v0)
pids=()
echo "[agent-envs] evaluating ${envs[*]} on built-in tasks with the embedded CPU model (logs in $out/*.log)"
for env in "${envs[@]}"; do
  "$PY" -m agent_envs.cli eval --env "$env" --limit 2 --mode lockstep --no-progress --out "$out/$env" "$@" \
    >"$out/$env.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!envs[@]}"; do
  wait "${pids[$i]}" || { status=$?; echo "[agent-envs] ${envs[$i]} failed (exit $status):"; }
  grep -v "^\[agent-envs\] embedded default" "$out/${envs[$i]}.log" | grep -v "Warning\|Loading weights" || true
done
[ "$status" = 0 ] || exit "$status"
"$PY" -m agent_envs.cli report "$out/MATH-ReAct-v0" "$out/DocVQA-CLI-v0" --out "$out/report.html" >/dev/null
echo "[agent-envs] report of both environments: $out/report.html"
