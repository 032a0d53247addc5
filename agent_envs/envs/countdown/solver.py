"""Exact Countdown solver: exhaustive search over Fractions (no floating point, no eval)."""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence


def solve(nums: Sequence[int], target: int) -> str | None:
    """An expression using every number of ``nums`` once that equals ``target``, or None.

    Repeatedly replaces two entries by their sum, difference, product or quotient (both orders
    for - and /), which covers every binary expression tree over the numbers.
    """
    goal = Fraction(target)
    seen: set[tuple[Fraction, ...]] = set()

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == goal else None
        key = tuple(sorted(v for v, _ in items))
        if key in seen:
            return None
        seen.add(key)
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                (a, ea), (b, eb) = items[i], items[j]
                rest = [items[k] for k in range(len(items)) if k not in (i, j)]
                options = [
                    (a + b, f"({ea} + {eb})"),
                    (a * b, f"({ea} * {eb})"),
                    (a - b, f"({ea} - {eb})"),
                    (b - a, f"({eb} - {ea})"),
                ]
                if b:
                    options.append((a / b, f"({ea} / {eb})"))
                if a:
                    options.append((b / a, f"({eb} / {ea})"))
                for value, expr in options:
                    found = search([*rest, (value, expr)])
                    if found is not None:
                        return found
        return None

    found = search([(Fraction(n), str(n)) for n in nums])
    return found[1:-1] if found is not None and found.startswith("(") else found
