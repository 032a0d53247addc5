"""``Countdown-ReAct-v0`` as data: python and bash tools (either satisfies "tool required"), the
Math-style action grammar with Countdown's texts, the built-in seeded generator as default data
(docs/protocol.md#countdown)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from agent_envs.core.spec import EnvSpec, Framing, ParserSpec, ReportSpec, Rules
from agent_envs.envs.countdown import texts
from agent_envs.envs.countdown.baseline import baseline
from agent_envs.envs.countdown.data import generate, load
from agent_envs.envs.countdown.metrics import METRICS
from agent_envs.envs.countdown.report import render_countdown, report_fields
from agent_envs.envs.countdown.task import CountdownTask
from agent_envs.tools.bash import BASH
from agent_envs.tools.python import PYTHON

#: this environment's prompt files, beside its code
PROMPTS = Path(__file__).resolve().parent / "prompts"
#: size of the built-in dataset (``dataset="builtin"``); ``dataset_kwargs`` may change n and seed
BUILTIN_SIZE = 200

PARSER = ParserSpec(truncated_and_relaxed=True)
RULES = Rules(PARSER, texts.TOOL_REQUIRED, texts.FORMAT_WARNING, no_input=texts.NO_INPUT)
#: single-turn mode: one reply, no tool required, the final answer is scored as is
RULES_SINGLE_TURN = Rules(
    PARSER, texts.TOOL_REQUIRED, texts.SINGLE_TURN_FORMAT_WARNING, no_input=texts.NO_INPUT, require_tool=False
)


def load_tasks(
    spec: Any = "builtin", *, n: int = BUILTIN_SIZE, seed: int = 0, limit: int | None = None
) -> list[CountdownTask]:
    """``"builtin"``: ``n`` generated solvable tasks (offline, seeded); a path: a JSONL/parquet
    file of ``nums``/``target`` rows; a list: task rows."""
    if isinstance(spec, str) and spec == "builtin":
        return generate(n, seed)[:limit]
    if isinstance(spec, (str, Path)):
        return load(spec, limit)
    return [CountdownTask.model_validate(row) for row in list(spec)[:limit]]


def user_message(template: str, task: CountdownTask) -> str:
    return task.fill(template)


def task_fields(task: CountdownTask) -> dict[str, Any]:
    """The target and the numbers, as records list them."""
    return {"target": task.target, "nums": list(task.nums)}


SPEC = EnvSpec(
    id="Countdown-ReAct-v0",
    entry_point="agent_envs.envs.countdown.env:Env",
    rules={"es": RULES, "http_eval": RULES},
    tools=(PYTHON, BASH.with_(framing=Framing(translate_newlines=True), blocked=texts.BLOCKED)),
    report=ReportSpec(trace_prefix="countdown", success_at=1.0, render_trace=render_countdown, fields=report_fields),
    system_prompt="countdown/system",
    user_prompt="countdown/user",
    prompt_dir=PROMPTS,
    skill_separator="\n\nAdditional skill instructions:\n",
    max_turns=20,
    max_tokens_per_turn=2048,
    max_trajectory_tokens=None,
    load_tasks=load_tasks,
    task_model=CountdownTask,
    user_message=user_message,
    task_fields=task_fields,
    metrics=METRICS,
    baseline=baseline,
    score_metric="correct_answer",
    description="Reach a target from 3-4 numbers with + - * /, each used once; python and bash tools.",
)

#: ``single_turn=True``, the common single-turn ES setup: one reply, no tool required, its own prompt
SINGLE_TURN_SPEC = replace(
    SPEC,
    rules={"es": RULES_SINGLE_TURN, "http_eval": RULES_SINGLE_TURN},
    max_turns=1,
    system_prompt="countdown/system_single_turn",
)
