"""The tiny vision-language model plays full DocVQA-VL-v0 episodes through TransformersPolicy and
``run_episodes``: the view tool's image observations reach the model as pixels, every turn's prompt
length is the environment's own processor count, and episodes end with a termination reason."""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Sequence

import pytest

from agent_envs.core.content import images_of
from agent_envs.policy.base import Completion, GenerationRequest, Policy
from agent_envs.policy.hf import TransformersPolicy
from agent_envs.policy.tiny_vlm import build_tiny_vlm
from agent_envs.rollout import run_episodes
from agent_envs.tokens import TokenCounter

VIEW_TOP = 'Action: {"name": "view", "arguments": {"box": [0, 0, 600, 300]}}'
TURNS = 3


class ViewsFirst(Policy):
    """Turn 1 is a scripted ``view`` of the page's top (a random model never calls a tool); the tiny
    VLM writes every later turn, with the view's image in its chat.  Records what the VLM was sent."""

    name = "views-first"

    def __init__(self, vlm: TransformersPolicy):
        self.vlm = vlm
        self.tokenizer, self.processor, self.max_model_len = vlm.tokenizer, vlm.processor, vlm.max_model_len
        self.sent: list[tuple[GenerationRequest, Completion]] = []
        self._lock = threading.Lock()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        later = [r for r in requests if len(r.messages) > 2]
        done = iter(self.vlm.generate(later) if later else [])
        out = [next(done) if len(r.messages) > 2 else Completion(text=VIEW_TOP, finish_reason="stop")
               for r in requests]
        with self._lock:
            self.sent += [(r, c) for r, c in zip(requests, out) if len(r.messages) > 2]
        return out


@pytest.fixture(scope="module")
def vlm(tmp_path_factory) -> TransformersPolicy:
    return TransformersPolicy(build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=0), num_threads=1)


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_tiny_vlm_plays_docvqa_vl_episodes_with_image_observations(vlm, docvqa_dir: Path, tmp_path: Path, mode):
    from agent_envs.envs.docvqa.data import load_docvqa_tasks

    tasks = load_docvqa_tasks(str(docvqa_dir / "val_v1.0.json"))[:2]
    policy = ViewsFirst(vlm)
    out = tmp_path / "records.jsonl"
    records = run_episodes("DocVQA-VL-v0", tasks, policy, samples=2, mode=mode, concurrency=4, progress=False,
                           out_path=out, env_kwargs={"max_turns": TURNS, "max_tokens_per_turn": 16})
    assert len(records) == 4 and len(out.read_text().splitlines()) == 4
    for record in records:
        assert record.error is None and record.termination_reason is not None, record.error
        assert record.turns == TURNS and record.token_counts_exact is True
        assert record.react_steps[0]["images"][0]["box"] == [0, 0, 600, 300]
        assert "base64" not in json.dumps(record.model_dump())  # records keep image facts, not pixels
    # every VLM turn carried the view's image, and its prompt length is the environment's count
    counter = TokenCounter(processor=vlm.processor)
    assert len(policy.sent) == 4 * (TURNS - 1)
    for request, completion in policy.sent:
        [image] = images_of(request.messages)
        assert image.size == (600, 300)
        assert completion.ok and completion.engine == "transformers" and completion.token_ids
        assert completion.prompt_tokens == counter.prompt_tokens(request.messages)
    # ... and it is the prompt each record's turn log reports
    logged = sorted(t["prompt_tokens"] for r in records for t in r.turn_log[1:])
    assert logged == sorted(c.prompt_tokens for _, c in policy.sent)
