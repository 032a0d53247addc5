"""The CLI's ``scripted`` DocVQA baseline, a scripted reference (not a model): OCR the whole page with
one real bash call, then answer.

On the built-in synthetic pages it is an oracle: it finds the built-in task whose question the
chat asks and whose gold answer the OCR output holds best (the check that kept the question,
:func:`~agent_envs.envs.docvqa.synth.best_ocr_anls`) and answers that gold answer, so a report
shows what a solved episode looks like.  Elsewhere (another data set, or the built-in pages not
built yet) it answers the OCR output's first text line.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from agent_envs.core.cache import cache_root, is_complete
from agent_envs.envs.docvqa.data import BUILTIN_SEED, BUILTIN_SIZE
from agent_envs.envs.docvqa.synth import best_ocr_anls, builtin_cache_dir
from agent_envs.core.content import text_of
from agent_envs.protocol.messages import action_text, last_observation_body

OCR_COMMAND = "tesseract /workspace/document.png stdout 2>/dev/null"


@functools.lru_cache(maxsize=1)
def builtin_answers() -> dict[str, list[list[str]]]:
    """Question text -> the gold answers of every built-in task that asks it; empty when the
    default built-in set has not been built (the baseline never builds pages itself)."""
    folder = builtin_cache_dir(BUILTIN_SIZE, BUILTIN_SEED, cache_root())
    if not is_complete(folder):
        return {}
    found: dict[str, list[list[str]]] = {}
    lines = (folder / "tasks.jsonl").read_text(encoding="utf-8").splitlines()
    for row in (json.loads(line) for line in lines if line.strip()):
        found.setdefault(row["question"], []).append(list(row["answers"]))
    return found


def oracle_answer(task_text: str, ocr: str) -> str | None:
    """The gold answer of the built-in task asked in ``task_text`` that ``ocr`` holds best, if any."""
    asked = [q for q in builtin_answers() if q in task_text]
    if not asked:
        return None
    golds = builtin_answers()[max(asked, key=len)]
    return max(golds, key=lambda answers: best_ocr_anls(ocr, answers))[0]


def baseline(request: Any) -> str:
    if not any(m["role"] == "assistant" for m in request.messages):
        return action_text("bash", {"command": OCR_COMMAND})
    ocr = last_observation_body(request.messages)
    task = next(
        text
        for m in reversed(request.messages)
        if m["role"] == "user" and not (text := text_of(m["content"])).startswith("Observation from ")
    )
    lines = [line.strip() for line in ocr.splitlines() if any(c.isalnum() for c in line)]
    answer = oracle_answer(task, ocr) or (lines[0] if lines else "unknown")
    return f"Final answer: {answer}"
