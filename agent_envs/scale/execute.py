"""One evaluation run on a policy or on an engine pool: the middle of ``agent-envs eval``.

:func:`execute` records the run's configuration in its folder (``config.json``, read by a resumed
run), runs the episodes on one in-process policy (:func:`agent_envs.rollout.run_episodes`) or
spread over a pool (:func:`agent_envs.scale.rollout.pool_run_episodes`; same arguments, same
records), and closes what it was given however the run ends.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from agent_envs.core.atomic import atomic_write
from agent_envs.core.steps import StepScorer
from agent_envs.policy.base import Policy
from agent_envs.rollout.records import EpisodeRecord
from agent_envs.rollout.runner import run_episodes

if TYPE_CHECKING:
    from .pool import EnginePool


def execute(
    policy: Policy | EnginePool,
    env_id: str,
    tasks: Sequence[Any],
    *,
    out: str | Path,
    config: dict[str, Any],
    step_scorer: StepScorer | None = None,
    **run: Any,
) -> tuple[list[EpisodeRecord], float]:
    """Run ``tasks`` of ``env_id`` on ``policy`` (a :class:`Policy` or an ``EnginePool``) and return
    the records and the wall seconds.  ``config`` is written to ``out/config.json`` first, with the
    policy's own description as ``policy_info``; ``run`` is :func:`~agent_envs.rollout.run_episodes`'
    keywords (``out_path``, ``samples``, ``resume``, ...).  The policy and the step scorer are closed
    at the end, also when the run is interrupted or fails."""
    started = time.perf_counter()
    try:
        config["policy_info"] = policy.describe() if isinstance(policy, Policy) else policy.spec.model_dump()
        # read by a resumed run (rollout.resume.check_resume)
        atomic_write(Path(out) / "config.json", [(json.dumps(config, indent=2, default=str) + "\n").encode()])
        scorer: dict[str, Any] = {} if step_scorer is None else {"step_scorer": step_scorer}
        if isinstance(policy, Policy):
            records = run_episodes(env_id, tasks, policy, **run, **scorer)
        else:
            from .rollout import pool_run_episodes  # the pool's modules load only for a pool

            records = pool_run_episodes(policy, env_id, tasks, **run, **scorer)
    finally:
        policy.close()
        if step_scorer is not None:
            step_scorer.close()
    return records, time.perf_counter() - started
