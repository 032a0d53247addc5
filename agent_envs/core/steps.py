"""The step-scorer contract (docs/protocol.md#process-rewards), below environments and rewards alike.

A scorer sees one :class:`StepContext` per step (a ``react_steps`` entry: an action or a warning,
with its observation) and returns a :class:`StepScore` in [0, 1].  Scoring is batched and async;
the environment (used directly) and the runner (batching across episodes) both go through
:func:`score_safely`, so a scorer that raises, returns the wrong number of scores or a score
outside [0, 1] becomes a recorded error for those steps, never an exception in the loop.
"""

from __future__ import annotations

import abc
import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Coroutine, Literal, Sequence, TypeVar

from agent_envs.core.types import error_text

T = TypeVar("T")

#: how an episode's step scores become one number (:func:`agent_envs.scoring.process.aggregate`)
Aggregation = Literal["product", "mean", "min"]


@dataclass(frozen=True)
class StepContext:
    """Everything a scorer may look at for one step; plain data (picklable, no environment)."""

    env_id: str
    #: the episode's record key (``<task_id>:sampleNN``)
    key: str
    #: the turn that produced the step (1-based)
    turn: int
    #: the text of the episode's first user message (the task as the model was asked it)
    question: str
    #: the task payload as in the record's ``task`` field
    task: dict[str, Any]
    #: the conversation up to and including this step's observation (content: str or parts)
    messages: list[dict[str, Any]]
    #: the model's text of this turn and its parsed action (None for a warning step)
    assistant: str
    action: dict[str, Any] | None
    #: the observation (or warning) the environment answered with
    observation: Any
    #: host paths of the images the environment's spec names for this task (e.g. a document page)
    images: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepScore:
    """A score in [0, 1], or None with the reason it could not be computed."""

    score: float | None
    error: str | None = None

    @classmethod
    def failed(cls, reason: str) -> "StepScore":
        return cls(None, reason)


class StepScorer(abc.ABC):
    """Scores a batch of steps.  ``aggregation`` is how an episode's step scores become one number."""

    name: str = "step-scorer"
    aggregation: Aggregation = "mean"

    @abc.abstractmethod
    async def score(self, contexts: Sequence[StepContext]) -> list[StepScore]:
        """One score per context, in order; may raise (the caller records the error)."""

    def score_sync(self, contexts: Sequence[StepContext]) -> list[StepScore]:
        """:meth:`score` from synchronous code, failures recorded (see :func:`score_safely`)."""
        return run_sync(score_safely(self, contexts))

    def close(self) -> None:
        """Release what the scorer holds (a judge closes its policy)."""


class BatchStepScorer(StepScorer):
    """A scorer whose work is a blocking batch call (a model forward, a batched ``generate``): it
    runs in a worker thread so an event loop driving other episodes keeps going."""

    @abc.abstractmethod
    def score_batch(self, contexts: Sequence[StepContext]) -> list[StepScore]: ...

    async def score(self, contexts: Sequence[StepContext]) -> list[StepScore]:
        return await asyncio.to_thread(self.score_batch, list(contexts))


def checked(result: Any) -> StepScore:
    """A scorer's answer for one step as a valid :class:`StepScore` (bad values become errors)."""
    if not isinstance(result, StepScore):
        return StepScore.failed(f"scorer returned {type(result).__name__}, not a StepScore")
    if result.score is None:
        return result if result.error else StepScore.failed("scorer returned no score and no reason")
    value = result.score
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        return StepScore.failed(f"step score {value!r} is not a number in [0, 1]")
    return StepScore(float(value))


async def score_safely(scorer: StepScorer, contexts: Sequence[StepContext]) -> list[StepScore]:
    """``scorer.score(contexts)`` that never raises: a failure is every step's recorded error."""
    if not contexts:
        return []
    try:
        out = await scorer.score(list(contexts))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return [StepScore.failed(error_text(exc))] * len(contexts)
    if not isinstance(out, (list, tuple)) or len(out) != len(contexts):
        count = len(out) if isinstance(out, (list, tuple)) else type(out).__name__
        return [StepScore.failed(f"scorer returned {count} scores for {len(contexts)} steps")] * len(contexts)
    return [checked(s) for s in out]


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, also when this thread runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
