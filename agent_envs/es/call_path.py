"""Where a driver's call into the engine's workers spends its time: on its way there, in the worker's
method, and on its way back.

An H100 run of 2026-12-05 (docs/scaling.md#folded-into-the-matmul) had the update call take 0.25 s in
the driver while the worker's own parts were done at 0.03 s and the device at 0.10 s; at P = 256 on the
135M shape 0.56 s against 0.09 s.  The call goes from the driver's thread to the engine's event loop,
over vLLM's socket to the engine core's process, through its busy loop to the worker and back the same
way; which of these holds it up decides what to change.  Both ends read the monotonic clock, which all
processes of one running kernel share, so the worker stamps its entry and exit with that clock and the
kernel's boot id, and the driver splits its own interval only where the ids match (a worker on another
machine, e.g. a Ray node, has a clock of its own).
"""

from __future__ import annotations

import time
from functools import cache
from typing import Any

#: the worker's stamps in its answer's times: the kernel's boot id and the clock at entry and at return
STAMPS = ("clock", "entered_at", "left_at")
#: the driver's split of one call: to the worker's method, in it, back
SPLIT = ("to_worker_s", "in_worker_s", "back_s")


@cache
def clock_id() -> str:
    """The running kernel's boot id: equal in two processes exactly when their monotonic clocks are one."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:  # not Linux: no shared clock can be shown, so no split is made
        return ""


def now() -> float:
    """The clock both ends stamp with."""
    return time.monotonic()


def stamps(entered: float) -> dict[str, Any]:
    """The worker's :data:`STAMPS` for a method entered at ``entered`` (:func:`now`) and returning now."""
    return {"clock": clock_id(), "entered_at": entered, "left_at": now()}


def split(start: float, end: float, worker: dict[str, Any]) -> dict[str, float]:
    """:data:`SPLIT` of a call the driver made from ``start`` to ``end`` (:func:`now`), from the worker's
    :func:`stamps`; empty where they are missing or from another clock."""
    if not worker.get("clock") or worker["clock"] != clock_id() or not set(STAMPS) <= set(worker):
        return {}
    entered, left = float(worker["entered_at"]), float(worker["left_at"])
    return {"to_worker_s": entered - start, "in_worker_s": left - entered, "back_s": end - left}
