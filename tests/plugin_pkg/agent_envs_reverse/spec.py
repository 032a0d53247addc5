"""The plug-in's spec: tasks, rules, tools, prompts (beside this file) and the scripted reference."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent_envs.core.spec import EnvSpec, ParserSpec, ReportSpec, Rules
from agent_envs.protocol.messages import action_text, last_observation_body, task_turn_text
from agent_envs.tools.bash import BASH

WORDS = ("sandbox", "gymnasium", "plugin", "entrypoint", "registry", "conformance", "trajectory", "evaluation")


class ReverseTask(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    word: str = Field(pattern=r"^[a-z]{1,40}$")


def load_tasks(spec: Any = "builtin", *, n: int = 8, seed: int = 0, limit: int | None = None) -> list[ReverseTask]:
    if spec == "builtin":
        rng = random.Random(seed)
        return [ReverseTask(id=f"reverse-{i}", word=rng.choice(WORDS)) for i in range(n)][:limit]
    return [ReverseTask.model_validate(row) for row in list(spec)[:limit]]


def user_message(template: str, task: ReverseTask) -> str:
    return template.replace("{word}", task.word)


def task_fields(task: ReverseTask) -> dict[str, Any]:
    return {"word": task.word}


def baseline(request: Any) -> str:
    """One real ``rev`` call, then its output as the answer."""
    user = task_turn_text(request.messages)
    if user is not None:
        word = re.search(r"Word: ([a-z]+)", user)
        return action_text("bash", {"command": f"printf '%s\\n' {word.group(1) if word else 'x'} | rev"})
    lines = last_observation_body(request.messages).strip().splitlines() or [""]
    return f"Final answer: {lines[0]}"


RULES = Rules(
    ParserSpec(),
    "Run a bash Action before answering.",
    'No valid action was parsed. Use: Action: {"name": "bash", "arguments": {"command": "<shell command>"}}',
)

SPEC = EnvSpec(
    id="Reverse-Bash-v0",
    entry_point="agent_envs_reverse.env:ReverseEnv",
    rules={"es": RULES, "http_eval": RULES},
    tools=(BASH,),
    report=ReportSpec(trace_prefix="reverse"),
    system_prompt="reverse/system",
    user_prompt="reverse/user",
    prompt_dir=Path(__file__).resolve().parent / "prompts",
    max_turns=4,
    max_tokens_per_turn=256,
    load_tasks=load_tasks,
    task_model=ReverseTask,
    user_message=user_message,
    task_fields=task_fields,
    baseline=baseline,
    description="Reverse a word with a shell command (a test plug-in).",
)
