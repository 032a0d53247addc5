"""Strict types for configuration boundaries: a wrong type is an error, never silently coerced.

Pydantic's lax mode would turn ``1.7`` or ``"3"`` into ``3`` and ``True`` into ``1``; a user who
passed such a value made a mistake that should surface where it was made (``gym.make`` or
``reset``), not as odd episodes later.
"""

from __future__ import annotations

import numbers
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationError


def _whole_number(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"must be an integer, not {type(value).__name__}")
    return int(value)


#: a Python or NumPy integer; bool, float and str are refused
WholeNumber = Annotated[int, BeforeValidator(_whole_number)]


def _processor(value: Any) -> Any:
    """An HF ``AutoProcessor``-like object: a chat template that renders image parts, a tokenizer."""
    if value is None:
        return None
    missing = [a for a in ("apply_chat_template", "tokenizer") if getattr(value, a, None) is None]
    if missing or not callable(value.apply_chat_template):
        raise ValueError(
            f"must be a processor with apply_chat_template and a tokenizer "
            f"(e.g. transformers.AutoProcessor), got {type(value).__name__}"
        )
    return value


#: a multimodal processor (see :func:`_processor`) or None
ChatProcessor = Annotated[Any, BeforeValidator(_processor)]


def invalid(what: str, exc: ValidationError) -> ValueError:
    """Every bad field in one message: ``invalid <what>: limits.workspace_mib=0: Input should be ...``."""
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}={err['input']!r}: {msg}" if where else msg)
    return ValueError(f"invalid {what}: " + "; ".join(parts))
