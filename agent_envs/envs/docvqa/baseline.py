"""The CLI's ``scripted`` DocVQA baseline: OCR the page once, answer with its first text line."""

from __future__ import annotations

from typing import Any

from agent_envs.protocol.messages import action_text, last_observation_body


def baseline(request: Any) -> str:
    if not any(m["role"] == "assistant" for m in request.messages):
        return action_text(
            "bash", {"command": "tesseract /workspace/document.png stdout 2>/dev/null | grep -m1 '[[:alnum:]]'"}
        )
    first = last_observation_body(request.messages).strip().splitlines() or ["unknown"]
    return f"Final answer: {first[0]}"
