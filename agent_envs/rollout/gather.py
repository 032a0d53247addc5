"""Batching of step-scorer calls across the episodes of an async run.

Episodes submit their new steps and go on generating; the steps submitted while a scorer call
runs go out together in the next call (at most one call in flight), so batches grow with load and
no episode's generation ever waits for a score.  An episode awaits its scores only when it ends.
"""

from __future__ import annotations

import asyncio

from agent_envs.core.steps import StepContext, StepScore, StepScorer, score_safely


class ScoreGatherer:
    """One per async run, used from the run's event loop only."""

    def __init__(self, scorer: StepScorer) -> None:
        self.scorer = scorer
        self._queue: list[tuple[StepContext, asyncio.Future[StepScore]]] = []
        self._drain: asyncio.Task[None] | None = None

    def submit(self, context: StepContext) -> asyncio.Future[StepScore]:
        future: asyncio.Future[StepScore] = asyncio.get_running_loop().create_future()
        self._queue.append((context, future))
        if self._drain is None:
            self._drain = asyncio.ensure_future(self._run())
        return future

    async def _run(self) -> None:
        try:
            while self._queue:
                await asyncio.sleep(0)  # steps submitted in the same loop pass join this call
                batch, self._queue = self._queue, []
                scores = await score_safely(self.scorer, [c for c, _ in batch])
                for (_, future), score in zip(batch, scores):
                    if not future.done():
                        future.set_result(score)
        finally:
            self._drain = None
