"""``MATH-Tools-v0`` as data: ``MATH-ReAct-v0`` (same tasks, budgets, sandboxed bash tool, blocklist and
scorer) with the native tool-call parser, the bash tool's schema and a system prompt without the
``Action:`` grammar (docs/protocol.md#native-tool-calls)."""

from __future__ import annotations

from agent_envs.core.spec import ParserSpec, Rules
from agent_envs.envs.math_react import texts
from agent_envs.envs.math_react.spec import SPEC as REACT
from agent_envs.envs.native import native_variant
from agent_envs.protocol.native import function_schema

RULES = Rules(
    ParserSpec(native_tool_calls=True),
    texts.NATIVE_TOOL_REQUIRED,
    texts.NATIVE_FORMAT_WARNING,
    tool_schemas=(function_schema("bash", "command", texts.BASH_DESCRIPTION, texts.BASH_COMMAND),),
)

SPEC = native_variant(
    REACT,
    id="MATH-Tools-v0",
    entry_point="agent_envs.envs.math_react.native.env:Env",
    rules=RULES,
    system_prompt="math_react/system_tools",
    description="MATH-ReAct-v0 with the model's native tool calls (<tool_call> blocks or a server's tool_calls).",
)
