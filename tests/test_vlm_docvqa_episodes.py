"""The tiny vision-language model plays full DocVQA-VL-v0 episodes through TransformersPolicy and
``run_episodes``: the view tool's image observations reach the model as pixels, every turn's prompt
length is the environment's own processor count, and episodes end with a termination reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_envs.core.content import images_of
from agent_envs.policy.hf import TransformersPolicy
from agent_envs.policy.scripted import RecordingPolicy, ScriptedOpening
from agent_envs.policy.tiny_vlm import build_tiny_vlm
from agent_envs.rollout import run_episodes
from agent_envs.core.tokens import TokenCounter

VIEW_TOP = 'Action: {"name": "view", "arguments": {"box": [0, 0, 600, 300]}}'
TURNS = 3


@pytest.fixture(scope="module")
def vlm(tmp_path_factory) -> TransformersPolicy:
    return TransformersPolicy(build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=0), num_threads=1)


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_tiny_vlm_plays_docvqa_vl_episodes_with_image_observations(vlm, docvqa_dir: Path, tmp_path: Path, mode):
    from agent_envs.envs.docvqa.data import load_docvqa_tasks

    tasks = load_docvqa_tasks(str(docvqa_dir / "val_v1.0.json"))[:2]
    # a random model never calls a tool: its first turn is a scripted view of the page's top
    recording = RecordingPolicy(vlm)
    policy = ScriptedOpening([VIEW_TOP], recording)
    out = tmp_path / "records.jsonl"
    records = run_episodes(
        "DocVQA-VL-v0",
        tasks,
        policy,
        samples=2,
        mode=mode,
        concurrency=4,
        progress=False,
        out_path=out,
        env_kwargs={"max_turns": TURNS, "max_tokens_per_turn": 16},
    )
    assert len(records) == 4 and len(out.read_text().splitlines()) == 4
    for record in records:
        assert record.error is None and record.termination_reason is not None, record.error
        assert record.turns == TURNS and record.token_counts_exact is True
        assert record.react_steps[0]["images"][0]["box"] == [0, 0, 600, 300]
        assert "base64" not in json.dumps(record.model_dump())  # records keep image facts, not pixels
    # every VLM turn carried the view's image, and its prompt length is the environment's count
    counter = TokenCounter(processor=vlm.processor)
    assert len(recording.calls) == 4 * (TURNS - 1)
    for request, completion in recording.calls:
        [image] = images_of(request.messages)
        assert image.size == (600, 300)
        assert completion.ok and completion.engine == "transformers" and completion.token_ids
        assert completion.prompt_tokens == counter.prompt_tokens(request.messages)
    # ... and it is the prompt each record's turn log reports
    logged = sorted(t["prompt_tokens"] for r in records for t in r.turn_log[1:])
    assert logged == sorted(c.prompt_tokens for _, c in recording.calls)
