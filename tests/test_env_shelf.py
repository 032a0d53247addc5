"""``run_episodes(envs=EnvShelf())``: runs of the same environment take their environments from the
caller's shelf, build only those they lack, and put them back closed; an environment kept across runs
gives the same episodes as a new one (an ES run kept 256 instead of building them every generation)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from test_runner import TASKS, BrokenEnvFactory, SeededMathPolicy

import agent_envs  # noqa: F401  (registers the environment ids)
from agent_envs.policy.base import Completion
from agent_envs.rollout.runner import run_episodes, strip_timings
from agent_envs.rollout.shelf import EnvShelf


class CountingFactory:
    """``gym.make("MATH-ReAct-v0")`` that keeps every env it built and counts their closes."""

    def __init__(self) -> None:
        self.built: list[gym.Env[Any, Any]] = []
        self.closes = 0

    def __call__(self, **kwargs: Any) -> gym.Env[Any, Any]:
        env = gym.make("MATH-ReAct-v0", **kwargs)
        close = env.close

        def counted_close() -> None:
            self.closes += 1
            close()

        env.close = counted_close  # type: ignore[method-assign]
        self.built.append(env)
        return env


def episodes(source: Any, mode: str, policy: Any = None, samples: int = 3, concurrency: int = 4, **kw: Any) -> Any:
    """``run_episodes`` of the runner tests' tasks (a seeded policy, bwrap sandboxes unless ``env_kwargs``)."""
    kw.setdefault("env_kwargs", {"sandbox": "bwrap", "max_turns": 6})
    return run_episodes(
        source, TASKS, policy or SeededMathPolicy(), samples=samples, mode=mode, concurrency=concurrency,
        progress=False, **kw,
    )  # fmt: skip


def run(source: Any, mode: str, **kw: Any) -> list[dict[str, Any]]:
    return [strip_timings(r) for r in episodes(source, mode, **kw)]


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_runs_on_a_shelf_build_their_envs_once_close_them_at_each_end_and_give_the_same_records(mode: str) -> None:
    fresh = run("MATH-ReAct-v0", mode)
    factory, shelf = CountingFactory(), EnvShelf()
    kept = [run(factory, mode, envs=shelf) for _ in range(3)]
    assert kept == [fresh] * 3  # real bash commands in bwrap sandboxes, episodes on reset envs
    assert len(factory.built) == len(shelf) == 4  # the first run's 4 in flight, none built by the next two
    assert factory.closes == 3 * 4  # every run closed its envs at its end, then put them back
    shelf.close()
    assert len(shelf) == 0 and factory.closes == 4 * 4


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_an_env_that_raised_is_closed_and_not_kept(mode: str) -> None:
    shelf, bad = EnvShelf(), TASKS[2]["id"]
    factory = BrokenEnvFactory(bad)
    for _ in range(2):
        records = episodes(
            factory, mode, samples=2, concurrency=3, env_kwargs={"sandbox": "none", "max_turns": 6}, envs=shelf
        )
        assert [r.termination_reason == "env_error" for r in records] == [r.task_id == bad for r in records]
        assert len(shelf) == 3  # the two envs that raised were replaced, not kept beside them
    shelf.close()


def test_a_shelf_refuses_a_run_of_other_keywords() -> None:
    shelf = EnvShelf()
    run("MATH-ReAct-v0", "async", envs=shelf, env_kwargs={"sandbox": "none", "max_turns": 6})
    with pytest.raises(ValueError, match="other keywords"):
        run("MATH-ReAct-v0", "async", envs=shelf, env_kwargs={"sandbox": "none", "max_turns": 5})
    shelf.close()


def child_processes() -> set[int]:
    """Processes whose parent is this one (a persistent bwrap sandbox is one while its episode runs)."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
            found.add(int(pid))
    return found


class SeesItsSandboxes(SeededMathPolicy):
    """The seeded policy, noting the child processes alive at every request."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[int] = set()

    def generate(self, requests: Any) -> list[Completion]:
        self.seen |= child_processes()
        return super().generate(requests)


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_kept_sandboxed_envs_leave_no_process_between_runs_or_after(mode: str) -> None:
    before, shelf = child_processes(), EnvShelf()
    for _ in range(2):
        policy = SeesItsSandboxes()
        episodes("MATH-ReAct-v0", mode, policy, samples=2, concurrency=3, envs=shelf)
        assert policy.seen - before, "no sandbox process ran during the episodes"
        assert child_processes() <= before, "a kept env's sandbox outlived its run"
    shelf.close()
    assert child_processes() <= before
