"""TransformersPolicy with the tiny vision-language model: chats with image parts reach the model as pixels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

from agent_envs.core.content import image_part
from agent_envs.policy.base import REQUEST_ERROR, GenerationRequest
from agent_envs.policy.hf import TransformersPolicy
from agent_envs.policy.sampling import SamplingConfig
from agent_envs.policy.tiny_vlm import build_tiny_vlm

NEVER = ["<<no stop>>"]


def page(text: str, size: tuple[int, int] = (180, 120)) -> Image.Image:
    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).text((8, 8), text, fill="black")
    return image


def chat(image: Image.Image | None) -> list[dict]:
    parts = [{"type": "text", "text": "Observation from view:\n"}] + ([image_part(image)] if image else [])
    return [
        {"role": "system", "content": "Answer from the page."},
        {"role": "user", "content": "Question: what is the total?"},
        {"role": "assistant", "content": 'Action:\n{"name": "view", "arguments": {}}'},
        {"role": "user", "content": parts},
    ]


def req(image: Image.Image | None, seed: int = 3, max_tokens: int = 12) -> GenerationRequest:
    return GenerationRequest(messages=chat(image), seed=seed, max_tokens=max_tokens, stop=NEVER)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=0)


@pytest.fixture(scope="module")
def greedy(model_dir: Path) -> TransformersPolicy:
    return TransformersPolicy(model_dir, sampling=SamplingConfig(temperature=0.0, presence_penalty=0.0))


def test_image_chat_decodes_as_transformers_generate_does(greedy: TransformersPolicy) -> None:
    """Same ids as ``model.generate`` on the processor's inputs: the pixels reached the forward pass."""
    image = page("TOTAL 42")
    got = greedy.generate([req(image)])[0]
    text = greedy.renderer.text(chat(image))
    inputs = greedy.processor(text=[text], images=[[image]], return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = greedy.model.generate(**inputs, max_new_tokens=12, do_sample=False, min_new_tokens=12)
    assert got.ok and got.token_ids == out[0, inputs["input_ids"].shape[1] :].tolist()
    assert got.prompt_tokens == inputs["input_ids"].shape[1]
    # the image costs its tiles: 180x120 becomes 3x2 tiles plus the global view, 16 tokens each, and tags
    text_only = greedy.generate([req(None)])[0]
    image_tokens = int((inputs["input_ids"] == greedy.model.config.image_token_id).sum())
    assert image_tokens == 7 * 16 and got.prompt_tokens > text_only.prompt_tokens + image_tokens


def test_the_image_changes_the_sample(model_dir: Path, greedy: TransformersPolicy) -> None:
    policy = TransformersPolicy(model_dir, model=greedy.model, processor=greedy.processor)
    a, b = policy.generate([req(page("TOTAL 42")), req(Image.new("RGB", (180, 120), "black"))])
    assert a.ok and b.ok and a.prompt_tokens == b.prompt_tokens and a.token_ids != b.token_ids


def test_seeded_and_batch_independent_with_text_neighbours(model_dir: Path, greedy: TransformersPolicy) -> None:
    policy = TransformersPolicy(model_dir, model=greedy.model, processor=greedy.processor, batch_decode=True)
    image = page("TOTAL 42")
    alone = policy.generate([req(image, seed=7)])[0]
    batch = policy.generate([req(None, seed=1), req(image, seed=7), req(None, seed=2)])
    assert [c.ok for c in batch] == [True] * 3 and batch[1].token_ids == alone.token_ids
    # text chats are rendered as before: the tokenizer's ids, no processor involved
    assert batch[0].prompt_tokens == len(policy.counter.prompt_ids(chat(None)))


def test_images_without_a_processor_or_undecodable_fail_as_records(greedy: TransformersPolicy) -> None:
    text_only = TransformersPolicy("tiny", model=greedy.model, tokenizer=greedy.tokenizer)
    refused = text_only.generate([req(page("x"))])[0]
    assert refused.error == REQUEST_ERROR and "no image processor" in refused.error_message
    bad = chat(None)
    bad[-1]["content"].append({"type": "image_url", "image_url": {"url": "https://example.invalid/p.png"}})
    failed = greedy.generate([GenerationRequest(messages=bad, seed=1, max_tokens=4)])[0]
    assert failed.error == REQUEST_ERROR and "only base64 data URLs" in failed.error_message


@pytest.fixture(scope="module")
def server(model_dir: Path, greedy: TransformersPolicy):
    from agent_envs.policy.server import PolicyServer

    sampled = TransformersPolicy(model_dir, model=greedy.model, processor=greedy.processor)
    with PolicyServer(sampled, model="tiny-vlm", record=8) as running:
        yield running


def test_openai_client_sends_the_image_and_the_server_model_sees_it(server) -> None:
    """A real server on 127.0.0.1 gets the very pixels the client sent, and its completion is the
    model's with the image in its input: the same tokens as a direct call, the image's tokens counted."""
    import asyncio

    import numpy as np

    from agent_envs.core.content import decode_image_url
    from agent_envs.policy.openai import OpenAIPolicy

    model = server.policy
    client = OpenAIPolicy(server.url, "tiny-vlm", processor=model.processor, max_model_len=model.max_model_len)
    image = page("TOTAL 42")
    sent = client.generate([req(image, seed=5)])[0]
    [part] = [p for p in server.received[-1]["messages"][-1]["content"] if p["type"] == "image_url"]
    assert np.array_equal(np.asarray(decode_image_url(part["image_url"]["url"])), np.asarray(image))
    direct = model.generate([req(image, seed=5)])[0]
    assert sent.ok and sent.token_ids == direct.token_ids and sent.prompt_tokens == direct.prompt_tokens
    assert asyncio.run(client.agenerate(req(image, seed=5))).token_ids == direct.token_ids
    # the prompt is the text-only chat's plus the image: its placeholder token expanded to the tiles
    text_only = client.generate([req(None, seed=5)])[0]
    assert sent.prompt_tokens == text_only.prompt_tokens + 1 + client.counter.image_tokens(chat(image))
    assert sent.prompt_tokens == client.counter.prompt_tokens(chat(image))
    client.close()


def test_server_refuses_image_parts_it_cannot_read(server) -> None:
    import httpx

    for part in (
        {"type": "image_url", "image_url": {"url": "https://example.invalid/p.png"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGEgcG5n"}},
        {"type": "input_audio", "input_audio": {}},
    ):
        body = {"model": "tiny-vlm", "max_tokens": 4, "messages": [{"role": "user", "content": [part]}]}
        reply = httpx.post(server.url + "/chat/completions", json=body, timeout=60)
        assert reply.status_code == 400 and "invalid request" in reply.json()["error"]["message"], reply.text


def test_openai_client_counts_the_image_before_sending(server) -> None:
    """With the processor the client's context check includes the image's tokens: a chat that fits
    only without them is refused locally, without a request."""
    from agent_envs.policy.base import CONTEXT_LENGTH_EXCEEDED
    from agent_envs.policy.openai import OpenAIPolicy

    processor = server.policy.processor
    prompt = OpenAIPolicy(server.url, "tiny-vlm", processor=processor).counter.prompt_tokens(chat(page("x")))
    client = OpenAIPolicy(server.url, "tiny-vlm", processor=processor, max_model_len=prompt + 11)
    before = len(server.received)
    refused, fits = client.generate([req(page("x"), max_tokens=12), req(page("x"), max_tokens=11)])
    assert refused.error == CONTEXT_LENGTH_EXCEEDED and fits.ok and fits.prompt_tokens == prompt
    assert len(server.received) == before + 1  # only the request that fits was sent
    client.close()
