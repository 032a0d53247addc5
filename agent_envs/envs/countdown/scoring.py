"""Countdown scoring: parse the final expression with ``ast`` and evaluate it exactly, never
executing anything.

Reward rule: 1.0 when the answer is an arithmetic expression that uses every given number
exactly once (as a multiset: a number given twice must appear twice) and whose exact rational
value equals the target; otherwise 0.0.  There is no partial credit.

What an answer may contain: non-negative integer literals, the binary operators ``+ - * /``
(``/`` is exact division: 6/4 is 3/2, not 1) and parentheses.  ``\\boxed{...}`` around it, ``×``/
``÷`` for ``*``/``/``, and a trailing ``= <number>`` (ignored: the left side's value is what
counts) are accepted.  Everything else scores 0 with a reason: unary minus or plus (the game
combines the given numbers, it does not negate them), ``**``, ``//``, ``%``, names, calls,
attribute access, floats, division by zero, and answers longer than ``MAX_CHARS``.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction
from typing import Callable, Sequence

from pydantic import BaseModel

from agent_envs.envs.countdown.task import CountdownTask
from agent_envs.protocol.parsing import answer_status, final_answer_line, strip_think
from agent_envs.scoring.result import ScoreResult

SCORE_METHOD = "countdown_exact"

MAX_CHARS = 300
_OPS: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}
_BOXED = re.compile(r"^\\boxed\s*\{(.*)\}$", re.S)
_RHS = re.compile(r"=\s*-?\d+(?:\.\d+)?\s*$")


class ExpressionError(ValueError):
    """The answer is not a valid Countdown expression (the message says why)."""


class CountdownScore(BaseModel):
    """The verdict on one answer expression (:func:`score`)."""

    reward: float
    correct: bool
    #: the exact value as "p" or "p/q", when the expression was valid
    value: str | None = None
    #: why the reward is 0 ("" when correct)
    reason: str = ""


def clean(answer: str) -> str:
    """The bare expression: ``\\boxed{}`` unwrapped, ``×÷`` mapped, a trailing ``= N`` dropped."""
    text = answer.strip()
    boxed = _BOXED.match(text)
    if boxed:
        text = boxed.group(1).strip()
    text = _RHS.sub("", text).strip()
    return text.replace("×", "*").replace("÷", "/")


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """The exact value of ``expression`` and the integer literals it uses, in order."""
    if len(expression) > MAX_CHARS:
        raise ExpressionError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ExpressionError(f"not an arithmetic expression ({type(exc).__name__})") from None
    used: list[int] = []
    try:
        return _value(tree.body, used), used
    except RecursionError:
        raise ExpressionError("expression nested too deeply") from None


def _value(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left, used), _value(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ExpressionError("division by zero")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        raise ExpressionError("unary operators are not allowed; combine the given numbers with + - * /")
    if isinstance(node, ast.BinOp):
        raise ExpressionError(f"operator {type(node.op).__name__} is not allowed; only + - * /")
    raise ExpressionError(f"{type(node).__name__} is not allowed; only integers, + - * / and parentheses")


def _multiset_error(used: Sequence[int], nums: Sequence[int]) -> str:
    if sorted(used) == sorted(nums):
        return ""
    return f"numbers used {sorted(used)} differ from the given numbers {sorted(nums)} (each exactly once)"


def score(answer: str | None, task: CountdownTask) -> CountdownScore:
    """Score a final answer against ``task`` (see the module docstring for the rule)."""
    if answer is None or not answer.strip():
        return CountdownScore(reward=0.0, correct=False, reason="no answer")
    try:
        value, used = evaluate(clean(answer))
    except ExpressionError as exc:
        return CountdownScore(reward=0.0, correct=False, reason=str(exc))
    shown = str(value)
    reason = _multiset_error(used, task.nums) or (
        "" if value == task.target else f"value {shown} is not the target {task.target}"
    )
    return CountdownScore(reward=0.0 if reason else 1.0, correct=not reason, value=shown, reason=reason)


def countdown_score(last_completion: str, task: CountdownTask, *, termination_reason: str | None) -> ScoreResult:
    """The episode's score: 1.0 only for an episode that ended with a final answer that
    :func:`score` accepts; the expression is parsed with ``ast`` and never executed.  The extras
    say why (``score_reason``) and what the expression came to (``value``)."""
    answer = final_answer_line(strip_think(last_completion))
    verdict = score(answer, task) if termination_reason == "final_answer" else None
    return ScoreResult(
        score=verdict.reward if verdict else 0.0,
        method=SCORE_METHOD,
        label=SCORE_METHOD,
        status="ok" if verdict else "skipped",
        answer_status=answer_status(last_completion),
        prediction=answer or "",
        extras={
            "score_reason": verdict.reason if verdict else f"episode ended with {termination_reason}",
            "value": verdict.value if verdict else None,
        },
    )
