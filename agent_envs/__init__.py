"""agent-envs: Gymnasium environments for multi-turn LLM tool use.

Importing the package registers every environment of :mod:`agent_envs.envs.registry` with Gymnasium.
"""

from __future__ import annotations

from agent_envs.envs.registry import ENV_IDS, register_all

__version__ = "0.1.0"

__all__ = ["ENV_IDS", "__version__"]

register_all()
