"""Held-out evaluation of an ES run, as the reference ES runner does it (docs/scaling.md#es-evaluation).

* **Initial** (``--initial-eval``): before the first generation, recorded as generation -1.
* **Interval**: after every ``eval_interval``-th update and the last (none at interval 0),
  ``--eval-samples`` samples per task, seed ``seed + updates`` (the reference's ``seed + g + 1``
  after generation ``g``), its ``<name>_eval`` blocks at the top level of the generation's record.
* **Final** (``--final-eval``): its own sample count (``--final-eval-samples``, 4) and seeds:
  ``seed + updates + 10000 * (i + 1)`` for the i-th held-out set (20270652 and 20280652 for DAPO
  and AIME after 25 updates of seed 20260627), recorded as ``{"generation": G, "final_eval": true}``.
* **Evaluation only** (``--eval-only``): replay a history's updates up to each chosen count and
  evaluate there, no training (the cards' "interval25": replay 25 updates, interval evaluation;
  "final4": replay 25, final evaluation).

Each held-out set is named (``--eval NAME=PATH``); its summary sits under ``<name>_eval`` and its
trace logs under ``trace_logs/<name>_eval``, ``<name>_eval_after_NNN`` and ``<name>_final_eval``,
next to ``trace_logs/train`` (members' logs, ``gen<GGG>_candidate<CC>_seed<S>_`` prefixed).  With a
frozen key-to-seed map (``--eval-key-seed-file``, JSONL of ``{"key": "<task>:sampleNN", "seed":
S}``) every held-out episode takes its trajectory seed from the map.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from agent_envs.core.atomic import atomic_write
from agent_envs.core.prompts import read_skill
from agent_envs.core.spec import EnvSpec, ReportSpec
from agent_envs.core.tasks import episode_key, task_id
from agent_envs.protocol.seeds import trajectory_seed
from agent_envs.rollout.metrics import es_summary
from agent_envs.rollout.records import as_row, dumps_line
from agent_envs.rollout.tracelog import training_prefix, write_trace_logs

from .history import ESConfig, Record, load_history, replay, update_records, write_history
from .population import ESTrainer, MemberResult, compact_row
from .seeds import check_seed_sequence

#: the final evaluation's seed offset per held-out set (set i: ``(i + 1) * FINAL_SEED_STRIDE``)
FINAL_SEED_STRIDE = 10_000
#: ``run(tasks, samples, base_seed, key_seeds) -> records``: one engine or a pool
Run = Callable[[Sequence[Any], int, int, Mapping[str, int] | None], Sequence[Any]]


def add_evaluation_arguments(p: argparse.ArgumentParser) -> None:
    """The evaluation options of ``agent-envs es``."""
    p.add_argument(
        "--eval",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="held-out tasks (repeatable; NAME labels the set, default the file stem)",
    )
    p.add_argument("--eval-limit", type=int, default=None, help="evaluate only the first N tasks of each set")
    p.add_argument("--eval-samples", type=int, default=1, help="samples per task of initial and interval evaluations")
    p.add_argument("--initial-eval", action="store_true", help="evaluate before training (generation -1)")
    p.add_argument("--final-eval", action="store_true", help="after the last update, the final evaluation")
    p.add_argument("--final-eval-samples", type=int, default=4, help="samples per task of the final evaluation")
    p.add_argument(
        "--eval-only",
        action="store_true",
        help="no training: replay --resume's updates to each --eval-generations count and evaluate",
    )
    p.add_argument(
        "--eval-generations",
        default=None,
        metavar="N[,N...]",
        help="--eval-only: update counts to evaluate at (default: all of the replayed history)",
    )
    p.add_argument("--eval-key-seed-file", default=None, help="frozen key-to-seed JSONL for every held-out episode")
    p.add_argument("--eval-key-seed-sha256", default=None, help="refuse a key-seed file with another SHA-256")
    p.add_argument("--skill-file", default=None, help="skill text appended to the system prompt (all episodes)")
    p.add_argument(
        "--write-trace-logs",
        action="store_true",
        help="Markdown trace logs of every member and evaluation episode, in the reference's layout",
    )
    p.add_argument("--trace-log-dir", default=None, help="default: trace_logs next to --history")
    p.add_argument(
        "--eval-out",
        default=None,
        metavar="DIR",
        help="keep every evaluation's full records as a run folder DIR/<label>/records.jsonl (labels as "
        "the trace logs': test_eval before training, test_eval_after_010 after 10 updates, ...) "
        "for `agent-envs compare`",
    )


def file_sha256(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_key_seeds(path: str | os.PathLike[str], expected_sha256: str | None = None) -> tuple[dict[str, int], str]:
    """A frozen key-to-seed map: one ``{"key", "seed"}`` object per line, each key once, at least one
    (docs/protocol.md#differences-and-parity-switches).  A seed written as integer text (``"12"``) or
    an integral float is read as that integer, as the reference's ``int(seed)``; a boolean, a fraction
    and a negative seed are refused (the reference's ``int()`` turned them into other seeds)."""
    digest = file_sha256(path)
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise ValueError(f"{path}: SHA-256 {digest} is not the expected {expected_sha256}")
    seeds: dict[str, int] = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} line {number}: not JSON ({exc.msg})") from None
        key, seed = (row.get("key"), _seed(row.get("seed"))) if isinstance(row, dict) else (None, None)
        if not isinstance(key, str) or seed is None:
            raise ValueError(f'{path} line {number}: expected {{"key": "<task>:sampleNN", "seed": <int >= 0>}}')
        if key in seeds:
            raise ValueError(f"{path} line {number}: duplicate key {key!r}")
        seeds[key] = seed
    if not seeds:
        raise ValueError(f"{path}: no key-to-seed lines (an empty map would leave every episode unseeded by it)")
    return seeds, digest


def _seed(value: Any) -> int | None:
    """A key-seed file's seed as an integer >= 0: an int, integer text or an integral float; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


@dataclass(frozen=True)
class HeldOutSet:
    name: str
    tasks: list[Any]

    def keys(self, samples: int) -> list[str]:
        return [episode_key(task_id(t), s) for t in self.tasks for s in range(samples)]


def held_out_sets(specs: Sequence[str], load: Callable[[str], list[Any]]) -> list[HeldOutSet]:
    """``[NAME=]PATH`` specs as named sets (``load(path)`` gives the tasks); names must differ."""
    sets = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or "/" in name:
            name, path = Path(spec).stem, spec
        sets.append(HeldOutSet(name, load(path)))
    names = [s.name for s in sets]
    if len(set(names)) != len(names):
        raise ValueError(f"held-out set names must differ, got {names}; name them NAME=PATH")
    return sets


def formula_key_seeds(sets: Sequence[HeldOutSet], samples: int, base_seed: int) -> dict[str, int]:
    """The seeds the formula gives (``base_seed + sample*1_000_003 + row``): a map to freeze."""
    return {
        episode_key(task_id(t), s): trajectory_seed(base_seed, row, s)
        for held in sets
        for row, t in enumerate(held.tasks)
        for s in range(samples)
    }


def _updates_label(updates: int) -> str:
    return f"after_{updates:03d}"


class Evaluator:
    """Runs the held-out sets with ``run`` and returns history records; writes trace logs."""

    def __init__(
        self,
        sets: Sequence[HeldOutSet],
        run: Run,
        *,
        seed: int,
        samples: int = 1,
        final_samples: int = 4,
        key_seeds: Mapping[str, int] | None = None,
        trace_dir: str | os.PathLike[str] | None = None,
        spec: EnvSpec | None = None,
        log: Callable[[str], None] = print,
        records_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if samples < 1 or final_samples < 1:
            raise ValueError(f"evaluation sample counts must be >= 1 (got {samples}, {final_samples})")
        self.sets, self.run, self.seed = list(sets), run, int(seed)
        self.samples, self.final_samples = int(samples), int(final_samples)
        self.key_seeds = dict(key_seeds) if key_seeds is not None else None
        if trace_dir is not None and spec is None:
            raise ValueError("trace logs need the environment's spec (its trace-log format)")
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        #: each round's full records as a run folder ``records_dir/<label>`` (``agent-envs compare``)
        self.records_dir = Path(records_dir) if records_dir is not None else None
        #: the environment: its own metrics block joins each summary, its report renders the trace logs
        self.spec, self.log = spec, log

    def check_key_seeds(self, samples: int) -> None:
        """Before any episode: the frozen map must hold every key an evaluation of ``samples`` uses."""
        if self.key_seeds is None:
            return
        for held in self.sets:
            missing = [k for k in held.keys(samples) if k not in self.key_seeds]
            if missing:
                raise ValueError(
                    f"the key-seed map lacks {len(missing)} of the {len(held.tasks) * samples} keys of "
                    f"{held.name!r} at {samples} samples (e.g. {', '.join(missing[:3])})"
                )

    def _round(self, label: str, samples: int, seeds: Sequence[int]) -> Record:
        out: Record = {}
        for held, seed in zip(self.sets, seeds):
            rows = [as_row(r) for r in self.run(held.tasks, samples, seed, self.key_seeds)]
            summary = es_summary(rows, samples, items=len(held.tasks))
            own = self.spec.metrics if self.spec is not None else None
            block = own.block(rows, samples) if own is not None else None
            if own is not None and block is not None:
                summary[own.key] = block
            folder = f"{held.name}_{label}"
            summary.update(
                label=folder, seed=seed, key_seeds=self.key_seeds is not None, scores=[compact_row(r) for r in rows]
            )
            out[f"{held.name}_eval"] = summary
            if self.trace_dir is not None and self.spec is not None:
                write_trace_logs(rows, self.trace_dir / folder, self.spec.report)
            if self.records_dir is not None:
                write_run_folder(self.records_dir / folder, rows, samples)
            self.log(
                f"[es] {folder}: mean_score={summary['mean_score']:.4f} max@{samples}="
                f"{summary[f'max@{samples}']:.4f} pass@{samples}={summary[f'pass@{samples}_count']}/"
                f"{len(held.tasks)} ({summary['count']} rows, errors {summary['error_count']}, seed {seed})"
            )
        return out

    def initial(self) -> Record:
        """Before any update: generation -1."""
        return {"generation": -1, **self._round("eval", self.samples, [self.seed] * len(self.sets))}

    def interval(self, updates: int) -> Record:
        """After ``updates`` updates (0: the base model, which the initial evaluation also is)."""
        label = "eval" if updates == 0 else f"eval_{_updates_label(updates)}"
        return self._round(label, self.samples, [self.seed + updates] * len(self.sets))

    def final(self, updates: int, **facts: Any) -> Record:
        """The final report after ``updates`` updates (``facts``: budgets recorded with it)."""
        seeds = [self.seed + updates + FINAL_SEED_STRIDE * (i + 1) for i in range(len(self.sets))]
        return {
            "generation": updates,
            "final_eval": True,
            "eval_samples": self.final_samples,
            **facts,
            **self._round("final_eval", self.final_samples, seeds),
        }


def write_run_folder(folder: Path, rows: Sequence[dict[str, Any]], samples: int) -> None:
    """An evaluation's records as a run folder (records.jsonl, config.json with its sample count),
    written whole: an evaluation repeated at the same label replaces the earlier one."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "records.jsonl", (dumps_line(r) for r in rows))
    atomic_write(folder / "config.json", [json.dumps({"samples": samples}).encode()])


def trace_members(trainer: ESTrainer, directory: Path, report: ReportSpec) -> None:
    """Write every member's episodes as trace logs (``report``'s format) under ``directory``
    (``trace_logs/train``) with the reference's training prefix, as the trainer's populations
    finish (one engine or a pool)."""
    evaluate = trainer.evaluate_population

    def traced(batch: Sequence[Any], seeds: Sequence[int], sigma: float, generation: int) -> list[MemberResult]:
        members = evaluate(batch, seeds, sigma, generation)
        for m in members:
            write_trace_logs(m.rows, directory, report, training_prefix(generation, m.member, m.seed))
        return members

    trainer.evaluate_population = traced  # type: ignore[method-assign]


def evaluation_marks(spec: str | None, available: int) -> list[int]:
    """``--eval-generations``: sorted update counts within the replayed history (default: its end)."""
    if spec is None:
        return [available]
    try:
        marks = sorted({int(part) for part in spec.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--eval-generations takes update counts like 10,20,25, got {spec!r}") from None
    bad = [m for m in marks if not 0 <= m <= available]
    if not marks or bad:
        raise ValueError(f"--eval-generations {spec!r}: counts must lie in 0..{available} (the replayed updates)")
    return marks


def eval_only_plan(
    config: ESConfig,
    history: Sequence[Record],
    replay_updates: int | None = None,
    marks: str | None = None,
    final: bool = False,
) -> tuple[int, list[int]]:
    """(updates to replay, update counts to evaluate at) of an evaluation-only run of ``history``; a
    ValueError for a history or marks it cannot follow, before any engine starts (the seeds must be
    ``config``'s: another ``--seed`` or ``--population`` would replay other updates)."""
    records = update_records(history, replay_updates)
    check_seed_sequence([r["seeds"] for r in records], config.seed, config.population)
    return len(records), evaluation_marks(marks, len(records)) if marks is not None or not final else []


def eval_only(
    config: ESConfig,
    backend: Any,
    evaluator: Evaluator,
    history_path: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    replay_updates: int | None = None,
    marks: str | None = None,
    final: bool = False,
    facts: Mapping[str, Any] | None = None,
) -> list[Record]:
    """Replay ``source``'s first ``replay_updates`` updates (default all) step by step, evaluate
    after each mark, then (``final``) the final evaluation at the last; never train.  The new
    history is written after every evaluation.  Without marks and ``final``, one interval
    evaluation at the end of the replay."""
    history = load_history(source) if source is not None else []
    available, points = eval_only_plan(config, history, replay_updates, marks, final)
    if points:
        evaluator.check_key_seeds(evaluator.samples)
    if final:
        evaluator.check_key_seeds(evaluator.final_samples)
    out: list[Record] = [{"config": config.model_dump()}]
    if source is not None:
        out.append(
            {
                "eval_only": {
                    "source": str(source),
                    "source_sha256": file_sha256(source),
                    "replay_updates": available,
                    "marks": points,
                }
            }
        )
    applied = 0

    def replay_to(target: int) -> None:
        nonlocal applied
        if target > applied:
            replay(history, backend, config.seed, config.population, target, config.tp_size, start=applied)
            applied = target

    for mark in points:
        replay_to(mark)
        out.append({"generation": mark - 1, "replayed_updates": mark, **evaluator.interval(mark)})
        write_history(history_path, out)
    if final:
        replay_to(available)
        out.append({**evaluator.final(available, **dict(facts or {})), "replayed_updates": available})
        write_history(history_path, out)
    return out


@dataclass
class EvalSetup:
    """What the evaluation flags ask for, checked before any engine starts (:func:`evaluation_setup`)."""

    args: argparse.Namespace
    sets: list[HeldOutSet]
    key_seeds: dict[str, int] | None
    skill: str | None
    trace_dir: Path | None
    #: the run's evaluation settings, stored in the history's config record
    config: dict[str, Any]

    def evaluator(
        self, run: Run, seed: int, spec: EnvSpec | None = None, log: Callable[[str], None] = print
    ) -> Evaluator:
        return Evaluator(
            self.sets,
            run,
            seed=seed,
            samples=self.args.eval_samples,
            final_samples=self.args.final_eval_samples,
            key_seeds=self.key_seeds,
            trace_dir=self.trace_dir,
            spec=spec,
            log=log,
            records_dir=self.args.eval_out,
        )

    def head(
        self, evaluator: Evaluator, config: ESConfig, head: list[Record] | None, start: int
    ) -> list[Record] | None:
        """The history a training run starts from: the resumed head, plus the initial evaluation
        when asked for and the run starts at generation 0."""
        if not self.args.initial_eval or start > 0:
            return head
        evaluator.check_key_seeds(evaluator.samples)
        return [*(head or [{"config": config.model_dump()}]), evaluator.initial()]

    def hook(self, evaluator: Evaluator) -> Callable[[int], Record | None] | None:
        """The trainer's interval evaluation after generation ``g`` (= ``g + 1`` updates)."""
        return (lambda generation: evaluator.interval(generation + 1)) if self.sets else None

    def train(self, trainer: ESTrainer, evaluator: Evaluator, facts: Mapping[str, Any]) -> list[Record]:
        """Run the trainer (members traced when asked), then the final evaluation when asked."""
        if self.sets:
            evaluator.check_key_seeds(evaluator.samples)
        if self.args.final_eval:
            evaluator.check_key_seeds(evaluator.final_samples)
        if self.trace_dir is not None and evaluator.spec is not None:
            trace_members(trainer, self.trace_dir / "train", evaluator.spec.report)
        history = trainer.run()
        if self.args.final_eval:
            history.append(evaluator.final(trainer.config.generations, **facts))
            write_history(trainer.history_path, history)
        return history


def evaluation_setup(args: argparse.Namespace, load: Callable[[str], list[Any]]) -> EvalSetup:
    """Check the evaluation flags together and load what they name (a ValueError says which)."""
    if (args.initial_eval or args.final_eval or args.eval_only or args.eval_key_seed_file) and not args.eval:
        raise ValueError(
            "--initial-eval, --final-eval, --eval-only and --eval-key-seed-file need held-out sets (--eval)"
        )
    if args.eval_generations is not None and not args.eval_only:
        raise ValueError("--eval-generations applies to --eval-only runs")
    sets = held_out_sets(args.eval, load)
    key_seeds, key_sha = (
        load_key_seeds(args.eval_key_seed_file, args.eval_key_seed_sha256) if args.eval_key_seed_file else (None, None)
    )
    skill, skill_sha = read_skill(args.skill_file) if args.skill_file else (None, None)
    trace_dir = None
    if args.write_trace_logs:
        trace_dir = (
            Path(args.trace_log_dir) if args.trace_log_dir else Path(args.history).resolve().parent / "trace_logs"
        )
    config = {
        "eval_datasets": [s.name for s in sets],
        "eval_samples": args.eval_samples,
        "initial_eval": args.initial_eval,
        "final_eval": args.final_eval,
        "final_eval_samples": args.final_eval_samples,
        "eval_only": args.eval_only,
        "eval_key_seed_file": args.eval_key_seed_file,
        "eval_key_seed_sha256": key_sha,
        "skill_file": args.skill_file,
        "skill_sha256": skill_sha,
        "eval_out": args.eval_out,
    }
    return EvalSetup(args, sets, key_seeds, skill, trace_dir, config)
