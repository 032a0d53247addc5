"""``agent-envs report`` end to end: real runs (scripted policy, real sandboxes, real DocVQA
pages) rendered to HTML and checked in a real headless Chromium through the rendered DOM."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import browser
from agent_envs.cli import main
from agent_envs.policy.factory import BACKENDS
from agent_envs.report.views import split_think, turns
from agent_envs.rollout.metrics import paired_bootstrap
from agent_envs.rollout.records import read_jsonl
from agent_envs.sandbox.output import MARKER

needs_browser = pytest.mark.skipif(
    browser.chromium() is None, reason="chromium not installed (bash scripts/install.sh --test installs it)"
)

#: a JS check run in the page after load: episode keys listed, page images decoded, filter and sort
CHECK = """function () {
  var index = document.getElementById('episode-index');
  var rows = Array.from(index.tBodies[0].rows);
  var visible = function () { return rows.filter(function (r) { return r.offsetParent !== null; }).length; };
  var out = {keys: rows.map(function (r) { return r.dataset.key; }), shown: visible()};
  out.images = Array.from(document.querySelectorAll('img.page-image')).map(function (i) { return i.naturalWidth; });
  out.plots = Array.from(document.querySelectorAll('img.plot')).map(function (i) { return i.naturalWidth; });
  var input = document.querySelector('input[data-filter-for=episode-index]');
  input.value = FILTER; input.dispatchEvent(new Event('input'));
  out.filtered = visible();
  input.value = ''; input.dispatchEvent(new Event('input'));
  out.unfiltered = visible();
  var th = Array.from(index.tHead.rows[0].cells).find(function (c) { return c.textContent.trim().startsWith('score'); });
  var scores = function () { return Array.from(index.tBodies[0].rows).map(function (r) { return parseFloat(r.cells[2].textContent); }); };
  th.click(); out.ascending = scores();
  th.click(); out.descending = scores();
  out.columns = Array.from(document.querySelectorAll('details.group')).map(function (g) { return g.querySelectorAll('article.episode').length; });
  return out;
}"""


def _eval(out: Path, *extra: str) -> str:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_envs.cli",
            "eval",
            "--policy",
            "scripted",
            "--out",
            str(out),
            "--no-progress",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out.parent,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _env() -> dict[str, str]:
    import os

    repo = str(Path(__file__).resolve().parent.parent)
    return dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture(scope="module")
def math_run(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("report") / "math"
    return out, _eval(out, "--limit", "3", "--samples", "2")


@pytest.fixture(scope="module")
def doc_run(tmp_path_factory, docvqa_dir) -> Path:
    out = tmp_path_factory.mktemp("report") / "docvqa"
    _eval(out, "--env", "DocVQA-CLI-v0", "--data", str(docvqa_dir / "val_v1.0.json"), "--limit", "2")
    return out


def _keys(run: Path) -> list[str]:
    rows, _ = read_jsonl(run / "records.jsonl")
    return sorted(r["key"] for r in rows)


def _check(report: Path, filter_text: str) -> dict:
    found = browser.check_page(report, CHECK.replace("FILTER", json.dumps(filter_text)))
    assert found["errors"] == [], found["errors"]
    return found["result"]


def test_eval_writes_the_report_and_prints_its_path(math_run, tmp_path):
    run, stdout = math_run
    report = run / "report.html"
    assert f"report: {report}" in stdout and report.is_file()
    html = report.read_text()
    # self-contained: nothing is fetched from anywhere
    assert not re.search(r'(src|href)="(https?:)?//', html) and "<link" not in html
    assert "ANLS" not in html  # no DocVQA columns for a run whose records carry no anls
    quiet = tmp_path / "quiet"
    assert "report:" not in _eval(quiet, "--limit", "1", "--no-report")
    assert not (quiet / "report.html").exists()


@needs_browser
def test_math_report_in_a_browser_lists_filters_and_sorts(math_run):
    run, _ = math_run
    result = _check(run / "report.html", "synth_math_0_1:")
    assert sorted(result["keys"]) == _keys(run) and result["shown"] == 6
    assert result["filtered"] == 2 and result["unfiltered"] == 6  # one task, two samples
    assert result["ascending"] == sorted(result["ascending"])
    assert result["descending"] == sorted(result["descending"], reverse=True)
    assert len(result["plots"]) == 5 and all(w > 0 for w in result["plots"])


@needs_browser
def test_docvqa_report_shows_decoded_pages_and_anls(doc_run):
    result = _check(doc_run / "report.html", "sample00")
    assert sorted(result["keys"]) == _keys(doc_run)
    assert len(result["images"]) == 2 and all(w > 0 for w in result["images"])
    assert max(result["images"]) <= 900  # real scans are downscaled before embedding
    assert "ANLS mean" in (doc_run / "report.html").read_text()


@needs_browser
def test_two_runs_side_by_side_with_the_compare_ci(math_run, tmp_path, capsys):
    run_a, _ = math_run
    run_b = tmp_path / "better"
    run_b.mkdir()
    rows, _ = read_jsonl(run_a / "records.jsonl")
    for row in rows:
        if row["task_id"] == "synth_math_0_0":
            row["score"] = 1.0
    (run_b / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(run_a), str(run_b), "--out", str(tmp_path / "cmp.html")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cmp.html")
    html = (tmp_path / "cmp.html").read_text()
    lo, hi = paired_bootstrap(read_jsonl(run_a / "records.jsonl")[0], rows)["bootstrap_95_ci"]
    assert f"95% bootstrap CI [{lo:+.4f}, {hi:+.4f}]" in html
    result = _check(tmp_path / "cmp.html", "better")
    assert len(result["keys"]) == 12 and result["filtered"] == 6
    assert result["columns"] == [2] * 6  # each episode of A beside the same episode of B
    # sorting by score: 1.0 rows first in one direction, last in the other
    assert result["ascending"] == sorted(result["ascending"]) and result["ascending"][-1] == 1.0
    assert result["descending"] == sorted(result["descending"], reverse=True) and result["descending"][0] == 1.0


@needs_browser
def test_math_and_docvqa_runs_in_one_report(math_run, doc_run, tmp_path):
    """What the main job writes: two environments side by side, no task pairing between them."""
    run, _ = math_run
    assert main(["report", str(run), str(doc_run), "--out", str(tmp_path / "both.html")]) == 0
    html = (tmp_path / "both.html").read_text()
    assert 'id="comparison"' not in html and "ANLS mean" in html
    result = _check(tmp_path / "both.html", "docvqa")
    assert sorted(result["keys"]) == sorted(_keys(run) + _keys(doc_run))
    assert result["filtered"] == len(_keys(doc_run)) and all(w > 0 for w in result["images"])


@needs_browser
def test_report_of_a_run_killed_midway(math_run, tmp_path):
    run, _ = math_run
    killed = tmp_path / "killed"
    killed.mkdir()
    lines = (run / "records.jsonl").read_bytes().splitlines(keepends=True)
    (killed / "records.jsonl").write_bytes(b"".join(lines[:4]) + lines[4][: len(lines[4]) // 2])  # torn last line
    shutil.copy(run / "config.json", killed / "config.json")  # no summary.json: the run never ended
    assert main(["report", str(killed)]) == 0
    html = (killed / "report.html").read_text()
    assert "incomplete" in html and "1 unreadable line(s) skipped" in html
    assert sorted(_check(killed / "report.html", "")["keys"]) == _keys(killed)


def _as_policy(run: Path, folder: Path, **config: object) -> Path:
    """A copy of ``run`` whose config.json says another policy ran it (the records stay real)."""
    shutil.copytree(run, folder)
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, **config}))
    return folder


def _section(html: str, section: str) -> str:
    return html.split(f'<section id="{section}">', 1)[1].split("</section>", 1)[0]


def test_first_section_says_what_each_run_is_and_how_to_run_a_real_model(math_run, tmp_path):
    run, _ = math_run
    tiny = _as_policy(run, tmp_path / "tiny", policy="cpu", max_turns=3, max_tokens_per_turn=128)
    real = _as_policy(run, tmp_path / "real", policy="vllm", model="Qwen/Qwen3-4B")
    assert main(["report", str(run), str(tiny), str(real), "--out", str(tmp_path / "three.html")]) == 0
    html = (tmp_path / "three.html").read_text()
    assert html.index('id="about"') < html.index('id="summary"')  # the first thing under the title
    assert "<title>agent-envs report: 3 runs of MATH-ReAct-v0</title>" in html
    about = _section(html, "about")
    assert all(name in about for name in ("math", "tiny", "real"))
    assert "scripted reference policy (no model)" in about and BACKENDS["scripted"].words in about
    assert "SmolLM2-135M-Instruct (embedded, CPU)" in about and BACKENDS["cpu"].words in about
    assert "Qwen/Qwen3-4B" in about and "at most 3 turns, 128 tokens per turn" in about
    assert "--env MATH-ReAct-v0 --policy vllm --model" in about and "--base-url http://127.0.0.1:8000/v1" in about
    # a real model alone: nothing to tell the reader about running one
    assert main(["report", str(real), "--out", str(tmp_path / "real.html")]) == 0
    alone = _section((tmp_path / "real.html").read_text(), "about")
    assert "Qwen/Qwen3-4B" in alone and "--base-url" not in alone


def test_plots_carry_no_legend_and_one_colour_key_names_every_run(math_run, tmp_path):
    """A legend drawn inside each small figure covered its title; the key above the plots replaces it."""
    import base64

    run, _ = math_run
    copies = [_as_policy(run, tmp_path / f"copy{i}") for i in range(5)]
    assert main(["report", str(run), *map(str, copies), "--out", str(tmp_path / "six.html")]) == 0
    section = _section((tmp_path / "six.html").read_text(), "plots")
    svgs = [base64.b64decode(src).decode() for src in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', section)]
    assert len(svgs) == 5 and not any("legend" in svg for svg in svgs)
    key = section.split('<p class="key">', 1)[1].split("</p>", 1)[0]
    assert all(f">{name}</span>" in key for name in ["math", *(c.name for c in copies)])
    assert len(set(re.findall(r"--c: (#[0-9a-f]{6})", key))) == 6  # six runs, six colours


@needs_browser
def test_the_explanation_is_on_the_first_screen(math_run, tmp_path):
    run, _ = math_run
    tiny = _as_policy(run, tmp_path / "tiny", policy="cpu")
    assert main(["report", str(run), str(tiny), "--out", str(tmp_path / "two.html")]) == 0
    found = browser.check_page(
        tmp_path / "two.html",
        """function () {
      var hint = document.querySelector('pre.hint').getBoundingClientRect();
      return {hint_bottom: hint.bottom, width: window.innerWidth};
    }""",
    )
    # Chromium's headless window is 780 px wide: even so narrow, it all fits in the first 1000 px
    assert found["errors"] == [] and 0 < found["result"]["hint_bottom"] <= 1000, found


def test_report_of_a_folder_without_records_is_a_usage_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no records at" in capsys.readouterr().err


@needs_browser
def test_screenshot_of_a_docvqa_trajectory(doc_run, tmp_path):
    """The episode view as a person sees it: page image beside the conversation, not blank."""
    from PIL import Image

    show_first = (
        "document.querySelectorAll('#summary,#plots,#tasks,#episode-index').forEach("
        "function (e) { e.style.display = 'none'; }); document.querySelector('details.group').open = true;"
    )
    png = browser.screenshot(doc_run / "report.html", tmp_path / "episode.png", script=show_first)
    with Image.open(png) as img:
        colours = img.convert("RGB").resize((200, 250)).getcolors(maxcolors=100_000)
    assert colours is not None and len(colours) > 50


def test_turns_fold_think_blocks_mark_truncation_and_keep_the_final_turn():
    row = {
        "termination_reason": "final_answer",
        "completion": "<think>sure</think>Final answer: 4",
        "react_steps": [
            {
                "turn": 1,
                "assistant": "<think>plan\nmore</think>Action: ...",
                "action": {"name": "bash", "arguments": {"command": "echo 4"}},
                "observation": "4" + MARKER + "9",
            },
            {"turn": 2, "assistant": "oops", "observation": "Format check failed"},
        ],
        "turn_log": [
            {"turn": 1, "seed": 7, "tokens": 12, "decision": "run"},
            {"turn": 2, "seed": 104, "tokens": 3, "decision": "warn"},
            {"turn": 3, "seed": 201, "tokens": 5, "decision": "final"},
        ],
        "turn_tool_s": [0.25, 0.0, 0.0],
    }
    t1, t2, t3 = turns(row)
    assert t1["segments"] == [("think", "plan\nmore"), ("text", "Action: ...")]
    assert t1["action"] == "bash$ echo 4" and t1["truncated"] and t1["tool_s"] == 0.25 and t1["seed"] == 7
    assert t2["warning"] and not t2["truncated"] and t2["tool_s"] is None
    assert t3["decision"] == "final" and t3["segments"][-1] == ("text", "Final answer: 4") and t3["observation"] is None
    # records written before turn_log existed still show every turn
    old = {k: v for k, v in row.items() if k not in ("turn_log", "turn_tool_s")}
    assert [t["decision"] for t in turns(old)] == ["run", "warn", "final"]
    assert split_think("<think>unclosed") == [("think", "unclosed")]


def test_a_tool_call_is_shown_as_written():
    """A shell command as a shell line; the python tool's code with its own lines; anything else as JSON."""

    def shown(action):
        return turns(
            {
                "react_steps": [{"turn": 1, "assistant": "", "action": action, "observation": "ok"}],
                "termination_reason": "max_turns",
            }
        )[0]["action"]

    assert shown({"name": "bash", "arguments": {"command": "ls -l"}}) == "bash$ ls -l"
    assert (
        shown({"name": "python", "arguments": {"code": "x = 6\nprint(x * 7)"}}) == "python (code):\nx = 6\nprint(x * 7)"
    )
    assert (
        shown({"name": "view", "arguments": {"box": [0, 0, 9, 9]}})
        == '{"name": "view", "arguments": {"box": [0, 0, 9, 9]}}'
    )


def test_records_carry_per_turn_facts(math_run):
    """What the trajectory view shows per turn comes from the environment and the runner."""
    run, _ = math_run
    rows, _ = read_jsonl(run / "records.jsonl")
    for row in rows:
        log = row["turn_log"]
        assert [t["turn"] for t in log] == list(range(1, row["turns"] + 1))
        assert [t["seed"] for t in log] == [row["seed"] + 97 * k for k in range(row["turns"])]
        assert sum(t["tokens"] for t in log) == row["generated_tokens"]
        assert [t["decision"] for t in log] == ["run", "final"]  # scripted: one tool call, then the answer
        assert row["turn_tool_s"][0] > 0 and row["turn_tool_s"][1] == 0
        assert row["tool_seconds"] == sum(row["turn_tool_s"])
        assert len(row["turn_generation_s"]) == row["turns"]


def test_countdown_report_shows_its_numbers_target_and_a_gold_solution(tmp_path):
    from agent_envs.envs.countdown.scoring import score
    from agent_envs.envs.countdown.task import CountdownTask

    out = tmp_path / "countdown"
    _eval(out, "--env", "Countdown-ReAct-v0", "--limit", "2")
    html = (out / "report.html").read_text()
    rows, _ = read_jsonl(out / "records.jsonl")
    golds = re.findall(r'<span class="label">gold</span> <code>(.*?)</code>', html)
    assert len(golds) == len(rows) == 2
    for row in rows:
        task = CountdownTask(id=row["task_id"], nums=tuple(row["nums"]), target=row["target"])
        assert f"Numbers: {', '.join(map(str, task.nums))}; target: {task.target}" in html
        # the gold is a solution: an expression the scorer accepts for exactly this task
        assert any(score(g.replace("&#39;", "'"), task).correct for g in golds)
