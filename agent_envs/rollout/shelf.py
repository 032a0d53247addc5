"""Environments kept across runs of :func:`~agent_envs.rollout.runner.run_episodes`.

A run builds one environment per episode in flight (``gym.make``: the spec's checks, its wrappers,
the environment's prompts, rules and token counter) and closes them all at its end.  A caller that
runs the same environment again and again, as an ES run does for every member every generation,
hands its runs one shelf instead: a run takes its environments from the shelf, builds only those it
lacks, and at its end puts them back closed (their tools stopped, nothing left running).  Every
episode starts with ``reset``, which starts the environment afresh, so a kept environment gives the
same episode as a new one.  At the run's end the shelf's owner closes them all.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Iterable

import gymnasium as gym

from agent_envs.policy.base import error_text


def close_quietly(env: gym.Env[Any, Any]) -> None:
    """Close ``env``; a failure is a warning (closing must not hide the run's own outcome)."""
    try:
        env.close()
    except Exception as exc:
        print(f"[agent-envs] warning: closing an environment failed: {error_text(exc)}", file=sys.stderr)


class EnvShelf:
    """Environments of one configuration (environment id or factory, and keywords), kept for the
    runs handed this shelf; a run asking for another configuration is refused, since it would
    otherwise run its episodes in environments built for the first.  Safe to share between the
    runs of threads that run at once (an ES generation's members)."""

    def __init__(self) -> None:
        self._idle: list[gym.Env[Any, Any]] = []
        #: every environment the shelf holds, idle or lent to a run (what :meth:`close` closes)
        self._kept: list[gym.Env[Any, Any]] = []
        self._built_with: tuple[Any, dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def check(self, source: Any, kwargs: dict[str, Any]) -> None:
        """Refuse a run whose environments are built from another ``source`` or other ``kwargs``."""
        with self._lock:
            if self._built_with is None:
                self._built_with = (source, dict(kwargs))
            elif self._built_with != (source, kwargs):
                raise ValueError(
                    f"this shelf keeps environments of {self._built_with[0]!r} built with other keywords; "
                    f"a run of {source!r} with these needs a shelf of its own"
                )

    def take(self) -> gym.Env[Any, Any] | None:
        """An idle environment, or None when every one is lent (then the run builds one)."""
        with self._lock:
            return self._idle.pop() if self._idle else None

    def build(self, make_env: Callable[[], gym.Env[Any, Any]]) -> gym.Env[Any, Any]:
        """A new environment, kept from now on."""
        env = make_env()
        with self._lock:
            self._kept.append(env)
        return env

    def put_back(self, envs: Iterable[gym.Env[Any, Any]]) -> None:
        """A run's environments, closed, back for the next run."""
        with self._lock:
            self._idle.extend(envs)

    def discard(self, env: gym.Env[Any, Any]) -> None:
        """Forget an environment that raised (its run closed it; the next run builds a new one)."""
        with self._lock:
            self._kept.remove(env)

    def close(self) -> None:
        """Close every environment the shelf holds; the shelf is empty afterwards."""
        with self._lock:
            envs, self._kept, self._idle = self._kept, [], []
        for env in envs:
            close_quietly(env)
