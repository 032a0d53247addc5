"""ES progress people can watch: a metrics row per generation in ``<history>.metrics.jsonl`` (flushed
as it is written), its PNG, and clear errors for a TensorBoard or W&B that is not installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_es_update_rule import Recorded, config, trainer

from agent_envs.es.history import load_history, update_records
from agent_envs.es.perturb import SeededPerturber
from agent_envs.es.progress import Progress, check_backends, metrics_path, metrics_row, plot_metrics, read_metrics
from test_es_history import make_model


def test_every_generation_appends_a_flushed_metrics_row(tmp_path: Path) -> None:
    history = tmp_path / "history.json"
    path = metrics_path(history)
    assert path.name == "history.json.metrics.jsonl"
    backend = Recorded(make_model(), exact_revert=True)
    before = [p.detach().clone() for _, p in backend.params]
    lines_seen: list[int] = []
    progress = Progress(path, log=lambda _: None)

    def observe(record: dict[str, Any], timing: dict[str, Any]) -> None:
        progress.observe(record, timing)
        lines_seen.append(len(path.read_text().splitlines()))  # on disk as soon as it is written

    run = trainer(history, config(generations=2, eval_interval=1), backend, eval_hook=held_out)
    run.progress = observe
    initial = {"generation": -1, "dapo_eval": {"mean_score": 0.25}}
    progress.observe(initial)
    run.run()
    progress.close()
    assert lines_seen == [2, 3]
    rows = read_metrics(path)
    records = update_records(load_history(history))
    assert rows[0] == {"generation": -1, "updates": 0, "held_out": {"dapo": 0.25}}
    for row, record in zip(rows[1:], records, strict=True):
        assert row["generation"] == record["generation"] and row["updates"] == record["generation"] + 1
        assert row["reward_mean"] == record["reward_mean"] and row["reward_std"] == record["reward_std"]
        assert row["reward_best"] == max(record["rewards"]) and row["sigma"] == record["sigma"]
        assert row["seconds"] >= 0 and row["held_out"] == {"dapo": 0.5 + record["generation"]}
        assert row == metrics_row(record, {"wall_s": row["seconds"]})  # rebuilt from the history alone
    # the update norm is the norm of the weights' change (float32 model: the change as added)
    first = SeededPerturber(make_model())
    first.update(*run.update_arguments(records[0]["seeds"], records[0]["weights"])[:2], records[0]["alpha"])
    change = torch.cat([(p.detach() - b).flatten() for (_, p), b in zip(first.params, before, strict=True)])
    assert rows[1]["update_norm"] == pytest.approx(float(change.norm()), rel=1e-5)
    png = plot_metrics(rows, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def held_out(generation: int) -> dict[str, Any]:
    return {"dapo_eval": {"mean_score": 0.5 + generation}}


def test_a_missing_tensorboard_or_wandb_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for module in ("torch.utils.tensorboard", "tensorboardX", "wandb"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it fails, installed or not
    with pytest.raises(ValueError, match="--tensorboard needs the 'tensorboard' package"):
        check_backends(str(tmp_path / "tb"), None)
    with pytest.raises(ValueError, match="--wandb needs the 'wandb' package"):
        Progress(tmp_path / "m.jsonl", wandb_project="p")
    assert not (tmp_path / "m.jsonl").exists()  # refused before anything was written
    from agent_envs.esrun.run import make_config
    from agent_envs.esrun.settings import parse_settings

    base = ["--model", "m", "--history", "h", "--train", "builtin"]
    for flags, message in (
        (["--wandb", "p"], "needs the 'wandb' package"),
        (["--mirrored", "--population", "5"], "even population"),
        (["--member-sampling", "beam"], "unknown member sampling"),
        (["--optimizer", "adam", "--adam-beta2", "1"], "adam_beta2"),
    ):
        with pytest.raises(SystemExit):
            parse_settings([*base, *flags])
        assert message in capsys.readouterr().err
    args = parse_settings([*base, "--mirrored", "--member-sampling", "Greedy", "--optimizer", "adam"])
    built = make_config(args, None)
    assert (built.mirrored, built.member_sampling, built.optimizer) == (True, "greedy", "adam")
    assert json.loads(built.model_dump_json())["adam_beta2"] == 0.999
    default = make_config(parse_settings(base), None)
    assert (default.mirrored, default.member_sampling, default.optimizer) == (False, "protocol", "sgd")
