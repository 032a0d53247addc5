"""``DocVQA-VL-v0``: DocVQA with a ``view`` tool that shows the model regions of the page as images."""

from __future__ import annotations

from agent_envs.envs.docvqa.vl.env import DocVQAVLEnv

__all__ = ["DocVQAVLEnv"]
