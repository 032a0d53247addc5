"""The policy interface: a batch of generation requests in, completions out.

Environments never call a policy; runners do.  An environment says what it wants generated next
(:class:`GenerationRequest`: messages, seed, token budget, stop strings) and consumes a
:class:`Completion` in ``step``.  A completion that failed carries ``error`` instead of text and ends
its episode with the matching termination reason rather than raising.
"""

from __future__ import annotations

import abc
import threading
from typing import Any, Callable, Sequence, TypeVar

# re-exported (``X as X``, as mypy's no_implicit_reexport reads it): the policy API names them
from agent_envs.core.content import Message as Message
from agent_envs.core.types import (
    CONTEXT_LENGTH_EXCEEDED as CONTEXT_LENGTH_EXCEEDED,
    REQUEST_ERROR as REQUEST_ERROR,
    Completion as Completion,
    GenerationRequest as GenerationRequest,
    error_text as error_text,
)

T = TypeVar("T")


class Policy(abc.ABC):
    """Batched text generation.  ``generate`` must return one completion per request, in order,
    and must not raise for a single failing request (return ``Completion(error=...)``)."""

    #: a Hugging Face tokenizer when the policy has one (used for exact token budgets)
    tokenizer: Any = None
    #: a Hugging Face processor when the policy takes images (exact image token counts)
    processor: Any = None
    #: maximum prompt + generation length, when known
    max_model_len: int | None = None
    name: str = "policy"

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]: ...

    async def agenerate(self, request: GenerationRequest) -> Completion:
        """Single-request async generation; backends with a real async engine override this.

        ``generate`` runs on a daemon thread of its own, not the event loop's executor: an
        interrupted run (Ctrl-C) stops without waiting for the generations in flight, which
        ``asyncio.run`` and interpreter exit would otherwise finish one by one (minutes)."""
        import asyncio

        loop = asyncio.get_running_loop()
        done: asyncio.Future[Completion] = loop.create_future()

        def settle(result: Completion | None, exc: BaseException | None) -> None:
            if done.done():  # cancelled meanwhile
                return
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(result)  # type: ignore[arg-type]

        def work() -> None:
            try:
                outcome: tuple[Completion | None, BaseException | None] = (self.generate([request])[0], None)
            except BaseException as exc:  # handed to the awaiting coroutine
                outcome = (None, exc)
            try:
                loop.call_soon_threadsafe(settle, *outcome)
            except RuntimeError:  # the loop is gone: nobody waits for this generation any more
                pass

        threading.Thread(target=work, daemon=True, name="agent-envs-generate").start()
        return await done

    def warm(self, request: GenerationRequest) -> None:
        """Host-side work for ``request`` ahead of its ``generate`` call (e.g. tokenising the prompt).

        The runner calls it from its env worker threads right after each episode's step, so that
        work overlaps the other episodes' steps instead of running serially while the engine waits.
        It may raise: the same error then surfaces from ``generate`` as usual."""

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        """Identity for records (model, engine, endpoint)."""
        return {"policy": self.name}


class EngineFailed(RuntimeError):
    """The engine itself failed during a call, not one request: it cannot serve another (vLLM's
    in-process engine, asked again after a step that raised half-way, spun forever on the requests that
    step left behind).  :func:`batch_or_each` fails every item of the call with it, retrying none."""


def batch_or_each(
    call: Callable[[list[T]], list[Completion]], items: Sequence[T], failed: Callable[[T, Exception], Completion]
) -> list[Completion]:
    """``call(items)``; if it raises, or answers with anything but one :class:`Completion` per item,
    every item is tried on its own, and one that fails alone becomes ``failed(item, exc)``.  So one
    bad request fails only its own episode (the reference runner's retry); the runner applies this
    to a policy's batch, an engine policy to each engine call.  :class:`EngineFailed` fails them all."""

    def checked(batch: list[T]) -> list[Completion]:
        out = call(batch)
        if len(out) != len(batch) or not all(isinstance(c, Completion) for c in out):
            raise RuntimeError(f"{len(out)} results for {len(batch)} requests, not one Completion each")
        return out

    try:
        return checked(list(items))
    except EngineFailed as exc:
        return [failed(item, exc) for item in items]
    except Exception:
        results = []
        for item in items:
            try:
                results.append(checked([item])[0])
            except Exception as exc:
                results.append(failed(item, exc))
        return results
