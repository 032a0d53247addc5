"""``DocVQA-VL-v0``: DocVQA-CLI-v0 whose model can also look at the page (docs/protocol.md#view-tool).

The same tasks, sandbox, budgets and ANLS scorer; ``page_in_prompt=True`` also puts the whole page
(within the view tool's pixel cap) in the first user message; ``max_view_pixels`` sets that cap.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agent_envs.core.observation import Shown
from agent_envs.core.spec import EnvSpec
from agent_envs.core.validation import WholeNumber
from agent_envs.envs.docvqa.env import DocVQACLIEnv, DocVQAOptions
from agent_envs.envs.docvqa.spec import DOCUMENT_PATH
from agent_envs.envs.docvqa.vl.spec import MAX_VIEW_PIXELS, SPEC, with_view_pixels
from agent_envs.tools.view import load_page, view


class VLOptions(DocVQAOptions):
    page_in_prompt: bool = Field(default=False, strict=True)
    #: the largest image (pixels) the view tool and the page in the prompt show
    max_view_pixels: WholeNumber = Field(default=MAX_VIEW_PIXELS, ge=1)


class DocVQAVLEnv(DocVQACLIEnv):
    """DocVQA with bash and ``view``; image observations are OpenAI content parts."""

    env_spec = SPEC
    Options = VLOptions
    options: VLOptions

    def _spec_for(self, options: VLOptions) -> EnvSpec:
        """This instance's view tool shows larger or smaller images when ``max_view_pixels`` says so."""
        if options.max_view_pixels == MAX_VIEW_PIXELS:
            return self.env_spec
        return with_view_pixels(self.env_spec, options.max_view_pixels)

    def _prompt_images(self, task: Any) -> tuple[Shown, ...]:
        if not self.options.page_in_prompt:
            return ()
        page, digest = load_page(task.image)
        return view(
            page,
            (0, 0, page.width, page.height),
            1.0,
            self.options.max_view_pixels,
            source=task.image,
            source_sha256=digest,
            target=DOCUMENT_PATH,
        ).images


Env = DocVQAVLEnv
