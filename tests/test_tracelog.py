"""Markdown trajectory logs: file names and byte format (docs/protocol.md#trace-logs, #trace-outcome-cases)."""

from __future__ import annotations

import pytest

from agent_envs.envs.registry import spec
from agent_envs.rollout.tracelog import render, safe_task_id, trace_filename, training_prefix, write_trace_log

DOC = spec("DocVQA-CLI-v0").report
MATH = spec("MATH-ReAct-v0").report

STEPS = [
    {
        "turn": 1,
        "assistant": "  Look first.\nAction: {...}  \n",
        "action": {"name": "bash", "arguments": {"command": "tesseract /workspace/document.png - | head"}},
        "observation": "Invoice n° 123\n[exit_code] 0",
    },
    {"turn": 2, "assistant": "no action here", "observation": "Format warning"},
    {
        "turn": 3,
        "assistant": 'Action: {"name": "bash"}',
        "action": {"name": "bash", "arguments": {}},
        "observation": "",
    },
]


def _doc_row(score: float, **extra) -> dict:
    row = {
        "task_id": "docvqa_18831",
        "sample_index": 0,
        "env_id": "DocVQA-CLI-v0",
        "score": score,
        "anls": score,
        "acc": 1.0 if score > 0.5 else 0.0,
        "prediction": "invoice 123",
        "score_method": "docvqa_paper_react_cli_anls",
        "termination_reason": "final_answer",
        "react_error": None,
        "image": "/data/doc.png",
        "answers": ["Invoice 123", "invoice no. 123"],
        "task": {"id": "docvqa_18831", "question": "What is the invoice number?"},
        "react_steps": STEPS[:1],
    }
    row.update(extra)
    return row


def _math_row(score: float, **extra) -> dict:
    row = {
        "task_id": "dapo_1/x",
        "sample_index": 3,
        "env_id": "MATH-ReAct-v0",
        "score": score,
        "score_method": "math_paper_react_cli_exact_fallback",
        "prediction": "42",
        "answer": "42",
        "react_error": None,
        "task": {"id": "dapo_1/x", "question": "What is 6*7?", "answer": "42"},
        "react_steps": STEPS,
    }
    row.update(extra)
    return row


@pytest.mark.parametrize("score,outcome", [(0.8, "SUCCEED"), (0.5, "FAILED"), (0.51, "SUCCEED")])
def test_docvqa_outcome_is_score_above_half(score, outcome):
    assert trace_filename(_doc_row(score), DOC) == f"docvqa_agent_docvqa_18831_sample00_{outcome}.md"


@pytest.mark.parametrize("score,outcome", [(1.0, "SUCCEED"), (0.9, "FAILED"), (0.0, "FAILED")])
def test_math_outcome_needs_full_score(score, outcome):
    assert trace_filename(_math_row(score), MATH) == f"math_agent_dapo_1_x_sample03_{outcome}.md"


def test_training_prefix_matches_the_logged_example():
    name = trace_filename(_doc_row(1.0), DOC, prefix=training_prefix(36, 0, 989551694))
    assert name == "docvqa_agent_gen036_candidate00_seed989551694_docvqa_18831_sample00_SUCCEED.md"


def test_safe_task_id_collapses_runs():
    assert safe_task_id("a b/:c.d-e_f") == "a_b_c.d-e_f"
    assert safe_task_id("é€x") == "_x"


def test_docvqa_body_byte_format():
    expected = (
        "# Chat History docvqa_docvqa_18831\n\n"
        "Task ID: docvqa_18831\nSetting: docvqa\nSample index: 0\nImage: /data/doc.png\n"
        "Question: What is the invoice number?\n"
        'Expected answers: ["Invoice 123", "invoice no. 123"]\n'
        "Prediction: invoice 123\nANLS: 0.5\nThreshold accuracy: 0.0\nScore: 0.5\n"
        "Score method: docvqa_paper_react_cli_anls\nOutcome: FAILED\nTermination reason: final_answer\n"
        "Failure reason: ANLS did not exceed 0.5.\n\n"
        "## Problem\n\nWhat is the invoice number?\n\n"
        "## Trace\n\n"
        "## Round 1\n\n### Assistant\n\nLook first.\nAction: {...}\n\n"
        "### Action\n\n```json\n"
        '{"name": "bash", "arguments": {"command": "tesseract /workspace/document.png - | head"}}\n```\n\n'
        "### Observation\n\n```text\nInvoice n° 123\n[exit_code] 0\n```\n\n"
        "## Final prediction\n\ninvoice 123\n\n---\n\n## RESULT\nFAILED\n"
    )
    assert render(_doc_row(0.5), DOC) == expected


def test_docvqa_success_has_empty_failure_reason_and_react_error_wins():
    assert "\nFailure reason: \n" in render(_doc_row(1.0), DOC)
    text = render(_doc_row(0.0, react_error="max_react_turns_exceeded"), DOC)
    assert "\nFailure reason: max_react_turns_exceeded\n" in text


def test_math_body_byte_format():
    """The reference's blank lines around the problem, expected answer and prediction (TL1); each
    observation stripped, an all-whitespace one without a section (TL2); a step without an action
    has no Action section."""
    steps = [*STEPS[:2], {**STEPS[1], "observation": "   spaced  \n"}, {**STEPS[2], "observation": " \n\t"}]
    expected = (
        "# Chat History math_reasoning_dapo_1/x\n\nTask ID: dapo_1/x\nSetting: math_reasoning\nSample index: 3\n"
        "Score: 0.0\nScore method: math_paper_react_cli_exact_fallback\nOutcome: FAILED\n"
        "Failure reason: Score was 0.\n\n"
        "## Problem\n\nWhat is 6*7?\n\nExpected answer: 42\n\n"
        "## Trace\n\n"
        "## Round 1\n\n### Assistant\n\nLook first.\nAction: {...}\n\n"
        "### Action\n\n```json\n"
        '{"name": "bash", "arguments": {"command": "tesseract /workspace/document.png - | head"}}\n```\n\n'
        "### Observation\n\n```text\nInvoice n° 123\n[exit_code] 0\n```\n\n"
        "## Round 2\n\n### Assistant\n\nno action here\n\n### Observation\n\n```text\nFormat warning\n```\n\n"
        "## Round 3\n\n### Assistant\n\nno action here\n\n### Observation\n\n```text\nspaced\n```\n\n"
        '## Round 4\n\n### Assistant\n\nAction: {"name": "bash"}\n\n'
        '### Action\n\n```json\n{"name": "bash", "arguments": {}}\n```\n\n'
        "## Prediction\n\n42\n\n---\n\n## RESULT\nFAILED\n"
    )
    assert render(_math_row(0.0, react_steps=steps), MATH) == expected


def test_write_uses_utf8_with_replacement(tmp_path):
    row = _math_row(1.0, prediction="bad \ud800 surrogate")
    path = write_trace_log(row, tmp_path / "logs", MATH)
    assert path.name == "math_agent_dapo_1_x_sample03_SUCCEED.md"
    data = path.read_bytes().decode("utf-8")
    assert "bad ? surrogate" in data
    assert "Failure reason: \n" in data


def test_an_environment_without_a_renderer_gets_the_shared_layout(tmp_path):
    """A new environment that declares no renderer still gets its logs (it used to raise at the end
    of `agent-envs eval`): the shared header and rounds, the task payload as the problem."""
    from agent_envs.core.spec import ReportSpec

    report = ReportSpec(trace_prefix="toy")
    row = {
        "task_id": "toy/1",
        "sample_index": 2,
        "env_id": "Toy-v0",
        "score": 0.0,
        "prediction": "7",
        "score_method": "exact",
        "task": {"id": "toy/1", "question": "3 + 4?"},
        "react_steps": STEPS[:1],
    }
    text = render(row, report)
    assert text.startswith("# Chat History Toy-v0_toy/1\n\nTask ID: toy/1\nSetting: Toy-v0\nSample index: 2\n")
    assert (
        '## Problem\n\n```json\n{\n  "id": "toy/1",\n  "question": "3 + 4?"\n}\n```\n\n## Trace\n\n## Round 1\n' in text
    )
    assert "Invoice n° 123" in text and text.endswith("## Prediction\n\n7\n\n---\n\n## RESULT\nFAILED\n")
    path = write_trace_log(row, tmp_path, report)
    assert path.name == "toy_agent_toy_1_sample02_FAILED.md" and path.read_text(encoding="utf-8") == text
