"""``agent-envs es``'s settings: one validated model (:class:`ESSettings`) and the parser that fills it.

ES's own options take their defaults from the model (the parser leaves an option it was not given
out, and the model fills it in), and the model takes those of the options the history records from
the history's :class:`~agent_envs.es.history.ESConfig` (:data:`CONFIG_FIELDS`), so each default is
written once and ``--help`` prints it from there; the step-scorer and held-out-evaluation options
keep their homes (:mod:`agent_envs.rewards.options`, :mod:`agent_envs.es.evaluation`), shared with
``agent-envs eval``.
Checks that need several options at once (a low-rank run's mode, a mirrored population's parity,
Adam's betas) are the model's validators, so a bad combination is refused before any engine starts.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent_envs.envs import registry
from agent_envs.envs.registry import ENV_IDS
from agent_envs.es.evaluation import add_evaluation_arguments
from agent_envs.es.history import ESConfig
from agent_envs.es.lowrank import lora_engine_keywords, lora_rank_slot
from agent_envs.es.population_lora import KERNELS
from agent_envs.es.member_sampling import normalize_member_sampling
from agent_envs.es.normalize import NORMALIZATIONS
from agent_envs.es.progress import check_backends
from agent_envs.es.revert_copy import LOCATIONS
from agent_envs.es.schedule import SCHEDULES
from agent_envs.es.seeds import check_mirrored
from agent_envs.es.update_rule import OPTIMIZERS, check_adam
from agent_envs.policy.vllm import DEFAULT_ROLLOUT_TOKEN_BUDGET, REFERENCE_TOKEN_BUDGET
from agent_envs.rewards.options import add_scorer_arguments
from agent_envs.rollout.options import (
    SAMPLING_FLAGS,
    add_max_tokens_per_turn,
    add_sampling_flags,
    key_value,
    max_tokens_help,
    sampling_flags,
)
from agent_envs.scale.mps import MODES as MPS_MODES
from agent_envs.scoring.process import AGGREGATIONS

KeyValues = list[tuple[str, Any]]

#: vLLM's largest CUDA-graph batch when not told (tokens), and its largest default ``max_num_seqs`` (GPUs of
#: 70 GB and more): vLLM 0.26's ``CompilationConfig`` and ``EngineArgs`` defaults
VLLM_GRAPH_BATCH = 512
VLLM_MAX_SEQS = 1024

#: the settings the history's config records under an :class:`ESConfig` field with a default, and
#: that field: their defaults are ESConfig's (the reference's), and
#: :func:`agent_envs.esrun.run.make_config` copies them into it
CONFIG_FIELDS: dict[str, str] = {
    "generations": "generations",
    "population": "population",
    "case_batch": "case_batch_size",
    "sigma_start": "sigma_start",
    "sigma_end": "sigma_end",
    "sigma_schedule": "sigma_schedule",
    "sigma_warmup": "sigma_warmup_steps",
    "sigma_total_steps": "sigma_total_steps",
    "alpha": "alpha",
    "normalization": "reward_normalization",
    "ddof": "reward_normalization_ddof",
    "eps": "reward_normalization_eps",
    "scope": "parameter_scope",
    "seed": "seed",
    "eval_interval": "eval_interval",
    "exact_revert": "exact_revert",
    "mirrored": "mirrored",
    "member_sampling": "member_sampling",
    "optimizer": "optimizer",
    "adam_beta1": "adam_beta1",
    "adam_beta2": "adam_beta2",
    "adam_eps": "adam_eps",
}


def reference(setting: str) -> Any:
    """The default of ``setting``: its :class:`ESConfig` field's."""
    return ESConfig.model_fields[CONFIG_FIELDS[setting]].get_default(call_default_factory=True)


class ESSettings(BaseModel):
    """Every option of an ES run; the run (:func:`agent_envs.esrun.run.open_run`) is built from it."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    # what is trained, on what
    env: str = ENV_IDS[0]  # as agent-envs eval's
    model: str
    train: str | None = None
    history: str
    # the population and its schedule (the reference's defaults, ESConfig's)
    generations: int = reference("generations")
    population: int = reference("population")
    case_batch: int = reference("case_batch")
    sigma_start: float = reference("sigma_start")
    sigma_end: float = reference("sigma_end")
    sigma_schedule: str = reference("sigma_schedule")
    sigma_warmup: int = reference("sigma_warmup")
    sigma_total_steps: int | None = reference("sigma_total_steps")
    alpha: float = reference("alpha")
    normalization: str = reference("normalization")
    ddof: int = reference("ddof")
    eps: float = reference("eps")
    scope: str = reference("scope")
    seed: int = reference("seed")
    eval_interval: int = reference("eval_interval")
    eval_concurrency: int = 16
    # resume and revert
    resume: str | None = None
    resume_generations: int | None = None
    exact_revert: bool = reference("exact_revert")
    revert_copy: str = "auto"
    perturbation: str = "full"
    rank: int = 4
    lora_kernel: str = "auto"
    adapter_dir: str | None = None
    sha256_each_generation: bool = False
    # the update rule (ours; the defaults are the reference's)
    mirrored: bool = reference("mirrored")
    member_sampling: str = reference("member_sampling")
    optimizer: str = reference("optimizer")
    adam_beta1: float = reference("adam_beta1")
    adam_beta2: float = reference("adam_beta2")
    adam_eps: float = reference("adam_eps")
    # progress
    metrics: str | None = None
    tensorboard: str | None = None
    wandb: str | None = None
    # episodes
    max_turns: int = 50
    max_tokens_per_turn: int | None = None
    sandbox: str = "bwrap"
    prompts: str | None = None
    env_arg: KeyValues = Field(default_factory=list)
    sampling: KeyValues = Field(default_factory=list)
    ignore_eos: bool = False
    toy_reward: bool = False
    concurrency: int | None = None
    mode: str | None = None
    # engines
    dtype: str = "bfloat16"
    max_model_len: int = 32768
    gpu_memory_utilization: float = 0.85
    load_format: str = "auto"
    rollout_token_budget: int = DEFAULT_ROLLOUT_TOKEN_BUDGET
    engine_arg: KeyValues = Field(default_factory=list)
    enforce_eager: bool = False
    engines: int = 1
    engines_per_gpu: int = 1
    mps: str = "auto"
    ray_address: str | None = None
    # process rewards: the combiner here, the scorer's options in agent_envs.rewards.options
    process_weight: float = 0.0
    process_aggregation: str | None = None
    step_scorer: str | None
    judge_url: str | None
    judge_model: str | None
    judge_prompt: str
    judge_timeout: float
    judge_retries: int
    prm_base: str | None
    prm_adapter: str | None
    # held-out evaluation (agent_envs.es.evaluation)
    eval: list[str]
    eval_limit: int | None
    eval_samples: int
    initial_eval: bool
    final_eval: bool
    final_eval_samples: int
    eval_only: bool
    eval_generations: str | None
    eval_key_seed_file: str | None
    eval_key_seed_sha256: str | None
    skill_file: str | None
    write_trace_logs: bool
    trace_log_dir: str | None
    eval_out: str | None

    @property
    def pooled(self) -> bool:
        """Engines as Ray actors (``--engines``, ``--engines-per-gpu`` or ``--ray-address``)."""
        return self.engines > 1 or self.engines_per_gpu > 1 or self.ray_address is not None

    @property
    def lora_slots(self) -> dict[str, Any]:
        """A low-rank engine's LoRA sizes, derived from the population once: one adapter slot per
        member, resident and on the host, at the rank's kernel slot, on the perturbed layers only.  The
        engine's keywords and the LoRA-kernel chooser both read them here."""
        return lora_engine_keywords(self.population, self.rank)

    @property
    def graph_batch(self) -> dict[str, Any]:
        """The engine keyword that puts a low-rank generation's decode steps inside CUDA graphs.  All
        P x B sequences decode at once, and vLLM captures graphs only up to 512 tokens when not told
        (``min(2 x max_num_seqs, 512)``): from P x B = 1,024 (P = 256 x B = 4, P = 64 x B = 16) every
        decode step would run without graphs, each layer's LoRA kernels launched from Python.  Capture up
        to P x B, at most the sequences a step can hold (``max_num_seqs`` if given, else vLLM's largest
        default, 1,024); nothing where vLLM's default already covers it, graphs are off, or the user set the
        graph sizes (``compilation_config``, ``max_cudagraph_capture_size``, ``cudagraph_capture_sizes``)."""
        given = dict(self.engine_arg)
        batch = min(self.population * self.case_batch, int(given.get("max_num_seqs", VLLM_MAX_SEQS)))
        own = given.keys() & {"compilation_config", "max_cudagraph_capture_size", "cudagraph_capture_sizes"}
        if batch <= VLLM_GRAPH_BATCH or self.enforce_eager or own:
            return {}
        return {"compilation_config": {"max_cudagraph_capture_size": batch}}

    @model_validator(mode="after")
    def _perturbation(self) -> ESSettings:
        """Low-rank members share one engine at once, so they need the async engine and one engine."""
        if self.lora_kernel not in KERNELS:
            raise ValueError(f"--lora-kernel: one of {', '.join(KERNELS)}, not {self.lora_kernel!r}")
        if self.perturbation == "full":
            if self.lora_kernel in ("population", "matmul"):
                raise ValueError("--lora-kernel applies to --perturbation lowrank (full-rank members have no adapters)")
            self.mode = self.mode or "lockstep"
            return self
        if self.mode == "lockstep":
            raise ValueError("--perturbation lowrank runs every member at once on one AsyncLLM: use --mode async")
        if self.pooled:
            raise ValueError(
                "--perturbation lowrank serves the whole population from one engine; drop --engines/--ray-address"
            )
        if self.exact_revert:
            raise ValueError(
                "--exact-revert does not apply to --perturbation lowrank: its base weights are never perturbed"
            )
        try:
            lora_rank_slot(self.rank)
        except ValueError as exc:
            raise ValueError(f"--rank: {exc}") from None
        self.mode = "async"
        return self

    @model_validator(mode="after")
    def _update_rule(self) -> ESSettings:
        """The update rule's and progress options' bad values."""
        self.member_sampling = normalize_member_sampling(self.member_sampling)
        check_mirrored(self.population, self.mirrored)
        if self.optimizer == "adam":
            check_adam({"beta1": self.adam_beta1, "beta2": self.adam_beta2, "eps": self.adam_eps})
        check_backends(self.tensorboard, self.wandb)
        return self

    def namespace(self) -> argparse.Namespace:
        """The settings as the shared option groups' helpers read them (``scorer_from_args``,
        ``evaluation_setup``)."""
        return argparse.Namespace(**dict(self))


class _Help(argparse.HelpFormatter):
    """States each option's default: the model's for ES's own options, the parser's for the rest."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        field = ESSettings.model_fields.get(action.dest)
        default = action.default
        if default is argparse.SUPPRESS and field is not None and not field.is_required():
            default = field.get_default(call_default_factory=True)
        if "default" in text or not action.option_strings or default in (None, False, [], argparse.SUPPRESS):
            return text
        return f"{text} (default: {str(default).replace('%', '%%')})"


def build_parser(prog: str = "agent-envs es train", eval_only: bool = False) -> argparse.ArgumentParser:
    """The options of ``agent-envs es train`` (and ``evaluate-only``): every one with its help."""
    what = "replay a history and evaluate, no training" if eval_only else "train with seeded evolution strategies"
    p = argparse.ArgumentParser(
        prog=prog,
        description=f"{what} on a vLLM model (docs/protocol.md#es-maths, docs/scaling.md)",
        formatter_class=_Help,
    )
    _run_options(p)
    _schedule_options(p)
    _revert_options(p)
    _update_rule_options(p)
    _episode_options(p)
    _engine_options(p)
    p.add_argument(
        "--process-weight", type=float, help="fitness = (1 - w) * outcome + w * process score (0: outcome only)"
    )
    p.add_argument(
        "--process-aggregation",
        choices=list(AGGREGATIONS),
        help="how step scores become the process score (default: the scorer's own)",
    )
    for action in p._actions:  # ES's own options: left out unless given, the model fills them in
        if action.dest in ESSettings.model_fields:
            action.default = argparse.SUPPRESS
    add_scorer_arguments(p)  # these keep their homes' defaults
    add_evaluation_arguments(p)  # held-out sets, initial/final/eval-only, key-seed map, skill, trace logs
    return p


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", choices=ENV_IDS, help="the environment trained on")
    p.add_argument("--model", required=True, help="any vLLM model path or name")
    p.add_argument(
        "--train", help="training tasks: a file the environment's loader reads (JSONL, ...) or a name such as builtin"
    )
    p.add_argument("--history", required=True, help="history.json path (rewritten every generation)")
    p.add_argument("--resume", help="history to replay before training (evaluate-only: the history evaluated)")
    p.add_argument("--resume-generations", type=int, help="replay only the first K updates")
    p.add_argument(
        "--sha256-each-generation",
        action="store_true",
        help="also record the full SHA-256 of the weights every generation (seconds each; the cheap "
        "fingerprint is always recorded, the SHA-256 always printed at the end)",
    )
    p.add_argument(
        "--metrics",
        metavar="PATH",
        help="per-generation metrics rows, appended and flushed (default: <history>.metrics.jsonl; a PNG "
        "of them is drawn beside it at the end)",
    )
    p.add_argument("--tensorboard", metavar="DIR", help="also log the metrics to TensorBoard here")
    p.add_argument("--wandb", metavar="PROJECT", help="also log the metrics to this W&B project")


def _schedule_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--generations", type=int, help="updates to train")
    p.add_argument("--population", type=int, help="members per generation (low-rank: also the engine's LoRA slots)")
    p.add_argument("--case-batch", type=int, help="training tasks per generation, the same for every member")
    p.add_argument("--sigma-start", type=float, help="noise scale at the first generation")
    p.add_argument("--sigma-end", type=float, help="noise scale at the end of the schedule")
    p.add_argument("--sigma-schedule", choices=SCHEDULES, help="how sigma moves from start to end")
    p.add_argument("--sigma-warmup", type=int, help="generations at sigma-start before the schedule")
    p.add_argument("--sigma-total-steps", type=int, help="schedule length (default: --generations)")
    p.add_argument("--alpha", type=float, help="learning rate of the update theta += alpha/N * sum w_i eps_i")
    p.add_argument("--normalization", choices=NORMALIZATIONS, help="how member rewards become weights")
    p.add_argument("--ddof", type=int, help="delta degrees of freedom of the z-score's standard deviation")
    p.add_argument("--eps", type=float, help="added to the z-score's standard deviation")
    p.add_argument("--scope", choices=["full", "all_linear"], help="which weights are perturbed")
    p.add_argument("--seed", type=int, help="base seed of the member seeds and of held-out evaluation")
    p.add_argument("--eval-interval", type=int, help="evaluate after every N-th update (0: no interval evaluation)")
    p.add_argument("--eval-concurrency", type=int, help="held-out episodes in flight")


def _revert_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exact-revert", action="store_true", help="restore weights bit-exactly after each member")
    p.add_argument(
        "--revert-copy",
        choices=LOCATIONS,
        help="where --exact-revert (and the pool, which always reverts exactly) keeps the weights: auto = "
        "on the GPU when it has room, else on the host with the reason printed; host = as before",
    )
    p.add_argument(
        "--perturbation",
        choices=["full", "lowrank"],
        help="full: the reference's per-element noise, members one after another; lowrank: a rank-R "
        "product per weight, every member a LoRA adapter, all served at once (async mode)",
    )
    p.add_argument("--rank", type=int, help="--perturbation lowrank: the rank R of each member's noise")
    p.add_argument(
        "--lora-kernel",
        choices=KERNELS,
        help="--perturbation lowrank: the members' adapters on kernels made for one population (population: "
        "docs/scaling.md#population-kernels), with the expand folded into each layer's matmul (matmul: "
        "docs/scaling.md#folded-into-the-matmul), or on vLLM's multi-LoRA kernels (vllm); auto (the default): "
        "matmul on a CUDA GPU up to 256 members, population above, vllm elsewhere",
    )
    p.add_argument(
        "--adapter-dir", help="--perturbation lowrank: where each generation's adapters are written (default /dev/shm)"
    )


def _update_rule_options(p: argparse.ArgumentParser) -> None:
    """Ours, not the reference's (the defaults are the reference's): recorded in the history's config."""
    p.add_argument(
        "--mirrored",
        action="store_true",
        help="members in pairs (+eps, -eps) sharing one seed, the update using both (population must be even)",
    )
    p.add_argument(
        "--member-sampling",
        help="how members' episodes are sampled: protocol (the policy's own, --sampling), greedy (temperature "
        "0, top-p 1, top-k off) or temperature=T; held-out evaluation keeps the policy's own",
    )
    p.add_argument(
        "--optimizer",
        choices=list(OPTIMIZERS),
        help="sgd: the reference's plain update; adam: Adam on the update direction (float32 moments beside "
        "the weights, rebuilt by --resume's replay)",
    )
    p.add_argument("--adam-beta1", type=float, help="--optimizer adam: first-moment decay")
    p.add_argument("--adam-beta2", type=float, help="--optimizer adam: second-moment decay")
    p.add_argument("--adam-eps", type=float, help="--optimizer adam: added to the second moment's root")


def _episode_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-turns", type=int, help="generations per episode")
    add_max_tokens_per_turn(
        p, max_tokens_help((env_id, registry.spec(env_id).max_tokens_per_turn) for env_id in ENV_IDS)
    )
    p.add_argument("--sandbox", choices=["bwrap", "none", "docker"], help="where tool commands run")
    p.add_argument(
        "--prompts",
        metavar="DIR",
        help="prompt profile: the reference's system prompt, checked against its published SHA-256 "
        "(docs/protocol.md#prompt-profiles)",
    )
    p.add_argument(
        "--env-arg",
        action="append",
        type=key_value,
        metavar="KEY=VALUE",
        help="extra environment keyword (value parsed as JSON), e.g. single_turn=true",
    )
    p.add_argument(
        "--sampling",
        action="append",
        type=key_value,
        metavar="KEY=VALUE",
        help="a sampling setting instead of the protocol's (agent_envs.policy.sampling.SamplingConfig), "
        "e.g. temperature=0.7; recorded in the history's config",
    )
    add_sampling_flags(p, "the protocol's; the same as --sampling KEY=VALUE, recorded so")
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
        "--concurrency",
        type=int,
        help="a member's episodes in flight (default: case batch x samples, all of them at once)",
    )
    p.add_argument(
        "--mode",
        choices=["lockstep", "async"],
        help="lockstep: vllm.LLM, one batch per turn (reference; the default for --perturbation full); "
        "async: AsyncVLLMPolicy, continuous (the default, and the only mode, for lowrank)",
    )


def _engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", help="the engine's dtype")
    p.add_argument("--max-model-len", type=int, help="the engine's context length")
    p.add_argument("--gpu-memory-utilization", type=float, help="the engine's share of GPU memory")
    p.add_argument("--load-format", help='vLLM load format; "dummy" gives random weights (smoke runs)')
    p.add_argument(
        "--rollout-token-budget",
        type=int,
        help=f"lockstep microbatch size; 0: a whole turn per engine call, {REFERENCE_TOKEN_BUDGET}: the reference's",
    )
    p.add_argument(
        "--engine-arg",
        action="append",
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
        "--engines", type=int, help="engines as Ray actors, one GPU each; members go to idle engines (docs/scaling.md)"
    )
    p.add_argument(
        "--engines-per-gpu",
        type=int,
        help="pack K engines on each GPU (1/K of a GPU and of --gpu-memory-utilization each; started one "
        "after another); --engines counts all of them",
    )
    p.add_argument(
        "--mps",
        choices=MPS_MODES,
        help="engines sharing a GPU run under CUDA MPS when the host offers it (auto) or never (off)",
    )
    p.add_argument("--ray-address", help="join this Ray cluster (multi-node) instead of a local one")


def parse_settings(argv: Sequence[str] | None = None, eval_only: bool = False, prog: str | None = None) -> ESSettings:
    """The command line as settings; a bad value or combination exits 2 with the parser's usage, as
    argparse does, before anything is loaded or started."""
    parser = build_parser(prog or ("agent-envs es evaluate-only" if eval_only else "agent-envs es train"), eval_only)
    values = vars(parser.parse_args(argv))
    flags = sampling_flags(values)  # --temperature X is --sampling temperature=X, as eval spells it
    for flag in SAMPLING_FLAGS:
        values.pop(flag, None)
    if flags:
        values["sampling"] = [*(values.get("sampling") or []), *flags.items()]
    if eval_only:
        values["eval_only"] = True
    try:
        return ESSettings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        error = first.get("ctx", {}).get("error")
        where = ".".join(str(part) for part in first["loc"])
        parser.error(str(error) if error is not None else f"--{where.replace('_', '-')}: {first['msg']}")
        raise  # parser.error exits
