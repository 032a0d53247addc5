"""``agent-envs``: evaluate a policy on an environment, summarise runs, compare two runs.

``agent-envs eval`` with no model runs the embedded default: the environment's built-in offline
tasks and the small CPU chat model, with reduced budgets so it finishes in minutes on a laptop.

Exit status of ``eval``: 0 done; 2 bad input, or the run directory cannot be written (checked
before the policy is built; a full disk mid-run is reported at its first failed write); 3 every
episode ended in an error (e.g. the server is down), so there is no result; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import json
import math
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from agent_envs import __version__
from agent_envs.core.atomic import atomic_write
from agent_envs.core.prompts import read_skill
from agent_envs.core.spec import EnvSpec, Metric
from agent_envs.envs import registry
from agent_envs.envs.registry import ENV_IDS
from agent_envs.esrun.export import export_and_print, export_parser
from agent_envs.policy.base import Policy
from agent_envs.policy.factory import BACKENDS, PolicySettings, build_policy, default_policy
from agent_envs.policy.sampling import SamplingConfig
from agent_envs.rewards.options import add_scorer_arguments, scorer_from_args, scorer_settings
from agent_envs.rollout.metrics import compare_means, group_metrics, paired_bootstrap, summarize
from agent_envs.rollout.options import env_kwargs as build_env_kwargs
from agent_envs.rollout.options import add_sampling_flags, key_value, sampling_flags
from agent_envs.core.tasks import task_id
from agent_envs.rollout.records import ERROR_TERMINATIONS, NotARecord, NotARecordsFile, load_records
from agent_envs.rollout.outputs import write_outputs
from agent_envs.rollout.resume import CannotResume, DamagedRecords, check_resume, read_records
from agent_envs.rollout.runfolder import FolderNotWritable, RecordsExist, default_run_dir, run_folder
from agent_envs.rollout.runlock import RunLockError
from agent_envs.rollout.runner import DEFAULT_BASE_SEED, MODES
from agent_envs.scale.execute import execute
from agent_envs.sandbox.base import SandboxUnavailable
from agent_envs.sandbox.factory import BACKENDS as SANDBOX_BACKENDS
from agent_envs.sandbox.factory import check_backend

if TYPE_CHECKING:
    from agent_envs.scale.pool import EnginePool

#: exit status of ``eval`` when every episode ended in an error (no result to report)
EXIT_ALL_ERRORED = 3


class UsageError(Exception):
    """Bad command-line input; printed without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-envs", description=__doc__.splitlines()[0].replace("``", ""))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, help="agent-envs COMMAND --help shows its options")

    ev = sub.add_parser("eval", help="run episodes and write records, summary and trace logs")
    ev.add_argument("--env", choices=ENV_IDS, default=ENV_IDS[0], help=f"the environment (default {ENV_IDS[0]})")
    ev.add_argument(
        "--data",
        action="append",
        default=None,
        metavar="[NAME=]SPEC",
        help="dataset spec for the env's loader (builtin, a JSONL path, dapo, aime, ...); repeat it "
        "to run each set into OUT/NAME and print their card (docs/cards.md)",
    )
    ev.add_argument(
        "--policy",
        choices=tuple(BACKENDS),
        help="default: openai with --base-url, transformers with --model, else cpu",
    )
    ev.add_argument("--model", help="model path or id (transformers, vllm, openai)")
    ev.add_argument(
        "--base-url", action="append", default=[], dest="base_urls", help="OpenAI-compatible endpoint (repeatable)"
    )
    ev.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="openai policy: limit per HTTP attempt (default 600)",
    )
    ev.add_argument(
        "--request-retries",
        type=int,
        default=None,
        metavar="N",
        help="openai policy: extra attempts after a 429, a 5xx or a transport error, waiting what "
        "Retry-After says or else exponentially longer (default 3)",
    )
    ev.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="openai policy: bearer token for the endpoint (default: $OPENAI_API_KEY when set; never recorded)",
    )
    ev.add_argument(
        "--tool-choice",
        choices=["none", "auto", "required"],
        default=None,
        help="openai policy, native tool-call variants: the tool_choice sent with the tools (default none: the "
        "calls stay in the text, where the native parser reads them; auto/required need a server that "
        "returns tool_calls)",
    )
    ev.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="passed to vllm.LLM (value parsed as JSON), e.g. tensor_parallel_size=2",
    )
    ev.add_argument(
        "--env-arg",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help='extra environment keyword (value parsed as JSON), e.g. scorer="exact"',
    )
    ev.add_argument(
        "--samples", type=int, default=1, help="episodes per task, each with its own trajectory seed (default 1)"
    )
    ev.add_argument(
        "--skill-file",
        type=Path,
        default=None,
        help="skill text appended to the system prompt (docs/protocol.md#skill-injection)",
    )
    ev.add_argument(
        "--prompts",
        type=Path,
        default=None,
        metavar="DIR",
        help="prompt profile: a folder holding the reference's system prompt as DIR/<env>/system.txt, "
        "checked against its published SHA-256 (docs/protocol.md#prompt-profiles)",
    )
    add_sampling_flags(ev)
    ev.add_argument("--seed", type=int, default=DEFAULT_BASE_SEED, help="base seed of the trajectory seeds")
    ev.add_argument(
        "--mode",
        choices=MODES,
        default="async",
        help="async (default): each episode asks for its next turn when ready; lockstep: one batched "
        "generation per turn for all episodes in flight",
    )
    ev.add_argument("--concurrency", type=int, default=None, help="episodes in flight (async) or batch size (lockstep)")
    ev.add_argument(
        "--tool-workers",
        type=int,
        default=None,
        help="threads stepping environments and tools (default: --concurrency)",
    )
    ev.add_argument(
        "--engines",
        type=int,
        default=1,
        help="run N engines as Ray actors (vllm: one GPU or TP group each; docs/scaling.md)",
    )
    ev.add_argument("--ray-address", default=None, help="join this Ray cluster (multi-node) instead of a local one")
    ev.add_argument(
        "--sandbox",
        choices=SANDBOX_BACKENDS,
        default="bwrap",
        help="where tool commands run (default bwrap; docs/sandbox.md)",
    )
    ev.add_argument(
        "--max-turns",
        type=int,
        default=None,
        help=f"generations per episode (default: the environment's{_row_defaults('max_turns')})",
    )
    ev.add_argument(
        "--max-tokens-per-turn",
        type=int,
        default=None,
        help=f"tokens per generation (default: the environment's{_row_defaults('max_tokens_per_turn')})",
    )
    ev.add_argument("--out", type=Path, default=None, help="run directory (default runs/<env>-<time>)")
    ev.add_argument(
        "--resume", action="store_true", help="keep finished records in --out, re-run missing or failed ones"
    )
    ev.add_argument("--limit", type=int, default=None, help="first N tasks only")
    ev.add_argument(
        "--trace-logs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write one markdown trace log per episode under OUT/trace_logs (docs/protocol.md#trace-logs)",
    )
    ev.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress on stderr (a bar on a terminal, otherwise a line every 15 s and at the end)",
    )
    ev.add_argument("--no-report", action="store_true", help="do not write report.html at the end")
    ev.add_argument(
        "--token-trajectories",
        action="store_true",
        help="record each episode's token ids and log-probabilities (docs/rl.md; records grow)",
    )
    add_scorer_arguments(ev)

    sm = sub.add_parser("summarize", help="print the metrics of one or more run directories")
    sm.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run folders (or their records.jsonl)")
    sm.add_argument("--group", type=int, default=None, metavar="K", help="also metrics per group of K samples")
    sm.add_argument(
        "--best-by",
        default="mean_score",
        metavar="METRIC",
        help="with --group: the metric that picks the best group (e.g. anls_mean4)",
    )
    sm.add_argument("--card", action="store_true", help="print the card-style summary of the runs (docs/cards.md)")
    sm.add_argument("--json", action="store_true", help="print the summaries as one JSON object instead of tables")

    cp = sub.add_parser("compare", help="paired bootstrap of two runs on the same tasks (B vs A)")
    cp.add_argument("run_a", type=Path, metavar="RUN_A", help="the baseline run folder (A)")
    cp.add_argument("run_b", type=Path, metavar="RUN_B", help="the run compared with it, on the same tasks (B)")
    cp.add_argument("--bootstrap-samples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    cp.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")

    rp = sub.add_parser("report", help="write a self-contained HTML report of one run, or of runs side by side")
    rp.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="one run folder, or several side by side")
    rp.add_argument(
        "--out", type=Path, default=None, help="output file (default RUN_DIR/report.html, or RUN_A/report-vs-B.html)"
    )

    sub.add_parser(  # the options of agent-envs es export, which it is
        "export-checkpoint",
        help="replay an ES history on a fresh engine and save it, with "
        "manifest.json and verification.json (docs/scaling.md)",
        parents=[export_parser(add_help=False)],
    )
    vc = sub.add_parser("verify-checkpoint", help="re-check an exported folder on a fresh engine")
    vc.add_argument("folder", type=Path, help="a folder written by export-checkpoint")
    vc.add_argument("--tp", type=int, default=None, help="load with this tensor_parallel_size (the manifest's)")
    vc.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="passed to vllm.LLM, e.g. dtype=float32",
    )
    tk = sub.add_parser("export", help="write a run's episodes for a trainer (token sequences, masks, rewards)")
    tk.add_argument("run", type=Path, metavar="RUN_DIR", help="a run made with eval --token-trajectories")
    tk.add_argument(
        "--format", choices=("tokens",), required=True, help="tokens: one training sequence per episode (docs/rl.md)"
    )
    tk.add_argument("--out", type=Path, default=None, help="output file (default RUN_DIR/tokens.jsonl)")

    # listed for --help only: main() hands everything after "serve" to the server's own parser
    sub.add_parser("serve", help="serve a policy over HTTP (agent-envs serve --help)")
    # likewise "es": its modes and options live in agent_envs.esrun
    sub.add_parser("es", help="train with evolution strategies, evaluate or export a history (agent-envs es --help)")
    return parser


# --------------------------------------------------------------------------- eval
def _row_defaults(option: str) -> str:
    """For --help: the backends whose row sets ``option``'s default (``Backend.run_defaults``)."""
    return "".join(
        f"; {row.run_defaults[option]} with --policy {kind}"
        for kind, row in BACKENDS.items()
        if option in row.run_defaults
    )


def _policy_kind(args: argparse.Namespace) -> str:
    return str(args.policy or default_policy(args.model, args.base_urls))


def _rows_with(fact: Callable[[Any], object]) -> str:
    """``--policy A or --policy B``: the backends whose row has ``fact``, for messages."""
    return " or ".join(f"--policy {kind}" for kind, row in BACKENDS.items() if fact(row))


def _sampling(args: argparse.Namespace) -> SamplingConfig:
    return SamplingConfig(**sampling_flags(args))


def _check_policy_flags(kind: str, args: argparse.Namespace) -> None:
    """What the backend's row of the factory table needs, as flags."""
    backend = BACKENDS[kind]
    if backend.needs_model and not args.model:
        raise UsageError(f"--policy {kind} needs --model")
    if backend.needs_endpoint and not args.base_urls:
        raise UsageError(f"--policy {kind} needs at least one --base-url")
    _check_model_path(kind, args)


def _check_model_path(kind: str, args: argparse.Namespace) -> None:
    """A local ``--model`` path that does not exist is one line where the policy would be built
    (the loaders took it for a hub id and ended in a traceback)."""
    backend = BACKENDS[kind]
    model = args.model or ""
    if backend.needs_model and not backend.needs_endpoint and model.startswith(("/", ".", "~")):
        if not Path(model).expanduser().exists():
            raise UsageError(f"--model {model}: no such file or folder (a hub model id is written owner/name)")


def _baseline(env_id: str) -> Callable[[Any], str]:
    """The environment's ``scripted`` answer: one real tool call, then an answer read off its output."""
    baseline = registry.spec(env_id).baseline
    if baseline is None:
        raise UsageError(f"{env_id} has no scripted baseline")
    return baseline


def _policy_settings(args: argparse.Namespace, script: Callable[[Any], Any] | None = None) -> PolicySettings:
    return PolicySettings(
        model=args.model,
        base_urls=args.base_urls,
        sampling=_sampling(args),
        engine_args=dict(args.engine_arg),
        mode=args.mode,
        samples_per_row=args.samples,
        timeout_s=args.request_timeout,
        max_retries=args.request_retries,
        api_key=args.api_key,
        tool_choice=args.tool_choice or "none",
        script=script,
    )


def make_policy(kind: str, args: argparse.Namespace, env_id: str) -> Policy:
    """Build the policy from the factory table; vLLM gets its async engine in async mode."""
    _check_policy_flags(kind, args)
    settings = _policy_settings(args, _baseline(env_id) if BACKENDS[kind].scripted_baseline else None)
    try:
        return build_policy(kind, settings)
    except ImportError as exc:
        raise UsageError(f"this installation cannot build the {kind} policy ({exc})") from exc


def _check_checkpoint_tp(model: str, engine_args: dict[str, Any]) -> None:
    """An exported checkpoint loads only with the TP size its manifest names."""
    from agent_envs.es.checkpoint import CheckpointError, check_tp

    try:
        check_tp(model, engine_args.get("tensor_parallel_size"))
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None


def _check_request_flags(kind: str, args: argparse.Namespace) -> None:
    http = BACKENDS[kind].http
    if not http and (args.api_key is not None or args.tool_choice is not None):
        raise UsageError(f"--api-key and --tool-choice apply to {_rows_with(lambda row: row.http)} only")
    if not http and (args.request_timeout is not None or args.request_retries is not None):
        raise UsageError(
            f"--request-timeout and --request-retries apply to {_rows_with(lambda row: row.http)} only "
            "(the judge's are --judge-timeout and --judge-retries)"
        )
    from agent_envs.policy.openai import check_request_limits

    try:
        check_request_limits(args.request_timeout, args.request_retries, ("--request-timeout", "--request-retries"))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _check_endpoints(policy: Policy | EnginePool) -> None:
    """A --base-url with no server behind it is one line before any episode, not every episode's error."""
    from agent_envs.policy.openai import OpenAIPolicy

    if isinstance(policy, OpenAIPolicy):
        try:
            policy.check_endpoints()
        except ConnectionError as exc:
            policy.close()
            raise UsageError(f"{exc}; start the server or fix --base-url") from None


def _hold_run_folder(out: Path, resume: bool, hold: contextlib.ExitStack) -> Path:
    """``out`` held by this run until ``hold`` closes (rollout.runfolder.run_folder); its records path."""
    try:
        return hold.enter_context(run_folder(out, resume=resume))
    except FolderNotWritable as exc:
        raise UsageError(f"--out {exc}") from None
    except RecordsExist as exc:
        raise UsageError(f"{exc} already has records: pass --resume to continue, or choose another --out") from None
    except (RunLockError, NotARecordsFile) as exc:
        raise UsageError(str(exc)) from None


def _raise_if_output(exc: OSError, out: Path) -> None:
    """A failed write into the run directory (a full disk, ...) as one line instead of a traceback."""
    name = exc.filename
    if name is not None and Path(os.path.abspath(name)).is_relative_to(os.path.abspath(out)):
        raise UsageError(
            f"cannot write {name}: {exc.strerror or exc}; finished records are kept "
            f"(rerun with --resume once it can be written)"
        ) from None


def _error_warning(records: Sequence[Any]) -> str | None:
    """One line on episodes that ended in an error, which are not model failures."""
    errors = [r for r in records if r.termination_reason in ERROR_TERMINATIONS]
    if not errors:
        return None
    reasons = ", ".join(
        f"{k}: {sum(1 for r in errors if r.termination_reason == k)}"
        for k in sorted({r.termination_reason for r in errors})
    )
    first = str(errors[0].react_error or "")[:200]
    return (
        f"[agent-envs] warning: {len(errors)} of {len(records)} episode(s) ended in an error ({reasons}; "
        f"first: {first}); 'mean' scores them 0, 'mean_non_err' leaves them out"
    )


def make_pool(kind: str, args: argparse.Namespace) -> EnginePool:
    """``--engines N`` / ``--ray-address``: one engine per Ray actor, built from the same engine args."""
    if args.engines < 1:
        raise UsageError("--engines must be >= 1")
    if not BACKENDS[kind].pooled:
        pooled = " or ".join(k for k, row in BACKENDS.items() if row.pooled)
        raise UsageError(f"--engines runs --policy {pooled}, not {kind}")
    _check_policy_flags(kind, args)
    try:
        from agent_envs.scale.engines import pool_spec
        from agent_envs.scale.pool import EnginePool
    except ImportError as exc:
        raise UsageError(f"--engines needs Ray: pip install 'agent-envs[ray]' ({exc})") from exc
    return EnginePool(pool_spec(kind, _policy_settings(args), args.env), args.engines, ray_address=args.ray_address)


def _load_tasks(
    env_id: str, data: str, env_args: dict[str, Any], limit: int | None
) -> tuple[list[Any], dict[str, Any]]:
    """The run's tasks and the environment's outcome-relevant settings (``env_settings``)."""
    import gymnasium as gym

    try:  # the run's own settings, so a bad one is reported before any model loads
        env = gym.make(env_id, dataset=data, **env_args)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid settings for {env_id}: {exc}") from exc
    try:
        tasks = list(env.get_wrapper_attr("tasks"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load --data {data!r} for {env_id}: {exc}") from exc
    finally:
        env.close()
    return (tasks if limit is None else tasks[:limit]), dict(env.get_wrapper_attr("env_settings"))


def _check_resume(path: Path, config: dict[str, Any]) -> None:
    try:
        check_resume(path, config)
    except CannotResume as exc:
        raise UsageError(str(exc)) from None


def _unique_ids(tasks: Sequence[Any], data: str) -> None:
    """Records are keyed by task id: a dataset that repeats one is refused before any model loads."""
    rows: dict[str, list[int]] = {}
    for row, task in enumerate(tasks, 1):
        rows.setdefault(task_id(task), []).append(row)
    repeated = next(((t, r) for t, r in rows.items() if len(r) > 1), None)
    if repeated is not None:
        where = ", ".join(map(str, repeated[1][:5]))
        raise UsageError(
            f"--data {data}: task id {repeated[0]!r} is used by rows {where}; ids must be unique "
            "(records are keyed by '<task_id>:sampleNN')"
        )


def _trajectory_tokenizer(kind: str, args: argparse.Namespace) -> Any:
    """``--token-trajectories`` with a policy that has no tokenizer: the one of ``--model`` (the
    environment renders the prompts as ids itself)."""
    if not args.model:
        raise UsageError(
            f"--token-trajectories needs the model's tokenizer; --policy {kind} has none: "
            "pass --model with the model's folder"
        )
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(args.model)
    except Exception as exc:
        raise UsageError(
            f"--token-trajectories needs the model's tokenizer; --policy {kind} has none and "
            f"--model {args.model!r} does not load one ({type(exc).__name__}: {exc})"
        ) from None


def cmd_eval(args: argparse.Namespace) -> int:
    """``eval``: several ``--data`` sets give one run folder each and their card; a run folder is locked
    from before anything is written in it to the end."""
    sets = data_sets(args.data or ["builtin"])
    if len(sets) > 1:
        return _eval_sets(args, sets)
    args.data = sets[0][1]
    with contextlib.ExitStack() as hold:
        return _eval(args, hold)


def _eval(args: argparse.Namespace, hold: contextlib.ExitStack) -> int:
    """One run: the command line read into settings, then the library's parts in order: the run
    folder held (rollout.runfolder), a resume checked (rollout.resume), the episodes run on a policy
    or a pool (scale.execute), the outputs written (rollout.outputs and the report)."""
    kind = _policy_kind(args)
    defaults = BACKENDS[kind].run_defaults
    limit, max_turns, max_tokens = (
        getattr(args, name) if getattr(args, name) is not None else defaults.get(name)
        for name in ("limit", "max_turns", "max_tokens_per_turn")
    )
    if args.samples < 1 or (limit is not None and limit < 1):
        raise UsageError("--samples and --limit must be >= 1")
    _check_request_flags(kind, args)
    out: Path = args.out or default_run_dir(args.env)
    records_path = _hold_run_folder(out, args.resume, hold)
    env_kwargs, skill_sha256 = _env_kwargs(args, max_turns, max_tokens)
    pooled = args.engines > 1 or args.ray_address is not None
    config = _run_config(args, kind, pooled, limit=limit, max_turns=max_turns, max_tokens=max_tokens)
    config["skill_sha256"] = skill_sha256
    if args.resume:
        _check_resume(out / "config.json", config)
    tasks, config["env_settings"] = _load_tasks(args.env, args.data, env_kwargs, limit)
    _unique_ids(tasks, args.data)
    try:  # a missing daemon is one line now, not every episode's error (docs/docker.md)
        check_backend(env_kwargs["sandbox"])
    except SandboxUnavailable as exc:
        raise UsageError(str(exc)) from None
    if defaults:
        print(
            f"[agent-envs] {kind} defaults: {len(tasks)} task(s) of {args.data!r} with {BACKENDS[kind].description}, "
            f"max_turns={max_turns}, max_tokens_per_turn={max_tokens}",
            file=sys.stderr,
        )
    try:
        scorer = scorer_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    policy = _open_policy(kind, args, pooled)
    run = dict(
        samples=args.samples,
        mode=args.mode,
        base_seed=args.seed,
        env_kwargs=env_kwargs,
        concurrency=args.concurrency or (16 if args.mode == "lockstep" else 64),
        tool_workers=args.tool_workers,
        out_path=records_path,
        resume=args.resume,
        progress=not args.no_progress,
        tags={"run": out.name},
    )
    try:
        records, wall = execute(policy, args.env, tasks, out=out, config=config, step_scorer=scorer, **run)
    except KeyboardInterrupt:
        done = len(load_records(records_path)) if records_path.exists() else 0
        print(
            f"\n[agent-envs] interrupted: {done} record(s) saved in {records_path}; rerun with --resume to finish",
            file=sys.stderr,
        )
        return 130
    except OSError as exc:
        _raise_if_output(exc, out)
        raise
    return _outputs(args, out, records, len(tasks), wall)


def _env_kwargs(
    args: argparse.Namespace, max_turns: int | None, max_tokens: int | None
) -> tuple[dict[str, Any], str | None]:
    """The environment's keyword arguments of the run, and the skill file's SHA-256 (None: no skill)."""
    skill, skill_sha256 = None, None
    if args.skill_file is not None:
        try:
            skill, skill_sha256 = read_skill(args.skill_file)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    env_kwargs = build_env_kwargs(
        sandbox=args.sandbox,
        max_turns=max_turns,
        max_tokens_per_turn=max_tokens,
        skill=skill,
        prompts=args.prompts,
        token_trajectories=args.token_trajectories,
        env_args=dict(args.env_arg).items(),
    )
    return env_kwargs, skill_sha256


def _run_config(
    args: argparse.Namespace,
    kind: str,
    pooled: bool,
    *,
    limit: int | None,
    max_turns: int | None,
    max_tokens: int | None,
) -> dict[str, Any]:
    """The run's ``config.json`` (what ``--resume`` compares); with ``--engines`` a backend whose row
    runs lockstep in a pool switches ``args.mode`` to it, and a step scorer is refused."""
    config: dict[str, Any] = {
        "env": args.env,
        "data": args.data,
        "policy": kind,
        "model": args.model,
        "base_urls": args.base_urls,
        "engine_args": dict(args.engine_arg),
        "sampling": _sampling(args).model_dump(),
        "samples": args.samples,
        "seed": args.seed,
        "mode": args.mode,
        "sandbox": args.sandbox,
        "max_turns": max_turns,
        "max_tokens_per_turn": max_tokens,
        "limit": limit,
        "env_args": dict(args.env_arg),
        "argv": sys.argv[1:],
        "skill_file": None if args.skill_file is None else str(args.skill_file),
        "skill_sha256": None,
        "prompts": None if args.prompts is None else str(args.prompts),
    }
    if pooled and BACKENDS[kind].pool_lockstep and args.mode == "async":  # each actor drives the offline engine
        print(f"[agent-envs] --engines with {kind} runs each engine in lockstep mode", file=sys.stderr)
        config["mode"] = args.mode = "lockstep"
    config["engines"] = args.engines
    if args.token_trajectories:  # only when on: older run folders resume as before
        config["token_trajectories"] = True
    if args.step_scorer is not None:
        if pooled:
            raise UsageError("--step-scorer runs with one engine (not with --engines or --ray-address)")
        config["step_scorer"] = scorer_settings(args)
    return config


def _open_policy(kind: str, args: argparse.Namespace, pooled: bool) -> Policy | EnginePool:
    """The run's policy (or engine pool), checked before any episode: a checkpoint's TP size, the
    endpoints' servers, a tokenizer for ``--token-trajectories``."""
    if BACKENDS[kind].loads_checkpoints and args.model:
        _check_checkpoint_tp(args.model, dict(args.engine_arg))
    policy: Policy | EnginePool = make_pool(kind, args) if pooled else make_policy(kind, args, args.env)
    _check_endpoints(policy)
    if args.token_trajectories and isinstance(policy, Policy) and policy.tokenizer is None:
        policy.tokenizer = _trajectory_tokenizer(kind, args)
    return policy


def _outputs(args: argparse.Namespace, out: Path, records: Sequence[Any], items: int, wall: float) -> int:
    """Summary, trace logs and report of the finished run, its table on stdout; the exit status."""
    try:
        summary = write_outputs(
            out, records, env_id=args.env, samples=args.samples, items=items, wall_s=wall, trace_logs=args.trace_logs
        )
    except OSError as exc:
        _raise_if_output(exc, out)
        raise
    print(format_table([(str(out), summary)], args.samples))
    if not args.no_report:
        print(f"[agent-envs] report: {_write_report([out])}")
    warning = _error_warning(records)
    if warning:
        print(warning, file=sys.stderr)
    if records and summary["non_error"]["count"] == 0:
        print(
            f"[agent-envs] error: every episode ended in an error, so this run measured nothing about the "
            f"model (exit status {EXIT_ALL_ERRORED})",
            file=sys.stderr,
        )
        return EXIT_ALL_ERRORED
    return 0


def data_sets(specs: Sequence[str]) -> list[tuple[str, str]]:
    """``[NAME=]SPEC`` values as (name, spec); a name defaults to the file stem or the spec."""
    sets = []
    for text in specs:
        name, sep, spec = text.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            name, spec = Path(text).stem or text, text
        sets.append((name, spec))
    names = [n for n, _ in sets]
    if len(set(names)) < len(names):
        raise UsageError(f"--data names must differ (got {', '.join(names)}); name them NAME=SPEC")
    if len(sets) > 1 and (dots := next((n for n in names if n in (".", "..")), None)) is not None:
        # each set's run folder is OUT/NAME: '..' would be outside OUT, '.' OUT itself
        raise UsageError(f"--data name {dots!r} is not a folder under --out; name the set NAME=SPEC")
    return sets


def _eval_sets(args: argparse.Namespace, sets: Sequence[tuple[str, str]]) -> int:
    """One run folder per data set under OUT, then their card (OUT/card.txt, OUT/card.json)."""
    out: Path = args.out or default_run_dir(args.env)
    status = 0
    for name, spec in sets:
        print(f"[agent-envs] data set {name}: {spec}", file=sys.stderr)
        code = cmd_eval(argparse.Namespace(**{**vars(args), "data": [spec], "out": out / name}))
        if code == 130:
            return code
        status = status or code
    print(_write_card([out / name for name, _ in sets], out))
    return status


def _write_card(runs: Sequence[Path], out: Path | None = None) -> str:
    """The card of ``runs`` (one data set each, named by its folder); also written under ``out``."""
    from agent_envs.rollout.card import dataset_card, format_card

    cards = {}
    for run in runs:
        records, samples, spec = _run_records(run)
        config_path = (run if run.is_dir() else run.parent) / "config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        cards[run.name if run.is_dir() else run.stem] = dataset_card(
            records, samples, spec=spec, settings=config.get("env_settings")
        )
    text = format_card(cards)
    if out is not None:
        atomic_write(out / "card.json", [(json.dumps(cards, indent=2) + "\n").encode()])
        atomic_write(out / "card.txt", [(text + "\n").encode()])
    return text


# --------------------------------------------------------------------------- summarize / compare
def _run_records(run: Path) -> tuple[list[Any], int, EnvSpec | None]:
    """A run's records, its sample count and the spec of the environment that wrote them."""
    path = run / "records.jsonl" if run.is_dir() else run
    if not path.exists():
        raise UsageError(f"no records at {path}")
    try:
        records = load_records(path)
    except (NotARecord, NotARecordsFile) as exc:
        raise UsageError(str(exc)) from None
    config_path = path.parent / "config.json"
    samples = json.loads(config_path.read_text()).get("samples") if config_path.exists() else None
    spec = registry.spec_of(r.row() for r in records)
    return records, int(samples or 1 + max((r.sample_index for r in records), default=0)), spec


def table_metrics() -> list[tuple[str, Metric]]:
    """The environments' own table columns (every registered one, so the table keeps one layout):
    ``(summary key of the block, metric)``, each column once."""
    seen: set[str] = set()
    out = []
    for spec in registry.SPECS.values():
        own = spec.metrics
        for metric in own.shown if own is not None else ():
            if own is not None and metric.column is not None and metric.column not in seen:
                seen.add(metric.column)
                out.append((own.key, metric))
    return out


def format_table(rows: Sequence[tuple[str, dict[str, Any]]], samples: int) -> str:
    """A plain-text table, one line per run."""

    def num(v: Any, fmt: str = "{:.4f}") -> str:
        return "-" if v is None else fmt.format(v)

    own = table_metrics()
    header = [
        "run",
        "records",
        "errors",
        "mean",
        "mean_non_err",
        f"max@{samples}",
        f"pass@{samples}",
        *(str(m.column) for _, m in own),
        "tool_call",
        "turns",
        "latency_s",
    ]
    lines = [header]
    for name, s in rows:
        es = s["es"]
        n = es["samples"]
        lines.append(
            [
                name,
                str(es["count"]),
                str(es["error_count"]),
                num(es["mean_score"]),
                num((s.get("non_error") or {}).get("mean_score")),
                num(es.get(f"max@{n}")),
                num(es.get(f"pass@{n}")),
                *(num(m.value(s.get(key) or {}, n)) for key, m in own),
                num(s.get("tool_call_rate"), "{:.2f}"),
                num((s.get("turns") or {}).get("mean"), "{:.2f}"),
                num((s.get("latency_s") or {}).get("mean"), "{:.2f}"),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def cmd_summarize(args: argparse.Namespace) -> int:
    from agent_envs.rollout.card import format_groups

    if args.card:
        print(_write_card(args.runs))
        return 0
    results = []
    for run in args.runs:
        records, samples, spec = _run_records(run)
        unscored = [r.key for r in records if not math.isfinite(r.score)]
        if unscored:
            print(
                f"[agent-envs] warning: {run}: {len(unscored)} record(s) have a score that is not a finite number "
                f"(NaN or Infinity), counted as 0 in the means: {', '.join(unscored[:5])}",
                file=sys.stderr,
            )
        summary = summarize(records, samples, spec=spec)
        if args.group:
            try:
                summary["groups"] = group_metrics(records, args.group, spec=spec, best_by=args.best_by)
            except ValueError as exc:
                raise UsageError(f"{run}: {exc}") from None
        results.append((str(run), summary, samples))
    if args.json:
        print(json.dumps({name: s for name, s, _ in results}, indent=2))
    else:
        for name, s, samples in results:
            print(format_table([(name, s)], samples))
            if "groups" in s:
                print(format_groups(s["groups"]))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    before, _, spec = _run_records(args.run_a)
    after, _, _ = _run_records(args.run_b)
    try:
        result = paired_bootstrap(before, after, samples=args.bootstrap_samples, spec=spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    mean_a, mean_b, delta = compare_means(result)
    runs = [("A", str(args.run_a), mean_a), ("B", str(args.run_b), mean_b)]
    width = max(len(name) for _, name, _ in runs)
    print(f"   {'run'.ljust(width)}  mean {result['score_metric']}")
    print("\n".join(f"{label}  {name.ljust(width)}  {mean:.4f}" for label, name, mean in runs))
    lo, hi = result["bootstrap_95_ci"]
    print(
        f"delta {delta:+.4f} over {result['paired_tasks']} tasks, 95% CI [{lo:+.4f}, {hi:+.4f}] "
        f"({result['bootstrap_samples']} bootstrap samples)"
    )
    return 0


def _write_report(runs: Sequence[Path], out: Path | None = None) -> Path:
    from agent_envs.report import RunError, build_report  # on demand: Jinja2 and matplotlib load slowly

    try:
        return build_report(runs, out)
    except RunError as exc:
        raise UsageError(str(exc)) from exc


def cmd_report(args: argparse.Namespace) -> int:
    print(_write_report(args.runs, args.out))
    return 0


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_export_checkpoint(args: argparse.Namespace) -> int:
    from agent_envs.es.checkpoint import CheckpointError

    try:
        return export_and_print(args)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None


def cmd_verify_checkpoint(args: argparse.Namespace) -> int:
    from agent_envs.es.checkpoint import CheckpointError, verify_checkpoint

    try:
        result = verify_checkpoint(args.folder, tp=args.tp, engine_args=dict(args.engine_arg), log=_progress)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(result, indent=2, default=str))
    return 0 if result["passed"] else 1


def cmd_export(args: argparse.Namespace) -> int:
    """A line that is not a record, or a damaged trajectory, is an error naming file and line (a
    skipped episode would silently drop out of a trainer's data); only the torn last line of a
    killed run is skipped, and said.  Nothing is written unless the whole export is."""
    from agent_envs.rollout.trajectories import BadTrajectory, export_tokens

    path = args.run / "records.jsonl" if args.run.is_dir() else args.run
    out = args.out or path.parent / "tokens.jsonl"
    if not path.exists():
        raise UsageError(f"no records at {path}")
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; name a file, e.g. {out / 'tokens.jsonl'}")
    blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UsageError(f"--out {out}: {blocker} is a file, not a directory")
    try:
        rows, torn = read_records(path)
    except DamagedRecords as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        summary = export_tokens([line.row for line in rows], out)
    except BadTrajectory as exc:
        raise UsageError(f"{path}: line {rows[exc.index].number}: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    if torn:
        print(f"[agent-envs] skipped the torn last line of {path} (a run killed while writing it)", file=sys.stderr)
    print(f"[agent-envs] exported {summary.line()}")
    return 0


def cmd_serve(argv: Sequence[str]) -> int:
    from agent_envs.policy.server import main as serve  # imported on demand: the other commands do not need it

    baselines = {env_id: spec.baseline for env_id in ENV_IDS if (spec := registry.spec(env_id)).baseline is not None}
    return int(serve(list(argv), baselines) or 0)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line, where an argument a subcommand does not know is reported with that
    subcommand's usage (argparse reports it with the top-level usage, which shows none of the
    subcommand's options); exits 2 on bad input, as argparse does."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        return cmd_serve(argv[1:])
    if argv[:1] == ["es"]:
        from agent_envs.esrun.command import main as es  # imported on demand, as serve

        return es(argv[1:])
    args = parse_args(argv)
    handler = {
        "eval": cmd_eval,
        "summarize": cmd_summarize,
        "compare": cmd_compare,
        "report": cmd_report,
        "export-checkpoint": cmd_export_checkpoint,
        "verify-checkpoint": cmd_verify_checkpoint,
        "export": cmd_export,
    }[args.command]
    try:
        return handler(args)
    except UsageError as exc:
        print(f"agent-envs {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
