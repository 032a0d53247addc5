"""``DocVQA-VL-v0`` as data: DocVQA-CLI-v0's budgets, tasks, mounts, scorer and report, plus a
``view`` tool that shows the model a region of the page as an image (docs/protocol.md#view-tool).
The OCR tools stay: bash runs in the same sandbox with the page at ``/workspace/document.png``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from agent_envs.core.content import open_image
from agent_envs.core.prompts import fill
from agent_envs.core.spec import EnvSpec, Rules, ToolSpec
from agent_envs.envs.docvqa import spec as cli
from agent_envs.envs.docvqa.vl import texts
from agent_envs.envs.docvqa.vl.baseline import baseline
from agent_envs.tools.view import MAX_PIXELS, view_tool

#: this environment's prompt files, beside its code
PROMPTS = Path(__file__).resolve().parent / "prompts"
#: largest image the view tool (and the page in the prompt) shows, in pixels
MAX_VIEW_PIXELS = MAX_PIXELS
RULES_ES = Rules(cli.PARSER_ES, texts.TOOL_REQUIRED, texts.FORMAT_WARNING_ES)
RULES_HTTP = Rules(cli.PARSER_HTTP, texts.TOOL_REQUIRED, texts.FORMAT_WARNING_HTTP)


def page_size(path: str) -> tuple[int, int]:
    with open_image(path, f"the page {path}") as img:
        width, height = img.size
        return int(width), int(height)


def user_message(template: str, task: Any) -> str:
    """The task text: ``{page_size}`` is the page's ``<width>x<height>`` in pixels."""
    width, height = page_size(task.image)
    return fill(template.replace("{page_size}", f"{width}x{height}"), task.question)


def page_view(max_pixels: int = MAX_VIEW_PIXELS) -> ToolSpec:
    """The view tool of the page mount, showing at most ``max_pixels`` per image."""
    return view_tool(cli.DOCUMENT_PATH, max_pixels)


def with_view_pixels(spec: EnvSpec, max_pixels: int) -> EnvSpec:
    """``spec`` whose view tool shows at most ``max_pixels`` per image."""
    return replace(spec, tools=tuple(page_view(max_pixels) if t.name == "view" else t for t in spec.tools))


SPEC = replace(
    cli.SPEC,
    id="DocVQA-VL-v0",
    entry_point="agent_envs.envs.docvqa.vl.env:Env",
    rules={"es": RULES_ES, "http_eval": RULES_HTTP},
    tools=(*cli.SPEC.tools, page_view()),
    report=replace(cli.SPEC.report, trace_prefix="docvqa_vl"),
    system_prompt="docvqa_vl/system",
    user_prompt="docvqa_vl/user",
    prompt_dir=PROMPTS,
    skill_separator=texts.SKILL_SUFFIX,
    user_message=user_message,
    baseline=baseline,
    description="Answer a question about a page image with OCR commands and a view tool that shows page regions.",
)
