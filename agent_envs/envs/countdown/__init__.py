"""``Countdown-ReAct-v0``: reach a target number from 3-4 given numbers with + - * /, each used
exactly once, with a persistent python tool and a bash tool (docs/protocol.md#countdown).

Its spec, task model, seeded generator and loader, ``ast`` scorer, texts and trace renderer live
in this folder; the registry entry is one line in :mod:`agent_envs.envs.registry`.
"""
