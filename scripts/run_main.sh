#!/usr/bin/env bash
# The main job: install what agent-envs needs, then evaluate every text environment (MATH-ReAct,
# DocVQA-CLI, Countdown-ReAct, PrimeCount-Python) on a few built-in tasks with the embedded CPU model
# (SmolLM2-135M) and, beside it, each environment's scripted reference policy; one HTML report of all the
# runs, and the ES-trained SmolLM2 shipped as a history (its first 50 generations replayed on the CPU once,
# about 100 s on 2 cores beside the evaluations, then cached; --es-generations 300: the whole run, about 10 minutes the first time)
# beside the base model on held-out few-shot Countdown tasks.
#   bash scripts/run_main.sh                                  # 2 tasks per environment
#   bash scripts/run_main.sh --limit 4                        # more tasks
#   bash scripts/run_main.sh --no-es                          # without the ES-trained model (--es-tasks N: its tasks)
#   bash scripts/run_main.sh --policy vllm --model Qwen/Qwen3-4B   # a real model in the embedded one's place
#   bash scripts/run_main.sh --base-url http://127.0.0.1:8000/v1 --model NAME   # any OpenAI-compatible server
# Other arguments go to the model's `agent-envs eval` calls; AGENT_ENVS_MAIN_OUT sets the output folder.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$EPOCHREALTIME
# the arguments are checked before anything is installed or run, where the package can be imported
# (on a machine that has never installed it they are checked after the installation, before any run)
case " $* " in *" -h "* | *" --help "*) exec "${PYTHON:-python3}" scripts/main_job.py --help ;; esac
if "${PYTHON:-python3}" -c "import agent_envs.cli" >/dev/null 2>&1; then
  "${PYTHON:-python3}" scripts/main_job.py --check "$@"
fi
bash scripts/install.sh
install_s=$(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
echo "[main] installed in ${install_s} s"
exec "${PYTHON:-python3}" scripts/main_job.py --install-s "$install_s" ${AGENT_ENVS_MAIN_OUT:+--out "$AGENT_ENVS_MAIN_OUT"} "$@"
