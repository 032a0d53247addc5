"""The ES-trained SmolLM2 shipped as a history (agent_envs.es.trained_model): what ships is small and
complete, and a replay on the CPU gives the weights the GPU trained, generation by generation."""

from __future__ import annotations

import json
from pathlib import Path

from agent_envs.es.history import history_config
from agent_envs.es.lowrank import lowrank_updates
from agent_envs.es.trained_model import HISTORY, build, provenance, trained_history


def test_the_shipped_history_holds_every_update_and_its_result():
    history = trained_history()
    assert HISTORY.stat().st_size < 120_000
    updates = lowrank_updates(history)  # seeds checked against the run's seed stream, weights from rewards
    records = [r for r in history if "rewards" in r]
    assert len(updates) == len(records) == 300
    assert all(str(r["weights_fingerprint"]).startswith("wf1:") for r in records)
    trained = provenance()
    assert history_config(history)["base_checksum"] == trained["base_checksum"]
    low, _ = trained["held_out_compare"]["bootstrap_95_ci"]
    assert low > 0 and trained["held_out_compare"]["paired_tasks"] == 512


def test_the_first_generations_replay_to_the_gpus_fingerprints(tmp_path: Path, smollm2_gguf: Path):
    from agent_envs.policy.hf import smollm2_hf_dir

    report = build(tmp_path, smollm2_hf_dir(), generations=2, check_every=1)
    assert report["base_matches_run"] is True  # the embedded model converted here is the run's base
    assert report["checked_generations"] == [1, 2]
    assert report["fingerprints_equal"] == report["generations"] == 2
    assert report["first_differing_generation"] is None and report["bit_exact"] is True
    assert json.loads((tmp_path / "replay.json").read_text()) == report
    for folder in ("base", "trained"):
        assert json.loads((tmp_path / folder / "config.json").read_text())["dtype"] == "bfloat16"
