"""A vision-language process reward model (base VLM + LoRA adapter) as a step scorer
(docs/protocol.md#vision-language-prm).

Convention: each step becomes one user message holding the step's images (e.g. a document page)
followed by the text of a prompt template (the judge's placeholders); the chat template's
generation prompt follows, and the step's score is the model's next-token probability of the
positive label against the negative one, ``p(+) / (p(+) + p(-))``, i.e. the label the model would
write right after reading the step.  Both labels must be single tokens.  An episode's step scores
aggregate by product (the chance that every step is right).

The adapter is applied with peft on transformers; the model runs in float32 and scores a batch in
one left-padded forward pass.  Serving the adapter through vLLM's LoRA support is not wired here.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Sequence

from agent_envs.core.prompts import load_prompt

from .judge import fill_template, load_images
from agent_envs.core.steps import Aggregation, BatchStepScorer, StepContext, StepScore

DEFAULT_TEMPLATE = "judges/prm_step"


class VLMRewardScorer(BatchStepScorer):
    name = "vlm-prm"

    def __init__(
        self,
        base: str | Path,
        adapter: str | Path | None = None,
        *,
        template: str | Path = DEFAULT_TEMPLATE,
        positive: str = "+",
        negative: str = "-",
        show_images: bool = True,
        aggregation: Aggregation = "product",
        device: str = "cpu",
    ) -> None:
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(str(base))
        self.processor.tokenizer.padding_side = "left"  # the last position is every row's step end
        self.label_ids = [self._single_token(positive), self._single_token(negative)]
        model = AutoModelForImageTextToText.from_pretrained(str(base), dtype=torch.float32)
        if adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter))
        self.model = model.to(device).eval()
        self.device, self.template, self.show_images = device, load_prompt(template), show_images
        self.aggregation = aggregation
        self._lock = threading.Lock()  # one forward at a time: torch modules are not re-entrant here

    def _single_token(self, label: str) -> int:
        ids = self.processor.tokenizer.encode(label, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"reward label {label!r} is {len(ids)} tokens for this tokenizer; it must be one")
        return ids[0]

    def inputs(self, contexts: Sequence[StepContext]) -> Any:
        """The processor's batch for ``contexts`` (token ids, attention mask, pixel values)."""
        texts, images = [], []
        for c in contexts:
            shown = load_images(c.images) if self.show_images else []
            content = [*({"type": "image"} for _ in shown), {"type": "text", "text": fill_template(self.template, c)}]
            texts.append(
                self.processor.apply_chat_template(
                    [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
                )
            )
            images += shown
        return self.processor(text=texts, images=images or None, return_tensors="pt", padding=True).to(self.device)

    def score_batch(self, contexts: Sequence[StepContext]) -> list[StepScore]:
        import torch

        batch = self.inputs(contexts)
        with self._lock, torch.no_grad():
            logits = self.model(**batch).logits[:, -1, :].float()
        pair = logits[:, self.label_ids].softmax(-1)[:, 0]
        return [StepScore(float(p)) for p in pair]
