"""Process rewards in the HTML report: a scored run (real episodes, real sandboxes) rendered and
checked in a real headless Chromium: per-turn step scores, the process column, metrics and plot."""

from __future__ import annotations

import json

import pytest

import browser
from agent_envs.report import build_report
from agent_envs.core.steps import BatchStepScorer, StepScore
from agent_envs.rollout.records import read_jsonl
from agent_envs.rollout.runner import run_episodes
from test_process_rewards import ENV_KWARGS, HashScorer
from test_runner import TASKS, SeededMathPolicy

CHECK = """function () {
  var turns = Array.from(document.querySelectorAll('article.episode')).map(function (a) {
    return {key: a.id, scores: Array.from(a.querySelectorAll('.step-score')).map(function (s) {
      return s.dataset.score !== undefined ? parseFloat(s.dataset.score) : s.dataset.error; }),
      process: (a.querySelector('.process-score') || {}).textContent};
  });
  var index = document.getElementById('episode-index');
  var head = Array.from(index.tHead.rows[0].cells).map(function (c) { return c.textContent.trim(); });
  var metrics = Array.from(document.querySelectorAll('table.metrics tbody tr')).map(function (r) {
    return [r.cells[0].textContent.trim(), r.cells[1].textContent.trim()]; });
  var plots = Array.from(document.querySelectorAll('figure')).map(function (f) {
    return [f.querySelector('figcaption').textContent, f.querySelector('img').naturalWidth]; });
  return {turns: turns, head: head, metrics: metrics, plots: plots};
}"""


class HalfFailing(BatchStepScorer):
    """HashScorer's scores, but a warning step (no action) fails: the report shows the reason."""

    aggregation = "product"

    def score_batch(self, contexts):
        ok = HashScorer().score_batch(contexts)
        return [s if c.action is not None else StepScore.failed("judge timed out") for c, s in zip(contexts, ok)]


needs_browser = pytest.mark.skipif(
    browser.chromium() is None, reason="chromium not installed (bash scripts/install.sh --test installs it)"
)


@needs_browser
def test_report_shows_step_scores_per_turn(tmp_path):
    run = tmp_path / "scored"
    run_episodes(
        "MATH-ReAct-v0",
        TASKS[:3],
        SeededMathPolicy(),
        samples=2,
        mode="lockstep",
        env_kwargs=ENV_KWARGS,
        progress=False,
        out_path=run / "records.jsonl",
        step_scorer=HalfFailing(),
    )
    rows, _ = read_jsonl(run / "records.jsonl")
    found = browser.check_page(build_report([run]), CHECK)
    assert found["errors"] == [], found["errors"]
    page = found["result"]
    by_key = {t["key"]: t for t in page["turns"]}
    for row in rows:
        shown = by_key[f"ep-scored-{row['key'].replace(':', '-')}"]
        expected = [s if s is not None else e for s, e in zip(row["step_scores"], row["step_score_errors"])]
        assert shown["scores"] == expected  # the full float travels in data-score
        process = row["process_score"]
        assert shown["process"].startswith("–" if process is None else f"{process:.4f}")
        assert "product of step scores" in shown["process"]
    assert any(e == "judge timed out" for r in rows for e in r["step_score_errors"])
    assert page["head"][-1] == "process score"
    metrics = dict(page["metrics"])
    steps = [s for r in rows for s in r["step_scores"] if s is not None]
    assert metrics["mean step score"] == f"{sum(steps) / len(steps):.4f}"
    assert metrics["step-score errors"] == str(sum(e is not None for r in rows for e in r["step_score_errors"]))
    assert metrics["process aggregation"] == "product"
    assert dict(page["plots"])["Step scores"] > 0


def test_unscored_runs_show_no_process_parts(tmp_path):
    run = tmp_path / "plain"
    run_episodes(
        "MATH-ReAct-v0",
        TASKS[:1],
        SeededMathPolicy(),
        env_kwargs=ENV_KWARGS,
        progress=False,
        out_path=run / "records.jsonl",
    )
    html = build_report([run]).read_text()
    assert "step score" not in html and "process score" not in html and "Step scores" not in html
    assert "step_scores" not in json.dumps(read_jsonl(run / "records.jsonl")[0])
