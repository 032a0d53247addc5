"""An ES run assembled from its settings: the history's config, the engines (one in this process, or
a Ray pool), the backend that perturbs them, the evaluator, the trainer.  ``agent-envs es`` drives
it; benchmarks drive the same objects through :func:`open_run`."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from pydantic import ValidationError

from agent_envs.core.prompts import PROFILE, profile_prompt, sha256
from agent_envs.core.steps import StepScorer
from agent_envs.envs import registry
from agent_envs.es.batched import LowRankESTrainer
from agent_envs.es.evaluation import EvalSetup, Evaluator, eval_only_plan, evaluation_setup
from agent_envs.es.fingerprint import combine_checksums
from agent_envs.es.history import ESConfig, ReplayMismatch, checked_generations, load_history, replay_is_exact, resume
from agent_envs.es.lora_kernels import use_tuned
from agent_envs.es.population_lora import choose as choose_lora_kernel
from agent_envs.es.population_lora import install as install_population_kernels
from agent_envs.es.member_sampling import member_sampling_settings
from agent_envs.es.population import ESTrainer, MemberResult, evaluate_member, member_concurrency, toy_reward
from agent_envs.es.worker import EXTENSION, VLLMLowRank, VLLMPerturbation
from agent_envs.policy import factory
from agent_envs.policy.adapter import AdapterPolicy
from agent_envs.policy.sampling import SamplingConfig
from agent_envs.rewards.combine import FitnessCombiner
from agent_envs.rewards.options import scorer_from_args, scorer_settings
from agent_envs.rollout import run_episodes
from agent_envs.rollout.episode_loop import EpisodeLoop
from agent_envs.rollout.options import env_kwargs
from agent_envs.rollout.shelf import EnvShelf

from .settings import CONFIG_FIELDS, ESSettings


@dataclass
class ESRun:
    """A trainer with its engines open; ``checksum()`` is the full SHA-256 of the weights (on request:
    it copies them to the host).  ``pool`` or ``policy`` is what the members run on.  Evaluation
    only has no trainer: ``evaluator`` runs on ``backend``'s replayed weights."""

    trainer: ESTrainer | None
    checksum: Callable[[], str]
    policy: Any = None
    pool: Any = None
    evaluator: Evaluator | None = None
    backend: Any = None
    setup: EvalSetup | None = None
    config: ESConfig | None = None


def build_process_reward(settings: ESSettings) -> tuple[StepScorer | None, FitnessCombiner | None]:
    """The step scorer and the fitness combiner the settings ask for (docs/protocol.md#fitness-combiner)."""
    if settings.process_weight and settings.step_scorer is None:
        raise SystemExit("--process-weight needs --step-scorer (there are no step scores to combine)")
    if settings.step_scorer is None:
        return None, None
    if settings.toy_reward:
        raise SystemExit("--toy-reward replaces the fitness; it cannot be combined with --step-scorer")
    try:
        scorer = scorer_from_args(settings.namespace())
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return scorer, FitnessCombiner(process_weight=settings.process_weight, aggregation=settings.process_aggregation)


def load_tasks(env_id: str, path: str, limit: int | None = None) -> list[Any]:
    """Tasks through the environment's own loader (a file, or a name such as ``builtin``)."""
    loader = registry.spec(env_id).load_tasks
    if loader is None:
        raise SystemExit(f"{env_id} has no task loader; ES needs one (its spec's load_tasks)")
    return list(loader(path, limit=limit))


def sampling_settings(settings: ESSettings) -> dict[str, Any]:
    """``--sampling`` over the protocol's settings (and ``--ignore-eos``); a bad one is refused by name."""
    values = {**dict(settings.sampling), "ignore_eos": settings.ignore_eos}
    try:
        SamplingConfig(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SystemExit(f"--sampling {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return values


def build_policy(settings: ESSettings, engine_kwargs: dict[str, Any]) -> Any:
    """The offline ``LLM``'s or the ``AsyncLLM``'s policy, built by the policy factory's vllm row (the
    CLI's and the engine pool's too); the ES backend drives its engine through it in either mode."""
    return factory.build_policy(
        "vllm",
        factory.PolicySettings(
            model=settings.model,
            mode=settings.mode,
            sampling=SamplingConfig(**sampling_settings(settings)),
            rollout_token_budget=settings.rollout_token_budget,
            engine_args=engine_kwargs,
        ),
    )


def make_config(settings: ESSettings, combiner: FitnessCombiner | None) -> ESConfig:
    """The history's config record (its format is the history's, unchanged: ``max_tokens`` is the
    per-turn limit there)."""
    s = settings
    return ESConfig(
        env_id=s.env,
        model=s.model,
        **{field: getattr(s, setting) for setting, field in CONFIG_FIELDS.items()},
        eval_seed=s.seed,
        history_file=s.history,
        max_turns=s.max_turns,
        max_tokens=s.max_tokens_per_turn,
        max_model_len=s.max_model_len,
        dtype=s.dtype,
        load_format=s.load_format,
        concurrency=s.concurrency or member_concurrency(s.case_batch),
        **({"ignore_eos": True} if s.ignore_eos else {}),
        **({"fitness": {**(scorer_settings(s.namespace()) or {}), **combiner.model_dump()}} if combiner else {}),
        **({"perturbation": "lowrank", "rank": s.rank} if s.perturbation == "lowrank" else {}),
        **({"sampling": dict(s.sampling)} if s.sampling else {}),
    )


def make_engine_kwargs(settings: ESSettings) -> dict[str, Any]:
    """``vllm.LLM`` keywords of every engine: CUDA graphs unless --enforce-eager; prefix caching stays on
    (after every weight change the backend gives the policy a new cache salt); --engine-arg on top; low-rank
    engines get one LoRA slot per member (:attr:`ESSettings.lora_slots`) and CUDA graphs up to the
    population's batch (:attr:`ESSettings.graph_batch`)."""
    kwargs = dict(
        worker_extension_cls=EXTENSION,
        dtype=settings.dtype,
        max_model_len=settings.max_model_len,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        load_format=settings.load_format,
        enforce_eager=settings.enforce_eager,
        seed=settings.seed,
        trust_remote_code=True,
        **dict(settings.engine_arg),
    )
    if settings.perturbation == "lowrank":
        kwargs.update(settings.lora_slots, **settings.graph_batch)
    return kwargs


def make_env_kwargs(settings: ESSettings, skill: str | None = None) -> dict[str, Any]:
    """The environment's keywords for members and held-out episodes (the shared builder's)."""
    return env_kwargs(
        sandbox=settings.sandbox,
        max_turns=settings.max_turns,
        max_tokens_per_turn=settings.max_tokens_per_turn,
        skill=skill,
        prompts=settings.prompts,
        env_args=settings.env_arg,
    )


def prompt_settings(settings: ESSettings) -> dict[str, Any]:
    """``--prompts``: the profile's system prompt checked against its published SHA-256 before any
    engine starts, and recorded in the history's config (docs/protocol.md#prompt-profiles)."""
    if not settings.prompts:
        return {}
    try:
        text = profile_prompt(settings.prompts, registry.spec(settings.env).system_prompt)
    except ValueError as exc:
        raise SystemExit(f"--prompts: {exc}") from None
    return {"prompts": settings.prompts, "prompt_profile": PROFILE, "system_prompt_sha256": sha256(text)}


@contextlib.contextmanager
def open_run(settings: ESSettings) -> Iterator[ESRun]:
    """Everything a run trains with, built from the settings, engines started (one engine in this
    process, or a Ray pool); closed on exit."""
    s = settings
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # a single engine's weights live in this process
    scorer, combiner = build_process_reward(s)
    try:
        if (s.train is None) != s.eval_only:
            raise SystemExit("give --train to train, or --eval-only (no training) without it")
        make_output_folders(s)
        try:
            setup = evaluation_setup(s.namespace(), lambda path: load_tasks(s.env, path, s.eval_limit))
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        train = load_tasks(s.env, s.train) if s.train else []
        config = make_config(s, combiner).model_copy(update={**setup.config, **prompt_settings(s)})
        if s.eval_only:
            try:
                history = load_history(s.resume) if s.resume else []
                eval_only_plan(config, history, s.resume_generations, s.eval_generations, s.final_eval)
            except (OSError, ValueError) as exc:
                raise SystemExit(f"[es] --eval-only --resume {s.resume}: {exc}") from None
        if s.pooled:
            if scorer is not None:
                raise SystemExit("--step-scorer runs on a single engine (the pool's actors score episodes themselves)")
            if s.mode == "async":
                print("[es] --engines: each engine runs its members in lockstep mode", file=sys.stderr)
            with pool_run(s, config, train, setup) as run:
                yield run
        else:
            with single_engine_run(s, config, train, setup, scorer, combiner) as run:
                yield run
    finally:
        if scorer is not None:
            scorer.close()


def make_output_folders(settings: ESSettings) -> None:
    """Create the folders the run writes into (``--history``'s and ``--metrics``' folders, ``--adapter-dir``)
    before any engine starts: a missing one would otherwise end the run at its first write, after the
    engine's start and the first generation's rollouts."""
    files = [settings.history, *([settings.metrics] if settings.metrics else [])]
    folders = [os.path.dirname(os.path.abspath(f)) for f in files]
    for folder in [*folders, *([settings.adapter_dir] if settings.adapter_dir else [])]:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise SystemExit(f"[es] cannot create the folder {folder}: {exc}") from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise SystemExit(f"[es] the folder {folder} is not writable")


def replay_source(settings: ESSettings, config: ESConfig, backend: Any) -> tuple[list[dict[str, Any]] | None, int]:
    """``--resume``: replay the history onto ``backend``, checking its fingerprints as it goes."""
    if not settings.resume:
        return None, 0
    source = load_history(settings.resume)
    try:
        head, start = resume(settings.resume, config, backend, settings.resume_generations)
    except ReplayMismatch as exc:
        raise SystemExit(f"[es] --resume {settings.resume}: {exc}") from None
    checked = checked_generations(source, start)
    print(
        f"[es] replayed {start} generations from {settings.resume}; weights {backend.fingerprint()} "
        f"({checked} of {start} checked against the history's fingerprints)"
    )
    if not replay_is_exact(source):
        print(
            "[es] note: that run reverted members in place (the reference's default), so its trained "
            "weights carry rounding residue the replay does not repeat; its fingerprints can be checked, and "
            "checksums match, only for runs trained with --exact-revert",
            file=sys.stderr,
        )
    return head, start


def record(config: ESConfig, **extra: Any) -> None:
    """Facts the engine decides (the LoRA kernels, the low-rank targets) kept in the history's config."""
    for key, value in extra.items():
        setattr(config, key, value)


def describe_start(backend: Any, config: ESConfig) -> None:
    copies = sorted({str(s.get("revert_copy_reason") or "") for s in backend.status()} - {""})
    print(
        f"[es] weights {backend.fingerprint()}; exact revert: {'; '.join(copies) if copies else 'off'}; "
        f"{(config.model_extra or {})['concurrency']} episodes in flight per member",
        file=sys.stderr,
    )


#: the thread of a single-engine async run's one event loop for every member's episodes
EPISODE_LOOP_THREAD = "es-episodes"


def episode_loop_for(policy: Any) -> EpisodeLoop:
    """Every member's async episodes on one event loop, not one loop per member thread: the async
    engine's own where the policy has one (no thread hand-off per request and answer), else a loop
    of the run's (docs/scaling.md#the-episode-loops-host-time)."""
    engine_loop = getattr(policy, "engine_loop", None)
    return EpisodeLoop.sharing(*engine_loop) if engine_loop is not None else EpisodeLoop(EPISODE_LOOP_THREAD)


def member_env_workers(settings: ESSettings) -> ThreadPoolExecutor:
    """The env worker threads of every member's episodes for the whole run: enough for the members
    that run at once (all of them in low-rank ES) with their episodes in flight.  Started once, not
    per member and generation: 16 members x 16 episodes started 256 threads at every generation's
    start, and the first turn waited for them (docs/scaling.md#the-episode-loops-host-time)."""
    at_once = settings.population if settings.perturbation == "lowrank" else 1
    per_member = settings.concurrency or member_concurrency(settings.case_batch)
    return ThreadPoolExecutor(max_workers=at_once * per_member, thread_name_prefix="es-env")


@contextlib.contextmanager
def single_engine_run(
    settings: ESSettings,
    config: ESConfig,
    train: list[Any],
    setup: EvalSetup,
    scorer: StepScorer | None,
    combiner: FitnessCombiner | None,
) -> Iterator[ESRun]:
    s = settings
    kwargs = make_env_kwargs(s, setup.skill)
    lowrank = s.perturbation == "lowrank"
    engine_kwargs = make_engine_kwargs(s)
    if lowrank:  # before the engine starts: vLLM reads its LoRA kernel settings once; the history keeps which
        kernel = choose_lora_kernel(s.lora_kernel, s.population)
        kernels = (
            use_tuned(s.model, engine_kwargs["max_loras"], engine_kwargs["max_lora_rank"])
            if kernel == "vllm"
            else install_population_kernels(s.rank, kernel)
        )
        record(config, lora_kernels=kernels)
        print(f"[es] low-rank: {kernels}", file=sys.stderr)
    started = time.perf_counter()
    policy = build_policy(s, engine_kwargs)
    # where a run's first minutes go: the engine's start (weights, compile, CUDA graphs, warm-up) apart from
    # the backend's set-up below (docs/scaling.md#gpu-host-staging: the same start took 2 minutes longer on
    # a fresh GPU host, its kernels compiled there)
    print(f"[es] engine started in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    workers = member_env_workers(s)
    # the members' environments for the whole run: built by the first generation, reset by the
    # next ones (256 gym.make every 16 x 16 generation before; docs/scaling.md#the-episode-loops-host-time)
    envs = EnvShelf()
    episode_loop = episode_loop_for(policy) if s.mode == "async" else None
    try:
        if lowrank:
            started = time.perf_counter()
            backend: Any = VLLMLowRank(policy, s.rank)
            record(config, lowrank_targets=[t.as_list() for t in backend.targets], base_checksum=backend.base_checksum)
            print(
                f"[es] low-rank: {len(backend.targets)} weights, rank {s.rank}, every member an adapter; "
                f"weights {backend.fingerprint()} (set up in {time.perf_counter() - started:.1f} s)",
                file=sys.stderr,
            )
            if kernel == "matmul":  # what folding took: a layer it does not serve keeps the population kernels
                folded = backend.lora_kernel()[0]["widened"]
                tiles = f" (widen tiles {folded['widen_tiles']})" if folded.get("widen_tiles") else ""
                planes = folded.get("layers_in_planes", 0)
                print(
                    f"[es] low-rank: {folded['layers']} layers with the members folded into their matmuls{tiles}"
                    + (f", {planes} of them packed in planes (a GEMM per slice)" if planes else ""),
                    file=sys.stderr,
                )
        else:
            backend = VLLMPerturbation(policy, scope=s.scope, exact_revert=s.exact_revert, revert_copy=s.revert_copy)
            describe_start(backend, config)
        config.tp_size = backend.tp_size

        def held_out(tasks: Sequence[Any], samples: int, seed: int, key_seeds: Mapping[str, int] | None) -> Any:
            return run_episodes(
                s.env,
                tasks,
                policy,
                samples=samples,
                mode=s.mode or "lockstep",
                base_seed=seed,
                env_kwargs=kwargs,
                concurrency=s.eval_concurrency,
                progress=False,
                key_seeds=key_seeds,
            )

        evaluator = setup.evaluator(held_out, seed=s.seed, spec=registry.spec(s.env))

        def checksum() -> str:
            return combine_checksums(backend.checksum())

        if s.eval_only:
            yield ESRun(None, checksum, policy=policy, evaluator=evaluator, backend=backend, setup=setup, config=config)
            return
        head, start = replay_source(s, config, backend)

        def evaluate(
            batch: Sequence[Any], seed: int, generation: int, member: int, adapter: str | None = None
        ) -> MemberResult:
            # through its adapter a member's episodes run beside every other member's, on one engine
            member_policy = policy if adapter is None else AdapterPolicy(policy, adapter)
            result = evaluate_member(
                member_policy,
                s.env,
                batch,
                seed,
                generation=generation,
                member=member,
                env_kwargs=kwargs,
                concurrency=s.concurrency,
                mode=s.mode,
                step_scorer=scorer,
                combiner=combiner,
                sampling=member_sampling_settings(config.member_sampling),
                workers=workers,
                envs=envs,
                episode_loop=episode_loop,
            )
            if s.toy_reward:
                result = result.model_copy(update={"reward": toy_reward(result.rows)})
            print(f"[es]   generation={generation} member={member} seed={seed} reward={result.reward:.4f}")
            return result

        history = setup.head(evaluator, config, head, start)
        hook = setup.hook(evaluator)
        if lowrank:
            trainer: ESTrainer = LowRankESTrainer(
                config,
                backend,
                policy,
                train,
                evaluate,
                s.history,
                adapter_dir=s.adapter_dir,
                history=history,
                start_generation=start,
                eval_hook=hook,
            )
        else:
            trainer = ESTrainer(
                config, backend, train, evaluate, s.history, history=history, start_generation=start, eval_hook=hook
            )
        trainer.sha256_each_generation = s.sha256_each_generation
        yield ESRun(trainer, checksum, policy=policy, evaluator=evaluator, backend=backend, setup=setup, config=config)
    finally:
        if episode_loop is not None:
            episode_loop.close()
        workers.shutdown(wait=True)
        envs.close()
        policy.close()


@contextlib.contextmanager
def pool_run(settings: ESSettings, config: ESConfig, train: list[Any], setup: EvalSetup) -> Iterator[ESRun]:
    """``--engines N`` (and ``--engines-per-gpu K``): one vLLM engine per Ray actor; members run on idle
    engines, every update on all engines (fingerprints compared each generation), held-out episodes
    spread over the engines."""
    from agent_envs.scale.engines import vllm_spec
    from agent_envs.scale.es import PoolBackend, PoolESTrainer
    from agent_envs.scale.pool import EnginePool
    from agent_envs.scale.rollout import pool_run_episodes

    s = settings
    kwargs = make_env_kwargs(s, setup.skill)
    spec = vllm_spec(
        s.model,
        make_engine_kwargs(s),
        sampling=sampling_settings(s),
        rollout_token_budget=s.rollout_token_budget,
        engines_per_gpu=s.engines_per_gpu,
    )
    with EnginePool(spec, s.engines, ray_address=s.ray_address, mps=s.mps) as pool:
        backend = PoolBackend(pool, scope=s.scope, revert_copy=s.revert_copy)
        config.tp_size, config.exact_revert = backend.tp_size, True  # the pool always reverts exactly

        def held_out(tasks: Sequence[Any], samples: int, seed: int, key_seeds: Mapping[str, int] | None) -> Any:
            return pool_run_episodes(
                pool,
                s.env,
                tasks,
                samples=samples,
                mode="lockstep",
                base_seed=seed,
                env_kwargs=kwargs,
                concurrency=s.eval_concurrency,
                progress=False,
                key_seeds=key_seeds,
            )

        evaluator = setup.evaluator(held_out, seed=s.seed, spec=registry.spec(s.env))
        if s.eval_only:
            yield ESRun(
                None, backend.checksum, pool=pool, evaluator=evaluator, backend=backend, setup=setup, config=config
            )
            return
        head, start = replay_source(s, config, backend)
        trainer = PoolESTrainer(
            config,
            backend,
            train,
            s.history,
            start_generation=start,
            history=setup.head(evaluator, config, head, start),
            eval_hook=setup.hook(evaluator),
            rollout_kwargs={"env_kwargs": kwargs, "concurrency": s.concurrency},
        )
        trainer.sha256_each_generation, trainer.toy_reward = s.sha256_each_generation, s.toy_reward
        yield ESRun(
            trainer, backend.checksum, pool=pool, evaluator=evaluator, backend=backend, setup=setup, config=config
        )
