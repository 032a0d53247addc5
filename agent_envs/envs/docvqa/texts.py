"""DocVQA's warning texts and skill separator, byte for byte (docs/protocol.md#warning-and-observation-texts)."""

from __future__ import annotations

from agent_envs.protocol.messages import ACTION_BLOCK

DOCVQA_TOOL_REQUIRED = (
    "You must use a bash Action to inspect/process the image file before answering. "
    "Tool observations are text only; then provide Final answer."
)
DOCVQA_FORMAT_WARNING_ES = (
    f"No valid action was parsed. Use exactly:\n{ACTION_BLOCK}\nor, after tool use, Final answer: <short answer>"
)
DOCVQA_FORMAT_WARNING_HTTP = (
    f"No valid action was parsed. Use exactly:\n{ACTION_BLOCK}\n"
    "or finish after tool use with: Final answer: <short answer>"
)
#: placed between the system prompt and a stripped, non-empty skill text
DOCVQA_SKILL_SUFFIX = (
    "\n\nUse the following distilled skill instructions while solving the task. "
    "They do not override the required bash/OCR tool-use and final-answer format.\n\n"
)
