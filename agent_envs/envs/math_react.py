"""``MATH-ReAct-v0``: solve a math problem with a sandboxed bash tool (protocol §3, ES runner)."""
from __future__ import annotations

from typing import Any

from agent_envs.data.math import load_math_tasks
from agent_envs.data.tasks import MathTask
from agent_envs.envs.react import ReActEnv, _Episode
from agent_envs.protocol import messages as msgs
from agent_envs.protocol.decision import MATH_ES, MATH_HTTP, Flavour
from agent_envs.scoring.math import SCORERS, math_score


class MathReActEnv(ReActEnv):
    """50 turns, 4096 tokens per turn, no trajectory cap; score 0/1 on the last completion.

    ``scorer="exact"`` reproduces the published numbers (they came from the exact fallback alone);
    ``"auto"`` tries math-verify first, as the protocol's code path does.
    """

    env_id = "MATH-ReAct-v0"
    default_max_tokens_per_turn = 4096
    default_max_trajectory_tokens = None
    observation_style = "math"
    system_prompt_name = "math_react_system"
    user_prompt_name = "math_react_user"
    skill_separator = msgs.MATH_SKILL_SUFFIX

    def __init__(self, *, scorer: str = "auto", score_timeout_s: float = 10.0, **kwargs: Any):
        if scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {SCORERS}, got {scorer!r}")
        self.scorer = scorer
        self.score_timeout_s = score_timeout_s
        super().__init__(**kwargs)

    def _flavour(self) -> Flavour:
        return MATH_ES if self.compat == "es" else MATH_HTTP

    def _load_tasks(self, spec: Any, **kwargs: Any) -> list[MathTask]:
        return load_math_tasks(spec, **kwargs)

    def _coerce_task(self, payload: Any) -> MathTask:
        return payload if isinstance(payload, MathTask) else MathTask.model_validate(payload)

    def _extra_config(self) -> dict[str, Any]:
        return {"scorer": self.scorer}

    def _score(self, ep: _Episode) -> dict[str, Any]:
        result = math_score(
            ep.last_completion,
            ep.task.answer,
            scorer=self.scorer,
            termination_reason=ep.termination_reason,
            used_bash=ep.used_bash,
            timeout_s=self.score_timeout_s,
        )
        return {
            "answer": ep.task.answer,
            "score": result.score,
            "score_method": result.label,
            "score_status": result.status,
            "answer_status": result.answer_status,
            "prediction": result.prediction,
        }
