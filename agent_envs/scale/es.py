"""ES over an engine pool: members go to whichever engine is idle; every update runs on every engine.

All engines start from the same weights and apply the same seeded updates, so no weights travel.
Reverting a perturbation by subtracting the noise leaves a rounding residue that depends on which
members an engine ran, so the pool always reverts exactly (a copy of the weights while perturbed,
on the GPU when it has room): only then are the engines, and a 1-engine and an N-engine run, bit
for bit the same.  After ``es_init`` and after every update each engine reports its weights
fingerprint (milliseconds, on the device); unless all agree the run stops with
:class:`WeightsDiverged`.  The agreed fingerprint is the generation's ``weights_fingerprint``, so a
history also says which weights it produced; the full SHA-256 is taken at the end (``checksum``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, cast

from pydantic import BaseModel, ConfigDict

from agent_envs.es.history import ESConfig, Record
from agent_envs.es.member_sampling import member_sampling_settings
from agent_envs.es.population import Backend, ESTrainer, MemberResult, evaluate_member, run_perturbed, toy_reward
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
    #: reward = :func:`~agent_envs.es.population.toy_reward` of the rows (smoke runs on random weights)
    toy_reward: bool = False
    #: the members' sampling over the engine policy's own (None: the policy's; agent_envs.es.member_sampling)
    sampling: dict[str, Any] | None = None


def run_member_on(engine: Engine, job: MemberJob, engine_index: int) -> MemberResult:
    """On the actor: the member's episodes run here (their sandboxes on this node)."""

    def evaluate() -> MemberResult:
        result = evaluate_member(
            engine.policy,
            job.env_id,
            job.tasks,
            job.seed,
            generation=job.generation,
            member=job.member,
            samples=job.samples,
            engine_index=engine_index,
            combiner=job.combiner,
            sampling=job.sampling,
            **job.rollout_kwargs,
        )
        return result.model_copy(update={"reward": toy_reward(result.rows)}) if job.toy_reward else result

    return run_perturbed(engine, job.seed, job.sigma, evaluate)


class PoolBackend:
    """The trainer's update backend over every engine of a pool, with the fingerprint check.
    ``revert_copy`` says where each engine keeps its exact-revert copy (:mod:`agent_envs.es.revert_copy`)."""

    def __init__(
        self, pool: EnginePool, scope: str = "full", log: Callable[[str], None] = print, revert_copy: str = "auto"
    ) -> None:
        self.pool, self.log = pool, log
        self.tp_size = int(pool.info[0]["tp_size"])
        started = pool.broadcast("es_init", scope, True, revert_copy)
        start = pool.agree({i: r["fingerprint"] for i, r in started.items()}, "after loading")
        copies = sorted({r["revert_copy"] for r in started.values()})
        log(f"[es] {len(pool.live)} engine(s) start from weights {start}; exact-revert copies: {', '.join(copies)}")

    def update(
        self, seeds: Sequence[int], weights: Sequence[float], alpha: float, optimizer: dict[str, Any] | None = None
    ) -> Any:
        out = self.pool.broadcast(
            "es_update", [int(s) for s in seeds], [float(w) for w in weights], float(alpha), optimizer
        )
        return out[min(out)]

    def fingerprint(self) -> str:
        """Every engine's fingerprint; they must agree (:class:`~agent_envs.scale.pool.WeightsDiverged`)."""
        return self.pool.agree(self.pool.broadcast("fingerprint"), "")

    def checksum(self) -> str:
        """The engines' agreed SHA-256 (seconds: the weights go to the host)."""
        return self.pool.agree(self.pool.broadcast("checksum"), "")


class PoolESTrainer(ESTrainer):
    """:class:`ESTrainer` whose members run in parallel on the pool's engines.  Its history equals a
    one-engine run's, except each sample's ``engine_index``."""

    def __init__(
        self,
        config: ESConfig,
        backend: PoolBackend,
        tasks: Sequence[Any],
        history_path: str,
        *,
        rollout_kwargs: dict[str, Any] | None = None,
        history: list[Record] | None = None,
        start_generation: int = 0,
        eval_hook: Callable[[int], dict[str, Any] | None] | None = None,
        log: Callable[[str], None] = print,
        combiner: FitnessCombiner | None = None,
    ) -> None:
        # members are perturbed on the engines (run_member_on), so the trainer only updates through it
        super().__init__(
            config, cast(Backend, backend), tasks, None, history_path, history, start_generation, eval_hook, log
        )
        self.pool = backend.pool
        self.rollout_kwargs = dict(rollout_kwargs or {})
        self.combiner = combiner
        #: engines that evaluate members (default: all); updates always run on every engine
        self.member_engines: list[int] | None = None
        #: score members with :func:`~agent_envs.es.population.toy_reward` (smoke runs on random weights)
        self.toy_reward = False

    def evaluate_population(
        self, batch: Sequence[Any], seeds: Sequence[int], sigma: float, generation: int
    ) -> list[MemberResult]:
        jobs = [
            MemberJob(
                env_id=self.config.env_id,
                tasks=list(batch),
                seed=s,
                sigma=self.member_sigma(sigma, i),
                generation=generation,
                member=i,
                samples=self.config.train_samples,
                rollout_kwargs=self.rollout_kwargs,
                combiner=self.combiner,
                toy_reward=self.toy_reward,
                sampling=member_sampling_settings(self.config.member_sampling),
            )
            for i, s in enumerate(seeds)
        ]

        def report(_: int, r: MemberResult) -> None:
            self.log(
                f"[es]   generation={generation} member={r.member} seed={r.seed} reward={r.reward:.4f} "
                f"engine={r.engine_index}"
            )

        return self.pool.map(f"{__name__}:run_member_on", jobs, report, self.member_engines)
