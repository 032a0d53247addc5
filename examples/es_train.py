"""Seeded evolution strategies on a vLLM model for MATH-ReAct or DocVQA-CLI (docs/protocol.md#es-maths).

Each generation draws ``--population`` member seeds, perturbs the weights in place inside the vLLM
worker (theta + sigma * eps(seed)), runs the generation's case batch with base seed = member seed,
reverts, normalises the member rewards and applies theta += alpha/N * sum w_i eps_i.  The history
(seeds + raw rewards) is rewritten atomically after every generation; ``--resume`` replays one.

Examples::

    # two quick generations on one GPU with random weights (no checkpoint needed)
    python examples/es_train.py --model Qwen/Qwen3-0.6B --load-format dummy \
        --env MATH-ReAct-v0 --train /data/math/dapo_evolve.jsonl --eval /data/math/dapo_test.jsonl \
        --generations 2 --population 4 --case-batch 4 --max-turns 3 --history runs/es/history.json
    # the published setting (25 x 16 x 16, cosine 1e-3 -> 5e-4, alpha 5e-4, z-score)
    python examples/es_train.py --model /ckpt/Qwen3.5-4B --train dapo_evolve.jsonl --eval dapo_test.jsonl
    # vLLM on CPU: weights must stay unpacked so they can be perturbed
    AGENT_ENVS_ES_CPU_PLAIN_LINEAR=1 python examples/es_train.py --model ~/.cache/agent-envs/smollm2-hf ...
    # continuous rollouts: AsyncVLLMPolicy (engine core in its own process, perturbed by name)
    python examples/es_train.py --mode async ...
    # low-rank population batching: every member a rank-4 LoRA adapter, all served at once by one engine
    python examples/es_train.py --perturbation lowrank --rank 4 ... (docs/protocol.md#low-rank-es)
    # the cards' evaluation modes on a trained history, no training (docs/scaling.md#es-evaluation):
    # "interval25" (replay 25 updates, 1 sample) and "final4" (replay 25, 4 samples, the final seeds)
    python examples/es_train.py --model M --eval-only --resume history.json --eval dapo=dapo_test.jsonl \
        --eval aime=aime_2026.jsonl --eval-generations 25 --history runs/interval25.json
    python examples/es_train.py --model M --eval-only --resume history.json --eval dapo=dapo_test.jsonl \
        --eval aime=aime_2026.jsonl --final-eval --final-eval-samples 4 --history runs/final4.json
    # fitness = 0.7 * outcome + 0.3 * mean step score from a judge served on 127.0.0.1:8001
    python examples/es_train.py ... --step-scorer judge --judge-url http://127.0.0.1:8001/v1 \
        --judge-model Qwen/Qwen3-8B --process-weight 0.3 --process-aggregation mean

Options (see ``--help``): --env, --model, --train, held-out evaluation (--eval NAME=PATH, --eval-limit,
--eval-samples, --initial-eval, --final-eval/--final-eval-samples, --eval-only/--eval-generations,
--eval-key-seed-file, --skill-file, --write-trace-logs), --generations,
--population, --case-batch, --sigma-start/--sigma-end/--sigma-schedule/--sigma-warmup/
--sigma-total-steps, --alpha, --normalization/--ddof/--eps, --scope, --seed, --eval-interval,
--eval-samples, --eval-out (held-out records before and after, for ``agent-envs compare``), --env-arg, --sampling,
--history, --resume (+ --resume-generations), --exact-revert (+ --revert-copy), --perturbation
full|lowrank (+ --rank, --adapter-dir), the update rule (--mirrored, --optimizer sgd|adam with
--adam-beta1/--adam-beta2/--adam-eps) and --member-sampling protocol|greedy|temperature=T
(docs/protocol.md#mirrored-pairs, #optimiser, #member-sampling), progress (--metrics, --tensorboard,
--wandb; docs/scaling.md#watching-an-es-run), --max-turns, --max-tokens,
--sandbox, --mode, --concurrency, --toy-reward, process rewards (--step-scorer judge|vlm-prm with
--judge-url/--judge-model/--judge-prompt or --prm-base/--prm-adapter, --process-weight, --process-aggregation:
docs/protocol.md#fitness-combiner), engine settings (--dtype, --max-model-len, --gpu-memory-utilization,
--load-format, --rollout-token-budget, --enforce-eager, --engine-arg), --engines N, --engines-per-gpu K, --mps and
--ray-address (engines as Ray actors; docs/scaling.md), --sha256-each-generation.

Speed (docs/scaling.md#es-at-the-engines-speed): engines run with CUDA graphs (``--enforce-eager`` for
eager), an exact revert keeps its copy on the GPU when it has room, a member's episodes all run at
once, and every generation records a cheap weights fingerprint that ``--resume`` checks generation
by generation.  The path before those changes stays reachable: ``--enforce-eager --exact-revert
--revert-copy host --concurrency 16``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from pydantic import ValidationError

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # weights live in this process's worker

from agent_envs.cli import _key_value as key_value
from agent_envs.envs import registry
from agent_envs.envs.registry import ENV_IDS
from agent_envs.protocol.seeds import DEFAULT_BASE_SEED
from agent_envs.es.batched import LowRankESTrainer
from agent_envs.es.evaluation import (
    EvalSetup,
    Evaluator,
    add_evaluation_arguments,
    eval_only,
    eval_only_plan,
    evaluation_setup,
)
from agent_envs.es.fingerprint import combine_checksums
from agent_envs.es.history import ESConfig, ReplayMismatch, checked_generations, load_history, replay_is_exact, resume
from agent_envs.es.lora_kernels import use_tuned
from agent_envs.es.lowrank import lora_rank_slot
from agent_envs.es.member_sampling import member_sampling_settings, normalize_member_sampling
from agent_envs.es.normalize import NORMALIZATIONS
from agent_envs.es.population import ESTrainer, evaluate_member, member_concurrency, toy_reward
from agent_envs.es.revert_copy import LOCATIONS
from agent_envs.es.progress import Progress, check_backends, metrics_path, plot_metrics, read_metrics
from agent_envs.es.schedule import SCHEDULES
from agent_envs.es.seeds import check_mirrored
from agent_envs.es.update_rule import OPTIMIZERS, check_adam
from agent_envs.es.worker import EXTENSION, VLLMLowRank, VLLMPerturbation
from agent_envs.policy import factory
from agent_envs.policy.adapter import AdapterPolicy
from agent_envs.policy.sampling import SamplingConfig
from agent_envs.policy.vllm import DEFAULT_ROLLOUT_TOKEN_BUDGET, REFERENCE_TOKEN_BUDGET
from agent_envs.scale.mps import MODES as MPS_MODES
from agent_envs.rewards.combine import FitnessCombiner
from agent_envs.rewards.options import add_scorer_arguments, scorer_from_args, scorer_settings
from agent_envs.core.prompts import PROFILE, profile_prompt, sha256
from agent_envs.core.steps import StepScorer
from agent_envs.scoring.process import AGGREGATIONS
from agent_envs.rollout import run_episodes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="MATH-ReAct-v0", choices=ENV_IDS)
    p.add_argument("--model", required=True, help="any vLLM model path or name")
    p.add_argument("--train", default=None, help="training tasks (JSONL / official DocVQA JSON); not with --eval-only")
    p.add_argument("--generations", type=int, default=25)
    p.add_argument("--population", type=int, default=16)
    p.add_argument("--case-batch", type=int, default=16)
    p.add_argument("--sigma-start", type=float, default=1e-3)
    p.add_argument("--sigma-end", type=float, default=5e-4)
    p.add_argument("--sigma-schedule", default="cosine", choices=SCHEDULES)
    p.add_argument("--sigma-warmup", type=int, default=0)
    p.add_argument("--sigma-total-steps", type=int, default=None, help="schedule length (default: generations)")
    p.add_argument("--alpha", type=float, default=5e-4)
    p.add_argument("--normalization", default="zscore", choices=NORMALIZATIONS)
    p.add_argument("--ddof", type=int, default=0)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--scope", default="full", choices=["full", "all_linear"])
    p.add_argument("--seed", type=int, default=DEFAULT_BASE_SEED)
    p.add_argument("--eval-interval", type=int, default=10, help="0: no interval evaluation")
    p.add_argument("--eval-concurrency", type=int, default=16, help="held-out episodes in flight")
    p.add_argument(
        "--env-arg",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="extra environment keyword (value parsed as JSON), e.g. single_turn=true",
    )
    p.add_argument("--history", required=True, help="history.json path (rewritten every generation)")
    p.add_argument("--resume", default=None, help="history to replay before training")
    p.add_argument("--resume-generations", type=int, default=None, help="replay only the first K updates")
    p.add_argument("--exact-revert", action="store_true", help="restore weights bit-exactly after each member")
    p.add_argument(
        "--revert-copy",
        default="auto",
        choices=LOCATIONS,
        help="where --exact-revert (and the pool, which always reverts exactly) keeps the weights: auto = "
        "on the GPU when it has room, else on the host with the reason printed; host = as before",
    )
    p.add_argument(
        "--perturbation",
        default="full",
        choices=["full", "lowrank"],
        help="full: the reference's per-element noise, members one after another; lowrank: a rank-R "
        "product per weight, every member a LoRA adapter, all served at once (async mode)",
    )
    p.add_argument("--rank", type=int, default=4, help="--perturbation lowrank: the rank R of each member's noise")
    add_update_rule_arguments(p)
    p.add_argument(
        "--adapter-dir",
        default=None,
        help="--perturbation lowrank: where each generation's adapters are written (default /dev/shm)",
    )
    p.add_argument(
        "--sha256-each-generation",
        action="store_true",
        help="also record the full SHA-256 of the weights every generation (seconds each; the cheap "
        "fingerprint is always recorded, the SHA-256 always printed at the end)",
    )
    p.add_argument("--max-turns", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=None, help="per-turn tokens (env default: 4096 / 512)")
    p.add_argument("--sandbox", default="bwrap", choices=["bwrap", "none", "docker"])
    p.add_argument(
        "--prompts",
        default=None,
        metavar="DIR",
        help="prompt profile: the reference's system prompt, checked against its published SHA-256 "
        "(docs/protocol.md#prompt-profiles)",
    )
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--load-format", default="auto", help='"dummy" gives random weights (smoke runs)')
    p.add_argument(
        "--rollout-token-budget",
        type=int,
        default=DEFAULT_ROLLOUT_TOKEN_BUDGET,
        help=f"lockstep microbatch size; 0: a whole turn per engine call, {REFERENCE_TOKEN_BUDGET}: the reference's",
    )
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="extra engine keyword (value parsed as JSON), e.g. max_num_batched_tokens=32768",
    )
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        help="no CUDA graphs (faster engine start, about 5x slower small-batch decoding)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="a member's episodes in flight (default: case batch x samples, all of them at once)",
    )
    p.add_argument(
        "--mode",
        default=None,
        choices=["lockstep", "async"],
        help="lockstep: vllm.LLM, one batch per turn (reference; the default for --perturbation full); "
        "async: AsyncVLLMPolicy, continuous (the default, and the only mode, for lowrank)",
    )
    p.add_argument(
        "--sampling",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="a sampling setting instead of the protocol's (agent_envs.policy.sampling.SamplingConfig), "
        "e.g. temperature=0.7; recorded in the history's config",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="keep generating past the end-of-sequence token: fixed-length turns (benchmarks)",
    )
    p.add_argument(
        "--toy-reward",
        action="store_true",
        help="reward = a hash of each episode's last completion in [0, 1): smoke runs on random "
        "weights, whose real scores are all 0",
    )
    p.add_argument(
        "--engines",
        type=int,
        default=1,
        help="engines as Ray actors, one GPU each; members go to idle engines (docs/scaling.md)",
    )
    p.add_argument(
        "--engines-per-gpu",
        type=int,
        default=1,
        help="pack K engines on each GPU (1/K of a GPU and of --gpu-memory-utilization each; started one "
        "after another); --engines counts all of them",
    )
    p.add_argument(
        "--mps",
        default="auto",
        choices=MPS_MODES,
        help="engines sharing a GPU run under CUDA MPS when the host offers it (auto) or never (off)",
    )
    p.add_argument("--ray-address", default=None, help="join this Ray cluster (multi-node) instead of a local one")
    add_scorer_arguments(p)
    add_evaluation_arguments(p)  # held-out sets, initial/final/eval-only, key-seed map, skill, trace logs
    p.add_argument(
        "--process-weight",
        type=float,
        default=0.0,
        help="fitness = (1 - w) * outcome + w * process score (0: outcome only)",
    )
    p.add_argument(
        "--process-aggregation",
        default=None,
        choices=list(AGGREGATIONS),
        help="how step scores become the process score (default: the scorer's own)",
    )
    args = p.parse_args(argv)
    check_perturbation_args(p, args)
    check_update_rule_args(p, args)
    return args


def add_update_rule_arguments(p: argparse.ArgumentParser) -> None:
    """Ours, not the reference's (the defaults are the reference's): recorded in the history's config."""
    p.add_argument(
        "--mirrored",
        action="store_true",
        help="members in pairs (+eps, -eps) sharing one seed, the update using both (population must be even)",
    )
    p.add_argument(
        "--member-sampling",
        default="protocol",
        help="how members' episodes are sampled: protocol (the policy's own, --sampling), greedy (temperature "
        "0, top-p 1, top-k off) or temperature=T; held-out evaluation keeps the policy's own",
    )
    p.add_argument(
        "--optimizer",
        default="sgd",
        choices=list(OPTIMIZERS),
        help="sgd: the reference's plain update; adam: Adam on the update direction (float32 moments beside "
        "the weights, rebuilt by --resume's replay)",
    )
    p.add_argument("--adam-beta1", type=float, default=0.9)
    p.add_argument("--adam-beta2", type=float, default=0.999)
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument(
        "--metrics",
        default=None,
        metavar="PATH",
        help="per-generation metrics rows, appended and flushed (default: <history>.metrics.jsonl; a PNG "
        "of them is drawn beside it at the end)",
    )
    p.add_argument("--tensorboard", default=None, metavar="DIR", help="also log the metrics to TensorBoard here")
    p.add_argument("--wandb", default=None, metavar="PROJECT", help="also log the metrics to this W&B project")


def check_update_rule_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The update rule's and progress flags' bad values, refused before any engine starts."""
    try:
        args.member_sampling = normalize_member_sampling(args.member_sampling)
        check_mirrored(args.population, args.mirrored)
        if args.optimizer == "adam":
            check_adam({"beta1": args.adam_beta1, "beta2": args.adam_beta2, "eps": args.adam_eps})
        check_backends(args.tensorboard, args.wandb)
    except ValueError as exc:
        parser.error(str(exc))


def check_perturbation_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Low-rank members share one engine at once, so they need the async engine and one engine."""
    pool = args.engines > 1 or args.engines_per_gpu > 1 or args.ray_address
    if args.perturbation == "full":
        args.mode = args.mode or "lockstep"
        return
    if args.mode == "lockstep":
        parser.error("--perturbation lowrank runs every member at once on one AsyncLLM: use --mode async")
    if pool:
        parser.error("--perturbation lowrank serves the whole population from one engine; drop --engines/--ray-address")
    if args.exact_revert:
        parser.error("--exact-revert does not apply to --perturbation lowrank: its base weights are never perturbed")
    try:
        lora_rank_slot(args.rank)
    except ValueError as exc:
        parser.error(f"--rank: {exc}")
    args.mode = "async"


def build_process_reward(args: argparse.Namespace) -> tuple[StepScorer | None, FitnessCombiner | None]:
    """The step scorer and the fitness combiner the flags ask for (docs/protocol.md#fitness-combiner)."""
    if args.process_weight and args.step_scorer is None:
        raise SystemExit("--process-weight needs --step-scorer (there are no step scores to combine)")
    if args.step_scorer is None:
        return None, None
    if args.toy_reward:
        raise SystemExit("--toy-reward replaces the fitness; it cannot be combined with --step-scorer")
    try:
        scorer = scorer_from_args(args)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return scorer, FitnessCombiner(process_weight=args.process_weight, aggregation=args.process_aggregation)


def load_tasks(env_id: str, path: str, limit: int | None = None) -> list[Any]:
    """Tasks through the environment's own loader (a file, or a name such as ``builtin``)."""
    loader = registry.spec(env_id).load_tasks
    if loader is None:
        raise SystemExit(f"{env_id} has no task loader; ES needs one (its spec's load_tasks)")
    return list(loader(path, limit=limit))


def build_policy(args: argparse.Namespace, engine_kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """(policy, engine handle for VLLMPerturbation): the offline LLM, or the AsyncLLM's policy,
    built by the policy factory's vllm row (the CLI's and the engine pool's too)."""
    policy = factory.build_policy(
        "vllm",
        factory.PolicySettings(
            model=args.model,
            mode=args.mode,
            sampling=SamplingConfig(**sampling_settings(args)),
            rollout_token_budget=args.rollout_token_budget,
            engine_args=engine_kwargs,
        ),
    )
    return policy, policy if args.mode == "async" else policy.llm


def sampling_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``--sampling`` over the protocol's settings (and ``--ignore-eos``); a bad one is refused by name."""
    settings = {**dict(args.sampling), "ignore_eos": args.ignore_eos}
    try:
        SamplingConfig(**settings)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SystemExit(f"--sampling {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return settings


def make_config(args: argparse.Namespace, combiner: FitnessCombiner | None) -> ESConfig:
    return ESConfig(
        env_id=args.env,
        model=args.model,
        generations=args.generations,
        population=args.population,
        case_batch_size=args.case_batch,
        sigma_start=args.sigma_start,
        sigma_end=args.sigma_end,
        sigma_schedule=args.sigma_schedule,
        sigma_warmup_steps=args.sigma_warmup,
        sigma_total_steps=args.sigma_total_steps,
        alpha=args.alpha,
        reward_normalization=args.normalization,
        reward_normalization_ddof=args.ddof,
        reward_normalization_eps=args.eps,
        parameter_scope=args.scope,
        seed=args.seed,
        eval_seed=args.seed,
        eval_interval=args.eval_interval,
        history_file=args.history,
        max_turns=args.max_turns,
        max_tokens=args.max_tokens,
        max_model_len=args.max_model_len,
        dtype=args.dtype,
        load_format=args.load_format,
        exact_revert=args.exact_revert,
        concurrency=args.concurrency or member_concurrency(args.case_batch),
        **({"ignore_eos": True} if args.ignore_eos else {}),
        **({"fitness": {**scorer_settings(args), **combiner.model_dump()}} if combiner else {}),
        **({"perturbation": "lowrank", "rank": args.rank} if args.perturbation == "lowrank" else {}),
        **({"sampling": dict(args.sampling)} if args.sampling else {}),
        mirrored=args.mirrored,
        member_sampling=args.member_sampling,
        optimizer=args.optimizer,
        adam_beta1=args.adam_beta1,
        adam_beta2=args.adam_beta2,
        adam_eps=args.adam_eps,
    )


def make_engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``vllm.LLM`` keywords of every engine: CUDA graphs unless --enforce-eager; prefix caching stays on
    (the backend resets the prefix cache after every weight change); --engine-arg on top; low-rank
    engines get one LoRA slot per member."""
    kwargs = dict(
        worker_extension_cls=EXTENSION,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        load_format=args.load_format,
        enforce_eager=args.enforce_eager,
        seed=args.seed,
        trust_remote_code=True,
        **dict(args.engine_arg),
    )
    if args.perturbation == "lowrank":
        kwargs.update(
            enable_lora=True,
            max_loras=args.population,
            max_cpu_loras=args.population,
            max_lora_rank=lora_rank_slot(args.rank),
        )
    return kwargs


def make_env_kwargs(args: argparse.Namespace, skill: str | None = None) -> dict[str, Any]:
    env_kwargs: dict[str, Any] = {
        "max_turns": args.max_turns,
        "sandbox": args.sandbox,
        "skill": skill,
        **({"prompts": args.prompts} if args.prompts else {}),
        **dict(args.env_arg),
    }
    if args.max_tokens is not None:
        env_kwargs["max_tokens_per_turn"] = args.max_tokens
    return env_kwargs


def prompt_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``--prompts``: the profile's system prompt checked against its published SHA-256 before any
    engine starts, and recorded in the history's config (docs/protocol.md#prompt-profiles)."""
    if not args.prompts:
        return {}
    try:
        text = profile_prompt(args.prompts, registry.spec(args.env).system_prompt)
    except ValueError as exc:
        raise SystemExit(f"--prompts: {exc}") from None
    return {"prompts": args.prompts, "prompt_profile": PROFILE, "system_prompt_sha256": sha256(text)}


@dataclass
class ESRun:
    """A trainer with its engines open; ``checksum()`` is the full SHA-256 of the weights (on request:
    it copies them to the host).  ``pool`` or ``policy`` is what the members run on.  With
    ``--eval-only`` there is no trainer: ``evaluator`` runs on ``backend``'s replayed weights."""

    trainer: ESTrainer | None
    checksum: Callable[[], str]
    policy: Any = None
    pool: Any = None
    evaluator: Evaluator | None = None
    backend: Any = None
    setup: EvalSetup | None = None
    config: ESConfig | None = None


@contextlib.contextmanager
def open_run(args: argparse.Namespace) -> Iterator[ESRun]:
    """Everything ``main`` trains with, built from the flags, engines started (one engine in this
    process, or a Ray pool); closed on exit.  Benchmarks drive the same objects."""
    scorer, combiner = build_process_reward(args)
    try:
        if (args.train is None) != args.eval_only:
            raise SystemExit("give --train to train, or --eval-only (no training) without it")
        try:
            setup = evaluation_setup(args, lambda path: load_tasks(args.env, path, args.eval_limit))
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        train = load_tasks(args.env, args.train) if args.train else []
        config = make_config(args, combiner).model_copy(update={**setup.config, **prompt_settings(args)})
        if args.eval_only:
            try:
                eval_only_plan(
                    config,
                    load_history(args.resume) if args.resume else [],
                    args.resume_generations,
                    args.eval_generations,
                    args.final_eval,
                )
            except (OSError, ValueError) as exc:
                raise SystemExit(f"[es] --eval-only --resume {args.resume}: {exc}") from None
        if args.engines > 1 or args.engines_per_gpu > 1 or args.ray_address:
            if scorer is not None:
                raise SystemExit("--step-scorer runs on a single engine (the pool's actors score episodes themselves)")
            if args.mode == "async":
                print("[es] --engines: each engine runs its members in lockstep mode", file=sys.stderr)
            with pool_run(args, config, train, setup) as run:
                yield run
        else:
            with single_engine_run(args, config, train, setup, scorer, combiner) as run:
                yield run
    finally:
        if scorer is not None:
            scorer.close()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    with open_run(args) as run:
        assert run.setup is not None and run.evaluator is not None
        if run.trainer is None:  # --eval-only: replay --resume's updates step by step and evaluate
            try:
                history = eval_only(
                    run.config,
                    run.backend,
                    run.evaluator,
                    args.history,
                    source=args.resume,
                    replay_updates=args.resume_generations,
                    marks=args.eval_generations,
                    final=args.final_eval,
                    facts=budgets(args),
                )
            except ReplayMismatch as exc:  # a replayed generation whose fingerprint is not the history's
                raise SystemExit(f"[es] --eval-only --resume {args.resume}: {exc}") from None
        else:
            history = train_watched(args, run)
        report(history, args.history, run.checksum())
        retries = getattr(run.backend, "reset_retries", 0)
        if retries:  # the engine still held KV blocks right after a member's episodes (async mode)
            print(f"[es] prefix-cache resets asked again {retries} times while the engine released KV blocks")


def train_watched(args: argparse.Namespace, run: ESRun) -> list[dict[str, Any]]:
    """Train with a metrics row per generation (and for the initial and final held-out evaluations)
    in the JSONL, TensorBoard and W&B; the PNG of the rows beside the JSONL at the end."""
    assert run.trainer is not None and run.setup is not None and run.evaluator is not None
    path = args.metrics or metrics_path(args.history)
    progress = Progress(path, args.tensorboard, args.wandb, run.config.model_dump() if run.config else None)
    try:
        run.trainer.progress = progress.observe
        if run.trainer.start_generation == 0:
            for record in run.trainer.history:
                if record.get("generation") == -1:  # the initial held-out evaluation
                    progress.observe(record)
        history = run.setup.train(run.trainer, run.evaluator, budgets(args))
        if history and history[-1].get("final_eval"):
            progress.observe(history[-1])
    finally:
        progress.close()
    try:
        print(f"[es] metrics {path}; curve {plot_metrics(read_metrics(path), f'{path}.png')}")
    except ImportError as exc:  # an engine's venv without matplotlib: the rows are what matters
        print(f"[es] metrics {path}; no curve drawn ({exc}): python -m agent_envs.es.progress {path} OUT.png")
    return history


def budgets(args: argparse.Namespace) -> dict[str, Any]:
    """The episode budgets a final evaluation record states."""
    return {"max_turns": args.max_turns, "max_tokens": args.max_tokens}


def replay_source(args: argparse.Namespace, config: ESConfig, backend: Any) -> tuple[list[dict[str, Any]] | None, int]:
    """``--resume``: replay the history onto ``backend``, checking its fingerprints as it goes."""
    if not args.resume:
        return None, 0
    source = load_history(args.resume)
    try:
        head, start = resume(args.resume, config, backend, args.resume_generations)
    except ReplayMismatch as exc:
        raise SystemExit(f"[es] --resume {args.resume}: {exc}") from None
    checked = checked_generations(source, start)
    print(
        f"[es] replayed {start} generations from {args.resume}; weights {backend.fingerprint()} "
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


def describe_start(backend: Any, config: ESConfig) -> None:
    copies = sorted({str(s.get("revert_copy_reason") or "") for s in backend.status()} - {""})
    print(
        f"[es] weights {backend.fingerprint()}; exact revert: {'; '.join(copies) if copies else 'off'}; "
        f"{config.concurrency} episodes in flight per member",
        file=sys.stderr,
    )


@contextlib.contextmanager
def single_engine_run(
    args: argparse.Namespace,
    config: ESConfig,
    train: list[Any],
    setup: EvalSetup,
    scorer: StepScorer | None,
    combiner: FitnessCombiner | None,
) -> Iterator[ESRun]:
    env_kwargs = make_env_kwargs(args, setup.skill)
    lowrank = args.perturbation == "lowrank"
    if lowrank:  # before the engine starts: vLLM reads its LoRA kernel settings once; the history keeps which
        config.lora_kernels = use_tuned(args.model, args.population, lora_rank_slot(args.rank))
        print(f"[es] low-rank: {config.lora_kernels}", file=sys.stderr)
    policy, engine = build_policy(args, make_engine_kwargs(args))
    try:
        if lowrank:
            backend: Any = VLLMLowRank(engine, args.rank)
            config.lowrank_targets = [t.as_list() for t in backend.targets]
            config.base_checksum = backend.base_checksum
            print(
                f"[es] low-rank: {len(backend.targets)} weights, rank {args.rank}, every member an adapter; "
                f"weights {backend.fingerprint()}",
                file=sys.stderr,
            )
        else:
            backend = VLLMPerturbation(
                engine, scope=args.scope, exact_revert=args.exact_revert, revert_copy=args.revert_copy
            )
            describe_start(backend, config)
        config.tp_size = backend.tp_size

        def held_out(tasks: Sequence[Any], samples: int, seed: int, key_seeds: Any) -> Sequence[Any]:
            return run_episodes(
                args.env,
                tasks,
                policy,
                samples=samples,
                mode=args.mode,
                base_seed=seed,
                env_kwargs=env_kwargs,
                concurrency=args.eval_concurrency,
                progress=False,
                key_seeds=key_seeds,
            )

        evaluator = setup.evaluator(held_out, seed=args.seed, spec=registry.spec(args.env))

        def checksum() -> str:
            return combine_checksums(backend.checksum())

        if args.eval_only:
            yield ESRun(None, checksum, policy=policy, evaluator=evaluator, backend=backend, setup=setup, config=config)
            return
        head, start = replay_source(args, config, backend)

        def evaluate(batch: Sequence[Any], seed: int, generation: int, member: int, adapter: str | None = None):
            # through its adapter a member's episodes run beside every other member's, on one engine
            member_policy = policy if adapter is None else AdapterPolicy(policy, adapter)
            result = evaluate_member(
                member_policy,
                args.env,
                batch,
                seed,
                generation=generation,
                member=member,
                env_kwargs=env_kwargs,
                concurrency=args.concurrency,
                mode=args.mode,
                step_scorer=scorer,
                combiner=combiner,
                sampling=member_sampling_settings(config.member_sampling),
            )
            if args.toy_reward:
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
                args.history,
                adapter_dir=args.adapter_dir,
                history=history,
                start_generation=start,
                eval_hook=hook,
            )
        else:
            trainer = ESTrainer(
                config, backend, train, evaluate, args.history, history=history, start_generation=start, eval_hook=hook
            )
        trainer.sha256_each_generation = args.sha256_each_generation
        yield ESRun(trainer, checksum, policy=policy, evaluator=evaluator, backend=backend, setup=setup, config=config)
    finally:
        policy.close()


def report(history: list[dict[str, Any]], path: str, checksum: str) -> None:
    rewards = [r["reward_mean"] for r in history if "reward_mean" in r]
    if rewards:
        print(
            f"[es] done: {len(rewards)} generations, reward_mean first {rewards[0]:.4f} last {rewards[-1]:.4f} "
            f"(stdev over generations {statistics.pstdev(rewards):.4f}); history {path}"
        )
    print(f"[es] final weights checksum {checksum}")


@contextlib.contextmanager
def pool_run(args: argparse.Namespace, config: ESConfig, train: list[Any], setup: EvalSetup) -> Iterator[ESRun]:
    """``--engines N`` (and ``--engines-per-gpu K``): one vLLM engine per Ray actor; members run on idle
    engines, every update on all engines (fingerprints compared each generation), held-out episodes
    spread over the engines."""
    from agent_envs.scale.engines import vllm_spec
    from agent_envs.scale.es import PoolBackend, PoolESTrainer
    from agent_envs.scale.pool import EnginePool
    from agent_envs.scale.rollout import pool_run_episodes

    env_kwargs = make_env_kwargs(args, setup.skill)
    spec = vllm_spec(
        args.model,
        make_engine_kwargs(args),
        sampling=sampling_settings(args),
        rollout_token_budget=args.rollout_token_budget,
        engines_per_gpu=args.engines_per_gpu,
    )
    with EnginePool(spec, args.engines, ray_address=args.ray_address, mps=args.mps) as pool:
        backend = PoolBackend(pool, scope=args.scope, revert_copy=args.revert_copy)
        config.tp_size, config.exact_revert = backend.tp_size, True  # the pool always reverts exactly

        def held_out(tasks: Sequence[Any], samples: int, seed: int, key_seeds: Any) -> Sequence[Any]:
            return pool_run_episodes(
                pool,
                args.env,
                tasks,
                samples=samples,
                mode="lockstep",
                base_seed=seed,
                env_kwargs=env_kwargs,
                concurrency=args.eval_concurrency,
                progress=False,
                key_seeds=key_seeds,
            )

        evaluator = setup.evaluator(held_out, seed=args.seed, spec=registry.spec(args.env))
        if args.eval_only:
            yield ESRun(
                None, backend.checksum, pool=pool, evaluator=evaluator, backend=backend, setup=setup, config=config
            )
            return
        head, start = replay_source(args, config, backend)
        trainer = PoolESTrainer(
            config,
            backend,
            train,
            args.history,
            start_generation=start,
            history=setup.head(evaluator, config, head, start),
            eval_hook=setup.hook(evaluator),
            rollout_kwargs={"env_kwargs": env_kwargs, "concurrency": args.concurrency},
        )
        trainer.sha256_each_generation, trainer.toy_reward = args.sha256_each_generation, args.toy_reward
        yield ESRun(
            trainer, backend.checksum, pool=pool, evaluator=evaluator, backend=backend, setup=setup, config=config
        )


if __name__ == "__main__":
    main()
