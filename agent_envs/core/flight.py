"""How many episodes a runner has in flight, for what must share a host resource among them (each
sandbox's tmpfs mounts share one memory budget, docs/reliability.md#limits).  The runner declares
it; the layers below read it, so neither names the other."""

from __future__ import annotations

import contextlib
from typing import Iterator

_declared: list[int] = []


@contextlib.contextmanager
def episodes_in_flight(n: int) -> Iterator[None]:
    """While the block runs, ``n`` episodes (of this runner) may be in flight at once."""
    _declared.append(max(1, n))
    try:
        yield
    finally:
        _declared.remove(max(1, n))


def in_flight() -> int:
    """The episodes all running runners of this process declared together (ES endpoints run
    runners side by side), else 1 (an environment used on its own)."""
    return max(1, sum(_declared))
