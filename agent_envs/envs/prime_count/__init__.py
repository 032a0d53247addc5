"""``PrimeCount-Python-v0``: count the primes in a range with a persistent python tool.

A small environment in one folder (docs/api.md#adding-an-environment): its task model and seeded
generator, its answer parser and exact scorer, its scripted reference and its prompts live here;
the registry finds it by :func:`environments`, and the shared trace-log layout and report serve it.
"""

from __future__ import annotations

from agent_envs.core.spec import EnvSpec


def environments() -> tuple[EnvSpec, ...]:
    """``PrimeCount-Python-v0``."""
    from agent_envs.envs.prime_count.spec import SPEC

    return (SPEC,)
