"""A command line that explains itself (issue 36): ``--version``, help on every option of every
command, descriptions without docstring markup, a bad option answered with its own command's
usage (also by ``scripts/run_main.sh``, before it installs or runs anything), and ``compare --json``."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from agent_envs import __version__
from agent_envs.cli import build_parser, main
from agent_envs.policy import server

REPO = Path(__file__).resolve().parent.parent
#: reStructuredText that reads as noise in a terminal: roles (:class:`X`) and inline literals (``x``)
MARKUP = re.compile(r":[a-z]+:`|``")


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    found = [("agent-envs serve", server.build_parser())]

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        found.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for command, sub in action.choices.items():
                    walk(f"{name} {command}", sub)

    walk("agent-envs", build_parser())
    return found


def test_every_option_of_every_command_has_help_and_no_markup():
    missing, marked = [], []
    for name, parser in _parsers():
        if MARKUP.search(parser.description or ""):
            marked.append(f"{name}: description")
        for action in parser._actions:
            label = f"{name} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                missing.append(label)
            elif action.help != argparse.SUPPRESS and MARKUP.search(str(action.help)):
                marked.append(label)
    assert not missing, f"options without help: {missing}"
    assert not marked, f"help with docstring markup: {marked}"


def test_serve_help_is_plain_text(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["serve", "--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    assert "OpenAI-compatible" in text and "--port PORT" in text and not MARKUP.search(text)


def test_version(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0 and capsys.readouterr().out == f"agent-envs {__version__}\n"


@pytest.mark.parametrize("command", ["eval", "summarize", "compare"])
def test_an_unknown_option_is_answered_with_its_commands_usage(command, capsys):
    argv = [command, "--bogus"] if command == "eval" else [command, "a", "b", "--bogus"]
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2
    assert err.startswith(f"usage: agent-envs {command} ")
    assert err.rstrip().endswith(f"agent-envs {command}: error: unrecognized arguments: --bogus")


def _run(folder, scores):
    folder.mkdir()
    rows = [
        {"key": f"t{i}:sample00", "task_id": f"t{i}", "row_index": i, "sample_index": 0, "score": s}
        for i, s in enumerate(scores)
    ]
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_compare_prints_a_table_or_with_json_only_json(tmp_path, capsys):
    a, b = _run(tmp_path / "base", [0.0, 1.0, 0.0, 0.0]), _run(tmp_path / "trained", [1.0, 1.0, 0.0, 1.0])
    assert main(["compare", str(a), str(b), "--bootstrap-samples", "200", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)  # the whole output is one JSON document
    assert result["paired_tasks"] == 4 and result["mean_score_delta"] == 0.5 and result["bootstrap_samples"] == 200
    assert main(["compare", str(a), str(b), "--bootstrap-samples", "200"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["A", str(a), "0.2500"] and lines[2].split() == ["B", str(b), "0.7500"]
    assert lines[3].startswith("delta +0.5000 over 4 tasks, 95% CI [")


def test_run_main_checks_its_arguments_before_installing_or_running_anything():
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_main.sh"), "--limit", "1", "--bogus"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AGENT_ENVS_MAIN_OUT": "/nonexistent/never-written"},
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "agent-envs eval: error: unrecognized arguments: --bogus" in proc.stderr
    assert "[install]" not in proc.stdout + proc.stderr and "[main]" not in proc.stdout
