"""``run_episodes(episode_loop=EpisodeLoop())``: async runs of many threads at once run their episodes
on the caller's one event loop, not on one each (an ES generation's 16 to 256 member threads), with
the same records; the loop stays open between runs and its thread ends with ``close``."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from test_runner import TASKS, SeededMathPolicy

from agent_envs.policy.base import Completion, GenerationRequest
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
