"""The objects a run starts with, kept out of the garbage collector's full passes while its generations run.

A full (oldest-generation) collection walks every container the process tracks.  Importing vLLM with
torch and transformers alone leaves about 675,000 of them (a full pass 0.33 s on a 2-core machine); the
engine's client, the tokenizer and the tasks add more.  The driver's event loop, which receives the
engine's outputs and runs the episodes, stops for the whole pass: an H100 ES generation at P = 256 x B =
4 (135M shape, 2026-12-05) had a driver pause of 0.62 s among 679 collections.  Those objects live as long
as the run, so a pass over them finds nothing; vLLM freezes its own engine process's startup heap for the
same reason.  :func:`run_heap_frozen` does it for the driver from a run's first generation to its end.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def run_heap_frozen() -> Iterator[None]:
    """Collect once, then move every tracked object to the permanent generation (``gc.freeze``) until the
    block ends.  Objects made inside the block are collected as usual.  On exit the heap is unfrozen, unless
    something had frozen objects before (vLLM's engine core in this process): a freeze cannot be undone in
    part, and theirs must stay."""
    first = gc.get_freeze_count() == 0
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if first:
            gc.unfreeze()
