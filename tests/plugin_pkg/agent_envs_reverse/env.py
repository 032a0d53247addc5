"""The plug-in's environment class: the shared ReAct loop plus its own scorer."""

from __future__ import annotations

from agent_envs.envs.react import EpisodeState, ReActEnv
from agent_envs.protocol.parsing import answer_status, final_answer_line, strip_think
from agent_envs.scoring.result import ScoreResult
from agent_envs_reverse.spec import SPEC


class ReverseEnv(ReActEnv):
    env_spec = SPEC

    def _score(self, ep: EpisodeState) -> ScoreResult:
        answer = (final_answer_line(strip_think(ep.last_completion)) or "").strip()
        ended = ep.termination_reason == "final_answer"
        return ScoreResult(
            score=1.0 if ended and answer == ep.task.word[::-1] else 0.0,
            method="reverse_exact",
            label="reverse_exact",
            status="ok" if ended else "skipped",
            answer_status=answer_status(ep.last_completion),
            prediction=answer,
        )
