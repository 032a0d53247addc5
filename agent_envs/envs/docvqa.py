"""``DocVQA-CLI-v0``: answer a question about a page image through shell and OCR commands only
(docs/protocol.md#docvqa-tool, ES runner).  The model never sees the image; the sandbox binds it read-only at
``/workspace/document.png``."""
from __future__ import annotations

from typing import Any

from agent_envs.data.docvqa import check_image, load_docvqa_tasks
from agent_envs.data.tasks import DocTask
from agent_envs.envs.react import ReActEnv, _Episode
from agent_envs.protocol import messages as msgs
from agent_envs.protocol.decision import DOCVQA_ES, DOCVQA_HTTP, Flavour
from agent_envs.sandbox.base import DOCUMENT_PATH, SandboxConfig
from agent_envs.scoring.anls import ANLS_VARIANTS, docvqa_score


class DocVQACLIEnv(ReActEnv):
    """50 turns, 512 tokens per turn, a 32,768-token trajectory cap (generations + observations)."""

    env_id = "DocVQA-CLI-v0"
    default_max_tokens_per_turn = 512
    default_max_trajectory_tokens = 32768
    observation_style = "docvqa"
    system_prompt_name = "docvqa_system"
    user_prompt_name = "docvqa_user"
    skill_separator = msgs.DOCVQA_SKILL_SUFFIX

    def __init__(self, *, anls_variant: str = "protocol", **kwargs: Any):
        if anls_variant not in ANLS_VARIANTS:
            raise ValueError(f"anls_variant must be 'protocol' or 'official', got {anls_variant!r}")
        self.anls_variant = anls_variant
        super().__init__(**kwargs)

    def _flavour(self) -> Flavour:
        return DOCVQA_ES if self.compat == "es" else DOCVQA_HTTP

    def _load_tasks(self, spec: Any, **kwargs: Any) -> list[DocTask]:
        return load_docvqa_tasks(spec, **kwargs)

    def _coerce_task(self, payload: Any) -> DocTask:
        return payload if isinstance(payload, DocTask) else DocTask.model_validate(payload)

    def _check_task(self, task: DocTask) -> None:
        check_image(task.image, f"task {task.id}")

    def _sandbox_config_for(self, task: DocTask) -> SandboxConfig:
        return self.sandbox_config.model_copy(update={"image_path": str(task.image)})

    def _extra_config(self) -> dict[str, Any]:
        return {"anls_variant": self.anls_variant}

    def _score(self, ep: _Episode) -> dict[str, Any]:
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
