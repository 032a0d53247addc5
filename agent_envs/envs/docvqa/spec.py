"""``DocVQA-CLI-v0`` as data: 50 turns, 512 tokens per turn, a 32,768-token trajectory cap, the bash
tool with DocVQA's framing, the page image mounted read-only at ``/workspace/document.png``, its
ANLS metrics and report fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_envs.core.spec import EnvSpec, Framing, Mount, ParserSpec, ReportSpec, Row, Rules
from agent_envs.envs.docvqa import texts
from agent_envs.envs.docvqa.baseline import baseline
from agent_envs.envs.docvqa.data import load_docvqa_tasks
from agent_envs.envs.docvqa.metrics import METRICS
from agent_envs.envs.docvqa.report import render_docvqa, report_fields
from agent_envs.envs.docvqa.task import DocTask
from agent_envs.tools.bash import BASH

#: this environment's prompt files, beside its code
PROMPTS = Path(__file__).resolve().parent / "prompts"
#: where the task's page image appears inside every sandbox (read-only)
DOCUMENT_PATH = "/workspace/document.png"
PARSER_ES = ParserSpec()
PARSER_HTTP = ParserSpec(require_arguments=True)
RULES_ES = Rules(PARSER_ES, texts.DOCVQA_TOOL_REQUIRED, texts.DOCVQA_FORMAT_WARNING_ES)
RULES_HTTP = Rules(PARSER_HTTP, texts.DOCVQA_TOOL_REQUIRED, texts.DOCVQA_FORMAT_WARNING_HTTP)
#: the reference DocVQA sandbox decoded bytes, stripped before the exit code, cut to exactly limit
FRAMING = Framing(rstrip=True, exact_limit=True)


def mounts(task: Any) -> list[Mount]:
    return [Mount(str(task.image), DOCUMENT_PATH, read_only=True)]


def task_fields(task: Any) -> Row:
    """The gold answers and the page (its host path and where the tools see it), as records list them."""
    return {"answers": list(task.answers), "image": task.image, "tool_image": DOCUMENT_PATH}


def step_images(task: Any) -> list[str]:
    """The page, shown to a step scorer with every step."""
    return [str(task.image)]


SPEC = EnvSpec(
    id="DocVQA-CLI-v0",
    entry_point="agent_envs.envs.docvqa.env:Env",
    rules={"es": RULES_ES, "http_eval": RULES_HTTP},
    tools=(BASH.with_(framing=FRAMING),),
    report=ReportSpec(
        trace_prefix="docvqa", success_at=0.5, success_strict=True, render_trace=render_docvqa, fields=report_fields
    ),
    system_prompt="docvqa/system",
    user_prompt="docvqa/user",
    prompt_dir=PROMPTS,
    skill_separator=texts.DOCVQA_SKILL_SUFFIX,
    max_turns=50,
    max_tokens_per_turn=512,
    max_trajectory_tokens=32768,
    load_tasks=load_docvqa_tasks,
    task_model=DocTask,
    mounts=mounts,
    step_images=step_images,
    task_fields=task_fields,
    metrics=METRICS,
    baseline=baseline,
    score_metric="anls",
    description="Answer a question about a page image through shell and OCR commands only.",
)
