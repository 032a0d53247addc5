"""Chat message content: a plain string, or a list of OpenAI chat content parts.

Text-only environments keep ``content`` a string (the protocol's exact bytes).  A message that
carries an image uses parts: ``{"type": "text", "text": ...}`` and
``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` -- the format OpenAI
compatible servers accept as is, so policies, records and reports share one representation and
only the engines that need pixels decode them (:func:`images_of`).
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from typing import Any, Sequence

Part = dict[str, Any]
Message = dict[str, Any]

_DATA_PREFIX = "data:"


def text_part(text: str) -> Part:
    return {"type": "text", "text": text}


def image_part(image: Any, *, image_format: str = "PNG") -> Part:
    """An image content part holding ``image`` (a PIL image) as a lossless data URL."""
    buffer = io.BytesIO()
    image.save(buffer, format=image_format)
    mime = f"image/{image_format.lower()}"
    url = f"{_DATA_PREFIX}{mime};base64,{base64.b64encode(buffer.getvalue()).decode('ascii')}"
    return {"type": "image_url", "image_url": {"url": url}}


def parts_of(content: Any) -> list[Part]:
    """``content`` as a list of parts (a string is one text part)."""
    if isinstance(content, str):
        return [text_part(content)]
    if isinstance(content, list):
        return content
    raise TypeError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def text_of(content: Any) -> str:
    """The text of ``content``: a string as is, the text parts of a list joined without separator."""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in parts_of(content) if p.get("type") == "text")


def plain_text(content: Any, image_marker: str = "[image]") -> str:
    """``content`` for a text-only reader: its text parts, each image part as ``image_marker``."""
    return "".join(p.get("text", "") if p.get("type") == "text" else image_marker for p in parts_of(content))


def transcript(messages: Sequence[Message], image_marker: str = "[image]") -> str:
    """A chat as ``[role]`` blocks of :func:`plain_text`, separated by blank lines."""
    return "\n\n".join(f"[{m['role']}]\n{plain_text(m['content'], image_marker)}" for m in messages)


def image_urls(messages: Sequence[Message]) -> list[str]:
    """Every image part's URL, in conversation order."""
    return [
        p["image_url"]["url"]
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == "image_url"
    ]


def has_images(messages: Sequence[Message]) -> bool:
    return any(
        isinstance(m.get("content"), list) and any(p.get("type") == "image_url" for p in m["content"]) for m in messages
    )


class ImageTooLarge(ValueError):
    """An image over Pillow's decompression-bomb limit (docs/reliability.md#limits)."""


def pixel_limit() -> int | None:
    """The largest image decoded, in pixels: twice ``PIL.Image.MAX_IMAGE_PIXELS`` (178,956,970 by
    default; Pillow warns from half of it), where Pillow refuses an image as a possible
    decompression bomb.  Set ``PIL.Image.MAX_IMAGE_PIXELS`` to change it (None: no limit)."""
    from PIL import Image

    return None if Image.MAX_IMAGE_PIXELS is None else 2 * int(Image.MAX_IMAGE_PIXELS)


def open_image(source: Any, where: str) -> Any:
    """``PIL.Image.open(source)`` (lazy: only the header is read), with an image over
    :func:`pixel_limit` refused as :class:`ImageTooLarge` naming ``where``: one error, with the
    limit, wherever a page or an image is opened."""
    from PIL import Image

    try:
        return Image.open(source)
    except Image.DecompressionBombError as exc:
        size = re.search(r"\((\d+) pixels\)", str(exc))
        pixels = f"{int(size.group(1)):,} pixels" if size else "too many pixels"
        raise ImageTooLarge(
            f"{where} has {pixels}, over the limit of {pixel_limit():,} (Pillow's "
            "decompression-bomb guard, 2 x PIL.Image.MAX_IMAGE_PIXELS)"
        ) from None


def decode_image_url(url: str) -> Any:
    """The PIL image of a ``data:image/...;base64,`` URL (other URLs are refused: nothing is fetched)."""
    if not url.startswith(_DATA_PREFIX) or ";base64," not in url:
        raise ValueError(f"only base64 data URLs are accepted for images, got {url[:40]!r}")
    try:
        raw = base64.b64decode(url.split(";base64,", 1)[1], validate=True)
        image = open_image(io.BytesIO(raw), "the image data URL")
        image.load()
    except ImageTooLarge:
        raise
    except (binascii.Error, OSError, ValueError) as exc:
        raise ValueError(f"image data URL does not decode: {exc}") from exc
    return image


def images_of(messages: Sequence[Message]) -> list[Any]:
    """The PIL images of every image part, in conversation order (RGB)."""
    return [decode_image_url(url).convert("RGB") for url in image_urls(messages)]


def copy_message(message: Message) -> Message:
    """A copy the caller may change freely (part lists and parts are copied too)."""
    out = dict(message)
    if isinstance(out.get("content"), list):
        out["content"] = [{k: (dict(v) if isinstance(v, dict) else v) for k, v in p.items()} for p in out["content"]]
    return out
