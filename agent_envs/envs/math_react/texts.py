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

# ``MATH-Tools-v0`` (docs/protocol.md#native-tool-calls): the same task with native tool calls; these
# texts are this package's own, not the reference's
NATIVE_TOOL_REQUIRED = (
    "You must call the bash tool before answering. "
    "Use command-line Python to compute or verify the solution, then provide Final answer."
)
NATIVE_FORMAT_WARNING = (
    "No tool call was found. Call the bash tool, or finish after using it with: Final answer: \\boxed{<answer>}"
)
BASH_DESCRIPTION = "Run a shell command in an isolated workspace and return its output and exit code."
BASH_COMMAND = 'The shell command, for example python3 -c "print(2**10)".'
