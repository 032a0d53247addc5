"""The cards' reports from the command line (docs/cards.md): ``summarize --group K --best-by``, and
the card of a run over several data sets (``eval --data A --data B``, ``summarize --card``), with
the scripted policy, real environments and real bubblewrap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_envs.cli import main

AIME = Path("/work/shared/data/math/aime_2026.jsonl")


def _doc_records(folder: Path, scores: dict[str, list[float]]) -> Path:
    """A DocVQA run folder: records whose ES score is their ANLS, and its config."""
    folder.mkdir()
    rows = [
        {
            "key": f"{t}:sample{i:02d}",
            "task_id": t,
            "row_index": r,
            "sample_index": i,
            "score": s,
            "anls": s,
            "acc": 1.0 if s > 0.5 else 0.0,
            "termination_reason": "final_answer",
            "env_id": "DocVQA-CLI-v0",
            "score_method": "docvqa_paper_react_cli_anls",
        }
        for r, (t, ss) in enumerate(scores.items())
        for i, s in enumerate(ss)
    ]
    (folder / "records.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "config.json").write_text(json.dumps({"samples": len(next(iter(scores.values())))}))
    return folder


def test_summarize_group_4_prints_every_group_and_the_best_by_the_named_metric(tmp_path, capsys):
    run = _doc_records(
        tmp_path / "doc",
        {"q1": [1.0, 0.8, 0.0, 0.0, 0.9, 0.9, 0.9, 0.9], "q2": [0.0, 0.0, 0.0, 0.0, 0.6, 0.6, 0.6, 1.0]},
    )
    assert main(["summarize", str(run), "--group", "4", "--best-by", "anls_mean4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("group "))
    assert header.split() == [
        "group",
        "samples",
        "count",
        "mean_score",
        "max@4",
        "pass@4",
        "anls_mean4",
        "anls_pass4",
        "acc_mean4",
        "acc_pass4",
        "exact_pass@4",
        "exact_mean4",
        "exact_pass4",
    ]
    table = {line.split()[0]: line.split() for line in lines[lines.index(header) + 1 :] if line[:1].isdigit()}
    assert (
        table["0"][1] == "0-3" and table["0"][6:8] == ["0.2250", "0.5000"] and table["0"][-2:] == ["0.1250", "0.5000"]
    )
    assert (
        table["1"][1] == "4-7" and table["1"][6:8] == ["0.8000", "0.9500"] and table["1"][-2:] == ["0.1250", "0.5000"]
    )
    assert lines[-1] == "best group by anls_mean4: 1 (samples 4-7)"
    assert main(["summarize", str(run), "--group", "4", "--best-by", "anls_mean4", "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)[str(run)]["groups"]
    assert groups["best_group"] == 1 and groups["groups"][0]["exact_mean4"] == 0.125
    assert main(["summarize", str(run), "--group", "4", "--best-by", "anls_mean"]) == 2
    assert "cannot choose the best group by 'anls_mean'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory) -> Path:
    if not AIME.is_file():
        pytest.skip(f"shared AIME file missing at {AIME}")
    out = tmp_path_factory.mktemp("card") / "run"
    code = main(
        [
            "eval",
            "--policy",
            "scripted",
            "--data",
            "synth=builtin",
            "--data",
            str(AIME),
            "--limit",
            "2",
            "--samples",
            "2",
            "--env-arg",
            'scorer="exact"',
            "--sandbox",
            "bwrap",
            "--out",
            str(out),
            "--no-progress",
            "--no-report",
        ]
    )
    assert code == 0
    return out


def test_eval_over_two_data_sets_writes_a_run_per_set_and_their_card(two_sets, capsys):
    assert sorted(p.name for p in two_sets.iterdir()) == ["aime_2026", "card.json", "card.txt", "synth"]
    for name in ("synth", "aime_2026"):
        config = json.loads((two_sets / name / "config.json").read_text())
        assert config["env_settings"] == {"scorer": "exact", "blocklist": True}
        assert len((two_sets / name / "records.jsonl").read_text().splitlines()) == 4
    cards = json.loads((two_sets / "card.json").read_text())
    assert list(cards) == ["synth", "aime_2026"]
    for card in cards.values():
        assert (card["tasks"], card["samples"], card["episodes"]) == (2, 2, 4)
        assert card["final_answer"] == {"count": 4, "total": 4, "value": 1.0}
        assert card["request_errors"] == 0 and card["settings"]["scorer"] == "exact"
        assert set(card["score_methods"]) <= {"math_paper_react_cli_exact_fallback"}
    text = (two_sets / "card.txt").read_text()
    assert text.startswith("synth: 2 tasks x 2 samples = 4 episodes; blocklist=True, scorer=exact\n")
    assert "\naime_2026: 2 tasks x 2 samples = 4 episodes" in text
    assert text.count("  final answers     4/4 = 1\n") == 2
    assert main(["summarize", "--card", str(two_sets / "synth"), str(two_sets / "aime_2026")]) == 0
    assert capsys.readouterr().out == text


def test_card_counts_solved_tasks_and_sample_zero(tmp_path, capsys):
    """c/n = x for binary scores: mean over samples, pass@k over tasks, acc@1 over sample 0."""
    run = tmp_path / "math"
    run.mkdir()
    outcomes = {"a": [1.0, 1.0, 0.0, 1.0], "b": [0.0, 0.0, 0.0, 1.0], "c": [0.0, 0.0, 0.0, 0.0]}
    rows = [
        {
            "key": f"{t}:sample{i:02d}",
            "task_id": t,
            "row_index": 0,
            "sample_index": i,
            "score": s,
            "termination_reason": "final_answer" if t != "c" else "max_turns",
            "score_method": "math_paper_react_cli_exact_fallback",
            "react_steps": [{"turn": 1, "assistant": "?", "observation": "warning"}] if t == "b" and i == 0 else [],
        }
        for t, ss in outcomes.items()
        for i, s in enumerate(ss)
    ]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["summarize", "--card", str(run)]) == 0
    text = capsys.readouterr().out
    assert "  mean@4            4/12 = 0.3333\n" in text
    assert "  pass@4            2/3 = 0.6667\n" in text and "  acc@1 (sample 0)  1/3 = 0.3333\n" in text
    assert "  max@4             0.6667\n" in text and "  per sample        0.3333 / 0.3333 / 0.0000 / 0.6667\n" in text
    assert "  final answers     8/12 = 0.6667\n" in text and "  terminations      final_answer 8, max_turns 4\n" in text
    assert "  parser errors     1 format warnings in 1 episodes\n" in text


def test_eval_skill_file_reaches_the_prompt_and_pins_resume(tmp_path, capsys):
    skill = tmp_path / "skill.md"
    skill.write_text("Print the answer with python first.\n")
    plain, skilled = tmp_path / "plain", tmp_path / "skilled"
    common = ["eval", "--policy", "scripted", "--limit", "1", "--no-progress", "--no-report", "--sandbox", "bwrap"]
    assert main([*common, "--out", str(plain)]) == 0
    assert main([*common, "--out", str(skilled), "--skill-file", str(skill)]) == 0
    config = json.loads((skilled / "config.json").read_text())
    assert config["skill_file"] == str(skill) and len(config["skill_sha256"]) == 64
    hashes = [
        json.loads((run / "records.jsonl").read_text().splitlines()[0])["env_config_hash"] for run in (plain, skilled)
    ]
    assert hashes[0] != hashes[1]  # the system prompt carries the skill
    skill.write_text("Another skill.\n")
    capsys.readouterr()
    assert main([*common, "--out", str(skilled), "--skill-file", str(skill), "--resume"]) == 2
    assert "skill_sha256" in capsys.readouterr().err
    assert main([*common, "--out", str(tmp_path / "x"), "--skill-file", str(tmp_path / "missing.md")]) == 2
    assert "skill file" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["..", "."])
def test_a_data_set_name_that_is_not_a_folder_under_out_is_refused(tmp_path, capsys, name):
    """``..=builtin`` wrote its run folder beside --out, ``.`` into --out itself."""
    out = tmp_path / "out"
    argv = ["eval", "--policy", "scripted", "--sandbox", "none", "--limit", "1", "--no-progress", "--out", str(out)]
    assert main([*argv, "--data", f"{name}=builtin", "--data", "b=builtin"]) == 2
    assert capsys.readouterr().err == (
        f"agent-envs eval: error: --data name {name!r} is not a folder under --out; name the set NAME=SPEC\n"
    )
    assert list(tmp_path.iterdir()) == []
