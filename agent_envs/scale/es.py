"""ES over an engine pool: members go to whichever engine is idle; every update runs on every engine.

All engines start from the same weights and apply the same seeded updates, so no weights travel.
Reverting a perturbation by subtracting the noise leaves a rounding residue that depends on which
members an engine ran, so the pool always reverts exactly (a host copy of the weights while
perturbed): only then are the engines, and a 1-engine and an N-engine run, bit for bit the same.
After ``es_init`` and after every update each engine reports a checksum of its weights; unless all
agree the run stops with :class:`WeightsDiverged`.  The agreed checksum is stored in the
generation's update record, so a history also says which weights it produced.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence, cast

from pydantic import BaseModel, ConfigDict

from agent_envs.es.history import ESConfig, Record
from agent_envs.es.population import Backend, ESTrainer, MemberResult, evaluate_member
from agent_envs.rewards.combine import FitnessCombiner

from .engines import Engine
from .pool import EnginePool


class MemberJob(BaseModel):
    """One population member: perturb with ``seed``, run the case batch, revert."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    env_id: str
    tasks: list[Any]
    seed: int
    sigma: float
    generation: int
    member: int
    samples: int = 1
    rollout_kwargs: dict[str, Any] = {}
    #: outcome + process -> fitness (None: the outcome alone)
    combiner: FitnessCombiner | None = None


def run_member_on(engine: Engine, job: MemberJob, engine_index: int) -> MemberResult:
    """On the actor: the member's episodes run here (their sandboxes on this node)."""
    engine.apply(job.seed, job.sigma)
    try:
        return evaluate_member(engine.policy, job.env_id, job.tasks, job.seed, generation=job.generation,
                               member=job.member, samples=job.samples, engine_index=engine_index,
                               combiner=job.combiner, **job.rollout_kwargs)
    finally:
        engine.revert(job.seed, job.sigma)


class PoolBackend:
    """The trainer's update backend over every engine of a pool, with the checksum check."""

    def __init__(self, pool: EnginePool, scope: str = "full", log: Callable[[str], None] = print) -> None:
        self.pool, self.log = pool, log
        self.tp_size = int(pool.info[0]["tp_size"])
        start = pool.agree(pool.broadcast("es_init", scope, True), "after loading")
        log(f"[es] {len(pool.live)} engine(s) start from weights {start[:16]}")

    def update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float) -> dict[str, Any]:
        out = self.pool.broadcast("es_update", [int(s) for s in seeds], [float(w) for w in weights], float(alpha))
        checksum = self.pool.agree({i: r["checksum"] for i, r in out.items()}, "after an update")
        self.log(f"[es] weights {checksum[:16]} on engines {sorted(out)}")
        return {"update": out[min(out)]["update"], "weights_checksum": checksum}

    def checksum(self) -> str:
        return self.pool.agree(self.pool.broadcast("checksum"), "")


class PoolESTrainer(ESTrainer):
    """:class:`ESTrainer` whose members run in parallel on the pool's engines.  Its history equals a
    one-engine run's, except each sample's ``engine_index``."""

    def __init__(self, config: ESConfig, backend: PoolBackend, tasks: Sequence[Any], history_path: str, *,
                 rollout_kwargs: dict[str, Any] | None = None, history: list[Record] | None = None,
                 start_generation: int = 0, eval_hook: Callable[[int], dict[str, Any] | None] | None = None,
                 log: Callable[[str], None] = print, combiner: FitnessCombiner | None = None) -> None:
        # members are perturbed on the engines (run_member_on), so the trainer only updates through it
        super().__init__(config, cast(Backend, backend), tasks, None, history_path, history, start_generation,
                         eval_hook, log)
        self.pool = backend.pool
        self.rollout_kwargs = dict(rollout_kwargs or {})
        self.combiner = combiner
        #: engines that evaluate members (default: all); updates always run on every engine
        self.member_engines: list[int] | None = None

    def evaluate_population(self, batch: Sequence[Any], seeds: Sequence[int], sigma: float,
                            generation: int) -> list[MemberResult]:
        jobs = [MemberJob(env_id=self.config.env_id, tasks=list(batch), seed=s, sigma=sigma, generation=generation,
                          member=i, samples=self.config.train_samples, rollout_kwargs=self.rollout_kwargs,
                          combiner=self.combiner)
                for i, s in enumerate(seeds)]

        def report(_: int, r: MemberResult) -> None:
            self.log(f"[es]   generation={generation} member={r.member} seed={r.seed} reward={r.reward:.4f} "
                     f"engine={r.engine_index}")

        return self.pool.map(f"{__name__}:run_member_on", jobs, report, self.member_engines)
