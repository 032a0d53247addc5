"""Render the report: load runs, compute views and plots, fill the Jinja2 template, write one file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from agent_envs.core.atomic import atomic_write

from . import plots, views
from .load import Run, RunError, load_run


def default_output(run_dirs: Sequence[str | Path]) -> Path:
    """``RUN/report.html`` for one run; ``RUN_A/report-vs-<B>.html`` when comparing."""
    first = Path(run_dirs[0])
    folder = first if first.is_dir() else first.parent
    if len(run_dirs) == 1:
        return folder / "report.html"
    return folder / ("report-vs-" + "-".join(_folder(Path(p)).name for p in run_dirs[1:]) + ".html")


def _folder(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def _unique_names(runs: list[Run]) -> None:
    """Two folders with the same name (``a/run`` vs ``b/run``) are told apart by their parent."""
    names = [r.name for r in runs]
    for run in runs:
        if names.count(run.name) > 1:
            run.name = f"{run.path.parent.name}/{run.name}"


def _shared_tasks(a: Run, b: Run) -> bool:
    """Two runs are compared task by task only when they evaluated some of the same tasks (runs of
    two different environments are shown side by side, not paired)."""
    return bool({r["task_id"] for r in a.rows} & {r["task_id"] for r in b.rows})


def render(runs: list[Run], compare: tuple[int, int] | None = None) -> str:
    """The report's HTML; two runs of shared tasks are compared, or among more the pair ``compare``
    (indices into ``runs``: A then B)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("agent_envs.report", "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    if compare is None and len(runs) == 2 and _shared_tasks(*runs):
        compare = (0, 1)
    comparison = views.comparison(runs[compare[0]], runs[compare[1]]) if compare else None
    if len(runs) <= 2:
        title = "agent-envs report: " + (" vs " if comparison else " + ").join(r.name for r in runs)
    else:  # the runs are listed under the title; a title naming six of them fills the first screen
        envs = list(dict.fromkeys(views.env_id(r) for r in runs))
        title = f"agent-envs report: {len(runs)} runs of {', '.join(envs)}"
    images: dict[str, str | None] = {}
    groups = views.episode_groups(runs, images)
    notes = [(r.name, [*filter(None, [views.unjudged(r)]), *r.notes]) for r in runs]
    return env.get_template("report.html.j2").render(
        title=title,
        runs=runs,
        colours=plots.COLOURS,
        generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        metrics=views.metric_rows(runs),
        plots=plots.all_plots(runs),
        task_rows=[views.task_rows(r) for r in runs],
        groups=groups,
        images={path: url for path, url in images.items() if url},
        comparison=comparison,
        has_process=any("process" in r.metrics for r in runs),
        notes=notes,
        about=views.about(runs),
    )


def check_output(path: Path) -> None:
    """A :class:`RunError` naming the problem when the report cannot be written at ``path``
    (checked before the runs are read and rendered)."""
    if path.is_dir():
        raise RunError(f"--out {path} is a directory; name a file, e.g. {path / 'report.html'}")
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise RunError(f"--out {path}: {blocker} is a file, not a directory")


def build_report(
    run_dirs: Sequence[str | Path], out: str | Path | None = None, compare: tuple[int, int] | None = None
) -> Path:
    """Write the self-contained HTML report of one run, or of two runs side by side (with more runs,
    ``compare`` names the two, by index into ``run_dirs``, that get the paired comparison)."""
    if not run_dirs:
        raise ValueError("give at least one run folder")
    path = Path(out) if out is not None else default_output(run_dirs)
    check_output(path)
    runs = [load_run(p) for p in run_dirs]
    _unique_names(runs)
    try:
        atomic_write(path, [render(runs, compare).encode("utf-8", "replace")])
    except OSError as exc:  # a read-only mount, a full disk, no permission
        raise RunError(f"cannot write the report to {path}: {exc.strerror or exc}") from None
    return path
