"""Inline media: page images and the regions a model was shown as data URLs (downscaled when
large), and matplotlib plots as SVG."""

from __future__ import annotations

import base64
import functools
import io
import os
from pathlib import Path
from typing import Any

from agent_envs.core.content import open_image

#: page images wider than this are downscaled before embedding (keeps the report small)
MAX_IMAGE_WIDTH = 900


def image_data_url(path: str | Path, max_width: int = MAX_IMAGE_WIDTH) -> str | None:
    """A ``data:`` URL of the image, or None when it cannot be read (moved, deleted, not an image)."""
    from PIL import UnidentifiedImageError

    try:
        with open_image(path, f"the page {path}") as img:
            img.load()
            return _jpeg_url(img, max_width)
    except (OSError, UnidentifiedImageError, ValueError):  # ImageTooLarge too
        return None


def _jpeg_url(img, max_width: int) -> str:
    from PIL import Image

    if img.width > max_width:
        img = img.resize((max_width, round(img.height * max_width / img.width)), Image.Resampling.LANCZOS)
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=82)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def _source(path: str) -> tuple[Any, str]:
    """The image at ``path`` and its file digest (cached while the file is unchanged)."""
    stat = os.stat(path)
    return _load(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _load(path: str, mtime_ns: int, size: int) -> tuple[Any, str]:
    from agent_envs.tools.view import load_page

    return load_page(path)


def rerender(facts: dict[str, Any]) -> tuple[Any, str | None]:
    """The image a model was shown, rebuilt from what its record kept (``source``, ``box``,
    ``size``; docs/protocol.md#image-observations), and a problem: why it cannot be (no image then),
    or that the source file changed since the run."""
    from PIL import Image, UnidentifiedImageError

    source, box, size = facts.get("source"), facts.get("box"), facts.get("size")
    if not (
        isinstance(source, str)
        and isinstance(box, list)
        and len(box) == 4
        and isinstance(size, list)
        and len(size) == 2
    ):
        return None, "the record does not say where this image came from"
    try:
        image, digest = _source(source)
        region = image.crop(tuple(box))
        if list(region.size) != size:
            region = region.resize(tuple(size), Image.Resampling.LANCZOS)
    except (OSError, UnidentifiedImageError, ValueError, TypeError) as exc:
        return None, f"cannot re-render it from {source}: {exc}"
    if facts.get("source_sha256") not in (None, digest):
        return region, f"{source} changed since the run: this is the region of the current file"
    return region, None


def shown_image(facts: dict[str, Any], max_width: int = MAX_IMAGE_WIDTH) -> dict[str, Any]:
    """:func:`rerender` for the report: ``url`` (None when it cannot be), ``problem`` and the facts
    to caption it with."""
    image, problem = rerender(facts)
    return {
        "url": None if image is None else _jpeg_url(image, max_width),
        "problem": problem,
        "box": facts.get("box"),
        "zoom": facts.get("zoom"),
        "size": facts.get("size"),
    }


def svg_data_url(svg: bytes) -> str:
    """Plots go in as ``<img>`` data URLs: each SVG keeps its own ids, so figures cannot clash."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg).decode()
