"""The tiny vision-language model: built from a config with seeded weights, loadable, and it sees images."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from PIL import Image

from agent_envs.policy.tiny_vlm import IMAGE_TOKEN, build_tiny_vlm, tokens_per_tile

CHAT = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Read the page. "},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}},
        ],
    }
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=0)


def digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_weights_depend_only_on_the_seed(model_dir: Path, tmp_path: Path) -> None:
    assert digest(build_tiny_vlm(tmp_path / "again", seed=0)) == digest(model_dir)
    assert digest(build_tiny_vlm(tmp_path / "other", seed=1)) != digest(model_dir)


def test_loads_with_auto_classes_and_the_image_reaches_the_logits(model_dir: Path) -> None:
    from transformers import AutoProcessor, AutoModelForImageTextToText

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    text = processor.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert text.count(IMAGE_TOKEN) == 1
    logits = []
    for colour in ("white", "black"):
        inputs = processor(text=[text], images=[[Image.new("RGB", (150, 40), colour)]], return_tensors="pt")
        # a 150x40 strip becomes 3x1 tiles of 64 pixels plus the global view, 16 tokens each
        assert int((inputs["input_ids"] == model.config.image_token_id).sum()) == 4 * tokens_per_tile()
        with torch.inference_mode():
            logits.append(model(**inputs).logits[0, -1])
    assert not torch.allclose(logits[0], logits[1])


def test_text_renders_as_the_default_model_does(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from agent_envs.policy.hf import smollm2_tokenizer

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    ours, smol = AutoTokenizer.from_pretrained(model_dir), smollm2_tokenizer()
    assert ours.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == smol.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=False
    )
