"""Pins for the deliberate differences from the reference that docs/protocol.md declares."""
from __future__ import annotations

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
    got = math_score("Final answer: \\boxed{2e999999999}", "1e999999999", scorer="exact",
                     termination_reason="final_answer", used_bash=True)
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
