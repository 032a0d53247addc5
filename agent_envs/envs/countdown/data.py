"""Countdown tasks: a built-in seeded generator of solvable instances and a loader for the
public ``nums``/``target`` layout (JSONL, or parquet through pyarrow, which ``datasets`` brings)."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from agent_envs.envs.countdown.solver import solve
from agent_envs.envs.countdown.task import CountdownTask

MAX_NUMBER = 99
MAX_TARGET = 100


def _random_value(rng: random.Random, nums: list[int]) -> Fraction | None:
    """The value of a random expression tree over ``nums`` with random operators (None: ÷0)."""
    values = [Fraction(n) for n in nums]
    while len(values) > 1:
        a = values.pop(rng.randrange(len(values)))
        b = values.pop(rng.randrange(len(values)))
        op = rng.choice("+-*/")
        if op == "/" and b == 0:
            return None
        values.append(a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b)
    return values[0]


def generate(n: int, seed: int = 0, sizes: tuple[int, ...] = (3, 4)) -> list[CountdownTask]:
    """``n`` solvable tasks, the same for the same ``seed``: numbers in 1..99, integer targets in
    1..100, each built from a random expression over its numbers and confirmed by the solver."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    tasks: list[CountdownTask] = []
    while len(tasks) < n:
        nums = [rng.randint(1, MAX_NUMBER) for _ in range(rng.choice(sizes))]
        value = _random_value(rng, nums)
        if value is None or value.denominator != 1 or not 1 <= value <= MAX_TARGET:
            continue
        target = int(value)
        if solve(nums, target) is None:  # cannot happen by construction; the solver keeps us honest
            raise AssertionError(f"generated an unsolvable task: {nums} -> {target}")
        tasks.append(CountdownTask(id=f"countdown-{seed}-{len(tasks)}", nums=tuple(nums), target=target))
    return tasks


def _rows(path: Path) -> Iterable[tuple[str, Any]]:
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield f"line {i}", json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}: line {i} is not JSON ({exc.msg})") from None
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist(), 1):
            yield f"row {i}", row
    else:
        raise ValueError(f"{path}: expected a .jsonl or .parquet file")


def load(path: str | Path, limit: int | None = None) -> list[CountdownTask]:
    """Tasks from rows with ``nums`` (a list of integers) and ``target``; ``id`` is optional
    (default ``<file stem>-<index>``) and other columns are ignored."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"countdown data not found: {p}")
    tasks: list[CountdownTask] = []
    for where, row in _rows(p):
        if limit is not None and len(tasks) >= limit:
            break
        if not isinstance(row, dict) or "nums" not in row or "target" not in row:
            raise ValueError(f"{p}: {where} needs 'nums' and 'target'")
        try:
            tasks.append(
                CountdownTask(
                    id=str(row.get("id") or f"{p.stem}-{len(tasks)}"), nums=tuple(row["nums"]), target=row["target"]
                )
            )
        except (ValidationError, TypeError) as exc:
            raise ValueError(f"{p}: {where} is not a valid task: {exc}") from None
    return tasks
