"""``DocVQA-VL-v0``: DocVQA-CLI-v0 whose model can also look at the page (docs/protocol.md#view-tool).

The same tasks, sandbox, budgets and ANLS scorer; ``page_in_prompt=True`` also puts the whole page
(within the view tool's pixel cap) in the first user message.
"""
from __future__ import annotations

from typing import Any

from agent_envs.core.observation import Shown
from agent_envs.envs.docvqa.env import DocVQACLIEnv
from agent_envs.envs.docvqa.spec import DOCUMENT_PATH
from agent_envs.envs.docvqa.vl.spec import MAX_VIEW_PIXELS, SPEC
from agent_envs.tools.view import load_image, view


class DocVQAVLEnv(DocVQACLIEnv):
    """DocVQA with bash and ``view``; image observations are OpenAI content parts."""

    env_spec = SPEC

    def __init__(self, *, page_in_prompt: bool = False, **kwargs: Any):
        if not isinstance(page_in_prompt, bool):
            raise ValueError(f"page_in_prompt must be True or False, got {page_in_prompt!r}")
        self.page_in_prompt = page_in_prompt
        super().__init__(**kwargs)

    def _extra_config(self) -> dict[str, Any]:
        return {**super()._extra_config(), "page_in_prompt": self.page_in_prompt}

    def _prompt_images(self, task: Any) -> tuple[Shown, ...]:
        if not self.page_in_prompt:
            return ()
        page = load_image(task.image)
        return view(page, (0, 0, page.width, page.height), 1.0, MAX_VIEW_PIXELS,
                    source=task.image, target=DOCUMENT_PATH).images


Env = DocVQAVLEnv
