"""Exact protocol strings (docs/protocol.md#warning-and-observation-texts, #docvqa-prompts, #math-prompts).

These texts are what the published models were trained and evaluated against, so they are
reproduced byte for byte; tests pin the hashes of docs/protocol.md#prompt-hashes.
"""
from __future__ import annotations

#: The two-line action block every prompt and format warning shows (docs/protocol.md#action-grammar).
ACTION_BLOCK = 'Action:\n{"name": "bash", "arguments": {"command": "<shell command>"}}'

NO_COMMAND = "No shell command was provided."
FORMAT_CHECK = "format_check"  # observation name of every protocol warning

DOCVQA_TOOL_REQUIRED = (
    "You must use a bash Action to inspect/process the image file before answering. "
    "Tool observations are text only; then provide Final answer."
)
DOCVQA_FORMAT_WARNING_ES = (
    f"No valid action was parsed. Use exactly:\n{ACTION_BLOCK}\n"
    "or, after tool use, Final answer: <short answer>"
)
DOCVQA_FORMAT_WARNING_HTTP = (
    f"No valid action was parsed. Use exactly:\n{ACTION_BLOCK}\n"
    "or finish after tool use with: Final answer: <short answer>"
)

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

#: Separators placed between a system prompt and a stripped, non-empty skill text.
DOCVQA_SKILL_SUFFIX = (
    "\n\nUse the following distilled skill instructions while solving the task. "
    "They do not override the required bash/OCR tool-use and final-answer format.\n\n"
)
MATH_SKILL_SUFFIX = "\n\nAdditional skill instructions:\n"  # profile "repo-react-v1"


def unknown_action(name: str) -> str:
    """Observation body for an action whose name is not ``bash``."""
    return f"Unknown action '{name}'. Available action is bash."


def observation_message(name: str, body: str) -> dict[str, str]:
    """The user message that carries a tool observation or a ``format_check`` warning (docs/protocol.md#conversation)."""
    return {"role": "user", "content": f"Observation from {name}:\n{body}"}


def with_skill(system_prompt: str, skill: str, suffix: str) -> str:
    """Append ``suffix`` + the stripped skill; an empty or blank skill leaves the prompt as is."""
    skill = skill.strip()
    return f"{system_prompt}{suffix}{skill}" if skill else system_prompt
