"""The PrimeCount task model (validated at the loader boundary) and its seeded generator."""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

#: the widest range a task asks about: a sieve in the python tool takes well under a second
MAX_HIGH = 2_000_000


class PrimeCountTask(BaseModel):
    """One instance: how many primes ``p`` satisfy ``low <= p <= high``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    low: StrictInt = Field(ge=0)
    high: StrictInt = Field(le=MAX_HIGH)

    @model_validator(mode="after")
    def _ordered(self) -> PrimeCountTask:
        if self.high < self.low:
            raise ValueError(f"high {self.high} is below low {self.low}")
        return self

    @property
    def answer(self) -> int:
        """The gold count (a sieve: ranges are small enough to count exactly here)."""
        return prime_count(self.low, self.high)

    def fill(self, template: str) -> str:
        """``template`` with ``{low}`` and ``{high}`` replaced (``str.replace``: other braces stay)."""
        return template.replace("{low}", str(self.low)).replace("{high}", str(self.high))


def prime_count(low: int, high: int) -> int:
    """Primes in ``[low, high]``, by a sieve of Eratosthenes."""
    if high < 2:
        return 0
    sieve = bytearray([1]) * (high + 1)
    sieve[0:2] = b"\0\0"
    for n in range(2, int(high**0.5) + 1):
        if sieve[n]:
            sieve[n * n :: n] = bytes(len(range(n * n, high + 1, n)))
    return sum(sieve[max(low, 0) :])


def generate(n: int, seed: int = 0) -> list[PrimeCountTask]:
    """``n`` tasks, the same for the same ``seed``: ranges of 1,000 to 200,000 numbers below 1,000,000,
    too many to count by hand, a second's work for a program."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        width = rng.randint(1_000, 200_000)
        low = rng.randint(0, 1_000_000 - width)
        tasks.append(PrimeCountTask(id=f"primes-{seed}-{i}", low=low, high=low + width))
    return tasks
