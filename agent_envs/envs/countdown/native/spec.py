"""``Countdown-Tools-v0`` as data: ``Countdown-ReAct-v0`` (same tasks, python and bash tools, scorer)
with the native tool-call parser, both tools' schemas and a system prompt without the ``Action:``
grammar (docs/protocol.md#native-tool-calls)."""

from __future__ import annotations

from agent_envs.core.spec import ParserSpec, Rules
from agent_envs.envs.countdown import texts
from agent_envs.envs.countdown.spec import SPEC as REACT
from agent_envs.envs.native import native_variant
from agent_envs.protocol.native import function_schema

SCHEMAS = (
    function_schema("python", "code", texts.PYTHON_DESCRIPTION, texts.PYTHON_CODE),
    function_schema("bash", "command", texts.BASH_DESCRIPTION, texts.BASH_COMMAND),
)
RULES = Rules(
    ParserSpec(native_tool_calls=True),
    texts.NATIVE_TOOL_REQUIRED,
    texts.NATIVE_FORMAT_WARNING,
    no_input=texts.NO_INPUT,
    tool_schemas=SCHEMAS,
)

SPEC = native_variant(
    REACT,
    id="Countdown-Tools-v0",
    entry_point="agent_envs.envs.countdown.native.env:Env",
    rules=RULES,
    system_prompt="countdown/system_tools",
    description="Countdown-ReAct-v0 with the model's native tool calls (<tool_call> blocks or a server's tool_calls).",
)
