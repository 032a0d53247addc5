"""``agent-envs es``: seeded evolution strategies on a vLLM model (docs/protocol.md#es-maths).

* ``agent-envs es train``: each generation draws ``--population`` member seeds, perturbs the weights
  in place inside the vLLM worker, runs the generation's case batch per member, reverts, normalises
  the rewards and applies the update; the history (seeds + raw rewards) gets each generation's record
  appended as it ends (``es.history.HistoryWriter``), and ``--resume`` replays one.
* ``agent-envs es evaluate-only``: replay a history's updates to each chosen count and evaluate the
  held-out sets there, no training (docs/scaling.md#es-evaluation).
* ``agent-envs es export``: replay a history on a fresh engine and save the weights as a checkpoint
  (the same as ``agent-envs export-checkpoint``).
"""

from __future__ import annotations

import statistics
import sys
from typing import Any, Sequence

from agent_envs.es.evaluation import eval_only
from agent_envs.es.history import ReplayMismatch
from agent_envs.es.population import GenerationFailed
from agent_envs.es.progress import Progress, metrics_path, plot_metrics, read_metrics

from .export import export
from .run import ESRun, open_run
from .settings import ESSettings, parse_settings

MODES = ("train", "evaluate-only", "export")
USAGE = f"usage: agent-envs es {{{','.join(MODES)}}} [OPTIONS]  (agent-envs es MODE --help lists a mode's options)"


def main(argv: Sequence[str] | None = None) -> int:
    """``agent-envs es MODE ...``; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    mode, rest = (argv[0], argv[1:]) if argv else ("", [])
    if mode in ("-h", "--help"):
        print(f"{USAGE}\n\n{(__doc__ or '').replace('``', '')}")
        return 0
    if mode == "export":
        return export(rest)
    if mode not in MODES:
        print(
            f"{USAGE}\nagent-envs es: error: choose a mode, one of {', '.join(MODES)} (got {mode!r})", file=sys.stderr
        )
        return 2
    settings = parse_settings(rest, eval_only=mode == "evaluate-only")
    run_settings(settings)
    return 0


def run_settings(settings: ESSettings) -> list[dict[str, Any]]:
    """Train, or evaluate only, as the settings say; the history written."""
    with open_run(settings) as run:
        assert run.setup is not None and run.evaluator is not None and run.config is not None
        if run.trainer is None:  # evaluation only: replay --resume's updates step by step and evaluate
            try:
                history = eval_only(
                    run.config,
                    run.backend,
                    run.evaluator,
                    settings.history,
                    source=settings.resume,
                    replay_updates=settings.resume_generations,
                    marks=settings.eval_generations,
                    final=settings.final_eval,
                    facts=budgets(settings),
                )
            except ReplayMismatch as exc:  # a replayed generation whose fingerprint is not the history's
                raise SystemExit(f"[es] --eval-only --resume {settings.resume}: {exc}") from None
        else:
            history = train_watched(settings, run)
        report(history, settings.history, run.checksum())
        retries = getattr(run.backend, "reset_retries", 0)
        if retries:  # the engine still held KV blocks right after a member's episodes (async mode)
            print(f"[es] prefix-cache resets asked again {retries} times while the engine released KV blocks")
    return history


def train_watched(settings: ESSettings, run: ESRun) -> list[dict[str, Any]]:
    """Train with a metrics row per generation (and for the initial and final held-out evaluations)
    in the JSONL, TensorBoard and W&B; the PNG of the rows beside the JSONL at the end."""
    assert run.trainer is not None and run.setup is not None and run.evaluator is not None
    path = settings.metrics or metrics_path(settings.history)
    progress = Progress(path, settings.tensorboard, settings.wandb, run.config.model_dump() if run.config else None)
    try:
        run.trainer.progress = progress.observe
        if run.trainer.start_generation == 0:
            for record in run.trainer.history:
                if record.get("generation") == -1:  # the initial held-out evaluation
                    progress.observe(record)
        try:
            history: list[dict[str, Any]] = run.setup.train(run.trainer, run.evaluator, budgets(settings))
        except GenerationFailed as exc:  # the generations before it are in the history already
            raise SystemExit(f"[es] {exc}; once the policy answers again: --resume {settings.history}") from None
        if history and history[-1].get("final_eval"):
            progress.observe(history[-1])
    finally:
        progress.close()
    try:
        print(f"[es] metrics {path}; curve {plot_metrics(read_metrics(path), f'{path}.png')}")
    except ImportError as exc:  # an engine's venv without matplotlib: the rows are what matters
        print(f"[es] metrics {path}; no curve drawn ({exc}): python -m agent_envs.es.progress {path} OUT.png")
    return history


def budgets(settings: ESSettings) -> dict[str, Any]:
    """The episode budgets a final evaluation record states (the history's names)."""
    return {"max_turns": settings.max_turns, "max_tokens": settings.max_tokens_per_turn}


def report(history: list[dict[str, Any]], path: str, checksum: str) -> None:
    rewards = [r["reward_mean"] for r in history if "reward_mean" in r]
    if rewards:
        print(
            f"[es] done: {len(rewards)} generations, reward_mean first {rewards[0]:.4f} last {rewards[-1]:.4f} "
            f"(stdev over generations {statistics.pstdev(rewards):.4f}); history {path}"
        )
    print(f"[es] final weights checksum {checksum}")
