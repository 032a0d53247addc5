"""Conformance checks for any registered environment, ours or a plug-in's (docs/api.md#conformance).

Each check runs real episodes (the environment's own sandbox, tools and scorer) and raises an
``AssertionError`` saying what an environment owes its users and did not give:

- :func:`check_gym_api`: Gymnasium's own ``check_env`` passes;
- :func:`check_total`: adversarial and random completions end in warnings or a protocol termination
  reason with a record that copies, pickles and JSON-encodes, never in an exception;
- :func:`check_runners_agree`: the ``scripted`` reference (the spec's ``baseline``) uses a tool and
  answers; the lockstep and async runners give the same records, the same seeds the same records;
- :func:`check_leaves_nothing`: reset and close leave no process or sandbox temp folder behind.

:func:`check_environment` runs them all.  A plug-in's own test suite calls it with its env id::

    from agent_envs.testing import check_environment
    check_environment("MyEnv-v0")
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import random
import tempfile
from pathlib import Path
from typing import Any, Callable, cast

import gymnasium as gym
from gymnasium.utils.env_checker import check_env

from agent_envs.core.spec import ToolSpec
from agent_envs.envs import registry
from agent_envs.envs.react import ReActEnv
from agent_envs.policy.scripted import ScriptedPolicy
from agent_envs.protocol.native import call_text
from agent_envs.rollout.records import EpisodeRecord, dumps_line
from agent_envs.rollout.runner import run_episodes, strip_timings

#: how an episode may end (docs/protocol.md#decision-order)
TERMINATIONS = frozenset({"final_answer", "max_turns", "max_response_tokens_exceeded", "context_length_exceeded"})
#: nesting depths of an action's extra argument: decodable (400, and 500 where copying a record
#: recursed past the limit), beyond the decoder (1,000) and far beyond it (100,000)
DEEP_NESTING = (400, 500, 1_000, 100_000)
#: small budgets keep the checks cheap; every code path is still reached
ENV_KWARGS: dict[str, Any] = {"max_turns": 4, "sandbox": "bwrap"}
#: the temp folders the sandboxes make (agent_envs.sandbox)
TEMP_PREFIXES = ("ae-mount-", "ae-local-")


def make(env_id: str, env_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> gym.Env[Any, Any]:
    """The environment on its built-in data with the checks' small budgets."""
    return gym.make(env_id, dataset="builtin", **{**ENV_KWARGS, **(env_kwargs or {}), **kwargs})


def act(env_id: str, tool: ToolSpec, text: str) -> str:
    """A call of ``tool`` carrying ``text`` as its input, in the environment's own format (ReAct or
    native; a tool of the whole arguments object gets it under a key of its own)."""
    arguments = {tool.argument or "input": text}
    if registry.spec(env_id).rules["es"].parser.native_tool_calls:
        return call_text(tool.name, arguments)
    return f"Action: {json.dumps({'name': tool.name, 'arguments': arguments})}"


def adversarial(env_id: str) -> list[str]:
    """Completions aimed at the parser, the tools and the scorer (in both call formats)."""
    tools = registry.spec(env_id).tools
    acts = [act(env_id, tool, "echo hi; exit 3") for tool in tools]
    calls = [call_text(tool.name, {tool.argument or "input": "echo hi"}) for tool in tools]
    return [
        *[f"<think>{c}</think>" for c in calls],
        *[f"<think>{c}" for c in calls],
        "".join(calls * 12),
        "<tool_call>",
        "<tool_call>{}</tool_call>",
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "bash", "arguments": "{"}</tool_call>',
        "<tool_call>" + "[" * 5000 + "</tool_call>",
        "",
        " ",
        "\0",
        "Final answer:",
        "Final answer: \\boxed{",
        "Answer: 1/0",
        "<think>",
        "<think>Final answer: 1</think>",
        'Action: {"name": "bash"',
        "Action: {}",
        "Action: []",
        'Action: {"name": "nope", "arguments": {}}',
        'Action: {"name": null}',
        *[a.replace("echo hi; exit 3", "") for a in acts],
        *acts,
        *[a.replace("echo hi; exit 3", "\\u0000") for a in acts],
        "Action: " + "{" * 5000,
        "x" * 20000,
        "Final answer: __import__('os').system('echo pwned')",
        "Final answer: \\boxed{" + "(" * 400 + "1" + ")" * 400 + "}",
        "Final answer: 9" + "9" * 400,
        "\ud800 Final answer: \udfff",
        *[
            a.replace('"echo hi; exit 3"}', '"echo deep", "x": ' + "[" * d + "]" * d + "}")
            for a in acts
            for d in DEEP_NESTING
        ],
    ]


def random_completions(seed: int, n: int) -> list[str]:
    """``n`` strings over the grammar's characters (a seeded, cheap fuzz beside :func:`adversarial`)."""
    rng = random.Random(seed)
    alphabet = "Action:{}[]\"':,\\\n finalswerbxodpyth0123456789+-*/()<>"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120))) for _ in range(n)]


def check_gym_api(env_id: str, env_kwargs: dict[str, Any] | None = None) -> None:
    env = make(env_id, env_kwargs)
    try:
        check_env(env.unwrapped)
    finally:
        env.close()


def check_record(record: dict[str, Any]) -> None:
    """An ending episode's record: a protocol termination, a score in [0, 1], and a value that crosses
    processes and files (copy, pickle, JSON, the runner's own model and line writer)."""
    assert record["termination_reason"] in TERMINATIONS, (record["termination_reason"], record.get("react_error"))
    assert 0.0 <= record["score"] <= 1.0, record["score"]
    assert pickle.loads(pickle.dumps(copy.deepcopy(record))) == json.loads(json.dumps(record))
    EpisodeRecord.model_validate(record)
    json.loads(dumps_line(record))


def check_total(env_id: str, env_kwargs: dict[str, Any] | None = None, random_seed: int = 0) -> None:
    completions = adversarial(env_id) + random_completions(random_seed, 24)
    env = make(env_id, env_kwargs)
    ended = 0
    try:
        env.reset(seed=0)
        for i, text in enumerate(completions):
            _, reward, terminated, truncated, info = env.step(text)
            assert isinstance(reward, float), f"reward {reward!r} is not a float"
            if terminated or truncated:
                ended += 1
                check_record(info["record"])
                env.reset(seed=i)
    finally:
        env.close()
    assert ended > 0, "no episode ended"


def scripted_records(
    env_id: str, mode: str, base_seed: int = 11, env_kwargs: dict[str, Any] | None = None, **kwargs: Any
) -> list[dict[str, Any]]:
    """The ``scripted`` reference on 2 built-in tasks, 2 samples each, timings stripped."""
    baseline = registry.spec(env_id).baseline
    assert baseline is not None, f"{env_id} has no baseline (EnvSpec.baseline): the scripted policy cannot run it"
    env = make(env_id, env_kwargs)
    try:
        tasks = cast(ReActEnv, env.unwrapped).tasks[:2]
    finally:
        env.close()
    records = run_episodes(
        env_id,
        tasks,
        ScriptedPolicy(baseline),
        samples=2,
        mode=mode,
        base_seed=base_seed,
        env_kwargs={**ENV_KWARGS, **(env_kwargs or {})},
        concurrency=3,
        progress=False,
        **kwargs,
    )
    return [strip_timings(r) for r in records]


def check_runners_agree(env_id: str, env_kwargs: dict[str, Any] | None = None) -> None:
    lockstep = scripted_records(env_id, "lockstep", env_kwargs=env_kwargs)
    assert len(lockstep) == 4 and all(r["error"] is None for r in lockstep), [r["error"] for r in lockstep]
    assert all(r["used_bash"] and r["termination_reason"] == "final_answer" for r in lockstep), [
        (r["used_bash"], r["termination_reason"]) for r in lockstep
    ]
    assert scripted_records(env_id, "async", env_kwargs=env_kwargs) == lockstep, "lockstep and async differ"
    assert scripted_records(env_id, "async", env_kwargs=env_kwargs) == lockstep, "a second async run differs"
    other = scripted_records(env_id, "lockstep", base_seed=12, env_kwargs=env_kwargs)
    assert [r["seed"] for r in other] != [r["seed"] for r in lockstep], "another base seed gave the same seeds"


def live_descendants() -> set[int]:
    """Live (non-zombie) processes below this one (Linux ``/proc``)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def temp_dirs() -> set[str]:
    """Sandbox folders in the temp folder the sandboxes use (``TMPDIR``; not always ``/tmp``)."""
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith(TEMP_PREFIXES)}


def check_leaves_nothing(env_id: str, env_kwargs: dict[str, Any] | None = None) -> None:
    before_procs, before_dirs = live_descendants(), temp_dirs()
    env = make(env_id, env_kwargs)
    tools = registry.spec(env_id).tools
    env.reset(seed=0)
    for tool in tools:  # start every tool, then reset mid-episode
        env.step(act(env_id, tool, "sleep 30 &"))
    env.reset(seed=1)
    for tool in tools:
        env.step(act(env_id, tool, "echo x > /tmp/f"))
    env.close()
    assert live_descendants() - before_procs == set(), "processes left behind"
    assert temp_dirs() - before_dirs == set(), "temp folders left behind"


#: every check, in the order :func:`check_environment` runs them
CHECKS: dict[str, Callable[..., None]] = {
    "gym_api": check_gym_api,
    "total": check_total,
    "runners_agree": check_runners_agree,
    "leaves_nothing": check_leaves_nothing,
}


def check_environment(env_id: str, env_kwargs: dict[str, Any] | None = None) -> list[str]:
    """Run every check on ``env_id`` (registered: import its package first); the names that passed.
    The first failure raises."""
    registry.spec(env_id)
    for check in CHECKS.values():
        check(env_id, env_kwargs)
    return list(CHECKS)
