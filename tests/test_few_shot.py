"""Few-shot turns (docs/protocol.md#few-shot-turns): worked examples as earlier chat turns, opt-in
for every environment, validated strictly; without them the chat is exactly the protocol's."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401  (registers the environments)
from agent_envs.core.prompts import few_shot_turns
from agent_envs.core.tokens import TokenCounter
from agent_envs.policy.hf import smollm2_tokenizer

SHOTS = [
    {"role": "user", "content": "Numbers: 3, 5\nTarget: 8"},
    {"role": "assistant", "content": "Final answer: \\boxed{3 + 5}"},
    {"role": "user", "content": "Numbers: 12, 4\nTarget: 3"},
    {"role": "assistant", "content": "Final answer: \\boxed{12 / 4}"},
]
TASK = {"id": "t", "nums": [6, 7], "target": 42}


def write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "shots.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def shots_file(tmp_path: Path) -> Path:
    return write(tmp_path, [json.dumps(m) for m in SHOTS])


def countdown(**kwargs):
    return gym.make("Countdown-ReAct-v0", single_turn=True, sandbox="none", **kwargs).unwrapped


def test_without_few_shot_the_chat_and_hash_are_the_protocols(tmp_path):
    plain, shot = countdown(), countdown(few_shot=str(shots_file(tmp_path)))
    obs, _ = plain.reset(options={"task": TASK})
    assert [m["role"] for m in obs] == ["system", "user"]
    shot_obs, _ = shot.reset(options={"task": TASK})
    assert shot_obs[0] == obs[0] and shot_obs[-1] == obs[-1]  # same system prompt, same task message
    assert plain.config_hash != shot.config_hash
    assert countdown(few_shot=None).config_hash == plain.config_hash


def test_the_examples_come_between_the_system_prompt_and_the_task(tmp_path):
    env = countdown(few_shot=shots_file(tmp_path))
    obs, _ = env.reset(options={"task": TASK})
    assert obs[1:5] == SHOTS
    assert "Numbers: 6, 7" in obs[5]["content"] and obs[5]["role"] == "user"
    assert env.generation_request().messages == obs
    assert env.observation_space.contains(obs)
    _, reward, terminated, _, info = env.step("6 * 7 = 42\nFinal answer: \\boxed{6 * 7}")
    assert (reward, terminated, info["termination_reason"]) == (1.0, True, "final_answer")
    assert info["record"]["task"]["nums"] == [6, 7]  # scored against the task, not an example


def test_a_list_gives_the_same_turns_as_the_file(tmp_path):
    assert countdown(few_shot=list(SHOTS)).config_hash == countdown(few_shot=shots_file(tmp_path)).config_hash
    assert few_shot_turns(list(SHOTS)) == few_shot_turns(shots_file(tmp_path))


def test_a_later_turn_sees_the_task_as_its_question(tmp_path):
    """Multi-turn: the observation follows the whole opening; step scorers get the task's message."""
    env = gym.make("MATH-ReAct-v0", sandbox="none", few_shot=shots_file(tmp_path), max_turns=3).unwrapped
    obs, _ = env.reset(options={"task": {"id": "m", "question": "What is 2 + 2?", "answer": "4"}})
    obs, reward, terminated, truncated, _ = env.step("I will think.")  # no action: a format warning
    assert not (terminated or truncated) and len(obs) == 8 and obs[-1]["role"] == "user"
    assert env.observation_space.contains(obs)
    (context,) = env.step_contexts()
    assert "What is 2 + 2?" in context.question and context.messages[1:5] == SHOTS


def test_the_prompt_tally_counts_the_examples():
    counter = TokenCounter(smollm2_tokenizer())
    env = countdown(few_shot=list(SHOTS), tokenizer=counter.tokenizer)
    env.reset(options={"task": TASK})
    ep = env._ep
    assert ep.tally.prompt_tokens() == counter.prompt_tokens(ep.messages)
    assert ep.tally.prompt_ids() == counter.prompt_ids(ep.messages)
    assert counter.prompt_tokens(ep.messages) > counter.prompt_tokens([ep.messages[0], ep.messages[-1]])


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"role": "user", "content": "a"}', "{not json"], "shots.jsonl:2: corrupt JSON line"),
        (['{"role": "assistant", "content": "a"}'], "shots.jsonl:1: expected role 'user'"),
        (['{"role": "user", "content": "a"}', '{"role": "user", "content": "b"}'], ":2: expected role 'assistant'"),
        (['{"role": "user", "content": "a", "name": "x"}'], ':1: expected an object with exactly "role" and "content"'),
        (["[1, 2]"], ':1: expected an object with exactly "role" and "content"'),
        (['{"role": "user", "content": "  "}'], ":1: content must be a non-empty string"),
        (['{"role": "user", "content": 3}'], ":1: content must be a non-empty string"),
        (['{"role": "user", "content": "a"}'], "pairs ending with an assistant message, got 1"),
        ([], "pairs ending with an assistant message, got 0"),
    ],
)
def test_a_bad_file_is_refused_with_its_line(tmp_path, lines, message):
    path = write(tmp_path, lines)
    with pytest.raises(ValueError) as exc:
        countdown(few_shot=str(path))
    text = str(exc.value)
    assert message in text and str(path) in text and "\n" not in text


def test_a_missing_file_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"few-shot file .*nowhere\.jsonl"):
        countdown(few_shot=str(tmp_path / "nowhere.jsonl"))


def test_a_bad_list_item_is_named():
    with pytest.raises(ValueError, match=r"few-shot turns: item 2: expected role 'assistant'"):
        few_shot_turns([SHOTS[0], SHOTS[0]])


@pytest.mark.parametrize("env_id", ["Countdown-ReAct-v0", "MATH-ReAct-v0"])
def test_the_scripted_baselines_read_the_task_not_the_first_example(env_id):
    """The CLI's scripted baselines find the task as the message their first turn ends with: with
    worked examples before it, real episodes (bwrap) still solve every task."""
    from agent_envs.envs.countdown.data import generate
    from agent_envs.envs.registry import spec
    from agent_envs.policy.scripted import ScriptedPolicy
    from agent_envs.rollout.runner import run_episodes

    tasks = (
        generate(2, seed=3)
        if env_id.startswith("Countdown")
        else [{"id": "m", "question": "Write the number 42.", "answer": "42"}]
    )
    records = run_episodes(
        env_id,
        tasks,
        ScriptedPolicy(spec(env_id).baseline),
        mode="lockstep",
        env_kwargs={"sandbox": "bwrap", "few_shot": list(SHOTS)},
        progress=False,
    )
    assert [r.score for r in records] == [1.0] * len(tasks), [r.termination_reason for r in records]
