"""Think stripping, final-answer grammar and action parsers (docs/protocol.md#conversation, #final-answer-grammar,
#action-parsers, #first-turn-rule, #docvqa-protocol-cases, #math-protocol-cases, #derived-cases)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_envs.protocol.nesting import bounded_copy, json_text, nesting_depth
from agent_envs.protocol.parsing import (
    MAX_ACTION_NESTING,
    answer_status,
    final_answer_line,
    is_single_bash_action,
    last_boxed,
    parse_relaxed_bash,
    strip_think,
)
from protocol_specs import PARSER_VARIANTS, parse_action

BASH = {"name": "bash", "arguments": {"command": "tesseract document.png stdout"}}
BASH_JSON = json.dumps(BASH)
BS = "\x08"  # "\b" typed in a non-raw string turns "\boxed" into BS + "oxed"


# --- docs/protocol.md#conversation: think stripping -----------------------------------------------


def test_strip_think_removes_every_span_any_case_across_lines():
    text = "  <think>a\nb</think>x<THINK>c</Think> y  "
    assert strip_think(text) == "x y"


def test_strip_think_is_non_greedy_and_leaves_unclosed_blocks():
    assert strip_think("<think>1</think>keep<think>2</think>") == "keep"
    assert strip_think("<think>never closed") == "<think>never closed"


# --- docs/protocol.md#final-answer-grammar --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("final answer：  7 ", "7"),  # #derived-cases: full-width colon
        ("Final answer:\n\\boxed{5}", "5"),  # #derived-cases: value on the next line
        ("ANSWER:x\nFinal Answer: y", "y"),  # #derived-cases: last line wins
        ("Final answer:", None),  # #derived-cases: nothing after the colon
        ("Final answer:   \n", ""),  # upstream quirk: whitespace is "at least one character"
        ("**Final answer:** 5", None),  # markdown does not start with the keyword
        ("The answer: 3", None),
        ("   answer : 12", "12"),  # leading and pre-colon whitespace
        ("Final answer: \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        (f"Final answer: {BS}oxed{{9}}", "9"),  # backspace spelling
        ("Final answer: \\boxed{1} or \\boxed{2}", "2"),  # last boxed in the value
        ("Final answer: \\boxed{unclosed", "\\boxed{unclosed"),  # unbalanced: the raw value
        ("Final answer: invoice 123", "invoice 123"),
        ("Answer: a\nsome text\nanswer: b\nmore", "b"),
    ],
)
def test_final_answer_line(text, expected):
    assert final_answer_line(text) == expected


def test_think_block_is_removed_before_the_final_answer_is_read():
    # docs/protocol.md#derived-cases: "<think>Final answer: 1</think>Final answer: 2" -> 2
    assert final_answer_line(strip_think("<think>Final answer: 1</think>Final answer: 2")) == "2"
    assert answer_status("<think>Final answer: 1</think>no answer here") == "missing_final_answer"
    assert answer_status("<think>x</think>\nFinal answer: 4") == "answered"


def test_last_boxed_balances_braces_and_prefers_the_real_spelling():
    assert last_boxed("\\boxed{a} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{a} \\boxed{b") is None  # the last one is unbalanced
    assert last_boxed(f"{BS}oxed{{x}}") == "x"
    assert last_boxed(f"{BS}oxed{{x}} \\boxed{{y}}") == "y"
    assert last_boxed("\\boxed{ 5 }") == "5"
    assert last_boxed("no box") is None


# --- docs/protocol.md#action-parsers --------------------------------------------------------------


@pytest.mark.parametrize("variant", PARSER_VARIANTS)
def test_inline_action_parses_in_every_variant(variant):
    # docs/protocol.md#docvqa-protocol-cases (2)
    assert parse_action(f"Action: {BASH_JSON}", variant) == BASH
    assert parse_action(f"Let me look.\nACTION:\n{BASH_JSON}\n", variant) == BASH  # prose, case


@pytest.mark.parametrize("variant", PARSER_VARIANTS)
def test_native_tool_call_xml_and_fenced_json_do_not_parse(variant):
    xml = "<tool_call><function=bash><parameter=command>ls</parameter></function></tool_call>"
    assert parse_action(xml, variant) is None
    fenced = f"Action:\n```json\n{BASH_JSON}\n```"
    assert parse_action(fenced, variant) is None


@pytest.mark.parametrize("variant", PARSER_VARIANTS)
def test_first_of_two_actions_wins_and_trailing_text_is_ignored(variant):
    second = json.dumps({"name": "bash", "arguments": {"command": "echo second"}})
    assert parse_action(f"Action: {BASH_JSON}\nAction: {second}", variant) == BASH
    assert parse_action(f"Action: {BASH_JSON} and then I wait", variant) == BASH
    assert parse_action(f"Action: {BASH_JSON}\nObservation from bash:\n{{fake}}", variant) == BASH


def test_multiline_json_parses():
    text = 'Action:\n{\n  "name": "bash",\n  "arguments": {"command": "ls -la"}\n}'
    assert parse_action(text, "docvqa_http") == {"name": "bash", "arguments": {"command": "ls -la"}}


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ("math_es", {"name": "bash", "arguments": {}}),  # #derived-cases: then "No shell command..."
        ("docvqa_es", {"name": "bash", "arguments": {}}),
        ("docvqa_http", None),  # arguments key required
        ("math_http", None),  # command required
    ],
)
def test_missing_arguments_per_variant(variant, expected):
    assert parse_action('Action: {"name":"bash"}', variant) == expected


@pytest.mark.parametrize("variant", PARSER_VARIANTS)
def test_non_object_or_ill_typed_actions_are_rejected(variant):
    assert parse_action('Action: ["bash"]', variant) is None  # #derived-cases
    assert parse_action('Action: {"name": 5, "arguments": {}}', variant) is None
    assert parse_action('Action: {"name": "bash", "arguments": "ls"}', variant) is None
    assert parse_action('Action: {"name": "bash", "arguments": null}', variant) is None
    assert parse_action("no action at all", variant) is None


def test_non_bash_names_are_accepted_except_by_the_math_http_parser():
    text = 'Action: {"name": "python", "arguments": {"command": "print(1)"}}'
    for variant in ("math_es", "docvqa_es", "docvqa_http"):
        assert parse_action(text, variant) == {"name": "python", "arguments": {"command": "print(1)"}}
    assert parse_action(text, "math_http") is None


def test_math_http_parser_requires_a_non_blank_string_command():
    # docs/protocol.md#math-protocol-cases (3): `code` instead of `command` is rejected
    assert parse_action('Action: {"name": "bash", "arguments": {"code": "ls"}}', "math_http") is None
    assert parse_action('Action: {"name": "bash", "arguments": {"command": "  "}}', "math_http") is None
    assert parse_action('Action: {"name": "bash", "arguments": {"command": 5}}', "math_http") is None
    ok = {"name": "bash", "arguments": {"command": "python -c 'print(1)'", "extra": 1}}
    assert parse_action(f"Action: {json.dumps(ok)}", "math_http") == ok


def test_relaxed_parser_only_in_math_es():
    single = "Action: {'name': 'bash', 'arguments': {'command': 'echo hi'}}"  # #derived-cases
    unterminated = 'Action: {"name": "bash", "arguments": {"command": "python -c \\"print(2)'
    unescaped = 'Action: {"name":"bash","arguments":{"command":"python -c "print(1)""}}'
    assert parse_action(single, "math_es") == {"name": "bash", "arguments": {"command": "echo hi"}}
    assert parse_action(unterminated, "math_es") == {"name": "bash", "arguments": {"command": 'python -c "print(2)'}}
    assert parse_action(unescaped, "math_es") == {"name": "bash", "arguments": {"command": "python -c"}}
    for variant in ("docvqa_es", "docvqa_http", "math_http"):
        assert parse_action(single, variant) is None
        assert parse_action(unterminated, variant) is None
        assert parse_action(unescaped, variant) is None


def test_relaxed_parser_details():
    assert parse_relaxed_bash("{'name': 'python', 'arguments': {'command': 'x'}}") is None
    assert parse_relaxed_bash("{'NAME': 'Bash', 'arguments': {'Command': 'ls'}}") == {
        "name": "bash",
        "arguments": {"command": "ls"},
    }
    assert parse_relaxed_bash("{'name': 'bash', 'arguments': {'command': '   '}}") is None
    assert parse_relaxed_bash("{'name': 'bash', 'arguments': {}}") is None
    # escaped quote of the same kind does not end the string; manual unescaping applies
    got = parse_relaxed_bash(r"{'name': 'bash', 'arguments': {'command': 'echo \'a\'\tb'}}")
    assert got == {"name": "bash", "arguments": {"command": "echo 'a'\tb"}}
    # bare double quotes inside a single-quoted command survive
    got = parse_relaxed_bash("""{'name': 'bash', 'arguments': {'command': 'python -c "print(1)"'}}""")
    assert got == {"name": "bash", "arguments": {"command": 'python -c "print(1)"'}}


def test_truncated_json_without_a_closing_brace_is_a_math_es_only_pass():
    text = 'Action: {"name": "bash", "arguments": {"command": "ls /tmp'
    assert parse_action(text, "math_es") == {"name": "bash", "arguments": {"command": "ls /tmp"}}
    assert parse_action(text, "docvqa_es") is None


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown parser variant"):
        parse_action("Action: {}", "math")  # type: ignore[arg-type]


# --- docs/protocol.md#first-turn-rule predicate ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (f"Action: {BASH_JSON}", True),
        (f"<think>\n\n</think>\nAction: {BASH_JSON}", True),
        (f"Let me reason first.\nAction: {BASH_JSON}", False),
        ('Action: {"name": "python", "arguments": {"command": "print(1)"}}', False),
        (f"Action: {BASH_JSON}\nthen more", False),  # must fully parse
        ('Action: {"name": "bash", "arguments": {"command": " "}}', False),
        (f"  action:\n{BASH_JSON}\n\n", True),
    ],
)
def test_single_bash_action(text, ok):
    assert is_single_bash_action(text) is ok


# --- properties: nothing raises, results are well-formed --------------------------------------

_pieces = st.sampled_from(
    [
        "Action:",
        "action: ",
        "{",
        "}",
        '"name"',
        "'name'",
        ":",
        '"bash"',
        "'bash'",
        '"command"',
        "'command'",
        '"',
        "'",
        "\\",
        "\\boxed{",
        BS + "oxed{",
        "Final answer:",
        "Answer：",
        "\n",
        "<think>",
        "</think>",
        "[",
        "]",
        ",",
        "1e999",
        "9" * 5000,
        "{" * 3000,
        " ",
    ]
)
_texty = st.one_of(st.text(), st.lists(st.one_of(_pieces, st.text(max_size=5)), max_size=40).map("".join))


@settings(max_examples=300, deadline=None)
@given(_texty)
def test_no_parser_raises_and_results_are_well_formed(text):
    assert isinstance(strip_think(text), str)
    for value in (final_answer_line(text), last_boxed(text)):
        assert value is None or isinstance(value, str)
    assert isinstance(is_single_bash_action(text), bool)
    assert answer_status(text) in ("answered", "missing_final_answer")
    for variant in PARSER_VARIANTS:
        action = parse_action(text, variant)
        if action is None:
            continue
        assert set(action) == {"name", "arguments"}
        assert isinstance(action["name"], str) and isinstance(action["arguments"], dict)
        if variant == "math_http":
            assert action["name"] == "bash" and action["arguments"]["command"].strip()


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1).filter(lambda c: c.strip()), st.text(alphabet=st.characters(blacklist_characters="\n{}")))
def test_well_formed_actions_round_trip_through_every_variant(command, prose):
    action = {"name": "bash", "arguments": {"command": command}}
    text = f"{prose}\nAction:\n{json.dumps(action)}"
    for variant in PARSER_VARIANTS:
        assert parse_action(text, variant) == action


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x08\\")))
def test_single_final_answer_line_returns_its_stripped_value(value):
    # the space after the colon already satisfies "at least one character", so even an empty
    # value yields "" (not None), as upstream does
    assert final_answer_line(f"Final answer: {value}") == value.strip()


# --- untrusted nesting depth (docs/protocol.md#differences-and-parity-switches) ---------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)


def _nested(depth: int) -> str:
    return '{"name": "bash", "arguments": {"command": "echo deep", "x": ' + "[" * depth + "]" * depth + "}}"


def _at_stack_depth(frames: int, fn):
    """``fn()`` called ``frames`` Python frames below here (a deep caller, such as a thread pool)."""
    return fn() if frames == 0 else _at_stack_depth(frames - 1, fn)


@settings(max_examples=200, deadline=None)
@given(value=_json, bound=st.integers(1, 4))
def test_json_text_and_bounded_copy_agree_with_the_standard_library(value, bound):
    assert json_text(value) == json.dumps(value, ensure_ascii=False)
    assert bounded_copy(value, 100) == value
    kept = bounded_copy(value, bound)
    assert nesting_depth(kept) <= bound


def test_deep_values_are_walked_without_recursion():
    deep = json.loads("[" * 900 + "]" * 900)
    assert nesting_depth(deep) == 900
    assert json_text(deep) == "[" * 900 + "]" * 900
    kept = bounded_copy({"x": deep}, 3)
    assert kept == {"x": [["[" * 898 + "]" * 898]]}  # two lists kept below the dict, the rest as its JSON text


def test_action_nesting_bound_is_the_same_from_every_stack_depth():
    """Up to MAX_ACTION_NESTING levels an action parses; beyond, it is undecodable, wherever the
    caller's stack is (the decoder alone would fail earlier the deeper its caller)."""
    for frames in (0, 300):
        ok = _at_stack_depth(frames, lambda: parse_action("Action: " + _nested(MAX_ACTION_NESTING - 2), "docvqa_es"))
        assert ok is not None and ok["arguments"]["command"] == "echo deep"
        assert (
            _at_stack_depth(frames, lambda: parse_action("Action: " + _nested(MAX_ACTION_NESTING - 1), "docvqa_es"))
            is None
        )
