"""Math's warning, first-turn and blocked-command texts, byte for byte (docs/protocol.md#warning-and-observation-texts)."""
from __future__ import annotations

from agent_envs.protocol.messages import ACTION_BLOCK

MATH_TOOL_REQUIRED = (
    "You must call the bash Action before answering. "
    "Use command-line Python to compute or verify the solution, then provide Final answer."
)
MATH_FORMAT_WARNING = (
    f"No valid action was parsed. Use exactly:\n{ACTION_BLOCK}\n"
    "or finish after bash use with: Final answer: \\boxed{<answer>}"
)
MATH_FIRST_TURN = "The first assistant turn must contain only one bash Action and no reasoning text."
MATH_BLOCKED = "Blocked unsafe or interactive desktop command in math tool sandbox."
MATH_SKILL_SUFFIX = "\n\nAdditional skill instructions:\n"  # profile "repo-react-v1"
