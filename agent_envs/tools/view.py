"""The ``view`` tool: a region of an image bound into the sandbox, shown to the model as an image
(docs/protocol.md#view-tool).

Its input is the action's whole ``arguments`` object, as data: ``{}`` is the whole image, ``{"box": [x0, y0,
x1, y1]}`` a region in the image's pixels (``x1``/``y1`` exclusive, as in PIL's ``crop``),
``"zoom": z`` scales it.  The result is never larger than ``max_pixels``; a larger one is scaled
down and the observation says so.  Bad arguments give a warning text and no image, never an
exception.  The image is read on the host by this trusted code; the model's input is numbers only.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from functools import partial
from pathlib import Path
from typing import Any

from agent_envs.core.content import ImageTooLarge, open_image
from agent_envs.core.observation import Observation, Shown, shown
from agent_envs.core.spec import Framing, ToolSpec
from agent_envs.core.types import error_text
from agent_envs.sandbox.base import SandboxConfig

#: default cap on the pixels of one shown image (1024 x 1024)
MAX_PIXELS = 1 << 20
#: largest accepted zoom factor
MAX_ZOOM = 4.0


class ViewError(ValueError):
    """Arguments the view tool refuses; the message is the model's warning."""


def load_page(path: str) -> tuple[Any, str]:
    """The image at ``path`` as PIL ``L`` or ``RGB`` (other modes are converted to RGB) and the
    sha256 of the very bytes it was decoded from (lets a report tell that a page changed after
    the run).  The file is read once."""
    data = Path(path).read_bytes()
    with open_image(io.BytesIO(data), f"the image {path}") as img:
        img.load()
        image = img if img.mode in ("L", "RGB") else img.convert("RGB")
    return image, hashlib.sha256(data).hexdigest()


def _integer(value: Any, what: str) -> int:
    """A whole number; ints are taken as they are (``math.isfinite`` of a huge int overflows)."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole:
        raise ViewError(f"{what} must be a whole number of pixels, got {_shown_value(value)}")
    return int(value)


def _shown_value(value: Any) -> str:
    """``value`` as JSON for a warning, cut short (a model may send anything)."""
    try:
        return _capped(json.dumps(value))
    except (ValueError, RecursionError):  # a 4,301-digit int or deep nesting
        return f"a {type(value).__name__}"


def _capped(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_view(
    arguments: dict[str, Any], width: int, height: int, max_zoom: float = MAX_ZOOM
) -> tuple[tuple[int, int, int, int], float]:
    """The (box, zoom) a view action asks for; :class:`ViewError` says what is wrong."""
    unknown = sorted(set(arguments) - {"box", "zoom"})
    if unknown:
        raise ViewError(
            f"unknown argument(s) {_capped(', '.join(map(repr, unknown)))}; only 'box' and 'zoom' are accepted"
        )
    box = arguments.get("box", [0, 0, width, height])
    if not isinstance(box, list) or len(box) != 4:
        raise ViewError(f"box must be a list of 4 numbers [x0, y0, x1, y1], got {_shown_value(box)}")
    x0, y0, x1, y1 = (_integer(v, f"box[{i}]") for i, v in enumerate(box))
    if x0 >= x1 or y0 >= y1:
        raise ViewError(f"box {_shown_value([x0, y0, x1, y1])} has no area; need x0 < x1 and y0 < y1")
    if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
        raise ViewError(
            f"box {_shown_value([x0, y0, x1, y1])} is outside the {width}x{height} image; "
            f"need 0 <= x0 < x1 <= {width} and 0 <= y0 < y1 <= {height}"
        )
    zoom = arguments.get("zoom", 1)
    if isinstance(zoom, bool) or not isinstance(zoom, (int, float)) or not 0 < zoom <= max_zoom:
        raise ViewError(f"zoom must be a number above 0 and at most {max_zoom:g}, got {_shown_value(zoom)}")
    return (x0, y0, x1, y1), float(zoom)


def render(image: Any, box: tuple[int, int, int, int], zoom: float, max_pixels: int) -> tuple[Any, str]:
    """The region at ``zoom``, scaled down to at most ``max_pixels``; and a note when it was."""
    from PIL import Image

    region = image.crop(box)
    want = (max(1, round(region.width * zoom)), max(1, round(region.height * zoom)))
    size, note = want, ""
    if want[0] * want[1] > max_pixels:
        scale = math.sqrt(max_pixels / (want[0] * want[1]))
        size = (max(1, math.floor(want[0] * scale)), max(1, math.floor(want[1] * scale)))
        note = f" (scaled down from {want[0]}x{want[1]} to stay within {max_pixels} pixels)"
    if size != region.size:
        region = region.resize(size, Image.Resampling.LANCZOS)
    return region, note


def view(image: Any, box: tuple[int, int, int, int], zoom: float, max_pixels: int, **facts: Any) -> Observation:
    """The observation showing ``box`` of ``image``: a line describing it, and the image."""
    region, note = render(image, box, zoom, max_pixels)
    text = (
        f"Region {list(box)} of the {image.width}x{image.height} image at zoom {zoom:g}, "
        f"shown as {region.width}x{region.height} pixels{note}."
    )
    part: Shown = shown(region, box=list(box), zoom=zoom, **facts)
    return Observation(text, (part,))


class ViewTool:
    """The ``view`` tool of one episode; ``target`` is where the image is mounted in the sandbox."""

    name = "view"

    def __init__(
        self,
        config: SandboxConfig,
        framing: Framing,
        limit: int,
        *,
        target: str,
        max_pixels: int = MAX_PIXELS,
        max_zoom: float = MAX_ZOOM,
    ) -> None:
        source = next((m.host for m in config.mounts if m.target == target), None)
        if source is None:
            raise ValueError(f"the view tool needs an image mounted at {target}; the sandbox has none")
        self.source, self.target = source, target
        self.max_pixels, self.max_zoom = max_pixels, max_zoom
        self._image: Any = None
        self._digest = ""

    def run(self, arguments: dict[str, Any]) -> str | Observation:
        if self._image is None:
            try:
                self._image, self._digest = load_page(self.source)
            except (OSError, ImageTooLarge) as exc:  # the page vanished or changed mid-episode: the episode goes on
                return f"[ERROR] The image cannot be read: {error_text(exc)}"
        image = self._image
        try:
            box, zoom = parse_view(arguments, image.width, image.height, self.max_zoom)
        except ViewError as exc:
            return (
                f"Invalid view arguments: {exc}. No image is shown. Use {{}} for the whole "
                f'{image.width}x{image.height} image, or {{"box": [x0, y0, x1, y1]}} in its pixels, '
                f'optionally with "zoom": z (0 < z <= {self.max_zoom:g}).'
            )
        return view(
            image, box, zoom, self.max_pixels, source=self.source, source_sha256=self._digest, target=self.target
        )

    def close(self) -> None:
        self._image = None


def view_tool(target: str, max_pixels: int = MAX_PIXELS) -> ToolSpec:
    """The declaration of a view tool over the image mounted at ``target``, showing at most
    ``max_pixels`` per image: ``{"box": [x0, y0, x1, y1], "zoom": z}``, the arguments object itself."""
    return ToolSpec(
        "view",
        partial(ViewTool, target=target, max_pixels=max_pixels),
        argument=None,
        description="shows the whole image.",
    )
