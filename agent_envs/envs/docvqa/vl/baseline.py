"""The CLI's ``scripted`` DocVQA-VL baseline: view the whole page, then DocVQA's OCR baseline
(OCR the page, answer with its first text line)."""

from __future__ import annotations

from typing import Any

from agent_envs.envs.docvqa.baseline import baseline as ocr_baseline
from agent_envs.protocol.messages import action_text


def baseline(request: Any) -> str:
    if not any(m["role"] == "assistant" for m in request.messages):
        return action_text("view", {})
    # the OCR baseline sees the chat without the view turn (messages 2 and 3)
    return ocr_baseline(request.model_copy(update={"messages": request.messages[:2] + request.messages[4:]}))
