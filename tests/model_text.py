"""Hypothesis strategies for what a model may write: the whole action grammar of an environment.

Completions are built from the pieces the protocol reads (docs/protocol.md#decision-order): think
blocks, ``Action:`` objects naming every tool of the environment (and unknown ones) with their
argument key (and others), final-answer lines with boxed values, and the JSON values inside them
at every extreme: integers past 64 bits and past the decoder's 4,300 digits, ``NaN``/``Infinity``,
lone surrogates, NUL bytes, and nesting from 0 to 3,000 levels (past the recursion limit).

Values are JSON *text*, so that what no encoder would emit (``1e999``, unbalanced brackets, a
5,000-digit literal) is in the grammar too.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

#: JSON literals at the edges of what decoders, ``float``, ``int`` and ``str`` accept
EXTREME_LITERALS = (
    "null",
    "true",
    "false",
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "-1e999",
    "1e-999",
    "-0",
    "0.0",
    "4.5",
    "1" + "0" * 400,
    "-" + "9" * 4300,
    "1" + "0" * 5000,
    str(2**63),
    str(-(2**63) - 1),
    str(2**70),
    "1e16",
    '"\\ud800"',
    '"\\udfff\\ud800"',
    '"\\u0000"',
    '""',
    '" "',
    '"\\n"',
)


def _nested(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


#: nesting from none to past the interpreter's recursion limit
nested = st.builds(_nested, st.one_of(st.integers(0, 40), st.integers(500, 3000)), st.sampled_from(["list", "dict"]))

leaf = st.one_of(
    st.sampled_from(EXTREME_LITERALS),
    st.integers(min_value=-(10**4299), max_value=10**4299).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(json.dumps),
    st.text(max_size=40).map(json.dumps),
    nested,
)


def _object(pairs: list[tuple[str, str]]) -> str:
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs) + "}"


#: any JSON value as text (lists and objects of leaves, a few levels deep)
value = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(st.tuples(st.text(max_size=8), inner), max_size=4).map(_object),
    ),
    max_leaves=8,
)


def _shell_safe(text: str) -> str:
    """A command string that cannot sleep or loop the sandbox into its timeout (kept cheap)."""
    return json.dumps(text.replace("sleep", "sl").replace("while", "wh").replace("yes", "y"))


def arguments(key: str, tool: str) -> st.SearchStrategy[str]:
    """An ``arguments`` object for ``tool`` whose input is ``key`` (``*``: the whole object)."""
    if key == "*":  # e.g. the view tool: {"box": [x0, y0, x1, y1], "zoom": z}
        box = st.lists(value, min_size=0, max_size=5).map(lambda xs: "[" + ", ".join(xs) + "]")
        fields = st.fixed_dictionaries(
            {}, optional={"box": st.one_of(box, value, nested), "zoom": value, "page": value}
        )
        return st.one_of(fields.map(lambda d: _object(list(d.items()))), value)
    command = st.one_of(
        st.text(max_size=60).map(_shell_safe),
        value,
        nested,
        st.sampled_from(['"echo hi"', '"print(1)"', '"exit 3"', '"1/0"', '"  "']),
    )
    extra = st.lists(st.tuples(st.text(max_size=8), st.one_of(value, nested)), max_size=2)
    return st.builds(lambda c, more: _object([(key, c), *more]), command, extra) | value


def action(tools: dict[str, str]) -> st.SearchStrategy[str]:
    """``Action: {...}`` for a tool of the environment or an unknown name, complete or cut off."""
    known = st.sampled_from(sorted(tools)).flatmap(
        lambda t: arguments(tools[t], t).map(lambda a: f'{{"name": {json.dumps(t)}, "arguments": {a}}}')
    )
    unknown = st.builds(
        lambda n, a: f'{{"name": {n}, "arguments": {a}}}', st.one_of(st.text(max_size=10).map(json.dumps), value), value
    )
    body = st.one_of(known, known, unknown, value)
    cut = st.builds(lambda b, n: b[:n], body, st.integers(0, 60))
    return st.builds(lambda sep, b: f"Action:{sep}{b}", st.sampled_from([" ", "\n", ""]), st.one_of(body, body, cut))


final = st.builds(
    lambda label, v: f"{label} {v}",
    st.sampled_from(["Final answer:", "Answer:", "final answer："]),
    st.one_of(
        st.text(max_size=30),
        value,
        value.map(lambda v: "\\boxed{" + v + "}"),
        nested.map(lambda n: "\\boxed{" + n.replace("[", "{").replace("]", "}") + "}"),
    ),
)


def completion(tools: dict[str, str]) -> st.SearchStrategy[str]:
    """A whole completion: prose, think blocks, actions and final answers in any order."""
    piece = st.one_of(
        action(tools),
        action(tools),
        final,
        st.text(max_size=40),
        st.text(max_size=30).map(lambda t: f"<think>{t}</think>"),
        st.just("<think>"),
    )
    return st.lists(piece, min_size=0, max_size=3).map("\n".join)


def known_breakers(tools: dict[str, str]) -> list[str]:
    """Completions that once raised out of ``step`` (kept as fixed examples): a view box with an
    integer too large for a float, and arguments nested deeper than a record copy could recurse."""
    out = []
    for tool, key in sorted(tools.items()):
        deep = _nested(900, "list")
        if key == "*":
            out.append(f'Action: {{"name": "{tool}", "arguments": {{"box": [0, 0, 1{"0" * 400}, 5]}}}}')
            out.append(f'Action: {{"name": "{tool}", "arguments": {{"box": {deep}}}}}')
        else:
            out.append(f'Action: {{"name": "{tool}", "arguments": {{"{key}": {deep}}}}}')
            out.append(f'Action: {{"name": "{tool}", "arguments": {{"{key}": "echo", "x": {deep}}}}}')
    return out
