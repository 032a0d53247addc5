"""``export``, ``summarize`` and ``compare`` on a records file holding a row without ``task_id``
(docs/reliability.md#run-folders): it ended in a pydantic ValidationError traceback from the
loader they share.  Each is one line naming the file and the line (not the row's index among the
readable rows: a blank line comes before it here), exit 2, no traceback, and export leaves no
``tokens.jsonl``.  Real processes on hand-written records, no model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _row(task_id: str) -> dict:
    turn = {"completion_ids": [3, 4], "observation_ids": [5], "sampled": True, "logprobs": [-0.1, -0.2]}
    return {
        "key": f"{task_id}:sample00",
        "task_id": task_id,
        "row_index": 0,
        "sample_index": 0,
        "score": 1.0,
        "token_trajectory": {"prompt_ids": [1, 2], "turns": [{**turn, "finish_reason": "stop"}], "exact": True},
    }


@pytest.mark.parametrize("command", ["export", "summarize", "compare"])
def test_a_row_without_task_id_is_one_line_naming_file_and_line(tmp_path, command):
    run = tmp_path / "run"
    run.mkdir()
    nameless = {k: v for k, v in _row("b").items() if k != "task_id"}
    lines = [json.dumps(_row("a")), "", json.dumps(nameless), json.dumps(_row("c"))]
    (run / "records.jsonl").write_text("\n".join(lines) + "\n")
    argv = {"export": [str(run), "--format", "tokens"], "summarize": [str(run)], "compare": [str(run), str(run)]}
    done = subprocess.run(
        [sys.executable, "-m", "agent_envs.cli", command, *argv[command]],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"agent-envs {command}: error: {run / 'records.jsonl'}: line 3 is not a record (task_id: Field required)"
        + ("; remove or repair it" if command == "export" else "")
        + "\n"
    )
    assert done.stdout == "" and sorted(p.name for p in run.iterdir()) == ["records.jsonl"]
