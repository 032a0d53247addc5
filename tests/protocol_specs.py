"""The named parser and framing variants of the two reference harnesses, for protocol tests.

Shared modules take a ParserSpec / Framing; the tests keep naming the variants they pin.
"""

from __future__ import annotations

from typing import Any

from agent_envs.core.spec import Framing, ParserSpec
from agent_envs.envs.docvqa import spec as doc
from agent_envs.envs.math_react import spec as math_
from agent_envs.protocol.parsing import parse_action as _parse_action
from agent_envs.sandbox.output import format_observation as _format_observation
from agent_envs.tools.python import format_python_observation as _format_python_observation

PARSERS = {
    "math_es": math_.PARSER_ES,
    "math_http": math_.PARSER_HTTP,
    "docvqa_es": doc.PARSER_ES,
    "docvqa_http": doc.PARSER_HTTP,
}
FRAMINGS = {"math": math_.FRAMING, "docvqa": doc.FRAMING}
MATH_ES, MATH_HTTP, MATH_HTTP_MATCHED = math_.RULES_ES, math_.RULES_HTTP, math_.RULES_HTTP_MATCHED
DOCVQA_ES, DOCVQA_HTTP = doc.RULES_ES, doc.RULES_HTTP


def parse_action(text: str, variant: Any) -> Any:
    return _parse_action(text, PARSERS.get(variant, variant) if isinstance(variant, str) else variant)


def _framing(style: Any) -> Framing | Any:
    return FRAMINGS.get(style, style) if isinstance(style, str) else style


def format_observation(result: Any, style: Any, limit: int = 6000) -> str:
    return _format_observation(result, _framing(style), limit)


def format_python_observation(result: Any, style: Any, limit: int = 6000) -> str:
    return _format_python_observation(result, _framing(style), limit)


__all__ = ["ParserSpec", "PARSERS", "FRAMINGS", "parse_action", "format_observation", "format_python_observation"]

PARSER_VARIANTS = tuple(PARSERS)


def _texts() -> Any:
    from types import SimpleNamespace

    from agent_envs.envs.docvqa import texts as doc_texts
    from agent_envs.envs.math_react import texts as math_texts
    from agent_envs.protocol import messages

    names = {}
    for module in (messages, doc_texts, math_texts):
        names.update({k: v for k, v in vars(module).items() if not k.startswith("_")})
    return SimpleNamespace(**names)


#: the shared protocol strings and both environments' texts, under one name
msg = _texts()
