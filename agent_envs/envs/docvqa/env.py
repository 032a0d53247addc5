"""``DocVQA-CLI-v0``: answer a question about a page image through shell and OCR commands only
(docs/protocol.md#docvqa-tool, ES runner).  The model never sees the image; the sandbox binds it read-only at
``/workspace/document.png``."""
from __future__ import annotations

from typing import Any

from agent_envs.envs.docvqa.data import check_image
from agent_envs.envs.docvqa.scoring import ANLS_VARIANTS, docvqa_score
from agent_envs.envs.docvqa.spec import DOCUMENT_PATH, SPEC
from agent_envs.envs.docvqa.task import DocTask
from agent_envs.envs.react import EpisodeState, ReActEnv


class DocVQACLIEnv(ReActEnv):
    """50 turns, 512 tokens per turn, a 32,768-token trajectory cap (generations + observations)."""

    env_spec = SPEC

    def __init__(self, *, anls_variant: str = "protocol", **kwargs: Any):
        if anls_variant not in ANLS_VARIANTS:
            raise ValueError(f"anls_variant must be 'protocol' or 'official', got {anls_variant!r}")
        self.anls_variant = anls_variant
        super().__init__(**kwargs)

    def _check_task(self, task: DocTask) -> None:
        check_image(task.image, f"task {task.id}")

    def _extra_config(self) -> dict[str, Any]:
        return {"anls_variant": self.anls_variant}

    def _score(self, ep: EpisodeState) -> dict[str, Any]:
        fields = docvqa_score(
            ep.last_completion,
            ep.task.answers,
            termination_reason=ep.termination_reason,
            used_bash=ep.used_bash,
            variant=self.anls_variant,
        )
        return {
            "answers": list(ep.task.answers),
            "image": ep.task.image,
            "tool_image": DOCUMENT_PATH,
            "score": fields.score,
            "score_method": fields.label,
            "score_status": fields.status,
            "answer_status": fields.answer_status,
            "prediction": fields.prediction,
            "anls": fields.anls,
            "vlns": fields.anls,
            "acc": fields.acc,
        }


Env = DocVQACLIEnv
