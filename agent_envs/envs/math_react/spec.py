"""``MATH-ReAct-v0`` as data: 50 turns, 4096 tokens per turn, no trajectory cap, the bash tool with
Math's framing and blocklist text, two rule sets (ES runner, HTTP evaluator)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_envs.core.spec import EnvSpec, Framing, ParserSpec, ReportSpec, Rules
from agent_envs.envs.math_react import texts
from agent_envs.envs.math_react.baseline import baseline
from agent_envs.envs.math_react.data import load_math_tasks
from agent_envs.envs.math_react.report import render_math, report_fields
from agent_envs.envs.math_react.task import MathTask
from agent_envs.tools.bash import BASH

#: this environment's prompt files, beside its code
PROMPTS = Path(__file__).resolve().parent / "prompts"
PARSER_ES = ParserSpec(truncated_and_relaxed=True)
PARSER_HTTP = ParserSpec(require_bash_command=True)  # repo-react-v1
RULES_ES = Rules(PARSER_ES, texts.MATH_TOOL_REQUIRED, texts.MATH_FORMAT_WARNING)
RULES_HTTP = Rules(PARSER_HTTP, texts.MATH_TOOL_REQUIRED, texts.MATH_FORMAT_WARNING)
#: the HTTP evaluator with the first-turn rule of docs/protocol.md#first-turn-rule
RULES_HTTP_MATCHED = Rules(
    PARSER_HTTP, texts.MATH_TOOL_REQUIRED, texts.MATH_FORMAT_WARNING, first_turn=texts.MATH_FIRST_TURN
)
#: the reference math runner read its pipes in text mode and cut floor(limit/2) per side
FRAMING = Framing(translate_newlines=True)


def task_fields(task: MathTask) -> dict[str, Any]:
    """The gold answer, as records list it."""
    return {"answer": task.answer}


SPEC = EnvSpec(
    id="MATH-ReAct-v0",
    entry_point="agent_envs.envs.math_react.env:Env",
    rules={"es": RULES_ES, "http_eval": RULES_HTTP},
    tools=(BASH.with_(framing=FRAMING, blocked=texts.MATH_BLOCKED),),
    report=ReportSpec(trace_prefix="math", success_at=1.0, render_trace=render_math, fields=report_fields),
    system_prompt="math_react/system",
    user_prompt="math_react/user",
    prompt_dir=PROMPTS,
    skill_separator=texts.MATH_SKILL_SUFFIX,
    max_turns=50,
    max_tokens_per_turn=4096,
    max_trajectory_tokens=None,
    load_tasks=load_math_tasks,
    task_model=MathTask,
    task_fields=task_fields,
    baseline=baseline,
    score_metric="correct_answer",
    description="Solve a math problem with a sandboxed bash tool; score 0/1 on the boxed answer.",
)
