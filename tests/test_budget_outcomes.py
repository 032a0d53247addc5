"""Budget outcomes the reference's runner decides before or around a generation
(docs/protocol.md#budgets-and-termination, #records): the context check of the first prompt, the
failed turn's prompt in ``max_context_tokens``, observation tokens without a trajectory cap."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401  (registers the environments)
from agent_envs.core.tokens import TokenCounter
from agent_envs.core.types import Completion
from agent_envs.policy.hf import smollm2_tokenizer
from agent_envs.policy.scripted import RecordingPolicy, ScriptedPolicy
from agent_envs.rollout import run_episodes

TASK = {"id": "t1", "question": "What is 6*7?", "answer": "42"}
NO_ACTION = "I think it is 42."  # no action, no final answer: a format warning


@pytest.fixture(scope="module")
def tokenizer():
    try:
        return smollm2_tokenizer()
    except FileNotFoundError as exc:
        pytest.skip(f"no SmolLM2 tokenizer: {exc}")


def _math(tokenizer, **kwargs):
    return gym.make("MATH-ReAct-v0", tasks=[TASK], tokenizer=tokenizer, sandbox="none", **kwargs).unwrapped


@pytest.mark.parametrize(
    "completion",
    [
        Completion(text="Final answer: \\boxed{42}", token_ids=[1, 2, 3]),  # a policy that generated anyway
        Completion(error="context_length_exceeded", error_message="prompt_tokens 1 + max_tokens 2 > max_model_len 2"),
        Completion(error="request_error", error_message="RuntimeError: the server refused"),
    ],
)
def test_a_first_prompt_that_cannot_fit_ends_the_same_under_every_policy(tokenizer, completion):
    """CX1/CX2: the environment checks the first prompt; the reason and react_error are the
    reference's value, the numbers go to ``react_error_detail``; nothing generated counts."""
    probe = _math(tokenizer)
    messages, _ = probe.reset(options={"row_index": 0})
    prompt = TokenCounter(tokenizer).prompt_tokens(messages)
    env = _math(tokenizer, max_tokens_per_turn=64, max_model_len=prompt + 63)
    env.reset(options={"row_index": 0})
    *_, truncated, info = env.step(completion)
    record = info["record"]
    assert truncated and record["termination_reason"] == record["react_error"] == "context_length_exceeded"
    assert record["react_error_detail"] == f"prompt_tokens {prompt} + max_tokens 64 > max_model_len {prompt + 63}"
    assert (record["turns"], record["generated_tokens"], record["max_context_tokens"], record["score"]) == (0, 0, 0, 0)
    fits = _math(tokenizer, max_tokens_per_turn=64, max_model_len=prompt + 64)
    fits.reset(options={"row_index": 0})
    record = fits.step(NO_ACTION)[4]["record"]  # the first turn runs; the longer second prompt does not fit
    assert (record["turns"], record["termination_reason"]) == (1, "context_length_exceeded")


@pytest.mark.parametrize("mode", ["async", "lockstep"])
def test_the_runner_asks_no_policy_for_a_first_prompt_that_cannot_fit(tokenizer, mode):
    """CX1: the reference ended such a trajectory before generating; the runner steps the
    environment without a policy call."""
    policy = RecordingPolicy(ScriptedPolicy(["Final answer: \\boxed{42}"]))
    env_kwargs = {"tokenizer": tokenizer, "sandbox": "none", "max_tokens_per_turn": 64, "max_model_len": 80}
    (record,) = run_episodes("MATH-ReAct-v0", [TASK], policy, env_kwargs=env_kwargs, mode=mode, progress=False)
    assert (record.termination_reason, record.react_error, policy.calls) == ("context_length_exceeded",) * 2 + ([],)
    assert record.policy_calls == 0 and record.react_error_detail.endswith("+ max_tokens 64 > max_model_len 80")


def test_a_failed_turns_prompt_counts_in_max_context_tokens(tokenizer):
    """E1: the reference counts the prompt of the turn whose request failed."""
    env = _math(tokenizer)
    env.reset(options={"row_index": 0})
    chat, *_ = env.step(NO_ACTION)
    *_, info = env.step(Completion(error="request_error", error_message="RuntimeError: boom"))
    record = info["record"]
    assert record["termination_reason"] == "request_error" and record["react_error"] == "RuntimeError: boom"
    assert record["max_context_tokens"] == TokenCounter(tokenizer).prompt_tokens(chat)


def test_docvqa_counts_observation_tokens_with_the_cap_lifted(docvqa_dir):
    """E2: ``max_trajectory_tokens=0`` lifts DocVQA's cap, but warnings still count, as the
    reference's ``max_total_tokens=0``; Math never counts them."""
    page = str(docvqa_dir / "documents" / "ffbg0227_2.png")
    rows = [{"questionId": 7, "query": "What page?", "answer": "2", "image": page}]
    env = gym.make("DocVQA-CLI-v0", dataset=rows, max_trajectory_tokens=0, max_turns=3).unwrapped
    env.reset(options={"row_index": 0})
    for _ in range(3):
        chat, *_, info = env.step(NO_ACTION)
    record = info["record"]
    assert record["termination_reason"] == "max_turns"
    warnings = sum(env.counter.message_tokens(m) for m in chat[3::2])
    assert warnings > 0 and record["trajectory_tokens"] == record["generated_tokens"] + warnings
    math = gym.make("MATH-ReAct-v0", tasks=[TASK], sandbox="none", max_turns=2).unwrapped
    math.reset(options={"row_index": 0})
    math.step(NO_ACTION)
    record = math.step(NO_ACTION)[4]["record"]
    assert record["trajectory_tokens"] == record["generated_tokens"]
