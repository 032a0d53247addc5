"""A tool result that carries images (docs/protocol.md#image-observations).

A tool's ``run`` returns either the observation text (every text tool) or an :class:`Observation`:
the text plus image content parts, each with the JSON-able facts a record keeps instead of its
pixels (what was shown, its size and the SHA-256 of its PNG), so records stay small and a report
can re-render the image from its source.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

from agent_envs.core.content import Part, image_part


@dataclass(frozen=True)
class Shown:
    """One image for the model: its content part and what a record keeps of it."""

    part: Part
    facts: dict[str, Any]


@dataclass(frozen=True)
class Observation:
    text: str
    images: tuple[Shown, ...] = ()


def shown(image: Any, **facts: Any) -> Shown:
    """``image`` (PIL) as a lossless PNG part; ``facts`` gain its ``size`` [w, h] and ``sha256``."""
    part = image_part(image)
    png = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
    return Shown(part, {**facts, "size": [image.width, image.height], "sha256": hashlib.sha256(png).hexdigest()})


def split(result: str | Observation) -> tuple[str, tuple[Shown, ...]]:
    """(text, images) of whatever a tool returned."""
    if isinstance(result, Observation):
        return result.text, result.images
    return result, ()
