"""``Countdown-ReAct-v0``: reach a target number from 3-4 given numbers with + - * /, each used
exactly once, with a persistent python tool and a bash tool (docs/protocol.md#countdown).

Its spec, task model, seeded generator and loader, ``ast`` scorer, texts and trace renderer live
in this folder; the registry finds it by :func:`environments`.
"""

from __future__ import annotations

from agent_envs.core.spec import EnvSpec

#: after MATH and DocVQA in the registry (agent_envs.envs.registry)
ORDER = 2


def environments() -> tuple[EnvSpec, ...]:
    """``Countdown-ReAct-v0`` and ``Countdown-Tools-v0``."""
    from agent_envs.envs.countdown.native.spec import SPEC as TOOLS
    from agent_envs.envs.countdown.spec import SPEC

    return (SPEC, TOOLS)
