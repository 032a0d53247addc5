"""What the template shows, computed from records: metric rows, per-task rows, episodes and turns.

Nothing here names an environment: each run's environment spec says what its own metrics are
called and gives each record's question, gold answer and page image; other columns appear when
the records carry their fields (``turn_log``, step scores)."""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from typing import Any, Sequence

from agent_envs.core.spec import MetricsSpec
from agent_envs.envs.registry import ENV_IDS
from agent_envs.policy.factory import BACKENDS, Backend
from agent_envs.rollout.metrics import paired_bootstrap
from agent_envs.rollout.records import ERROR_TERMINATIONS
from agent_envs.sandbox.output import MARKER
from agent_envs.scoring.metrics import by_task, clamped_score

from .load import Run
from .media import image_data_url, shown_image

Row = dict[str, Any]
_THINK = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.S)


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _is_error(row: Row) -> bool:
    return bool(row.get("error")) or row.get("termination_reason") in ERROR_TERMINATIONS


def _succeeded(run: Run, row: Row) -> bool:
    return run.report.succeeded(float(row.get("score") or 0.0))


def unjudged(run: Run) -> str | None:
    """The note for records of an environment this version does not know (or older records that
    do not say): they are shown with the plain rule, success at score 1."""
    if run.spec is not None or not run.rows:
        return None
    ids = sorted({str(r.get("env_id") or "(none)") for r in run.rows})
    return (
        f"{len(run.rows)} record(s) with env_id {', '.join(ids)}: not an environment registered here, "
        "so success is read as score >= 1"
    )


def _own_metrics(runs: Sequence[Run]) -> list[MetricsSpec]:
    """The environments' own metric specs of these runs, each once, in run order."""
    out: list[MetricsSpec] = []
    for run in runs:
        own = run.spec.metrics if run.spec is not None else None
        if own is not None and all(m.key != own.key for m in out):
            out.append(own)
    return out


def _at_k_label(key: str, runs: Sequence[Run]) -> str:
    for own in _own_metrics(runs):
        for prefix, label in own.at_k_labels.items():
            key = key.replace(prefix, label)
    return key.replace("mean@", "Mean@").replace("pass@", "Pass@")


def backend(run: Run) -> Backend | None:
    """The policy backend's row of the run (config.json's ``policy``); None for a kind this process
    does not know (a run from another version, a backend registered elsewhere)."""
    return BACKENDS.get(str(run.config.get("policy")))


def env_id(run: Run) -> str:
    return str(run.config.get("env") or (run.rows[0].get("env_id") if run.rows else None) or "?")


def model_name(run: Run) -> str:
    row = backend(run)
    if row is not None and row.label is not None:
        return row.label
    return str(run.config.get("model") or (run.config.get("policy_info") or {}).get("model") or "–")


def about(runs: Sequence[Run]) -> Row:
    """The page's first words: one line per run (environment, policy, tasks, budget), what each kind
    of policy is, and, when no run is of a real model, how to evaluate one."""
    described: list[Row] = []
    policies: dict[str, str] = {}
    for i, run in enumerate(runs):
        c, row = run.config, backend(run)
        budget = ", ".join(
            part
            for part in (
                f"at most {c['max_turns']} turns" if c.get("max_turns") else "",
                f"{c['max_tokens_per_turn']} tokens per turn" if c.get("max_tokens_per_turn") else "",
            )
            if part
        )
        described.append(
            {
                "name": run.name,
                "colour": i,
                "env": env_id(run),
                "policy": model_name(run),
                "tasks": len({r["task_id"] for r in run.rows}),
                "episodes": len(run.rows),
                "budget": budget or "the environment's own",
            }
        )
        if row is not None and row.words:
            policies.setdefault(model_name(run), row.words)
    parents = {run.path.resolve().parent for run in runs}
    return {
        "runs": described,
        "policies": policies,
        "example_env": env_id(runs[0]) if runs else ENV_IDS[0],
        "folder": str(parents.pop()) if len(parents) == 1 else None,
        "hint": any(row is not None and not row.real_model for row in map(backend, runs)),
    }


def metric_rows(runs: Sequence[Run]) -> list[tuple[str, list[str]]]:
    """The summary table: one row per metric, one column per run; rows no run has are left out."""

    def stat(run: Run, key: str, field: str = "mean", digits: int = 1) -> str:
        return _fmt((run.metrics.get(key) or {}).get(field), digits)

    def tool_time(run: Run) -> str:
        total = sum(float(r.get("tool_seconds") or 0.0) for r in run.rows)
        calls = sum(int(r.get("tool_calls") or 0) for r in run.rows)
        return f"{total:.2f} s over {calls} calls" if calls else "no tool calls"

    def reasons(run: Run) -> str:
        counts = Counter(str(r.get("termination_reason")) for r in run.rows)
        return ", ".join(f"{k} {v}" for k, v in counts.most_common())

    rows: list[tuple[str, list[str]]] = [
        ("environment", [env_id(r) for r in runs]),
        ("model", [model_name(r) for r in runs]),
        (
            "status",
            [
                ("complete" if r.complete else "incomplete: no summary.json (run stopped early)")
                + (f"; {r.unreadable_lines} unreadable line(s) skipped" if r.unreadable_lines else "")
                for r in runs
            ],
        ),
        ("episodes (expected)", [f"{len(r.rows)} ({r.metrics['es']['expected_count']})" for r in runs]),
        ("errors (infrastructure, not the model)", [str(sum(_is_error(x) for x in r.rows)) for r in runs]),
        (
            "model failures (ran, scored as failed)",
            [str(sum(not _is_error(x) and not _succeeded(r, x) for x in r.rows)) for r in runs],
        ),
        ("mean score", [_fmt(r.metrics["es"]["mean_score"]) for r in runs]),
    ]
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run.metrics.get("at_k", {}) if k not in keys]
    for key in keys:
        rows.append((_at_k_label(key, runs), [_fmt(r.metrics["at_k"].get(key)) for r in runs]))
    if any("process" in r.metrics for r in runs):

        def process(run: Run, key: str) -> str:
            value = (run.metrics.get("process") or {}).get(key)
            return ", ".join(value) if isinstance(value, list) else _fmt(value)

        rows += [
            ("mean step score", [process(r, "mean_step_score") for r in runs]),
            ("mean process score", [process(r, "mean_process_score") for r in runs]),
            ("process aggregation", [process(r, "aggregations") for r in runs]),
            ("step-score errors", [process(r, "step_score_errors") for r in runs]),
        ]
    for own in _own_metrics(runs):
        if any(own.key in r.metrics for r in runs):
            rows += [
                (m.label, [_fmt(m.value(r.metrics.get(own.key) or {}, r.samples)) for r in runs])
                for m in own.shown
                if m.label is not None
            ]
    rows += [
        ("termination reasons", [reasons(r) for r in runs]),
        ("tool-call rate", [_fmt(r.metrics.get("tool_call_rate"), 2) for r in runs]),
        ("turns per episode (mean / max)", [f"{stat(r, 'turns')} / {stat(r, 'turns', 'max', 0)}" for r in runs]),
        (
            "generated tokens per episode (mean / total)",
            [f"{stat(r, 'generated_tokens')} / {stat(r, 'generated_tokens', 'total', 0)}" for r in runs],
        ),
        ("tool time", [tool_time(r) for r in runs]),
        (
            "episode wall time, s (mean / p90)",
            [f"{stat(r, 'latency_s', digits=2)} / {stat(r, 'latency_s', 'p90', 2)}" for r in runs],
        ),
        ("run wall time, s", [_fmt(((r.saved_summary or {}).get("run") or {}).get("wall_s"), 1) for r in runs]),
    ]
    return rows


def task_rows(run: Run) -> list[Row]:
    """One row per task: samples, best and mean score, mean turns, termination reasons."""
    out = []
    for task, group in by_task(run.rows).items():
        scores = [clamped_score(r) for r in group]
        out.append(
            {
                "task": task,
                "samples": len(group),
                "best": max(scores),
                "mean": statistics.fmean(scores),
                "turns": statistics.fmean(float(r.get("turns") or 0) for r in group),
                "reasons": ", ".join(sorted({str(r.get("termination_reason")) for r in group})),
                "question": run.report.fields(group[0]).question,
                "anchor": anchor(run, group[0]["key"]),
            }
        )
    return out


def anchor(run: Run, key: str) -> str:
    return "ep-" + re.sub(r"[^A-Za-z0-9_-]+", "-", f"{run.name}-{key}")


def _action_text(action: Any) -> str | None:
    """A parsed tool call as a shell line (``name$ command``), a tool's one text argument as the
    text itself (``name (code):`` and the code, its lines as written), else compact JSON."""
    if not action:
        return None
    args = action.get("arguments") if isinstance(action, dict) else None
    if isinstance(args, dict) and len(args) == 1:
        ((key, value),) = args.items()
        if isinstance(value, str):
            return f"{action.get('name')}$ {value}" if key == "command" else f"{action.get('name')} ({key}):\n{value}"
    return json.dumps(action, ensure_ascii=False)


def split_think(text: str) -> list[tuple[str, str]]:
    """``[(kind, text)]`` with kind ``think`` for ``<think>`` blocks (folded in the page), else ``text``."""
    parts: list[tuple[str, str]] = []
    pos = 0
    for m in _THINK.finditer(text):
        if text[pos : m.start()].strip():
            parts.append(("text", text[pos : m.start()].strip()))
        parts.append(("think", m.group(1).strip()))
        pos = m.end()
    if text[pos:].strip() or not parts:
        parts.append(("text", text[pos:].strip()))
    return parts


def _shown(facts: Any, images: dict[str, str | None]) -> list[Row]:
    """The images a step (or the task message) showed the model, each re-rendered once per report
    into ``images`` under ``shown:<sha256>`` and referred to by that key."""
    out = []
    for fact in facts if isinstance(facts, list) else []:
        if not isinstance(fact, dict):
            continue
        key = "shown:" + str(fact.get("sha256") or json.dumps(fact, sort_keys=True))
        shown = shown_image(fact)
        images.setdefault(key, shown.pop("url"))
        out.append({**shown, "key": key, "ok": bool(images[key])})
    return out


def turns(row: Row, images: dict[str, str | None] | None = None) -> list[Row]:
    """Every policy call of the episode: model text, parsed action, observation, images shown and
    per-turn facts (``images`` collects the data URLs, as :func:`episode` does).  The last turn (a
    final answer, or one cut by a budget) is not in ``react_steps``; its text is the record's
    ``completion``."""
    images = {} if images is None else images
    react_steps = row.get("react_steps") or []
    steps: dict[int, Row] = {}
    for i, s in enumerate(react_steps):  # a turn's first step: the one that carries its text
        steps.setdefault(int(s.get("turn", i + 1)), s)
    step_scores = _step_scores(row, react_steps)
    log = row.get("turn_log") or []
    tool_s = row.get("turn_tool_s") or []
    gen_s = row.get("turn_generation_s") or []
    count = max(len(log), max(steps, default=0) + (1 if row.get("termination_reason") == "final_answer" else 0))
    out = []
    for n in range(1, count + 1):
        step = steps.get(n)
        info = log[n - 1] if n - 1 < len(log) else {}
        text = str(step.get("assistant", "")) if step else str(row.get("completion") or "")
        observation = step.get("observation") if step else None
        decision = info.get("decision") or ("final" if step is None else "run" if step.get("action") else "warn")
        out.append(
            {
                "n": n,
                "segments": split_think(text),
                "action": _action_text(step.get("action")) if step else None,
                "observation": observation,
                "truncated": bool(observation) and MARKER.strip() in str(observation),
                "images": _shown(step.get("images"), images) if step else [],
                "warning": decision not in ("run", "final"),
                "decision": decision,
                "seed": info.get("seed"),
                "tokens": info.get("tokens"),
                "prompt_tokens": info.get("prompt_tokens"),
                "finish_reason": info.get("finish_reason"),
                "tool_s": tool_s[n - 1] if n - 1 < len(tool_s) and decision == "run" else None,
                "gen_s": gen_s[n - 1] if n - 1 < len(gen_s) else None,
                **dict(zip(("step_score", "step_score_error"), step_scores.get(n, (None, None)))),
            }
        )
    return out


def _step_scores(row: Row, react_steps: Sequence[Row]) -> dict[int, tuple[float | None, str | None]]:
    """Turn -> (step score, scorer error) of the records a step scorer scored (aligned with ``react_steps``)."""
    scores = row.get("step_scores") or []
    errors = row.get("step_score_errors") or [None] * len(scores)
    return {
        int(s.get("turn", i + 1)): (scores[i], errors[i] if i < len(errors) else None)
        for i, s in enumerate(react_steps)
        if i < len(scores)
    }


def episode(run: Run, row: Row, images: dict[str, str | None]) -> Row:
    """One episode; its page image (when the environment names one) is embedded once per report in
    ``images`` and referred to by its path."""
    fields = run.report.fields(row)
    image = fields.image
    if image and image not in images:
        images[image] = image_data_url(image)
    return {
        "run": run.name,
        "anchor": anchor(run, row["key"]),
        "key": row["key"],
        "task": row["task_id"],
        "sample": row.get("sample_index"),
        "seed": row.get("seed"),
        "score": clamped_score(row),
        "success": _succeeded(run, row),
        "is_error": _is_error(row),
        "reason": row.get("termination_reason"),
        "react_error": row.get("react_error"),
        "error": row.get("error"),
        "latency": row.get("latency_s"),
        "tokens": row.get("generated_tokens"),
        "tool_s": row.get("tool_seconds"),
        "prediction": row.get("prediction"),
        "gold": fields.gold,
        "question": fields.question,
        "score_note": fields.score_note,
        "process_score": row.get("process_score"),
        "process_aggregation": row.get("process_aggregation"),
        "image_path": image,
        "image_ok": bool(image and images.get(image)),
        "prompt_images": _shown(row.get("prompt_images"), images),
        "turns": turns(row, images),
    }


def episode_groups(runs: Sequence[Run], images: dict[str, str | None]) -> list[Row]:
    """Episodes grouped by key, one column per run that has it (side by side when comparing);
    fills ``images`` (path -> data URL) with the page images they show."""
    keys: list[str] = []
    by_key: list[dict[str, Row]] = []
    for run in runs:
        index = {r["key"]: r for r in run.rows}
        by_key.append(index)
        keys += [k for k in index if k not in keys]
    groups = []
    for key in keys:
        columns = [
            {**shown_episode(run, idx[key], images), "colour": i}
            for i, (run, idx) in enumerate(zip(runs, by_key))
            if key in idx
        ]
        groups.append({"key": key, "task": columns[0]["task"], "columns": columns})
    return groups


def shown_episode(run: Run, row: Row, images: dict[str, str | None]) -> Row:
    """:func:`episode`, or for a record whose fields do not fit (a damaged or foreign record) its
    identity and score with the reason it cannot be shown in full."""
    try:
        return episode(run, row, images)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        note = f"{row['key']}: turns not shown ({type(exc).__name__}: {exc})"
        run.notes.append(note)
        return {
            "run": run.name,
            "anchor": anchor(run, row["key"]),
            "key": row["key"],
            "task": row["task_id"],
            "sample": row["sample_index"],
            "seed": row.get("seed"),
            "score": clamped_score(row),
            "success": None,
            "is_error": _is_error(row),
            "reason": row.get("termination_reason"),
            "react_error": row.get("react_error"),
            "error": row.get("error"),
            "latency": row.get("latency_s"),
            "tokens": row.get("generated_tokens"),
            "tool_s": None,
            "prediction": str(row.get("prediction")),
            "gold": None,
            "question": "",
            "score_note": None,
            "process_score": None,
            "process_aggregation": None,
            "image_path": None,
            "image_ok": False,
            "prompt_images": [],
            "turns": [],
            "problem": note,
        }


def comparison(a: Run, b: Run) -> Row:
    """Per-task paired means and ``compare``'s paired bootstrap CI (B minus A)."""
    try:
        result: Row | None = paired_bootstrap(a.rows, b.rows, spec=a.spec)
        problem = None
    except ValueError as exc:
        result, problem = None, str(exc)
    ta, tb = by_task(a.rows), by_task(b.rows)
    rows = []
    for task in [t for t in ta if t in tb]:
        ma = statistics.fmean(clamped_score(r) for r in ta[task])
        mb = statistics.fmean(clamped_score(r) for r in tb[task])
        rows.append({"task": task, "a": ma, "b": mb, "delta": mb - ma, "anchor": anchor(a, ta[task][0]["key"])})
    return {"a": a.name, "b": b.name, "result": result, "problem": problem, "rows": rows}
