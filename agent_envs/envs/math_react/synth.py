"""Seeded synthetic math problems that need real computation (the offline MATH-ReAct default).

Each problem is small enough to state in one sentence but large enough that a model should
reach for the bash tool.  Answers are integer strings computed here from closed forms; the
tests recompute them independently (brute force or sympy) from the recorded ``params``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction
from math import comb, prod

from agent_envs.envs.math_react.task import MathTask

SOURCE = "agent-envs/synthetic-math"
_SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23)

Problem = tuple[str, int, dict[str, object]]  # question, answer, params


def _modpow(rng: random.Random) -> Problem:
    base, exp = rng.randint(3, 97), rng.randint(100, 5000)
    mod = rng.choice((1000, 10_000, 997, 1009, 2024, 100_000))
    q = f"What is the remainder when {base}^{exp} is divided by {mod}?"
    return q, pow(base, exp, mod), {"base": base, "exp": exp, "mod": mod}


def _coprime_count(rng: random.Random) -> Problem:
    primes = sorted(rng.sample(_SMALL_PRIMES, rng.randint(2, 4)))
    m = prod(p ** rng.randint(1, 2) for p in primes)
    n = rng.randint(20_000, 99_999)
    count = 0
    for mask in range(1 << len(primes)):  # inclusion-exclusion over the distinct prime factors
        chosen = [p for i, p in enumerate(primes) if mask >> i & 1]
        count += (-1) ** len(chosen) * (n // prod(chosen))
    q = f"How many integers k with 1 <= k <= {n} satisfy gcd(k, {m}) = 1?"
    return q, count, {"n": n, "m": m}


def _lattice_paths(rng: random.Random) -> Problem:
    w, h = rng.randint(8, 16), rng.randint(8, 16)
    bx, by = rng.randint(1, w - 1), rng.randint(1, h - 1)
    through = comb(bx + by, bx) * comb(w - bx + h - by, w - bx)
    q = (
        f"A path on the integer grid goes from (0, 0) to ({w}, {h}) using unit steps right "
        f"(+1, 0) or up (0, +1). How many such paths avoid the point ({bx}, {by})?"
    )
    return q, comb(w + h, w) - through, {"w": w, "h": h, "bx": bx, "by": by}


def _factored_number(rng: random.Random) -> dict[int, int]:
    primes = rng.sample(_SMALL_PRIMES + (29, 31, 37, 41, 43), rng.randint(3, 5))
    return {p: rng.randint(1, 4) for p in sorted(primes)}


def _sum_of_divisors(rng: random.Random) -> Problem:
    fac = _factored_number(rng)
    n = prod(p**e for p, e in fac.items())
    sigma = prod((p ** (e + 1) - 1) // (p - 1) for p, e in fac.items())
    return f"What is the sum of all positive divisors of {n}?", sigma, {"n": n}


def _num_divisors(rng: random.Random) -> Problem:
    fac = _factored_number(rng)
    fac[rng.choice(list(fac))] += rng.randint(2, 6)  # one large exponent makes guessing harder
    n = prod(p**e for p, e in fac.items())
    count = prod(e + 1 for e in fac.values())
    return f"How many positive divisors does {n} have?", count, {"n": n}


def _unit_fractions(rng: random.Random) -> Problem:
    denominators = sorted(rng.sample(range(2, 60), rng.randint(4, 7)))
    total = sum(Fraction(1, d) for d in denominators)
    terms = " + ".join(f"1/{d}" for d in denominators)
    q = f"Write {terms} as a fraction p/q in lowest terms with p and q positive integers. What is p + q?"
    return q, total.numerator + total.denominator, {"denominators": denominators}


def _trailing_zeros(rng: random.Random) -> Problem:
    n, base = rng.randint(300, 1500), rng.choice((10, 12, 6))
    # Exponent of each prime of `base` in n! (Legendre), divided by its multiplicity in base.
    factors = {10: {2: 1, 5: 1}, 12: {2: 2, 3: 1}, 6: {2: 1, 3: 1}}[base]
    zeros = min(_legendre(n, p) // e for p, e in factors.items())
    q = f"How many trailing zeros does {n}! have when written in base {base}?"
    return q, zeros, {"n": n, "base": base}


def _legendre(n: int, p: int) -> int:
    total, power = 0, p
    while power <= n:
        total += n // power
        power *= p
    return total


FAMILIES: dict[str, Callable[[random.Random], Problem]] = {
    "modpow": _modpow,
    "coprime_count": _coprime_count,
    "lattice_paths": _lattice_paths,
    "sum_of_divisors": _sum_of_divisors,
    "num_divisors": _num_divisors,
    "unit_fractions": _unit_fractions,
    "trailing_zeros": _trailing_zeros,
}


def generate_math_tasks(n: int, seed: int = 0) -> list[MathTask]:
    """``n`` problems cycling through the families; task i depends only on (seed, i)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    names = list(FAMILIES)
    tasks = []
    for i in range(n):
        family = names[i % len(names)]
        question, answer, params = FAMILIES[family](random.Random(f"synth_math:{seed}:{i}"))
        tasks.append(
            MathTask(
                id=f"synth_math_{seed}_{i}",
                question=question,
                answer=str(answer),
                source=SOURCE,
                family=family,
                params=params,
            )
        )
    return tasks
