"""``agent-envs`` end to end with the scripted policy, real environments and real sandboxes:
output files, SIGKILL + ``--resume``, ``summarize`` and ``compare``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_envs.cli import main
from agent_envs.envs.registry import spec
from agent_envs.rollout.records import read_jsonl

REPO = Path(__file__).resolve().parent.parent


def _cli(*args: str, cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "agent_envs.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _eval(out: Path, *extra: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = _cli("eval", "--policy", "scripted", "--out", str(out), "--no-progress", *extra, cwd=cwd)
    stdout, stderr = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def math_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    out = root / "math"
    done = _eval(out, "--limit", "3", "--samples", "2", "--sandbox", "bwrap", "--mode", "lockstep", cwd=root)
    assert done.returncode == 0, done.stderr
    assert "records" in done.stdout and str(out) in done.stdout
    return out


def test_eval_writes_records_summary_config_and_trace_logs(math_run):
    rows, bad = read_jsonl(math_run / "records.jsonl")
    assert bad == 0 and len(rows) == 6
    expected = sorted(f"synth_math_0_{i}:sample{s:02d}" for i in range(3) for s in range(2))
    assert sorted(r["key"] for r in rows) == expected
    assert all(r["used_bash"] and r["termination_reason"] == "final_answer" and r["policy"] == "scripted" for r in rows)
    summary = json.loads((math_run / "summary.json").read_text())
    assert summary["es"]["count"] == 6 and summary["es"]["samples"] == 2 and summary["es"]["items"] == 3
    assert summary["tool_call_rate"] == 1.0
    config = json.loads((math_run / "config.json").read_text())
    assert config["env"] == "MATH-ReAct-v0" and config["samples"] == 2 and config["policy"] == "scripted"
    logs = sorted(p.name for p in (math_run / "trace_logs").iterdir())
    assert len(logs) == 6 and all(n.startswith("math_agent_synth_math_0_") for n in logs)
    for row in rows:
        outcome = "SUCCEED" if row["score"] >= 1.0 else "FAILED"
        assert f"math_agent_{row['task_id']}_sample{row['sample_index']:02d}_{outcome}.md" in logs


def test_eval_refuses_to_mix_runs(math_run, tmp_path):
    done = _eval(math_run, "--limit", "3", cwd=tmp_path)
    assert done.returncode == 2 and "--resume" in done.stderr
    done = _eval(math_run, "--limit", "3", "--samples", "2", "--resume", "--max-turns", "7", cwd=tmp_path)
    assert done.returncode == 2 and "configuration changed" in done.stderr and "max_turns" in done.stderr


def test_sigkill_then_resume_gives_exactly_one_record_per_episode(tmp_path):
    out = tmp_path / "run"
    args = ("--limit", "12", "--samples", "2", "--sandbox", "bwrap", "--concurrency", "2")
    proc = _cli("eval", "--policy", "scripted", "--out", str(out), "--no-progress", *args, cwd=tmp_path)
    records = out / "records.jsonl"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if records.exists() and len(records.read_bytes().splitlines()) >= 3:
                break
            time.sleep(0.05)  # polling the file, not synchronising on time
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    before, _ = read_jsonl(records)
    assert 3 <= len(before) < 24
    done = _eval(out, *args, "--resume", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows, bad = read_jsonl(records)
    keys = [r["key"] for r in rows]
    expected = {f"synth_math_0_{i}:sample{s:02d}" for i in range(12) for s in range(2)}
    assert bad == 0 and len(keys) == 24 and set(keys) == expected
    # finished episodes were kept, not re-run
    kept = {r["key"]: r for r in rows}
    assert all(kept[r["key"]]["latency_s"] == r["latency_s"] for r in before)
    assert json.loads((out / "summary.json").read_text())["es"]["count"] == 24


def test_summarize_and_compare(math_run, capsys):
    assert main(["summarize", str(math_run), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)[str(math_run)]
    assert summary["es"]["count"] == 6
    assert "mean_anls" not in summary["diagnostics"]
    assert summary["diagnostics"]["score_metric"] == spec("MATH-ReAct-v0").score_metric
    assert main(["summarize", str(math_run), "--group", "1"]) == 0
    text = capsys.readouterr().out
    assert "\n0      0-0" in text and "\n1      1-1" in text and "best group by mean_score: 0" in text
    assert main(["compare", str(math_run), str(math_run), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["paired_tasks"] == 3 and result["mean_score_delta"] == 0.0
    assert result["score_metric"] == spec("MATH-ReAct-v0").score_metric
    assert result["bootstrap_95_ci"] == [0.0, 0.0]


def test_compare_rejects_different_task_sets(math_run, tmp_path, capsys):
    rows, _ = read_jsonl(math_run / "records.jsonl")
    other = tmp_path / "other"
    other.mkdir()
    (other / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["row_index"] != 0))
    assert main(["compare", str(math_run), str(other)]) == 2
    assert "task sets differ" in capsys.readouterr().err


def test_docvqa_scripted_eval_reads_the_page_with_tesseract(tmp_path):
    out = tmp_path / "doc"
    done = _eval(out, "--env", "DocVQA-CLI-v0", "--limit", "2", "--sandbox", "bwrap", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows, _ = read_jsonl(out / "records.jsonl")
    assert len(rows) == 2
    for row in rows:
        obs = row["react_steps"][0]["observation"]
        # the scripted reference is an oracle on the built-in pages: the gold answer the OCR output holds
        assert "[exit_code] 0" in obs and row["prediction"] in row["answers"] and row["score"] > 0
        assert "anls" in row and row["env_id"] == "DocVQA-CLI-v0"
    assert all(p.name.startswith("docvqa_agent_docvqa_") for p in (out / "trace_logs").iterdir())
    assert "anls_mean1" in json.loads((out / "summary.json").read_text())["docvqa"]


def test_bad_input_gives_a_clear_error(tmp_path, capsys):
    assert (
        main(
            [
                "eval",
                "--policy",
                "scripted",
                "--data",
                str(tmp_path / "missing.jsonl"),
                "--out",
                str(tmp_path / "x"),
                "--no-progress",
            ]
        )
        == 2
    )
    assert "cannot load --data" in capsys.readouterr().err
    assert main(["summarize", str(tmp_path / "nowhere")]) == 2
    assert "no records" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--engine-arg", "no-equals-sign"])


def test_serve_hands_its_arguments_to_the_policy_server(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("usage: agent-envs serve")
