"""Seed streams and case batches of the ES trainer (docs/protocol.md#population-seeds, #case-batches, #sampling-and-seeds).

Every seed a generation uses is a pure function of ``(seed, population, generation)``, so a
resumed or replayed run can regenerate and check them instead of trusting stored values.
"""

from __future__ import annotations

import random
from typing import Sequence, TypeVar

from agent_envs.protocol.seeds import trajectory_seed  # re-exported: ES code computes episode seeds too

__all__ = [
    "SeedStream",
    "check_mirrored",
    "population_seeds",
    "check_seed_sequence",
    "trajectory_seed",
    "case_batch",
    "check_run_shape",
]

T = TypeVar("T")
SEED_HIGH = 2**31 - 1


class SeedStream:
    """Population seeds: one ``random.Random(seed)`` stream, ``population`` draws per generation.

    ``mirrored`` (docs/protocol.md#mirrored-pairs, ours): ``population / 2`` draws per generation,
    each seed given to two consecutive members (+eps, -eps); the population must be even."""

    def __init__(self, seed: int, population: int, start_generation: int = 0, mirrored: bool = False) -> None:
        if int(population) < 1:
            raise ValueError(f"population must be >= 1, got {population!r}")
        check_mirrored(population, mirrored)
        self.population, self.mirrored = int(population), bool(mirrored)
        self._draws = self.population // 2 if mirrored else self.population
        self._rng = random.Random(int(seed))
        self.generation = 0
        self.fast_forward(start_generation)

    def fast_forward(self, generations: int) -> None:
        """Skip ``generations`` whole generations (resume: start_generation x population draws)."""
        for _ in range(int(generations)):
            self.next_generation()

    def next_generation(self) -> list[int]:
        seeds = self._members(self._rng)
        self.generation += 1
        return seeds

    def peek(self) -> list[int]:
        """The seeds :meth:`next_generation` will return, without advancing the stream."""
        ahead = random.Random()
        ahead.setstate(self._rng.getstate())
        return self._members(ahead)

    def _members(self, rng: random.Random) -> list[int]:
        drawn = [rng.randrange(1, SEED_HIGH) for _ in range(self._draws)]
        return [s for s in drawn for _ in range(2)] if self.mirrored else drawn


def check_mirrored(population: int, mirrored: bool) -> None:
    """Mirrored members come in pairs, so the population must be even."""
    if mirrored and int(population) % 2:
        raise ValueError(f"mirrored pairs need an even population, got {population}")


def population_seeds(seed: int, population: int, generations: int, mirrored: bool = False) -> list[list[int]]:
    """The seeds of generations ``0 .. generations-1``."""
    stream = SeedStream(seed, population, mirrored=mirrored)
    return [stream.next_generation() for _ in range(int(generations))]


def check_seed_sequence(stored: Sequence[Sequence[int]], seed: int, population: int, mirrored: bool = False) -> int:
    """Require stored per-generation seeds to equal the regenerated stream; return how many."""
    stream = SeedStream(seed, population, mirrored=mirrored)
    for generation, seeds in enumerate(stored):
        expected = stream.next_generation()
        if [int(s) for s in seeds] != expected:
            raise ValueError(
                f"generation {generation}: stored seeds do not match the seed stream of seed={seed}, "
                f"population={population}{', mirrored' if mirrored else ''}; use the original --seed and --population "
                "(and --mirrored as the run had it)"
            )
    return len(stored)


def case_batch(tasks: Sequence[T], generation: int, batch_size: int) -> list[T]:
    """Generation ``g``'s tasks: ``batch_size`` of them, cyclically from ``(g * B) mod |tasks|``."""
    if not tasks:
        raise ValueError("the training task list is empty")
    if int(batch_size) < 1:
        raise ValueError(f"case_batch_size must be >= 1, got {batch_size!r}")
    start = (int(generation) * int(batch_size)) % len(tasks)
    return [tasks[(start + i) % len(tasks)] for i in range(int(batch_size))]


def check_run_shape(generations: int, population: int, case_batch_size: int, eval_only: bool = False) -> None:
    """Generations, population and case batch must be >= 1 (generations may be 0 when eval-only)."""
    if int(generations) < (0 if eval_only else 1):
        raise ValueError(f"generations must be >= {0 if eval_only else 1}, got {generations!r}")
    if int(population) < 1:
        raise ValueError(f"population must be >= 1, got {population!r}")
    if int(case_batch_size) < 1:
        raise ValueError(f"case_batch_size must be >= 1, got {case_batch_size!r}")
