"""The LLM-judge step scorer: its prompt file, the score it parses, batched generation, images for
a vision-language judge, and a real small model judging a real episode's step."""

from __future__ import annotations

import re

import pytest
from PIL import Image

from agent_envs.core.content import images_of
from agent_envs.policy.base import Completion
from agent_envs.policy.scripted import ScriptedPolicy
from agent_envs.core.prompts import load_prompt
from agent_envs.rewards.judge import LLMJudgeScorer, fill_template, parse_score
from agent_envs.core.steps import StepContext, StepScore
from agent_envs.rollout.runner import run_episodes
from test_process_rewards import ENV_KWARGS
from test_runner import TASKS, SeededMathPolicy

MESSAGES = [
    {"role": "system", "content": "be careful"},
    {"role": "user", "content": "What is {action} 6*7?"},
    {"role": "assistant", "content": "hmm"},
    {"role": "user", "content": "Observation: use a tool"},
    {"role": "assistant", "content": "Action: run"},
    {"role": "user", "content": "42"},
]


def context(images: tuple[str, ...] = (), turn: int = 2, observation: str = "42") -> StepContext:
    return StepContext(
        env_id="MATH-ReAct-v0",
        key="t:sample00",
        turn=turn,
        question="What is {action} 6*7?",
        task={"id": "t"},
        messages=MESSAGES,
        assistant="Action: run",
        action={"name": "bash"},
        observation=observation,
        images=images,
    )


def test_template_file_is_filled_in_one_pass():
    text = fill_template(load_prompt("judges/step"), context())
    # the question's literal "{action}" is not re-filled; the system prompt and the step itself
    # are not part of the "conversation so far"
    assert "What is {action} 6*7?" in text and "[assistant]\nhmm" in text and "be careful" not in text
    assert text.count("Action: run") == 1 and "What the environment answered:\n42" in text
    assert not re.search(r"\{(question|conversation|action|observation|turn)\}", text.replace("{action} 6", ""))


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("fine step.\nScore: 0.75", StepScore(0.75)),
        ("**Score:** 1", StepScore(1.0)),
        ("Score: 0.2 at first... on reflection\nscore = .9", StepScore(0.9)),
        ("Score: 1.7", StepScore.failed("judge score 1.7 is outside [0, 1]")),
    ],
)
def test_parse_score(reply, expected):
    assert parse_score(reply) == expected


def test_unparseable_output_is_a_clear_error():
    result = parse_score("The step looks good to me.")
    assert result.score is None
    assert result.error == (
        "unparseable judge output (no 'Score: <number in [0, 1]>' line): 'The step looks good to me.'"
    )


def test_template_without_placeholders_is_refused(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("Rate this.\n")
    with pytest.raises(ValueError, match="has none of the placeholders"):
        LLMJudgeScorer(ScriptedPolicy([]), path)


class CountingJudge(ScriptedPolicy):
    """Scores 0.9 a step whose tool printed something and exited 0, 0.1 any other; 'shrug' for
    steps that printed nothing (an unparseable reply).  Counts batched calls."""

    def __init__(self) -> None:
        super().__init__(self.reply)
        self.batches: list[int] = []

    @staticmethod
    def reply(request) -> str:
        text = request.messages[0]["content"]
        answered = text.split("What the environment answered:\n", 1)[1]
        if "checking" in answered:
            return "shrug"
        return "Looks right.\nScore: 0.9" if "[exit_code] 0" in answered else "No.\nScore: 0.1"

    def generate(self, requests):
        self.batches.append(len(requests))
        assert len({r.seed for r in requests}) == 1
        return super().generate(requests)


def test_judge_scores_a_lockstep_run_in_batches():
    judge = CountingJudge()
    records = run_episodes(
        "MATH-ReAct-v0",
        TASKS,
        SeededMathPolicy(),
        samples=3,
        mode="lockstep",
        concurrency=16,
        env_kwargs=ENV_KWARGS,
        progress=False,
        step_scorer=LLMJudgeScorer(judge),
    )
    steps = [
        (s, score, error) for r in records for s, score, error in zip(r.react_steps, r.step_scores, r.step_score_errors)
    ]
    assert sum(judge.batches) == len(steps) and max(judge.batches) > 1
    for step, score, error in steps:
        observation = step["observation"]
        if "checking" in observation:
            assert score is None and error.startswith("unparseable judge output")
        else:
            assert score == (0.9 if "[exit_code] 0" in observation else 0.1) and error is None
    assert any(e for *_, e in steps) and any(s == 0.1 for _, s, _ in steps)
    assert all(r.process_aggregation == "mean" for r in records)


def test_failed_judge_request_is_recorded():
    failing = ScriptedPolicy(lambda r: Completion(error="request_error", error_message="HTTP 503"))
    assert LLMJudgeScorer(failing).score_sync([context()]) == [StepScore.failed("judge request failed: HTTP 503")]


def test_vision_judge_is_shown_the_page(tmp_path):
    page = Image.new("RGB", (40, 30), (10, 200, 30))
    page.putpixel((5, 7), (255, 0, 0))
    page.save(tmp_path / "page.png")
    seen = []
    judge = ScriptedPolicy(lambda r: seen.append(r) or "Score: 0.5")
    scorer = LLMJudgeScorer(judge, show_images=True)
    assert scorer.score_sync([context(images=(str(tmp_path / "page.png"),))]) == [StepScore(0.5)]
    (shown,) = images_of(seen[0].messages)
    assert shown.tobytes() == page.tobytes()
    assert seen[0].messages[0]["content"][-1]["type"] == "text"
    text_only = []
    LLMJudgeScorer(ScriptedPolicy(lambda r: text_only.append(r) or "Score: 0.5")).score_sync([context(images=("x",))])
    assert isinstance(text_only[0].messages[0]["content"], str)


def test_a_real_small_model_as_judge_never_breaks_the_loop():
    from agent_envs.policy.hf import default_cpu_policy

    try:
        policy = default_cpu_policy(num_threads=1)
    except FileNotFoundError as exc:
        pytest.skip(f"default CPU model unavailable: {exc}")
    try:
        first, second = LLMJudgeScorer(policy, max_tokens=24).score_sync([context(), context(observation="41")])
    finally:
        policy.close()
    for result in (first, second):
        assert (
            result.score is not None and 0 <= result.score <= 1 and result.error is None
        ) or result.error.startswith("unparseable judge output")


def test_eval_cli_scores_steps_with_a_judge_served_on_localhost(tmp_path, capsys):
    """``agent-envs eval --step-scorer judge``: the judge is a real OpenAI-compatible server on
    127.0.0.1 (requests over real sockets); records, summary and report carry the step scores."""
    import json

    from agent_envs.cli import main
    from agent_envs.policy.server import PolicyServer
    from agent_envs.rollout.records import read_jsonl

    out = tmp_path / "run"
    with PolicyServer(CountingJudge(), model="judge") as server:
        code = main(
            [
                "eval",
                "--policy",
                "scripted",
                "--limit",
                "2",
                "--out",
                str(out),
                "--no-progress",
                "--step-scorer",
                "judge",
                "--judge-url",
                server.url,
                "--judge-model",
                "judge",
            ]
        )
    assert code == 0, capsys.readouterr().err
    rows, _ = read_jsonl(out / "records.jsonl")
    for row in rows:  # the scripted baseline runs one tool call that prints, then answers
        assert row["step_scores"] == [0.9] and row["step_score_errors"] == [None]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["process"]["mean_step_score"] == 0.9 and summary["process"]["steps"] == len(rows)
    assert json.loads((out / "config.json").read_text())["step_scorer"]["judge_url"] == server.url
    assert 'class="step-score" data-score="0.9"' in (out / "report.html").read_text()
    assert (
        main(["eval", "--policy", "scripted", "--limit", "1", "--out", str(tmp_path / "bad"), "--step-scorer", "judge"])
        == 2
    )
    assert "--step-scorer judge needs --judge-url and --judge-model" in capsys.readouterr().err


def test_a_judge_trickling_a_byte_at_a_time_costs_the_eval_its_deadline_not_forever(tmp_path, capsys):
    """docs/reliability.md#deadlines: ``--judge-timeout``/``--judge-retries`` bound a stuck judge (a
    server sending a byte every 0.5 s never trips a per-read timeout); the step's score is a
    recorded error and the run ends."""
    from agent_envs.cli import main
    from agent_envs.rollout.records import read_jsonl
    from slow_servers import TrickleServer, run_bounded

    out = tmp_path / "run"
    argv = [
        "eval",
        "--policy",
        "scripted",
        "--limit",
        "1",
        "--out",
        str(out),
        "--no-progress",
        "--no-report",
        "--step-scorer",
        "judge",
        "--judge-model",
        "judge",
        "--judge-timeout",
        "1.5",
        "--judge-retries",
        "1",
    ]
    with TrickleServer() as server:
        finished, code, seconds = run_bounded(lambda: main([*argv, "--judge-url", server.url]), 60)
        assert finished, f"eval still running after {seconds:.0f}s"
        assert server.accepted == 2  # one attempt and one retry, each cut at 1.5 s
    assert code == 0, capsys.readouterr().err
    [row] = read_jsonl(out / "records.jsonl")[0]
    assert row["step_scores"] == [None]
    assert row["step_score_errors"][0].startswith("judge request failed: AttemptDeadline: no complete answer")
    bad = [a if a != str(out) else str(tmp_path / "bad") for a in argv[:-4]]
    assert main([*bad, "--judge-url", "http://127.0.0.1:9/v1", "--judge-timeout", "0"]) == 2
    assert "--judge-timeout must be > 0" in capsys.readouterr().err
