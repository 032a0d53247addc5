"""A ReAct environment's native-tool-call variant, derived from its spec (docs/protocol.md#native-tool-calls)."""

from __future__ import annotations

import dataclasses

from agent_envs.core.spec import EnvSpec, Rules
from agent_envs.protocol.native import native_baseline


def native_variant(
    react: EnvSpec, *, id: str, entry_point: str, rules: Rules, system_prompt: str, description: str
) -> EnvSpec:
    """``react`` with native rules (for every harness), its own system prompt and the scripted
    baseline playing the native format; tasks, tools, budgets and report are ``react``'s."""
    baseline = None if react.baseline is None else native_baseline(react.baseline)
    return dataclasses.replace(
        react,
        id=id,
        entry_point=entry_point,
        rules={"es": rules, "http_eval": rules},
        system_prompt=system_prompt,
        description=description,
        baseline=baseline,
    )
