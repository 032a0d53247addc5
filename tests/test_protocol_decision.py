"""Decision order and exact protocol strings (docs/protocol.md#prompt-hashes, #warning-and-observation-texts,
#decision-order, #docvqa-prompts, #math-prompts, #first-turn-rule, #docvqa-protocol-cases, #math-protocol-cases)."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_envs.protocol.decision import decide
from protocol_specs import (
    DOCVQA_ES,
    DOCVQA_HTTP,
    MATH_ES,
    MATH_HTTP,
    MATH_HTTP_MATCHED,
    msg,
)

ALL_FLAVOURS = (MATH_ES, MATH_HTTP, MATH_HTTP_MATCHED, DOCVQA_ES, DOCVQA_HTTP)


def action(name: str = "bash", **arguments: object) -> str:
    return "Action:\n" + json.dumps({"name": name, "arguments": arguments})


# --- exact strings -----------------------------------------------------------------------------


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_hashed_warnings_match_section_1_2():
    assert len(msg.DOCVQA_FORMAT_WARNING_HTTP) == 170
    assert _sha(msg.DOCVQA_FORMAT_WARNING_HTTP) == "ac4f675528c9a7cb4ecb5bfc9d89ea3d0b194303c4a7450945c53d51d7046c4c"
    assert len(msg.DOCVQA_TOOL_REQUIRED) == 138
    assert _sha(msg.DOCVQA_TOOL_REQUIRED) == "098885d4186e06107118d25a800a7e895401bef9a631bf65a5699f86a76c7345"


def test_unhashed_strings_are_verbatim():
    block = 'Action:\n{"name": "bash", "arguments": {"command": "<shell command>"}}'
    assert msg.DOCVQA_FORMAT_WARNING_ES == (
        f"No valid action was parsed. Use exactly:\n{block}\nor, after tool use, Final answer: <short answer>"
    )
    assert msg.MATH_FORMAT_WARNING == (
        f"No valid action was parsed. Use exactly:\n{block}\n"
        "or finish after bash use with: Final answer: \\boxed{<answer>}"
    )
    assert msg.MATH_TOOL_REQUIRED == (
        "You must call the bash Action before answering. Use command-line Python to compute or "
        "verify the solution, then provide Final answer."
    )
    assert msg.MATH_FIRST_TURN == ("The first assistant turn must contain only one bash Action and no reasoning text.")
    assert msg.MATH_BLOCKED == "Blocked unsafe or interactive desktop command in math tool sandbox."
    assert msg.NO_COMMAND == "No shell command was provided."
    assert msg.unknown_action("python") == "Unknown action 'python'. Available action is bash."


def test_observation_message_frame():
    assert msg.observation_message("bash", "42\n[exit_code] 0") == {
        "role": "user",
        "content": "Observation from bash:\n42\n[exit_code] 0",
    }


def test_skill_injection_suffixes():
    docvqa = msg.with_skill("SYS", "  read carefully \n", msg.DOCVQA_SKILL_SUFFIX)
    assert docvqa == (
        "SYS\n\nUse the following distilled skill instructions while solving the task. They do not "
        "override the required bash/OCR tool-use and final-answer format.\n\nread carefully"
    )
    assert "bash/OCR" in docvqa  # docs/protocol.md#docvqa-protocol-cases (7)
    assert msg.with_skill("SYS", "tip", msg.MATH_SKILL_SUFFIX) == "SYS\n\nAdditional skill instructions:\ntip"
    assert msg.with_skill("SYS", " \n ", msg.MATH_SKILL_SUFFIX) == "SYS"


# --- docs/protocol.md#docvqa-protocol-cases -------------------------------------------------------


@pytest.mark.parametrize("flavour", [DOCVQA_ES, DOCVQA_HTTP])
def test_docvqa_action_validation(flavour):
    # docs/protocol.md#docvqa-protocol-cases (1)
    ok = decide(action(command="tesseract document.png stdout"), used_bash=False, flavour=flavour)
    assert (ok.kind, ok.act_kind, ok.command) == ("act", "run", "tesseract document.png stdout")
    assert ok.observation is None and ok.observation_name == "bash"
    blank = decide(action(command="   "), used_bash=False, flavour=flavour)
    assert (blank.kind, blank.act_kind, blank.observation) == ("act", "empty_command", msg.NO_COMMAND)
    assert blank.command is None  # an empty command is not tool use
    other = decide(action("python", command="print(1)"), used_bash=True, flavour=flavour)
    assert (other.act_kind, other.observation_name) == ("unknown_action", "python")
    assert other.observation == "Unknown action 'python'. Available action is bash."
    assert other.observation_message() == {
        "role": "user",
        "content": "Observation from python:\nUnknown action 'python'. Available action is bash.",
    }


@pytest.mark.parametrize("flavour", [DOCVQA_ES, DOCVQA_HTTP])
def test_docvqa_final_answer_requires_prior_tool_use(flavour):
    # docs/protocol.md#docvqa-protocol-cases (3) and (4)
    early = decide("Final answer: guessed", used_bash=False, flavour=flavour)
    assert (early.kind, early.observation_name, early.observation) == ("warn", "format_check", msg.DOCVQA_TOOL_REQUIRED)
    assert early.observation_message()["content"] == "Observation from format_check:\n" + msg.DOCVQA_TOOL_REQUIRED
    late = decide("Final answer: invoice 123", used_bash=True, flavour=flavour)
    assert (late.kind, late.final_answer) == ("final", "invoice 123")


def test_docvqa_free_text_gets_the_harness_specific_format_warning():
    # docs/protocol.md#docvqa-protocol-cases (5), #warning-and-observation-texts
    http = decide("I should inspect the image", used_bash=False, flavour=DOCVQA_HTTP)
    assert (http.kind, http.observation) == ("warn", msg.DOCVQA_FORMAT_WARNING_HTTP)
    es = decide("I should inspect the image", used_bash=False, flavour=DOCVQA_ES)
    assert (es.kind, es.observation) == ("warn", msg.DOCVQA_FORMAT_WARNING_ES)


def test_docvqa_es_accepts_missing_arguments_but_http_warns():
    es = decide('Action: {"name": "bash"}', used_bash=False, flavour=DOCVQA_ES)
    assert (es.kind, es.act_kind) == ("act", "empty_command")
    http = decide('Action: {"name": "bash"}', used_bash=False, flavour=DOCVQA_HTTP)
    assert (http.kind, http.observation) == ("warn", msg.DOCVQA_FORMAT_WARNING_HTTP)


# --- Math decision order -------------------------------------------------------------------------


def test_math_warnings_and_final():
    early = decide("Final answer: \\boxed{4}", used_bash=False, flavour=MATH_ES)
    assert (early.kind, early.observation) == ("warn", msg.MATH_TOOL_REQUIRED)
    junk = decide("I will think about it.", used_bash=True, flavour=MATH_ES)
    assert (junk.kind, junk.observation_name, junk.observation) == ("warn", "format_check", msg.MATH_FORMAT_WARNING)
    done = decide("So.\n\nFinal answer: \\boxed{\\frac{1}{2}}\n", used_bash=True, flavour=MATH_ES)
    assert (done.kind, done.final_answer) == ("final", "\\frac{1}{2}")


@pytest.mark.parametrize("flavour", ALL_FLAVOURS)
def test_action_wins_over_a_final_answer_in_the_same_completion(flavour):
    text = "Final answer: \\boxed{3}\n" + action(command="python -c 'print(3)'")
    got = decide(text, used_bash=True, flavour=flavour)
    assert (got.kind, got.command) == ("act", "python -c 'print(3)'")


def test_think_block_is_stripped_before_deciding():
    text = "<think>" + action(command="rm -rf x") + "</think>Final answer: 2"
    got = decide(text, used_bash=True, flavour=MATH_ES)
    assert (got.kind, got.final_answer) == ("final", "2")


def test_math_es_missing_command_and_relaxed_parse():
    # docs/protocol.md#derived-cases: {"name":"bash"} -> "No shell command was provided."
    empty = decide('Action: {"name":"bash"}', used_bash=False, flavour=MATH_ES)
    assert (empty.act_kind, empty.observation_name, empty.observation) == ("empty_command", "bash", msg.NO_COMMAND)
    relaxed = decide("Action: {'name': 'bash', 'arguments': {'command': 'echo hi'}}", used_bash=False, flavour=MATH_ES)
    assert (relaxed.act_kind, relaxed.command) == ("run", "echo hi")


def test_es_runner_stringifies_a_non_string_command():
    got = decide('Action: {"name": "bash", "arguments": {"command": 42}}', used_bash=False, flavour=MATH_ES)
    assert (got.act_kind, got.command) == ("run", "42")


def test_math_http_turns_non_bash_names_into_format_warnings():
    # docs/protocol.md#action-parsers: the HTTP Math evaluator rejects non-bash names instead of answering "Unknown action"
    text = action("python", command="print(1)")
    assert decide(text, used_bash=True, flavour=MATH_HTTP).observation == msg.MATH_FORMAT_WARNING
    assert decide(text, used_bash=True, flavour=MATH_ES).act_kind == "unknown_action"


# --- docs/protocol.md#first-turn-rule, #math-protocol-cases (4) -----------------------------------

BASH_CALL = action(command="python -c 'print(1)'")


@pytest.mark.parametrize(
    ("text", "kind", "body"),
    [
        (BASH_CALL, "act", None),
        ("<think>\n\n</think>\n" + BASH_CALL, "act", None),
        ("Let me reason first.\n" + BASH_CALL, "warn", msg.MATH_FIRST_TURN),
        (action("python", command="print(1)"), "warn", msg.MATH_FORMAT_WARNING),  # not a valid first action
    ],
)
def test_first_turn_rule_matched_agentic(text, kind, body):
    got = decide(text, used_bash=False, flavour=MATH_HTTP_MATCHED)
    assert (got.kind, got.observation) == (kind, body)


def test_first_turn_rule_applies_only_until_bash_ran_and_only_in_matched_agentic():
    text = "Let me reason first.\n" + BASH_CALL
    assert decide(text, used_bash=True, flavour=MATH_HTTP_MATCHED).kind == "act"
    for flavour in (MATH_ES, MATH_HTTP):
        assert decide(text, used_bash=False, flavour=flavour).kind == "act"
    # the tool-required check comes first (docs/protocol.md#decision-order: step 2 before step 3)
    early = decide("Final answer: \\boxed{1}", used_bash=False, flavour=MATH_HTTP_MATCHED)
    assert early.observation == msg.MATH_TOOL_REQUIRED


# --- properties ----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(), st.booleans(), st.sampled_from(ALL_FLAVOURS))
def test_decide_never_raises_and_is_consistent(text, used_bash, flavour):
    got = decide(text, used_bash=used_bash, flavour=flavour)
    if got.kind == "final":
        assert used_bash and got.final_answer is not None
    elif got.kind == "warn":
        assert got.observation_name == "format_check" and got.observation
    else:
        assert got.action is not None and got.observation_name == got.action["name"]
        assert (got.act_kind == "run") == (got.command is not None)
        if got.command is not None:
            assert got.command.strip()
