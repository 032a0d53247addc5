"""Gymnasium's own wrappers and vector envs on our environments, as users stack them (issue 36).

Every wrapper of ``gymnasium.wrappers`` and ``gymnasium.wrappers.vector`` is either run on an
environment here or listed with the reason it cannot apply to chat observations and text actions,
so a wrapper a new Gymnasium adds fails the classification until it is looked at.  The episodes
are single-turn Countdown with fixed completions: no model, no sandbox process, milliseconds each.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any, Callable

import gymnasium as gym
import gymnasium.wrappers as W
import gymnasium.wrappers.vector as V
import pytest
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.utils import create_zero_array

import agent_envs  # noqa: F401  (registers the environments)
from agent_envs.envs.time_limit import RecordTruncation

ENV_ID = "Countdown-ReAct-v0"
TASKS = [{"id": "t0", "nums": [6, 7], "target": 42}, {"id": "t1", "nums": [2, 3], "target": 6}]
SOLVED, WRONG = "Final answer: 6*7", "Final answer: 6+7"
ZERO_CHAT = [{"role": "system", "content": ""}]


def _make(**kwargs: Any) -> gym.Env:
    """One reply, scored at once: an episode is a reset and a step."""
    return gym.make(ENV_ID, dataset=TASKS, single_turn=True, **kwargs)


def _last(obs: Any) -> list[dict[str, Any]]:
    return obs[-1:]


#: name -> (wrap the environment, what the wrapped episode's reset and final step must show)
Check = Callable[[gym.Env, Any, Any, float, dict[str, Any]], None]


def _delay(env, first, obs, reward, info):
    assert first == ZERO_CHAT and obs[-1]["role"] == "user"  # the reset chat, one step late


def _stack(env, first, obs, reward, info):
    assert len(obs) == 2 and obs[0] == first[1] and obs[1][-1] == {"role": "assistant", "content": SOLVED}


def _transform_obs(env, first, obs, reward, info):
    assert first[0]["role"] == "user" and obs == [{"role": "assistant", "content": SOLVED}]


def _clipped(env, first, obs, reward, info):
    assert reward == 0.5 and info["record"]["score"] == 1.0


def _doubled(env, first, obs, reward, info):
    assert reward == 2.0 and info["record"]["score"] == 1.0


def _normalised(env, first, obs, reward, info):
    assert reward > 1.0 and info["record"]["score"] == 1.0


def _autoreset(env, first, obs, reward, info):
    fresh, again, terminated, truncated, _ = env.step("ignored: this step resets")
    assert len(fresh) == 2 and (again, terminated, truncated) == (0.0, False, False)


def _ordered(env, first, obs, reward, info):
    with pytest.raises(gym.error.ResetNeeded):
        W.OrderEnforcing(_make()).step(SOLVED)


def _statistics(env, first, obs, reward, info):
    assert info["episode"]["r"] == 1.0 and info["episode"]["l"] == 1  # the wrapper's, beside ours
    assert info["record"]["score"] == 1.0 and info["record"]["termination_reason"] == "final_answer"


def _frames(env, first, obs, reward, info):
    frames = env.render()
    assert len(frames) == 2 and frames[1].endswith("[assistant]\n" + SOLVED)


def _solved(env, first, obs, reward, info):
    assert reward == 1.0 and info["record"]["score"] == 1.0


SINGLE: dict[str, tuple[Callable[[gym.Env], gym.Env], Check]] = {
    "DelayObservation": (lambda e: W.DelayObservation(e, 1), _delay),
    "FrameStackObservation": (lambda e: W.FrameStackObservation(e, 2), _stack),
    "TransformObservation": (lambda e: W.TransformObservation(e, _last, e.observation_space), _transform_obs),
    "TransformAction": (lambda e: W.TransformAction(e, lambda a: a.replace("6x7", "6*7"), e.action_space), _solved),
    "StickyAction": (lambda e: W.StickyAction(e, 0.5), _solved),
    "RepeatAction": (lambda e: W.RepeatAction(e, 2), _solved),
    "ClipReward": (lambda e: W.ClipReward(e, 0.0, 0.5), _clipped),
    "TransformReward": (lambda e: W.TransformReward(e, lambda r: 2 * float(r)), _doubled),
    "NormalizeReward": (lambda e: W.NormalizeReward(e), _normalised),
    "TimeLimit": (lambda e: W.TimeLimit(e, 5), _solved),
    "Autoreset": (lambda e: W.Autoreset(e), _autoreset),
    "PassiveEnvChecker": (lambda e: W.PassiveEnvChecker(e), _solved),
    "OrderEnforcing": (lambda e: W.OrderEnforcing(e), _ordered),
    "RecordEpisodeStatistics": (lambda e: W.RecordEpisodeStatistics(e), _statistics),
    "RenderCollection": (lambda e: W.RenderCollection(e), _frames),
}
_ARRAYS = "needs array observations (Box, Dict or images); ours are chats"
NOT_APPLICABLE = {
    "AtariPreprocessing": "Atari frames",
    "DtypeObservation": _ARRAYS,
    "DiscretizeObservation": _ARRAYS,
    "FilterObservation": _ARRAYS,
    "FlattenObservation": _ARRAYS,
    "GrayscaleObservation": _ARRAYS,
    "MaxAndSkipObservation": _ARRAYS,
    "NormalizeObservation": _ARRAYS,
    "ResizeObservation": _ARRAYS,
    "ReshapeObservation": _ARRAYS,
    "RescaleObservation": _ARRAYS,
    "TimeAwareObservation": _ARRAYS,
    "AddWhiteNoise": _ARRAYS,
    "ObstructView": _ARRAYS,
    "AddRenderObservation": "needs rgb_array rendering; ours renders text (ansi)",
    "RecordVideo": "needs rgb_array rendering; ours renders text (ansi)",
    "HumanRendering": "needs rgb_array rendering; ours renders text (ansi)",
    "ClipAction": "needs Box actions; ours are completion text",
    "DiscretizeAction": "needs Box actions; ours are completion text",
    "RescaleAction": "needs Box actions; ours are completion text",
    "ArrayConversion": "converts array frameworks (numpy, torch, jax); ours are text",
    "JaxToNumpy": "converts array frameworks (numpy, torch, jax); ours are text",
    "JaxToTorch": "converts array frameworks (numpy, torch, jax); ours are text",
    "NumpyToTorch": "converts array frameworks (numpy, torch, jax); ours are text",
}


def _vector_last(obs: Any) -> tuple[Any, ...]:
    return tuple(o[-1:] for o in obs)


#: vector wrappers: name -> (wrap the vector env, its reward for the two completions (SOLVED, WRONG))
VECTOR: dict[str, tuple[Callable[[Any], Any], list[float]]] = {
    "VectorizeTransformObservation": (
        lambda e: V.VectorizeTransformObservation(
            e, W.TransformObservation, func=_last, observation_space=e.single_observation_space
        ),
        [1.0, 0.0],
    ),
    "VectorizeTransformAction": (
        lambda e: V.VectorizeTransformAction(e, W.TransformAction, func=str.strip, action_space=e.single_action_space),
        [1.0, 0.0],
    ),
    "VectorizeTransformReward": (
        lambda e: V.VectorizeTransformReward(e, W.TransformReward, func=lambda r: 3 * float(r)),
        [3.0, 0.0],
    ),
    "DictInfoToList": (V.DictInfoToList, [1.0, 0.0]),
    "TransformObservation": (lambda e: V.TransformObservation(e, _vector_last), [1.0, 0.0]),
    "TransformAction": (lambda e: V.TransformAction(e, lambda acts: tuple(a.strip() for a in acts)), [1.0, 0.0]),
    "TransformReward": (lambda e: V.TransformReward(e, lambda r: 2 * r), [2.0, 0.0]),
    "ClipReward": (lambda e: V.ClipReward(e, 0.0, 0.5), [0.5, 0.0]),
    "NormalizeReward": (V.NormalizeReward, []),
    "RecordEpisodeStatistics": (V.RecordEpisodeStatistics, [1.0, 0.0]),
}
VECTOR_NOT_APPLICABLE = {
    name: NOT_APPLICABLE[name]
    for name in (
        "FilterObservation",
        "FlattenObservation",
        "GrayscaleObservation",
        "ResizeObservation",
        "ReshapeObservation",
        "RescaleObservation",
        "DtypeObservation",
        "NormalizeObservation",
        "ClipAction",
        "RescaleAction",
        "RecordVideo",
        "HumanRendering",
        "ArrayConversion",
        "JaxToNumpy",
        "JaxToTorch",
        "NumpyToTorch",
    )
}


def test_every_gymnasium_wrapper_is_run_here_or_says_why_it_cannot_apply():
    assert set(W.__all__) - {"vector"} == set(SINGLE) | set(NOT_APPLICABLE)
    assert set(V.__all__) == set(VECTOR) | set(VECTOR_NOT_APPLICABLE)


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_wrapper_runs_an_episode_to_its_record(name):
    wrap, check = SINGLE[name]
    env = wrap(_make(render_mode="ansi"))
    first, _ = env.reset(seed=0, options={"row_index": 0})
    obs, reward, terminated, truncated, info = env.step(SOLVED if name != "TransformAction" else "Final answer: 6x7")
    assert (terminated, truncated, info["termination_reason"]) == (True, False, "final_answer")
    check(env, first, obs, float(reward), info)
    env.close()


def test_zero_chat_pads_inside_the_observation_space():
    space = _make().observation_space
    assert create_zero_array(space) == ZERO_CHAT and space.contains(ZERO_CHAT)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name", sorted(VECTOR))
def test_vector_wrapper_runs_on_sync_and_async_vector_envs_with_default_arguments(name, mode):
    wrap, rewards = VECTOR[name]
    envs = wrap(gym.make_vec(ENV_ID, num_envs=2, vectorization_mode=mode, dataset=TASKS, single_turn=True))
    try:
        obs, _ = envs.reset(seed=0, options={"row_index": 0})
        obs, reward, terminated, truncated, info = envs.step((SOLVED + " ", WRONG))
        assert list(terminated) == [True, True] and not any(truncated)
        # a vector env's info holds each key as an array over the envs (dicts key by key)
        scores = [i["record"]["score"] for i in info] if isinstance(info, list) else list(info["record"]["score"])
        assert scores == [1.0, 0.0]
        if rewards:
            assert list(reward) == rewards
        if name == "RecordEpisodeStatistics":
            assert list(info["episode"]["r"]) == [1.0, 0.0]
        # next-step autoreset: the next step starts fresh episodes, whose chats the vector env returns
        obs, reward, *_ = envs.step(("x", "x"))
        assert [len(o) for o in obs] == ([1, 1] if "TransformObservation" in name else [2, 2])
    finally:
        envs.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_same_step_autoreset_keeps_the_final_chat_and_record(mode):
    envs = gym.make_vec(
        ENV_ID,
        num_envs=2,
        vectorization_mode=mode,
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        dataset=TASKS,
        single_turn=True,
    )
    try:
        envs.reset(seed=0, options={"row_index": 0})
        obs, reward, terminated, _, info = envs.step((SOLVED, WRONG))
        assert [len(o) for o in obs] == [2, 2] and list(terminated) == [True, True]  # already the next episodes
        assert [len(o) for o in info["final_obs"]] == [3, 3]
        assert list(info["final_info"]["record"]["score"]) == list(reward) == [1.0, 0.0]
    finally:
        envs.close()


def test_async_vector_env_shares_chats_between_steps():
    envs = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="async", dataset=TASKS, max_turns=3)
    try:
        first, _ = envs.reset(seed=0, options={"row_index": 1})
        obs, *_ = envs.step(("hello", "again"))
        assert [o[:2] for o in obs] == list(first) and [o[2]["content"] for o in obs] == ["hello", "again"]
        later, *_ = envs.step(("x", "y"))
        assert [o[4]["content"] for o in later] == ["x", "y"]
        assert [len(o) for o in obs] == [4, 4]  # copies: a later step leaves what was returned alone
    finally:
        envs.close()


@pytest.mark.parametrize("by_hand", [False, True])
def test_time_limit_cut_ends_the_episode_with_its_own_reason_and_record(by_hand):
    env: gym.Env
    if by_hand:
        env = RecordTruncation(W.TimeLimit(gym.make(ENV_ID, dataset=TASKS), 2))
    else:
        env = gym.make(ENV_ID, dataset=TASKS, max_episode_steps=2)
    env.reset(seed=0, options={"row_index": 0})
    assert env.step("thinking")[2:4] == (False, False)
    _, reward, terminated, truncated, info = env.step("Final answer: 6+7")
    record = info["record"]
    assert (terminated, truncated, info["termination_reason"]) == (False, True, "time_limit")
    assert (record["termination_reason"], record["react_error"], record["turns"]) == (
        "time_limit",
        "time_limit_exceeded",
        2,
    )
    assert reward == record["score"] == 0.0
    env.reset(seed=0)  # the next episode starts as usual
    env.close()


def test_the_environments_own_end_wins_over_a_time_limit_at_the_same_step():
    env = gym.make(ENV_ID, dataset=TASKS, max_turns=2, max_episode_steps=2)
    env.reset(seed=0, options={"row_index": 0})
    env.step("thinking")
    info = env.step("still thinking")[4]
    assert info["termination_reason"] == info["record"]["termination_reason"] == "max_turns"


def _episode(env: gym.Env) -> dict[str, Any]:
    env.reset(seed=3, options={"row_index": 0})
    return env.step(SOLVED)[4]["record"]


def test_environments_pickle_and_deepcopy_between_episodes_and_before_a_tool_runs():
    env = _make()
    spec = pickle.loads(pickle.dumps(env.spec))
    expected = _episode(env)
    for twin in (pickle.loads(pickle.dumps(env)), copy.deepcopy(env), gym.make(spec)):
        assert _episode(twin) == expected
    env.reset(seed=3, options={"row_index": 0})
    mid = pickle.loads(pickle.dumps(env))  # after reset: the chat so far travels, the copy goes on alone
    assert mid.step(SOLVED)[4]["record"] == env.step(SOLVED)[4]["record"] == expected


def test_copying_while_a_tool_runs_is_refused_with_the_reason():
    env = gym.make(ENV_ID, dataset=TASKS, sandbox="bwrap")
    env.reset(seed=0)
    env.step('Action: {"name": "bash", "arguments": {"command": "echo hi"}}')
    for copy_it in (pickle.dumps, copy.deepcopy):
        with pytest.raises(TypeError, match=r"while its episode's tools are running \(bash\)"):
            copy_it(env)
    env.close()
