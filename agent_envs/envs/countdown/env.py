"""``Countdown-ReAct-v0``: reach a target number with a persistent python tool and a bash tool
(docs/protocol.md#countdown).  ``single_turn=True`` is the common single-turn ES setup: one reply,
no tools, the single-turn prompt."""
from __future__ import annotations

from typing import Any

from agent_envs.envs.countdown.scoring import score
from agent_envs.envs.countdown.spec import RULES_SINGLE_TURN, SPEC
from agent_envs.envs.react import EpisodeState, ReActEnv
from agent_envs.protocol.parsing import answer_status, final_answer_line, strip_think
from agent_envs.scoring.result import ZEROING_TERMINATIONS

SCORE_METHOD = "countdown_exact"


class CountdownReActEnv(ReActEnv):
    """20 turns, 2048 tokens per turn; reward 1.0 for an exact expression using every number once."""

    env_spec = SPEC

    def __init__(self, *, single_turn: bool = False, **kwargs: Any):
        if not isinstance(single_turn, bool):
            raise ValueError(f"single_turn must be True or False, got {single_turn!r}")
        self.single_turn = single_turn
        if single_turn:
            if kwargs.get("max_turns", 1) != 1:
                raise ValueError("single_turn=True means max_turns=1")
            kwargs["max_turns"] = 1
            if kwargs.get("system_prompt") is None:
                kwargs.setdefault("prompt_file", "countdown/system_single_turn")
        super().__init__(**kwargs)
        if self.sandbox_config.backend == "docker":  # refused here, not at the first python call
            raise ValueError('Countdown-ReAct-v0: the python tool cannot run on the "docker" sandbox backend '
                             'yet; use "bwrap" or "none"')
        if single_turn:
            self.rules = RULES_SINGLE_TURN

    def _extra_config(self) -> dict[str, Any]:
        return {"single_turn": self.single_turn}

    def _score(self, ep: EpisodeState) -> dict[str, Any]:
        """1.0 only for an episode that ended with a final answer that :func:`score` accepts;
        the expression is parsed with ``ast`` and never executed."""
        answer = final_answer_line(strip_think(ep.last_completion))
        if ep.termination_reason in ZEROING_TERMINATIONS:
            status, result = "skipped", None
        elif ep.termination_reason != "final_answer":
            status, result = "skipped", None
        else:
            status, result = "ok", score(answer, ep.task)
        return {
            "target": ep.task.target,
            "nums": list(ep.task.nums),
            "score": result.reward if result else 0.0,
            "score_method": SCORE_METHOD,
            "score_status": status,
            "score_reason": result.reason if result else f"episode ended with {ep.termination_reason}",
            "answer_status": answer_status(ep.last_completion),
            "prediction": answer or "",
            "value": result.value if result else None,
        }


Env = CountdownReActEnv
