"""``DocVQA-VL-v0``'s warning texts and skill separator: DocVQA's, with the view tool named."""

from __future__ import annotations

from agent_envs.protocol.messages import ACTION_BLOCK

#: the two action blocks the prompt and the format warnings show
ACTION_BLOCKS = f'{ACTION_BLOCK}\nor\nAction:\n{{"name": "view", "arguments": {{"box": [x0, y0, x1, y1]}}}}'
TOOL_REQUIRED = "You must use a bash or view Action to inspect the page before answering. Then provide Final answer."
FORMAT_WARNING_ES = (
    f"No valid action was parsed. Use exactly one of:\n{ACTION_BLOCKS}\n"
    "or, after tool use, Final answer: <short answer>"
)
FORMAT_WARNING_HTTP = (
    f"No valid action was parsed. Use exactly one of:\n{ACTION_BLOCKS}\n"
    "or finish after tool use with: Final answer: <short answer>"
)
#: placed between the system prompt and a stripped, non-empty skill text
SKILL_SUFFIX = (
    "\n\nUse the following distilled skill instructions while solving the task. "
    "They do not override the required tool use and final-answer format.\n\n"
)
