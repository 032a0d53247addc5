"""``DocVQA-CLI-v0``: its spec, task model, loader, ANLS scorer, synthetic set and trace renderer."""

from __future__ import annotations

from agent_envs.envs.docvqa.env import DocVQACLIEnv

__all__ = ["DocVQACLIEnv"]
