"""``DocVQA-CLI-v0``: its spec, task model, loader, ANLS scorer, synthetic set and trace renderer."""

from __future__ import annotations

from agent_envs.core.spec import EnvSpec
from agent_envs.envs.docvqa.env import DocVQACLIEnv

__all__ = ["DocVQACLIEnv", "ORDER", "environments"]

#: after MATH in the registry (agent_envs.envs.registry)
ORDER = 1


def environments() -> tuple[EnvSpec, ...]:
    """DocVQA-CLI-v0 and DocVQA-VL-v0 (the registry finds this folder by this function)."""
    from agent_envs.envs.docvqa.spec import SPEC
    from agent_envs.envs.docvqa.vl.spec import SPEC as VARIANT

    return (SPEC, VARIANT)
