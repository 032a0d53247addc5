"""Image token counts (docs/protocol.md#image-token-counts): with the tiny VLM's real processor the
environment's counts equal the processor's own tokenisation of the chat at every turn, counted
incrementally; without one, images cost the documented tile estimate and counts say so."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import pytest
from PIL import Image

import agent_envs  # noqa: F401
from agent_envs.core.content import image_part, text_part
from agent_envs.envs.docvqa.data import load_docvqa_tasks
from agent_envs.policy.tiny_vlm import build_tiny_vlm
from agent_envs.core.tokens import IMAGE_TILE, PromptTally, TokenCounter, estimate_image_tokens, estimate_tokens


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=0))


def processor_count(processor, messages) -> int:
    """The reference: the processor's own chat template and tokenisation of the OpenAI parts."""
    encoded = processor.apply_chat_template(
        json.loads(json.dumps(messages)), tokenize=True, add_generation_prompt=True, return_dict=True
    )
    return len(encoded["input_ids"][0])


def view(**arguments) -> str:
    return "Action: " + json.dumps({"name": "view", "arguments": arguments})


def test_env_counts_with_a_processor_are_exact_at_every_turn(processor, docvqa_dir):
    tasks = load_docvqa_tasks(str(docvqa_dir / "val_v1.0.json"))
    env = gym.make("DocVQA-VL-v0", dataset=tasks, processor=processor, page_in_prompt=True)
    turns = [
        view(box=[100, 100, 500, 180]),
        view(),
        view(box=[0, 0, 40, 300], zoom=3),
        'Action: {"name": "bash", "arguments": {"command": "echo hi"}}',
        view(box=[0, 0, 0, 0]),
    ]
    try:
        messages, _ = env.reset(options={"row_index": 0})
        ep = env.unwrapped._ep
        assert env.unwrapped.counter.incremental and ep.tally.incremental
        assert ep.tally.prompt_tokens() == processor_count(processor, messages)
        observation_costs = 0
        for text in turns:
            messages, *_ = env.step(text)
            assert ep.tally.prompt_tokens() == processor_count(processor, messages), text
            observation_costs += processor_count(processor, messages[-1:])
            assert ep.trajectory_tokens - ep.generated_tokens == observation_costs
        # the policy-side count of the turn equals the processor's count of the chat it was given
        *_, info = env.step("Final answer: x")
        record = info["record"]
        assert record["token_counts_exact"] is True
        assert record["turn_log"][-1]["prompt_tokens"] == processor_count(processor, messages)
        # the counts include the images: 4 of them (page + 3 views), at least 16 tokens each (a global view)
        text_only = TokenCounter(processor=processor).prompt_tokens(
            [
                {**m, "content": [p for p in m["content"] if p["type"] == "text"]}
                if isinstance(m["content"], list)
                else m
                for m in messages
            ]
        )
        assert processor_count(processor, messages) - text_only >= 4 * 16
    finally:
        env.close()


def test_a_processor_template_that_is_not_prefix_stable_is_counted_in_full(processor):
    """A template whose rendering of earlier messages changes as the chat grows fails the probe:
    every count then renders the whole chat through the processor, and stays exact."""
    import copy

    odd = copy.copy(processor)
    odd.chat_template = "{{- messages|length -}}" + processor.chat_template
    counter = TokenCounter(processor=odd)
    assert not counter.incremental and TokenCounter(processor=processor).incremental
    chat = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [text_part("q"), image_part(Image.new("RGB", (70, 70)))]},
    ]
    tally = PromptTally(counter, chat)
    for turn in range(3):
        assert tally.prompt_tokens() == processor_count(odd, chat)
        chat += [
            {"role": "assistant", "content": f"a{turn}"},
            {"role": "user", "content": [text_part("o"), image_part(Image.new("L", (30 + turn, 200)))]},
        ]


def test_without_a_processor_each_image_costs_its_tiles():
    assert IMAGE_TILE == 28
    assert estimate_image_tokens(28, 28) == 1 and estimate_image_tokens(29, 28) == 2
    assert estimate_image_tokens(900, 1164) == math.ceil(900 / 28) * math.ceil(1164 / 28) == 1386
    chat = [
        {"role": "user", "content": [text_part("Observation from view:\nok"), image_part(Image.new("L", (100, 50)))]}
    ]
    counter = TokenCounter()
    assert (
        counter.prompt_tokens(chat) == estimate_tokens("<|user|>\nObservation from view:\nok\n<|assistant|>\n") + 4 * 2
    )
    assert not counter.exact_for(chat) and not counter.exact_for([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="images has token ids only with a processor"):
        TokenCounter(_tokenizer()).prompt_ids(chat)


def _tokenizer():
    from agent_envs.policy.hf import smollm2_tokenizer

    return smollm2_tokenizer()


def test_processor_argument_is_checked():
    with pytest.raises(
        ValueError,
        match=r"invalid DocVQA-VL-v0 argument: processor='x': must be a processor with "
        r"apply_chat_template and a tokenizer",
    ):
        gym.make("DocVQA-VL-v0", processor="x")


def test_the_runner_hands_the_policys_processor_to_the_environment(processor, docvqa_dir):
    """A policy with a ``processor`` gets exact image counts without the user passing it twice."""
    from agent_envs.policy.scripted import ScriptedPolicy
    from agent_envs.rollout.runner import run_episodes

    class VisionScripted(ScriptedPolicy):
        pass

    policy = VisionScripted([view(box=[0, 0, 300, 300]), "Final answer: x"], tokenizer=processor.tokenizer)
    policy.processor = processor
    tasks = load_docvqa_tasks(str(docvqa_dir / "val_v1.0.json"))[:1]
    [record] = run_episodes("DocVQA-VL-v0", tasks, policy, samples=1, mode="lockstep", progress=False)
    assert record.token_counts_exact is True and record.error is None
    [plain] = run_episodes(
        "DocVQA-VL-v0",
        tasks,
        ScriptedPolicy([view(box=[0, 0, 300, 300]), "Final answer: x"], tokenizer=processor.tokenizer),
        samples=1,
        mode="lockstep",
        progress=False,
    )
    assert plain.token_counts_exact is False and plain.error is None
