"""Countdown's own warning and blocked-command texts (docs/protocol.md#countdown)."""

from __future__ import annotations

PYTHON_ACTION = 'Action:\n{"name": "python", "arguments": {"code": "<python code>"}}'
BASH_ACTION = 'Action:\n{"name": "bash", "arguments": {"command": "<shell command>"}}'

TOOL_REQUIRED = (
    "You must run a python or bash Action before answering. "
    "Check your expression with a tool, then provide Final answer."
)
FORMAT_WARNING = (
    f"No valid action was parsed. Use exactly:\n{PYTHON_ACTION}\nor\n{BASH_ACTION}\n"
    "or finish after tool use with: Final answer: \\boxed{<expression>}"
)
#: single-turn mode: no tools, so the only valid reply is the final answer
SINGLE_TURN_FORMAT_WARNING = "No final answer was found. End your reply with: Final answer: \\boxed{<expression>}"
NO_INPUT = "No code or command was provided."
BLOCKED = "Blocked unsafe or interactive desktop command in the Countdown sandbox."

# ``Countdown-Tools-v0`` (docs/protocol.md#native-tool-calls): the same task with native tool calls
NATIVE_TOOL_REQUIRED = (
    "You must call the python or bash tool before answering. "
    "Check your expression with a tool, then provide Final answer."
)
NATIVE_FORMAT_WARNING = (
    "No tool call was found. Call the python or bash tool, or finish after using one with: "
    "Final answer: \\boxed{<expression>}"
)
PYTHON_DESCRIPTION = (
    "Run Python code in an interpreter that keeps its variables and imports between calls; returns what it prints."
)
PYTHON_CODE = "The Python code to run; print what you want to see."
BASH_DESCRIPTION = "Run a shell command in an isolated workspace and return its output and exit code."
BASH_COMMAND = "The shell command to run."
