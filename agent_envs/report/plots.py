"""The report's figures, drawn by matplotlib's SVG backend (no display, no network).

Every figure overlays the runs being reported, one colour per run, so two runs compare at a glance.
The figures carry no legend of their own: the page shows one colour key above them all, which
stays readable for any number of runs (a legend drawn inside each small figure covered its title).
"""

from __future__ import annotations

import io
from collections import Counter
from typing import Any, Sequence

from .load import Run
from .media import svg_data_url

COLOURS = ("#2563eb", "#ea580c", "#16a34a", "#9333ea", "#0891b2", "#be123c", "#65a30d", "#a16207")


def _figure(height: float = 2.6) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("svg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    return plt.subplots(figsize=(4.6, height), dpi=100)


def _finish(fig: Any, ax: Any, title: str, xlabel: str, ylabel: str) -> str:
    import matplotlib.pyplot as plt

    ax.set_title(title, fontsize=10, loc="left")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    return svg_data_url(buf.getvalue())


def histogram(values: Sequence[Sequence[float]], title: str, xlabel: str, ylabel: str, bins: Any = 20) -> str | None:
    """Overlaid histograms, one per run (``values[i]`` is run ``i``'s); None when no run has a value."""
    if not any(values):
        return None
    fig, ax = _figure()
    used = [(vs, COLOURS[i % len(COLOURS)]) for i, vs in enumerate(values) if vs]  # a run's colour by its index
    # several runs: bars side by side within each bin (overlaid translucent bars mix colours)
    ax.hist([vs for vs, _ in used], bins=bins, color=[c for _, c in used], edgecolor="white", linewidth=0.5)
    ax.yaxis.get_major_locator().set_params(integer=True)
    return _finish(fig, ax, title, xlabel, ylabel)


def counts(values: Sequence[Sequence[int]], title: str, xlabel: str) -> str | None:
    """Bars for small integer values (turns per episode), side by side per run."""
    if not any(values):
        return None
    fig, ax = _figure()
    width = 0.8 / len(values)
    for i, vs in enumerate(values):
        c = Counter(vs)
        xs = sorted(c)
        ax.bar(
            [x + (i - (len(values) - 1) / 2) * width for x in xs],
            [c[x] for x in xs],
            width=width,
            color=COLOURS[i % len(COLOURS)],
        )
    seen = [v for vs in values for v in vs]
    ax.set_xlim(min(seen) - 0.7, max(seen) + 0.7)
    step = max(1, (max(seen) - min(seen)) // 10 + 1)
    ax.set_xticks(range(min(seen), max(seen) + 1, step))
    ax.yaxis.get_major_locator().set_params(integer=True)
    return _finish(fig, ax, title, xlabel, "episodes")


def reasons(runs: Sequence[Run]) -> str | None:
    """Termination reasons as grouped horizontal bars."""
    counts = [Counter(str(r.get("termination_reason")) for r in run.rows) for run in runs]
    labels = sorted(set().union(*counts), key=lambda k: -sum(c[k] for c in counts))
    if not labels:
        return None
    fig, ax = _figure(height=max(1.8, 0.8 + 0.4 * len(labels) * max(1, len(runs) * 0.7)))
    height = 0.8 / len(runs)
    for i, c in enumerate(counts):
        ys = [j + i * height for j in range(len(labels))]
        ax.barh(ys, [c[k] for k in labels], height=height, color=COLOURS[i % len(COLOURS)])
    ax.set_yticks([j + height * (len(runs) - 1) / 2 for j in range(len(labels))], labels)
    ax.invert_yaxis()
    ax.xaxis.get_major_locator().set_params(integer=True)
    return _finish(fig, ax, "Termination reasons", "episodes", "")


def all_plots(runs: Sequence[Run]) -> list[dict[str, str]]:
    """Every figure that has data, as ``{"title", "src"}``."""

    def per_turn(run: Run, field: str, only_tools: bool = False) -> list[float]:
        out: list[float] = []
        for row in run.rows:
            log = row.get("turn_log") or []
            if field == "tokens":
                out += [float(t["tokens"]) for t in log if isinstance(t.get("tokens"), (int, float))]
            else:
                secs = row.get(field) or []
                out += [float(s) for t, s in zip(log, secs) if not only_tools or t.get("decision") == "run"]
        return out

    def step_scores(run: Run) -> list[float]:
        return [float(v) for r in run.rows for v in r.get("step_scores") or [] if v is not None]

    figures = [
        (
            "Score distribution",
            histogram(
                [[float(r.get("score") or 0.0) for r in run.rows] for run in runs],
                "Score per episode",
                "score",
                "episodes",
                bins=[i / 10 for i in range(11)],
            ),
        ),
        (
            "Turns per episode",
            counts([[int(r.get("turns") or 0) for r in run.rows] for run in runs], "Turns per episode", "turns"),
        ),
        (
            "Tokens per turn",
            histogram(
                [per_turn(run, "tokens") for run in runs], "Generated tokens per turn", "tokens in one turn", "turns"
            ),
        ),
        (
            "Tool-call latency",
            histogram(
                [[s * 1000 for s in per_turn(run, "turn_tool_s", True)] for run in runs],
                "Sandbox time per tool call",
                "milliseconds",
                "tool calls",
            ),
        ),
        ("Termination reasons", reasons(runs)),
        (
            "Step scores",
            histogram(
                [step_scores(run) for run in runs],
                "Process reward per step",
                "step score",
                "steps",
                bins=[i / 10 for i in range(11)],
            ),
        ),
    ]
    return [{"title": title, "src": src} for title, src in figures if src]
