"""``DocVQA-VL-v0``: DocVQA-CLI-v0 whose model can also look at the page (docs/protocol.md#view-tool).

The same tasks, sandbox, budgets and ANLS scorer; ``page_in_prompt=True`` also puts the whole page
(within the view tool's pixel cap) in the first user message; ``max_view_pixels`` sets that cap.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import Field

from agent_envs.core.observation import Shown
from agent_envs.envs.args import Checked
from agent_envs.envs.docvqa.env import DocVQACLIEnv
from agent_envs.envs.docvqa.spec import DOCUMENT_PATH
from agent_envs.envs.docvqa.vl.spec import MAX_VIEW_PIXELS, SPEC, view_tool
from agent_envs.tools.view import load_page, view
from agent_envs.core.validation import WholeNumber


class VLArgs(Checked):
    page_in_prompt: bool = Field(strict=True)
    #: the largest image (pixels) the view tool and the page in the prompt show
    max_view_pixels: WholeNumber = Field(ge=1)


class DocVQAVLEnv(DocVQACLIEnv):
    """DocVQA with bash and ``view``; image observations are OpenAI content parts."""

    env_spec = SPEC

    def __init__(self, *, page_in_prompt: bool = False, max_view_pixels: int = MAX_VIEW_PIXELS, **kwargs: Any):
        args = VLArgs.checked("DocVQA-VL-v0 argument", {"page_in_prompt": page_in_prompt,
                                                        "max_view_pixels": max_view_pixels})
        self.page_in_prompt, self.max_view_pixels = args.page_in_prompt, args.max_view_pixels
        if self.max_view_pixels != MAX_VIEW_PIXELS:  # this instance's view tool shows larger or smaller images
            self.env_spec = replace(SPEC, tools={**SPEC.tools, "view": view_tool(self.max_view_pixels)})
        super().__init__(**kwargs)

    def _extra_config(self) -> dict[str, Any]:
        return {**super()._extra_config(), "page_in_prompt": self.page_in_prompt,
                "max_view_pixels": self.max_view_pixels}

    def _prompt_images(self, task: Any) -> tuple[Shown, ...]:
        if not self.page_in_prompt:
            return ()
        page, digest = load_page(task.image)
        return view(page, (0, 0, page.width, page.height), 1.0, self.max_view_pixels,
                    source=task.image, source_sha256=digest, target=DOCUMENT_PATH).images


Env = DocVQAVLEnv
