"""Inline media: page images as data URLs (downscaled when large) and matplotlib plots as SVG."""
from __future__ import annotations

import base64
import io
from pathlib import Path

#: page images wider than this are downscaled before embedding (keeps the report small)
MAX_IMAGE_WIDTH = 900


def image_data_url(path: str | Path, max_width: int = MAX_IMAGE_WIDTH) -> str | None:
    """A ``data:`` URL of the image, or None when it cannot be read (moved, deleted, not an image)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.load()
            if img.width > max_width:
                img = img.resize((max_width, round(img.height * max_width / img.width)), Image.LANCZOS)
            if img.mode not in ("RGB", "L"):
                img = img.convert("RGB")
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=82)
    except (OSError, UnidentifiedImageError, ValueError):
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def svg_data_url(svg: bytes) -> str:
    """Plots go in as ``<img>`` data URLs: each SVG keeps its own ids, so figures cannot clash."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg).decode()
