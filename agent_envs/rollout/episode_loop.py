"""One event loop for the async episodes of many runs of
:func:`~agent_envs.rollout.runner.run_episodes` at once.

Each async run starts an event loop of its own (``asyncio.run``) in its caller's thread.  An ES
generation runs every member's episodes at once, one run per member thread: 16 to 256 event loops,
each woken by its own env worker calls and engine answers, all taking turns at one interpreter.  A
caller that runs many at once hands them one :class:`EpisodeLoop` instead: their episodes run as
tasks of one loop on one thread, while the calling threads wait for their results.  On a 2-core
host that cut the rollouts of a 16 x 16 generation around an instant engine by about a quarter
(0.26 -> 0.19 s; docs/scaling.md#the-episode-loops-host-time).

:meth:`EpisodeLoop.sharing` runs them on a loop that already runs, such as an async engine's own
(``AsyncVLLMPolicy.engine_loop``): an episode then awaits the engine in its own loop, with no
hand-off to another thread and back for each request.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


class EpisodeLoop:
    """An event loop running on a daemon thread of its own until :meth:`close`."""

    def __init__(self, name: str = "agent-envs-episodes") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        #: whether this object started the loop (and so stops it in :meth:`close`)
        self.owned = True
        self.thread.start()

    @classmethod
    def sharing(cls, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> "EpisodeLoop":
        """The episodes on ``loop``, which runs forever on ``thread`` and belongs to someone else:
        :meth:`close` leaves it running."""
        shared = cls.__new__(cls)
        shared.loop, shared.thread, shared.owned = loop, thread, False
        return shared

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (from any thread but the loop's own)."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("EpisodeLoop.run called on the loop's own thread: it would wait for itself")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:  # an interrupted caller (Ctrl-C on the main thread): its run's tasks end too
            future.cancel()
            raise

    def close(self) -> None:
        """Stop the loop (after its runs have returned) and join its thread; a shared loop goes on."""
        if not self.owned:
            return
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
        self.loop.close()
