"""Progress of an ES run that people can watch: one metrics row per generation, appended (and flushed)
to ``<history>.metrics.jsonl``, optionally sent to TensorBoard or Weights & Biases, and drawn as a PNG
(reward curve and held-out points) by :func:`plot_metrics`.

A row holds the generation, the member rewards' mean/std/best, sigma, the update's norm (the L2 norm
of the float32 change before its cast to the weights' dtype, as the backend reports it), the held-out
mean scores when that generation was evaluated, the generation's seconds and its generated tokens
per second.  The history stays the record a run is replayed from; the metrics file is for watching,
and can always be rebuilt from the history (:func:`metrics_row`).

    python -m agent_envs.es.progress runs/es/history.json.metrics.jsonl reward.png
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

Record = dict[str, Any]


def metrics_path(history_path: str | Path) -> Path:
    """The metrics file beside a history: ``<history>.metrics.jsonl``."""
    return Path(f"{history_path}.metrics.jsonl")


def update_norm(update: Any) -> float | None:
    """The update's L2 norm from a backend's answer: one dict, or one per tensor-parallel rank
    (disjoint shards: their norms combine as a root sum of squares)."""
    if isinstance(update, Mapping):
        value = update.get("update_norm")
        return None if value is None else float(value)
    if isinstance(update, (list, tuple)):
        norms = [update_norm(u) for u in update]
        return None if not norms or None in norms else math.sqrt(sum(n * n for n in norms if n is not None))
    return None


def held_out_scores(record: Mapping[str, Any]) -> dict[str, float]:
    """``{set name: mean score}`` of a record's ``<name>_eval`` blocks (a generation's interval
    evaluation, an initial, final or eval-only record)."""
    return {
        key.removesuffix("_eval"): float(block["mean_score"])
        for key, block in record.items()
        if key.endswith("_eval") and isinstance(block, Mapping) and "mean_score" in block
    }


def metrics_row(record: Mapping[str, Any], timing: Mapping[str, Any] | None = None) -> Record | None:
    """A history record's metrics row: a generation's, or a held-out-only one (the initial evaluation,
    generation -1, and the final one); None for other records (the config, a resume note)."""
    if "rewards" in record:
        rewards = [float(r) for r in record["rewards"]]
        seconds = (timing or {}).get("wall_s")
        tokens = sum(int(row.get("generated_tokens") or 0) for s in record.get("samples", []) for row in s["result"])
        row: Record = {
            "generation": int(record["generation"]),
            "updates": int(record["generation"]) + 1,
            "reward_mean": float(record["reward_mean"]),
            "reward_std": float(record["reward_std"]),
            "reward_best": max(rewards),
            "sigma": float(record["sigma"]),
            "update_norm": next((n for n in map(update_norm, record.get("updates", [])) if n is not None), None),
            "seconds": None if seconds is None else round(float(seconds), 3),
            "tokens_per_s": None if not seconds else round(tokens / float(seconds), 1),
        }
        scores = held_out_scores(record)  # interval evaluations sit at the top level (R1)
        return {**row, "held_out": scores} if scores else row
    scores = held_out_scores(record)
    if scores and "generation" in record:
        generation = int(record["generation"])  # -1: the initial evaluation; a final one: the updates it follows
        return {"generation": generation, "updates": max(generation, 0), "held_out": scores}
    return None


def describe(row: Mapping[str, Any]) -> str:
    """The row as one log line."""
    held = " ".join(f"{k}={v:.4f}" for k, v in row.get("held_out", {}).items())
    if "reward_mean" not in row:
        return f"[es] progress generation={row['generation']} held-out {held}"
    norm, speed = row.get("update_norm"), row.get("tokens_per_s")
    return (
        f"[es] progress generation={row['generation']} reward mean={row['reward_mean']:.4f} "
        f"std={row['reward_std']:.4f} best={row['reward_best']:.4f} sigma={row['sigma']:.3g} "
        f"update_norm={'-' if norm is None else f'{norm:.4g}'} {row['seconds']} s"
        f"{'' if speed is None else f' {speed:.0f} tok/s'}{f' held-out {held}' if held else ''}"
    )


class Progress:
    """The sinks of a run's metrics rows: the JSONL file (always), TensorBoard and W&B (when asked)."""

    def __init__(
        self,
        path: str | Path,
        tensorboard: str | None = None,
        wandb_project: str | None = None,
        config: Mapping[str, Any] | None = None,
        log: Any = print,
    ) -> None:
        self.writer = tensorboard_writer(tensorboard) if tensorboard else None
        self.wandb = wandb_run(wandb_project, config) if wandb_project else None
        self.path, self.log = Path(path), log
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    def observe(self, record: Mapping[str, Any], timing: Mapping[str, Any] | None = None) -> Record | None:
        """Write the record's metrics row (if it has one) everywhere; return it."""
        row = metrics_row(record, timing)
        if row is None or self._file is None:
            return row
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        self.log(describe(row))
        scalars = flat_scalars(row)
        step = int(row["updates"])
        if self.writer is not None:
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)
        return row

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def flat_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The row's numbers under TensorBoard/W&B names (``es/reward_mean``, ``held_out/<set>``)."""
    skip = ("generation", "updates", "held_out")
    out = {f"es/{k}": float(v) for k, v in row.items() if k not in skip and v is not None}
    out.update({f"held_out/{k}": float(v) for k, v in row.get("held_out", {}).items()})
    return out


def check_backends(tensorboard: str | None, wandb_project: str | None) -> None:
    """Before any engine starts: the backends asked for must be importable (a ValueError names the package)."""
    if tensorboard:
        tensorboard_class()
    if wandb_project:
        wandb_module()


def tensorboard_writer(log_dir: str) -> Any:
    return tensorboard_class()(log_dir=log_dir)


def tensorboard_class() -> Any:
    """TensorBoard's ``SummaryWriter``: torch's (needs the ``tensorboard`` package) or ``tensorboardX``'s."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        try:
            from tensorboardX import SummaryWriter  # type: ignore[import-not-found]
        except ImportError:
            raise ValueError(
                "--tensorboard needs the 'tensorboard' package (for torch.utils.tensorboard) or 'tensorboardX'; "
                "neither is installed (pip install tensorboard)"
            ) from None
    return SummaryWriter


def wandb_module() -> Any:
    try:
        import wandb  # type: ignore[import-not-found]
    except ImportError:
        raise ValueError("--wandb needs the 'wandb' package, which is not installed (pip install wandb)") from None
    return wandb


def wandb_run(project: str, config: Mapping[str, Any] | None) -> Any:
    """A Weights & Biases run in ``project`` with the run's config."""
    return wandb_module().init(project=project, config=dict(config or {}))


def read_metrics(path: str | Path) -> list[Record]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_metrics(rows: Sequence[Mapping[str, Any]], out: str | Path, title: str = "ES training") -> Path:
    """A PNG of the member reward (mean, with best as a thin line) per generation and the held-out
    mean scores where they were evaluated, against the updates applied before them."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    train = [r for r in rows if "reward_mean" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        x = [r["updates"] for r in train]
        ax.plot(x, [r["reward_mean"] for r in train], label="member reward (mean)", color="#2563eb")
        ax.plot(x, [r["reward_best"] for r in train], label="member reward (best)", color="#93c5fd", linewidth=0.8)
    names = sorted({name for r in rows for name in r.get("held_out", {})})
    for name, colour in zip(names, ("#ea580c", "#16a34a", "#9333ea", "#be123c")):
        points = [(r["updates"], r["held_out"][name]) for r in rows if name in r.get("held_out", {})]
        ax.plot(*zip(*points), "o--", label=f"held-out {name}", color=colour)
    ax.set_xlabel("updates")
    ax.set_ylabel("score")
    ax.set_title(title, loc="left")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, format="png", metadata={"Software": None})
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m agent_envs.es.progress METRICS.jsonl OUT.png", file=sys.stderr)
        return 2
    print(plot_metrics(read_metrics(args[0]), args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
