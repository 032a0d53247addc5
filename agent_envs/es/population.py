"""One ES generation end to end: evaluate each member on the case batch, normalise, update, record.

A member is evaluated on the positive perturbation only (the reference's), or, with ``mirrored``,
members come in (+eps, -eps) pairs sharing a seed (ours: agent_envs.es.update_rule); its rollouts use
the member seed as base seed, so every trajectory seed follows from the history.  The weights are
always restored in a ``finally`` block, whatever the rollout does.  A member's episodes all run at
once by default (concurrency = case batch x samples).  After every update the weights fingerprint
(:mod:`agent_envs.es.fingerprint`) goes into the generation's record, so a replay can check itself
against the run it replays generation by generation.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, TypeVar

from pydantic import BaseModel, ConfigDict

from agent_envs.core.tasks import task_id
from agent_envs.core.types import REQUEST_ERROR
from agent_envs.policy.adapter import SamplingPolicy
from agent_envs.rollout.records import as_row
from agent_envs.rollout.runner import run_episodes
from agent_envs.scoring.metrics import clamped_score

from .fingerprint import combine_checksums
from .frozen_heap import run_heap_frozen
from .history import ESConfig, GenerationRecord, HistoryWriter, Record
from .normalize import normalize_rewards, population_std
from .schedule import interval_evaluation_due, sigma_at_step
from .seeds import SeedStream, case_batch
from .update_rule import member_sign, optimizer_settings, update_terms

if TYPE_CHECKING:
    from agent_envs.rewards.combine import FitnessCombiner

T = TypeVar("T")
R = TypeVar("R")
Rollout = Callable[..., Sequence[Any]]
COMPACT_KEYS = (
    "key",
    "task_id",
    "row_index",
    "sample_index",
    "score",
    "prediction",
    "latency_s",
    "used_bash",
    "termination_reason",
    "answer_status",
    "context_trims",
    "max_context_tokens",
    "generated_tokens",
    "seed",
    "engine_index",
    "trajectory_tokens",
    "trace_rounds",
    "score_method",
)


class Backend(Protocol):
    """What the trainer needs from a perturbation backend (SeededPerturber, VLLMPerturbation)."""

    tp_size: int

    def apply(self, seed: int, sigma: float) -> Any: ...
    def revert(self, seed: int, sigma: float) -> Any: ...
    def update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float) -> Any: ...
    def fingerprint(self) -> str: ...


def full_checksum(backend: Any) -> str:
    """SHA-256 of the backend's weights (one string; tensor-parallel ranks combined)."""
    return combine_checksums(backend.checksum())


class MemberResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generation: int
    member: int
    seed: int
    reward: float
    rows: list[dict[str, Any]]
    engine_index: int = 0
    #: seconds the engine spent applying and reverting this member's perturbation (not in the history)
    perturb_s: float | None = None


#: kept in the history's rows when present (runs with a step scorer / a fitness combiner)
PROCESS_KEYS = ("process_score", "fitness")


def op_seconds(result: Any) -> float:
    """Seconds a weight operation reported: one worker's dict, or the slowest of a list of them."""
    if isinstance(result, dict):
        return float(result.get("seconds") or 0.0)
    if isinstance(result, (list, tuple)):
        return max((op_seconds(r) for r in result), default=0.0)
    return 0.0


def toy_reward(rows: Sequence[dict[str, Any]]) -> float:
    """Mean over episodes of sha256(last completion) read as a number in [0, 1): a reward that moves
    the weights on random (dummy) weights, whose real scores are all 0, for smoke runs and benchmarks."""
    values = [int(hashlib.sha256(str(r.get("response", "")).encode()).hexdigest()[:8], 16) / 2**32 for r in rows]
    return sum(values) / max(1, len(values))


def run_perturbed(backend: Backend, seed: int, sigma: float, evaluate: Callable[[], MemberResult]) -> MemberResult:
    """Apply the member's perturbation, evaluate, revert whatever happened; the result carries the
    apply + revert seconds."""
    applied = backend.apply(seed, sigma)
    try:
        result = evaluate()
    finally:
        reverted = backend.revert(seed, sigma)
    return result.model_copy(update={"perturb_s": op_seconds(applied) + op_seconds(reverted)})


class GenerationFailed(RuntimeError):
    """Every episode of a generation ended in a request error: its rewards measure the engine or server,
    not the members (a dead engine answers every later generation the same way), so the run stops
    before that generation's update, with the history of the generations before it."""


def check_answered(generation: int, members: Sequence[MemberResult]) -> None:
    """:class:`GenerationFailed` when no episode of the generation got an answer from the policy."""
    rows = [row for m in members for row in m.rows]
    if rows and all(row.get("termination_reason") == REQUEST_ERROR for row in rows):
        raise GenerationFailed(
            f"generation {generation}: all {len(rows)} episodes ended in {REQUEST_ERROR} "
            f"(first: {str(rows[0].get('react_error') or '')[:300]}); nothing of it was updated or written"
        )


def compact_row(row: dict[str, Any]) -> dict[str, Any]:
    """The history's per-row summary: scores and accounting, no transcripts."""
    return {**{k: row.get(k) for k in COMPACT_KEYS}, **{k: row[k] for k in PROCESS_KEYS if k in row}}


def evaluate_member(
    policy: Any,
    env_id: str,
    tasks: Sequence[Any],
    member_seed: int,
    *,
    generation: int,
    member: int,
    samples: int = 1,
    rollout: Rollout | None = None,
    engine_index: int = 0,
    combiner: FitnessCombiner | None = None,
    sampling: Mapping[str, Any] | None = None,
    **rollout_kwargs: Any,
) -> MemberResult:
    """Run the case batch with base seed = member seed; reward = mean of max(0, score), or with a
    :class:`~agent_envs.rewards.combine.FitnessCombiner` the mean of each episode's combined fitness
    (outcome + process, written into the rows as ``fitness``; docs/protocol.md#fitness-combiner).

    ``rollout`` defaults to :func:`agent_envs.rollout.run_episodes` in lockstep mode (one policy
    call per turn, as the reference trainer) with every episode of the member in flight at once
    (``concurrency`` = tasks x samples unless given).  A job the runner returned no row for counts
    as a 0 in the denominator, like a failed rollout.  ``sampling``: settings the member's requests
    carry over the policy's own (:func:`~agent_envs.es.member_sampling.member_sampling_settings`).
    """
    if sampling:
        policy = SamplingPolicy(policy, sampling)
    tags = {"generation": generation, "member": member, "member_seed": member_seed, "engine_index": engine_index}
    if rollout is None:
        rollout = run_episodes
        concurrency = rollout_kwargs.pop("concurrency", None) or member_concurrency(len(tasks), samples)
        rollout_kwargs = {
            "mode": "lockstep",
            "progress": False,
            "tags": tags,
            "concurrency": concurrency,
            **rollout_kwargs,
        }
    rows = rollout(env_id, list(tasks), policy, samples=samples, base_seed=member_seed, **rollout_kwargs)
    tagged = [{**as_row(row), **tags} for row in rows]
    if combiner is not None:
        tagged = [{**row, "fitness": combiner.fitness(row)} for row in tagged]
    fitness = clamped_score if combiner is None else (lambda row: row["fitness"])
    expected = max(len(tasks) * samples, len(tagged))
    reward = sum(fitness(r) for r in tagged) / expected if expected else 0.0
    return MemberResult(
        generation=generation, member=member, seed=member_seed, reward=reward, rows=tagged, engine_index=engine_index
    )


def member_concurrency(tasks: int, samples: int = 1) -> int:
    """Episodes in flight for one member by default: all of them (case batch x samples)."""
    return max(1, int(tasks) * int(samples))


def map_endpoint_serial(items: Sequence[T], endpoints: Sequence[Any], fn: Callable[[Any, T], R]) -> list[R]:
    """Item i runs on endpoint i mod E; each endpoint runs its items one after another, the
    endpoints in parallel.  Results come back in item order; the first error is re-raised."""
    if not endpoints:
        raise ValueError("map_endpoint_serial needs at least one endpoint")
    results: list[Any] = [None] * len(items)
    errors: list[BaseException] = []

    def drain(e: int) -> None:
        for i in range(e, len(items), len(endpoints)):
            if errors:
                return
            try:
                results[i] = fn(endpoints[e], items[i])
            except BaseException as exc:  # surfaced to the caller below
                errors.append(exc)

    threads = [threading.Thread(target=drain, args=(e,)) for e in range(len(endpoints))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


class ESTrainer:
    """Generation loop on one perturbation backend (one engine); the history is rewritten after
    every generation so an interrupted run can be resumed from it."""

    def __init__(
        self,
        config: ESConfig,
        backend: Backend,
        tasks: Sequence[Any],
        evaluate: Callable[[Sequence[Any], int, int, int], MemberResult] | None,
        history_path: str,
        history: list[Record] | None = None,
        start_generation: int = 0,
        eval_hook: Callable[[int], dict[str, Any] | None] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        if not tasks:
            raise ValueError("the training task list is empty")
        self.config, self.backend, self.tasks = config, backend, list(tasks)
        self.evaluate, self.history_path, self.eval_hook, self.log = evaluate, history_path, eval_hook, log
        if history is None:
            if config.start_fingerprint is None:
                self.config = config = config.model_copy(update={"start_fingerprint": backend.fingerprint()})
            history = [{"config": config.model_dump()}]
        self.history = history
        #: appends each generation's record to ``history_path`` (the first write replaces the file)
        self._history_file = HistoryWriter(history_path)
        self.start_generation = start_generation
        self.seeds = SeedStream(config.seed, config.population, start_generation, config.mirrored)
        #: Adam's settings for every update, or None: the reference's plain update
        self.optimizer = optimizer_settings(config.model_dump())
        #: also record the full SHA-256 of the weights in every generation (seconds each, on the host)
        self.sha256_each_generation = False
        #: the last step's timings: wall, members, update, fingerprint, per-member apply + revert seconds
        self.last_timing: dict[str, Any] = {}
        #: called with each generation's record (its evaluation included) and timings once it is in
        #: the history: the metrics rows of agent_envs.es.progress
        self.progress: Callable[[Record, dict[str, Any]], Any] | None = None

    def sigma(self, generation: int) -> float:
        c = self.config
        return sigma_at_step(
            c.sigma_start,
            c.sigma_end,
            generation,
            c.sigma_total_steps or c.generations,
            c.sigma_schedule,
            c.sigma_warmup_steps,
        )

    def member_sigma(self, sigma: float, member: int) -> float:
        """The member's signed noise scale: ``-sigma`` for the second member of a mirrored pair."""
        return sigma * member_sign(member, self.config.mirrored)

    def run_member(self, tasks: Sequence[Any], seed: int, sigma: float, generation: int, member: int) -> MemberResult:
        evaluate = self.evaluate
        if evaluate is None:
            raise RuntimeError("this trainer has no member evaluator; override evaluate_population")
        signed = self.member_sigma(sigma, member)
        return run_perturbed(self.backend, seed, signed, lambda: evaluate(tasks, seed, generation, member))

    def evaluate_population(
        self, batch: Sequence[Any], seeds: Sequence[int], sigma: float, generation: int
    ) -> list[MemberResult]:
        """Every member's result, in member order: here one after another on the one backend."""
        return [self.run_member(batch, s, sigma, generation, i) for i, s in enumerate(seeds)]

    def update_arguments(
        self, seeds: Sequence[int], weights: Sequence[float]
    ) -> tuple[list[int], list[float], dict[str, Any]]:
        """``(seeds, weights, keywords)`` of the backend's update: one term per mirrored pair, and
        Adam's settings when the run uses Adam (none otherwise: the reference's call)."""
        terms = update_terms(seeds, weights, self.config.mirrored)
        return *terms, ({"optimizer": self.optimizer} if self.optimizer is not None else {})

    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], sigma: float) -> Any:
        """The generation's update on the backend (the reference's update needs no sigma)."""
        seeds, weights, extra = self.update_arguments(seeds, weights)
        return self.backend.update(seeds, weights, self.config.alpha, **extra)

    def step(self, generation: int) -> Record:
        c = self.config
        seeds = self.seeds.next_generation()
        sigma = self.sigma(generation)
        batch = case_batch(self.tasks, generation, c.case_batch_size)
        start = time.perf_counter()
        members = self.evaluate_population(batch, seeds, sigma, generation)
        check_answered(generation, members)
        rewards = [m.reward for m in members]
        weights = normalize_rewards(
            rewards, c.reward_normalization, c.reward_normalization_ddof, c.reward_normalization_eps
        )
        members_done = time.perf_counter()
        update = self.apply_update(seeds, weights, sigma)
        updated = time.perf_counter()
        fingerprint = self.backend.fingerprint()
        fingerprinted = time.perf_counter()
        extra = {"weights_sha256": full_checksum(self.backend)} if self.sha256_each_generation else {}
        record = GenerationRecord(
            generation=generation,
            case_batch=[task_id(t) for t in batch],
            sigma=sigma,
            sigma_start=c.sigma_start,
            sigma_end=c.sigma_end,
            sigma_schedule=c.sigma_schedule,
            sigma_warmup_steps=c.sigma_warmup_steps,
            seeds=seeds,
            rewards=rewards,
            weights=weights,
            alpha=c.alpha,
            reward_normalization=c.reward_normalization,
            reward_normalization_ddof=c.reward_normalization_ddof,
            reward_normalization_eps=c.reward_normalization_eps,
            reward_mean=sum(rewards) / len(rewards),
            reward_std=population_std(rewards),
            tp_size=self.backend.tp_size,
            samples=[
                {
                    "engine_index": m.engine_index,
                    "seed": m.seed,
                    "reward": m.reward,
                    "result": [compact_row(r) for r in m.rows],
                }
                for m in members
            ],
            updates=[update],
            weights_fingerprint=fingerprint,
            **extra,
        ).model_dump()
        self.last_timing = {
            "wall_s": time.perf_counter() - start,
            "members_s": members_done - start,
            "update_s": updated - members_done,
            "fingerprint_s": fingerprinted - updated,
            "perturb_s": [m.perturb_s for m in members],
        }
        perturb = [t for t in self.last_timing["perturb_s"] if t is not None]
        self.log(
            f"[es] generation={generation} sigma={sigma:.6g} reward_mean={record['reward_mean']:.4f} "
            f"reward_std={record['reward_std']:.4f} weights {fingerprint} "
            f"({self.last_timing['wall_s']:.1f} s; apply + revert {max(perturb, default=0.0):.3f} s per member "
            f"at most, fingerprint {self.last_timing['fingerprint_s']:.3f} s)"
        )
        return record

    def run(self) -> list[Record]:
        """Every generation from :attr:`start_generation` on, each record appended to the history file as
        it is made; the objects alive at the start kept out of full garbage collections meanwhile
        (:mod:`agent_envs.es.frozen_heap`)."""
        c = self.config
        with run_heap_frozen():
            for generation in range(self.start_generation, c.generations):
                record = self.step(generation)
                if self.eval_hook and interval_evaluation_due(generation, c.generations, c.eval_interval):
                    record.update(self.eval_hook(generation) or {})  # top-level <name>_eval keys, as the reference
                self.history.append(record)
                self._history_file.write(self.history)
                if self.progress is not None:
                    self.progress(record, self.last_timing)
        return self.history
