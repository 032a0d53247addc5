"""``DocVQA-CLI-v0``: answer a question about a page image through shell and OCR commands only
(docs/protocol.md#docvqa-tool, ES runner).  The model never sees the image; the sandbox binds it read-only at
``/workspace/document.png``."""

from __future__ import annotations

from agent_envs.envs.args import EnvOptions
from agent_envs.envs.docvqa.data import check_image
from agent_envs.envs.docvqa.scoring import AnlsVariant, docvqa_score
from agent_envs.envs.docvqa.spec import SPEC
from agent_envs.envs.docvqa.task import DocTask
from agent_envs.envs.react import EpisodeState, ReActEnv
from agent_envs.scoring.result import ScoreResult


class DocVQAOptions(EnvOptions):
    #: "protocol" (the published numbers) or "official" (the DocVQA challenge's normalisation)
    anls_variant: AnlsVariant = "protocol"


class DocVQACLIEnv(ReActEnv):
    """50 turns, 512 tokens per turn, a 32,768-token trajectory cap (generations + observations)."""

    env_spec = SPEC
    Options = DocVQAOptions
    options: DocVQAOptions

    def _check_task(self, task: DocTask) -> None:
        check_image(task.image, f"task {task.id}")

    def _score(self, ep: EpisodeState) -> ScoreResult:
        return docvqa_score(
            ep.last_completion,
            ep.task.answers,
            termination_reason=ep.termination_reason,
            used_bash=ep.used_bash,
            variant=self.options.anls_variant,
        )


Env = DocVQACLIEnv
