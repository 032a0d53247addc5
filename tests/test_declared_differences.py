"""Pins for the deliberate differences from the reference that docs/protocol.md declares."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from pydantic import ValidationError

import agent_envs  # noqa: F401  (registers the environments)
from agent_envs.envs.docvqa.data import DocDataError, load_docvqa_tasks
from agent_envs.envs.math_react.data import MathDataError, load_math_tasks
from agent_envs.protocol.decision import decide
from protocol_specs import DOCVQA_ES, MATH_ES
from agent_envs.envs.math_react.scoring import exact_fallback_match, math_score

BASH_ECHO = '{"name": "bash", "arguments": {"command": "echo hi"}, "x": '
UNDECODABLE = {
    "too deep": "Action: " + BASH_ECHO + "[" * 100_000 + "]" * 100_000 + "}",
    "too many digits": "Action: " + BASH_ECHO + "1" + "0" * 5000 + "}",
}


@pytest.mark.parametrize("text", UNDECODABLE.values(), ids=UNDECODABLE.keys())
def test_action_json_the_reference_decoder_raises_on(text):
    """The reference ended such an episode as request_error; here Math's relaxed parser runs the
    command and DocVQA (no relaxed parser) answers with the format warning."""
    math = decide(text, used_bash=False, flavour=MATH_ES)
    assert (math.kind, math.command) == ("act", "echo hi")
    doc = decide(text, used_bash=False, flavour=DOCVQA_ES)
    assert (doc.kind, doc.observation_name) == ("warn", "format_check")


def test_decimal_overflow_is_no_match_instead_of_an_exception():
    assert exact_fallback_match("1e999999999", "2e999999999") is False
    got = math_score(
        "Final answer: \\boxed{2e999999999}",
        "1e999999999",
        scorer="exact",
        termination_reason="final_answer",
        used_bash=True,
    )
    assert (got.score, got.method) == (0.0, "exact_fallback")


def test_all_empty_gold_answers_are_refused(tmp_path):
    row = {"id": 1, "question": "q", "answers": ["", "  "], "image": "p.png"}
    with pytest.raises(DocDataError, match="row 0: needs .*; this row has no answers"):
        load_docvqa_tasks([row], cache_dir=tmp_path)
    env = gym.make("DocVQA-CLI-v0")
    try:
        with pytest.raises(ValidationError, match="answers"):
            env.reset(options={"task": row})
    finally:
        env.close()


def test_a_null_gold_answer_is_refused_not_scored_as_the_text_none():
    row = {"id": "m1", "question": "1+1?", "answer": None}
    with pytest.raises(MathDataError, match="row 0: missing field"):
        load_math_tasks([row])
    env = gym.make("MATH-ReAct-v0", dataset=[{**row, "answer": "2"}])
    try:
        with pytest.raises(ValidationError, match="must not be null"):
            env.reset(options={"task": row})
    finally:
        env.close()


def _bash(command: str) -> str:
    return "Action: " + json.dumps({"name": "bash", "arguments": {"command": command}})


def _observation(env_id: str, sandbox: dict, command: str) -> str:
    env = gym.make(env_id, sandbox=sandbox)
    try:
        env.reset(seed=0)
        messages, *_ = env.step(_bash(command))
    finally:
        env.close()
    return messages[-1]["content"].removeprefix("Observation from bash:\n")


def test_a_signal_death_in_the_persistent_shell_shows_bashs_report():
    """The reference ran each DocVQA command in a fresh shell, whose child's SIGABRT left no output;
    the persistent shell reports the death on stderr.  mode="fresh" gives the reference text."""
    abort = 'python3 -c "import os; os.abort()"'
    persistent = _observation("DocVQA-CLI-v0", {"backend": "bwrap", "mode": "persistent"}, abort)
    assert persistent.startswith("[stderr]\n") and "Aborted" in persistent
    assert persistent.endswith("\n[exit_code] 134")
    fresh = _observation("DocVQA-CLI-v0", {"backend": "bwrap", "mode": "fresh"}, abort)
    assert fresh == "Bash exited with code 134 and no output."


def test_a_background_job_holding_the_pipe_does_not_time_out_the_math_tool():
    """The reference Math runner waited for its pipes to close, so ``sleep 4 &`` made a 1 s command
    time out and lose its output; the sandbox returns when the command itself is done.
    sandbox="none" reproduces the reference."""
    command, limits = "sleep 4 & echo bg", {"timeout_s": 1.0}
    sandboxed = _observation("MATH-ReAct-v0", {"backend": "bwrap", "limits": limits}, command)
    assert sandboxed == "bg\n\n[exit_code] 0"
    unsandboxed = _observation("MATH-ReAct-v0", {"backend": "none", "limits": limits}, command)
    assert unsandboxed == "Bash timed out after 1.0s."


def test_a_docvqa_record_without_tool_use_keeps_its_last_completion():
    """The reference blanked ``response``/``completion`` when bash never ran; the record keeps the
    completion (the score and the prediction are the reference's: 0 and empty)."""
    env = gym.make("DocVQA-CLI-v0", max_turns=2)
    try:
        env.reset(seed=0)
        env.step("Final answer: guessed")
        *_, info = env.step("The total is 42")
    finally:
        env.close()
    record = info["record"]
    assert (record["termination_reason"], record["used_bash"]) == ("max_turns", False)
    assert record["response"] == record["completion"] == "The total is 42"
    assert (record["score"], record["prediction"], record["score_method"]) == (
        0.0,
        "",
        "docvqa_paper_react_cli_no_tool_use",
    )


def _nested_action(depth: int) -> str:
    return "Action: " + BASH_ECHO + "[" * depth + "]" * depth + "}"


def test_action_json_nested_beyond_512_levels_is_undecodable():
    """The reference decoded up to its recursion limit (about 990 levels less its stack); here the
    bound is fixed, so every call site decides alike: Math's relaxed parser runs the command,
    DocVQA answers with the format warning."""
    text = _nested_action(600)
    assert decide(text, used_bash=False, flavour=MATH_ES).action == {
        "name": "bash",
        "arguments": {"command": "echo hi"},
    }
    assert decide(text, used_bash=False, flavour=DOCVQA_ES).kind == "warn"


def test_a_stored_action_keeps_its_parts_below_100_levels_as_json_text():
    """The reference stored the decoded action whole; copying or pickling a record holding 500
    levels raised RecursionError.  Here the command runs, and below 100 levels the record keeps
    the JSON text."""
    env = gym.make("DocVQA-CLI-v0")
    try:
        env.reset(seed=0)
        deep = "[" * 300 + "]" * 300
        messages, *_ = env.step('Action: {"name": "bash", "arguments": {"command": "echo hi", "x": ' + deep + "}}")
        *_, info = env.step("Final answer: hi")
    finally:
        env.close()
    assert messages[-1]["content"] == "Observation from bash:\nhi\n[exit_code] 0"
    action = info["record"]["react_steps"][0]["action"]
    assert action["name"] == "bash" and action["arguments"]["command"] == "echo hi"
    value = action["arguments"]["x"]
    for _ in range(98):  # below the action and its arguments, 98 levels of the list are kept as they were
        assert isinstance(value, list) and len(value) == 1
        value = value[0]
    assert value == "[" * 202 + "]" * 202
