"""The results file of ``bench_es_generation.py`` and the one table built from it (pure functions).

A GPU host's command limit (10 minutes) is shorter than every row at every population, so the
benchmark runs in phases (``--phase lowrank``, ``fullrank``, ``old``), each a command of its own on
the same warm host, each appending its measurements to one JSON-lines file (``--results FILE``);
``--phase table`` prints the table of everything in it.  Each phase measures its own raw rows on the
prompts its generations sent, so every share is taken against raw from the same command.

A measurement: ``shape``, ``population``, ``case_batch``, ``phase``, ``variant``, ``kind`` (``raw_B``,
``raw_PB``, ``raw_PB_own``, ``lowrank``, ``fullrank``, ``old``, ``other``), ``engines``, ``walls`` and
``tokens`` (one entry per timed generation or raw repeat), ``note``, and ``merged`` (rows joined from an
earlier run by ``--merge``, marked in the table).

Two shares: against ``raw_PB`` (a plain engine given the same requests, which computes a prompt that
several members send once and shares its KV blocks between them), and against ``raw_PB_own`` (the same
requests with each member's KV its own, as members with weights of their own need: the prefill work the
population cannot skip).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

KEYS = ("shape", "population", "case_batch", "phase", "variant", "kind", "engines", "walls", "tokens")
HEAD = (
    "shape",
    "P x B",
    "variant",
    "engines",
    "timed",
    "wall per generation (s): median (min-max)",
    "tok/s (median)",
    "share of raw at P x B, %: median (min-max)",
    "share of raw at P x B with each member's KV its own, %",
    "members/s",
    "vs linear",
    "notes",
)


def int_list(text: str) -> list[int]:
    """``"16,64,256"`` -> ``[16, 64, 256]`` (argparse type; a clear error for anything else)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"expected comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"expected comma-separated positive integers, got {text!r}")
    return values


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def not_run(exc: BaseException, limit: int = 400) -> str:
    """A failed case's note: the exception's last line, where a remote error (Ray's) ends with its cause.
    On an H100 (2026-12-07) the row kept the first 160 characters of a ``RayTaskError``, the actor's repr in
    colour codes, and lost the ``torch.OutOfMemoryError`` at the traceback's end; a refusal's advice (the
    share that fits) comes at the end of its line too, hence the longer limit."""
    lines = [line.strip() for line in ANSI_ESCAPE.sub("", str(exc)).splitlines() if line.strip()]
    name, last = type(exc).__name__, lines[-1] if lines else ""
    return (f"not run: {name} from {last}" if len(lines) > 1 else f"not run: {name}: {last}")[:limit]


def append(path: Path, measurements: Iterable[dict[str, Any]]) -> None:
    """Add measurements to the results file, one JSON object a line (a killed phase keeps earlier lines)."""
    with path.open("a") as f:
        for m in measurements:
            missing = [k for k in KEYS if k not in m]
            if missing or len(m["walls"]) != len(m["tokens"]):
                raise ValueError(f"measurement {m.get('variant')!r}: missing {missing} or walls/tokens differ")
            f.write(json.dumps(m) + "\n")


def load(path: Path) -> list[dict[str, Any]]:
    """Every measurement in the results file, in the order the phases wrote them."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def spread(values: Sequence[float], spec: str) -> str:
    """``median (min-max)`` of the values; the median alone for one value; ``-`` for none."""
    if not values:
        return "-"
    mid = format(statistics.median(values), spec)
    return mid if len(values) == 1 else f"{mid} ({format(min(values), spec)}-{format(max(values), spec)})"


def rates(m: dict[str, Any]) -> list[float]:
    """Generated tokens per second of each timed generation (or raw repeat)."""
    return [t / w for w, t in zip(m["walls"], m["tokens"], strict=True) if w]


def raw_rate(group: list[dict[str, Any]], m: dict[str, Any], kind: str = "raw_PB") -> tuple[float | None, str]:
    """The median raw tok/s at P x B (``kind``: ``raw_PB`` or ``raw_PB_own``) a measurement's share is
    taken against: the first raw of its own phase (same prompts), else none (a share against another
    phase's prompts is not given)."""
    same = [r for r in group if r["kind"] == kind and r["phase"] == m["phase"] and r["walls"]]
    if not same:
        return None, "no raw at P x B in this phase"
    return statistics.median(rates(same[0])), ""


def shares(group: list[dict[str, Any]], m: dict[str, Any], kind: str) -> tuple[str, str]:
    """Each timed generation's share of the raw of ``kind`` (:func:`raw_rate`), as ``median (min-max)`` %."""
    raw, why = raw_rate(group, m, kind)
    return spread([100 * r / raw for r in rates(m)] if raw else [], ".0f"), why


def table(measurements: list[dict[str, Any]]) -> str:
    """One markdown table across shapes, populations and phases (a row per measurement), then the
    notes (measurements without walls: engine starts, kernel settings, failures) by case and phase."""
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    footnotes = [
        f"- {m['shape']} {m['population']} x {m['case_batch']}, {m['phase']}: {m['variant']}: {m['note']}"
        for m in measurements
        if not m["walls"]
    ]
    cases: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for m in measurements:
        if m["walls"]:
            cases.setdefault((m["shape"], m["population"], m["case_batch"]), []).append(m)
    for (shape, p, b), group in sorted(cases.items()):
        one = [m for m in group if m["kind"] == "fullrank" and m["engines"] == 1 and m["walls"]]
        # the first one-engine row: a later command's pool of k re-measures engine 0 with 1/k of the memory
        per_member_one = p / statistics.median(one[0]["walls"]) if one else None
        for m in group:
            share, why = shares(group, m, "raw_PB")
            share_own, _ = shares(group, m, "raw_PB_own")
            members = p / statistics.median(m["walls"]) if m["kind"] in ("lowrank", "fullrank", "old") else None
            linear = (
                f"{members / (m['engines'] * per_member_one):.2f}"
                if members and per_member_one and m["kind"] == "fullrank"
                else "-"
            )
            notes = "; ".join(
                n for n in ("merged from an earlier run" if m.get("merged") else "", why, m.get("note", "")) if n
            )
            cells = [
                shape,
                f"{p} x {b}",
                m["variant"],
                str(m["engines"]),
                str(len(m["walls"])),
                spread(m["walls"], ".2f"),
                f"{statistics.median(rates(m)):.0f}",
                share,
                share_own,
                "-" if members is None else f"{members:.2f}",
                linear,
                notes,
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, *(["", "Notes:", *footnotes] if footnotes else [])])
