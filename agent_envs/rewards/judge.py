"""An LLM judge as a step scorer: any :class:`~agent_envs.policy.base.Policy` reads a prompt built
from a template file and ends its reply with ``Score: <number in [0, 1]>`` (docs/protocol.md#llm-judge).

Placeholders (filled in one pass, so text inside a value is never re-filled): ``{question}`` (the
task as the agent was asked it), ``{conversation}`` (the turns before the step), ``{action}`` (the
agent's message of the step), ``{observation}`` (the environment's answer), ``{turn}``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from agent_envs.core.content import image_part, open_image, text_of, text_part, transcript
from agent_envs.policy.base import GenerationRequest, Policy
from agent_envs.core.prompts import load_prompt

from agent_envs.core.steps import Aggregation, BatchStepScorer, StepContext, StepScore

DEFAULT_TEMPLATE = "judges/step"
PLACEHOLDERS = ("question", "conversation", "action", "observation", "turn")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
#: the last ``Score: x`` line of the reply (markdown emphasis around the number allowed)
_SCORE = re.compile(r"score\s*[:=]\s*\**\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+))", re.IGNORECASE)


def render_conversation(messages: Sequence[dict[str, Any]]) -> str:
    """``[role]`` blocks of text; an image part shows as ``[image]``."""
    return transcript(messages) or "(nothing yet)"


def load_images(paths: Sequence[str]) -> list[Any]:
    """The images at ``paths`` as RGB PIL images (files closed)."""
    out = []
    for path in paths:
        with open_image(path, f"the image {path}") as img:
            out.append(img.convert("RGB"))
    return out


def fill_template(template: str, context: StepContext) -> str:
    values = {
        "question": context.question,
        # the system prompt and first user message are the task; the step's two messages come last
        "conversation": render_conversation(context.messages[2:-2]),
        "action": context.assistant,
        "observation": text_of(context.observation),
        "turn": str(context.turn),
    }
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def parse_score(text: str) -> StepScore:
    """The judge's last ``Score: x``; no such line, or x outside [0, 1], is a recorded error."""
    found = _SCORE.findall(text)
    if not found:
        return StepScore.failed(f"unparseable judge output (no 'Score: <number in [0, 1]>' line): {text[-200:]!r}")
    value = float(found[-1])
    if not 0.0 <= value <= 1.0:
        return StepScore.failed(f"judge score {value} is outside [0, 1]")
    return StepScore(value)


class LLMJudgeScorer(BatchStepScorer):
    """One batched ``policy.generate`` per scorer call, one request per step.

    ``show_images`` attaches the step's images (e.g. a document page) to the judge's message, for a
    vision-language judge.  Every request uses ``seed``, so a seeded policy judges deterministically.
    """

    name = "llm-judge"

    def __init__(
        self,
        policy: Policy,
        template: str | Path = DEFAULT_TEMPLATE,
        *,
        max_tokens: int = 512,
        seed: int = 0,
        show_images: bool = False,
        aggregation: Aggregation = "mean",
    ) -> None:
        self.policy = policy
        self.template = load_prompt(template)
        if not _PLACEHOLDER.search(self.template):
            raise ValueError(
                f"judge template {template!r} has none of the placeholders "
                + ", ".join("{" + p + "}" for p in PLACEHOLDERS)
            )
        self.max_tokens, self.seed, self.show_images = max_tokens, seed, show_images
        self.aggregation = aggregation

    def request(self, context: StepContext) -> GenerationRequest:
        text = fill_template(self.template, context)
        content: Any = text
        if self.show_images and context.images:
            content = [*(image_part(img) for img in load_images(context.images)), text_part(text)]
        return GenerationRequest(
            messages=[{"role": "user", "content": content}],
            seed=self.seed,
            max_tokens=self.max_tokens,
            key=f"judge:{context.key}:turn{context.turn}",
        )

    def close(self) -> None:
        self.policy.close()

    def score_batch(self, contexts: Sequence[StepContext]) -> list[StepScore]:
        completions = self.policy.generate([self.request(c) for c in contexts])
        return [
            parse_score(c.text) if c.ok else StepScore.failed(f"judge request failed: {c.error_message or c.error}")
            for c in completions
        ]
