"""``PrimeCount-Python-v0``: count the primes in a range with a persistent python tool."""

from __future__ import annotations

from agent_envs.envs.prime_count.scoring import prime_count_score
from agent_envs.envs.prime_count.spec import SPEC
from agent_envs.envs.react import EpisodeState, ReActEnv
from agent_envs.scoring.result import ScoreResult


class PrimeCountEnv(ReActEnv):
    """6 turns, 1024 tokens per turn; reward 1.0 for the exact count."""

    env_spec = SPEC

    def _score(self, ep: EpisodeState) -> ScoreResult:
        return prime_count_score(ep.last_completion, ep.task, termination_reason=ep.termination_reason)


Env = PrimeCountEnv
