"""``agent-envs export`` and the token export on damaged input (docs/reliability.md#run-folders):
a damaged ``token_trajectory``, a corrupt line or an unusable ``--out`` is one line naming file
and line, exit 2, and no output file (the export is written atomically or not at all); the export's
reader refuses lines a trainer would mis-index.  Hand-written records, real files, no model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from agent_envs import cli
from agent_envs.rollout.trajectories import episode_tokens, load_token_export

REPO = Path(__file__).resolve().parent.parent


def _row(key: str, **trajectory) -> dict:
    turn = {"completion_ids": [3, 4], "observation_ids": [5], "sampled": True, "logprobs": [-0.1, -0.2]}
    return {
        "key": f"{key}:sample00",
        "task_id": key,
        "row_index": 0,
        "sample_index": 0,
        "score": 1.0,
        "token_trajectory": {"prompt_ids": [1, 2], "turns": [{**turn, "finish_reason": "stop"}], "exact": True}
        | trajectory,
    }


def _run(tmp_path: Path, *lines: str) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "records.jsonl").write_text("".join(line + "\n" for line in lines))
    return run


GOOD = json.dumps(_row("a"))
TURN = _row("a")["token_trajectory"]["turns"][0]


@pytest.mark.parametrize(
    "trajectory, problem",
    [
        ({"turns": None}, "token_trajectory.turns: Input should be a valid list"),
        ({"turns": ["x"]}, "token_trajectory.turns.0: Input should be a valid dictionary"),
        ({"turns": [{"sampled": True}]}, "token_trajectory.turns.0.completion_ids: Field required"),
        ({"prompt_ids": None}, "token_trajectory.prompt_ids: Input should be a valid list"),
        ({"prompt_ids": ["1"]}, "token_trajectory.prompt_ids.0: Input should be a valid integer"),
        ({"prompt_ids": [1.0]}, "token_trajectory.prompt_ids.0: Input should be a valid integer"),
        ({"prompt_ids": [-1]}, "token_trajectory.prompt_ids.0: Input should be greater than or equal to 0"),
        ({"prompt_ids": [2**80]}, "token_trajectory.prompt_ids.0: Input should be less than 2147483648"),
        ({"prompt_ids": [[1]]}, "token_trajectory.prompt_ids.0: Input should be a valid integer"),
        ({"turns": [{**TURN, "logprobs": "x"}]}, "token_trajectory.turns.0.logprobs: Input should be a valid list"),
        ({"turns": [{**TURN, "sampled": "yes"}]}, "token_trajectory.turns.0.sampled: Input should be a valid boolean"),
    ],
)
def test_a_damaged_trajectory_is_one_line_naming_file_and_line_and_writes_nothing(
    tmp_path, capsys, trajectory, problem
):
    run = _run(tmp_path, GOOD, json.dumps(_row("b", **trajectory)))
    assert cli.main(["export", str(run), "--format", "tokens"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agent-envs export: error: {run / 'records.jsonl'}: line 2: record 'b:sample00': {problem}")
    assert err.count("\n") == 1 and not (run / "tokens.jsonl").exists()


def test_a_corrupt_middle_line_is_an_error_and_only_a_torn_last_line_is_skipped_and_said(tmp_path, capsys):
    """A skipped middle line would drop an episode from a trainer's data without a word; the torn
    last line is what a killed run leaves (its episode re-runs with eval --resume)."""
    run = _run(tmp_path, GOOD, "{not json", json.dumps(_row("c")))
    assert cli.main(["export", str(run), "--format", "tokens"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agent-envs export: error: {run / 'records.jsonl'}: line 2 is not JSON")
    assert err.count("\n") == 1 and not (run / "tokens.jsonl").exists()
    run = _run(tmp_path, GOOD, json.dumps(_row("c"))[:30])
    assert cli.main(["export", str(run), "--format", "tokens"]) == 0
    out, err = capsys.readouterr()
    assert "skipped the torn last line" in err and "1 episode(s)" in out
    assert [e.key for e in load_token_export(run / "tokens.jsonl")] == ["a:sample00"]


def test_nothing_to_export_leaves_no_file(tmp_path, capsys):
    row = _row("a")
    row.pop("token_trajectory")
    run = _run(tmp_path, json.dumps(row))
    assert cli.main(["export", str(run), "--format", "tokens"]) == 2
    assert "no episode has a token trajectory to export (skipped: 1 no token trajectory" in capsys.readouterr().err
    assert not (run / "tokens.jsonl").exists()


def test_out_a_directory_or_under_a_file_is_one_line(tmp_path, capsys):
    run = _run(tmp_path, GOOD)
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    for out, problem in (
        (tmp_path, f"--out {tmp_path} is a directory; name a file, e.g. {tmp_path / 'tokens.jsonl'}"),
        (blocker / "t.jsonl", f"--out {blocker / 't.jsonl'}: {blocker} is a file, not a directory"),
    ):
        assert cli.main(["export", str(run), "--format", "tokens", "--out", str(out)]) == 2
        assert capsys.readouterr().err == f"agent-envs export: error: {problem}\n"


def test_out_on_a_read_only_mount_is_one_line(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private read-only bind mount")
    run = _run(tmp_path, GOOD)
    target = tmp_path / "ro"
    target.mkdir()
    script = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    argv = [sys.executable, "-m", "agent_envs.cli", "export", str(run), "--format", "tokens"]
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", str(target), *argv]
        + ["--out", str(target / "t.jsonl")],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"agent-envs export: error: cannot write {target / 't.jsonl'}: Read-only file system\n"


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda e: e.update(loss_mask=e["loss_mask"][:-1]), "loss_mask and logprobs must have one entry per token"),
        (lambda e: e.update(logprobs=e["logprobs"] + [0.0]), "loss_mask and logprobs must have one entry per token"),
        (lambda e: e.update(prompt_length=99), "prompt_length 99 is past the end of the 5 tokens"),
        (lambda e: e.update(tokens=["1", 2, 3, 4, 5]), "tokens.0: Input should be a valid integer"),
        (lambda e: e.update(loss_mask=[0, 0, 2, 1, 0]), "loss_mask.2: Input should be less than or equal to 1"),
    ],
)
def test_load_token_export_refuses_lines_a_trainer_would_mis_index(tmp_path, edit, problem):
    line = asdict(episode_tokens(_row("a")))
    edit(line)
    (tmp_path / "t.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=rf"t.jsonl:1: not a token-trajectory line \({problem}"):
        load_token_export(tmp_path / "t.jsonl")
