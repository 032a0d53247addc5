"""Chats that carry images, rendered through a Hugging Face processor into a model's exact inputs.

A vision-language model sees each image as a run of image tokens whose length depends on the
image (its tiles or patches), so a chat's prompt length is known only after the processor has
expanded every image placeholder.  :class:`ProcessorRenderer` does that once per request and keeps
both forms: the expanded ids (what the model attends to: the count budgets and context checks use)
and the template's ids with one placeholder per image (what vLLM takes with the images and expands
itself).  Text-only chats never come here: they tokenise exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from agent_envs.core.content import Message, images_of
from agent_envs.core.tokens import TokenCounter, processor_inputs


@dataclass
class ImagePrompt:
    """One chat with images, rendered for a vision-language model."""

    #: token ids with every image expanded to its image tokens
    ids: list[int]
    #: the chat template's token ids, one placeholder token per image
    placeholder_ids: list[int]
    #: the decoded images (PIL, RGB), in conversation order
    images: list[Any]
    #: the processor's image tensors for the model's forward pass (``pixel_values`` ...)
    features: dict[str, Any] = field(default_factory=dict)


class ProcessorRenderer:
    """Renders chats with a processor's chat template (as the environments' :class:`TokenCounter`
    renders them, so both count the same tokens) and its image processor."""

    def __init__(self, processor: Any, enable_thinking: bool = False):
        if getattr(processor, "tokenizer", None) is None or getattr(processor, "image_processor", None) is None:
            raise TypeError(
                f"a processor with a tokenizer and an image processor is needed, got {type(processor).__name__}"
            )
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.counter = TokenCounter(processor=processor, enable_thinking=enable_thinking)

    def text(self, messages: Sequence[Message]) -> str:
        """The prompt text, one image placeholder per image part, with the generation prompt."""
        return self.counter.render(messages)

    def render(self, messages: Sequence[Message]) -> ImagePrompt:
        text, images = self.text(messages), images_of(messages)
        encoded = processor_inputs(self.processor, text, images, return_tensors="pt")
        features = {k: v for k, v in encoded.items() if k not in ("input_ids", "attention_mask")}
        return ImagePrompt(
            ids=encoded["input_ids"][0].tolist(),
            placeholder_ids=list(self.tokenizer.encode(text, add_special_tokens=False)),
            images=images,
            features=features,
        )

    def prompt_tokens(self, messages: Sequence[Message]) -> int:
        return len(self.render(messages).ids)


def load_processor(source: str) -> Any:
    """The processor of a model folder when it is a vision-language model (its config names a
    vision tower), else None: a text model keeps its tokenizer alone."""
    from transformers import AutoConfig, AutoProcessor

    config = AutoConfig.from_pretrained(source)
    if getattr(config, "vision_config", None) is None:
        return None
    return AutoProcessor.from_pretrained(source)
