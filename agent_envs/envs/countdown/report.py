"""Countdown trace logs, in the Math layout with the numbers and target as the problem, and its
report fields."""

from __future__ import annotations

import functools

from agent_envs.core.spec import ReportFields, Row
from agent_envs.envs.countdown.solver import solve
from agent_envs.protocol.tracelog import answer_log, task_of

#: the report's gold shows a solution for tasks of at most this many numbers (the exhaustive
#: search takes milliseconds for 4 numbers, up to a minute for 6)
SOLVED_UP_TO = 4


def render_countdown(row: Row, result: str) -> str:
    """Math's layout with the numbers and the target as the problem; a failure without a react error
    gives the scorer's reason."""
    task = task_of(row)
    problem = [f"Numbers: {', '.join(map(str, task.get('nums', [])))}", f"Target: {task.get('target', '')}"]
    return answer_log(row, result, "countdown", problem, str(row.get("score_reason") or "Score was 0."))


@functools.lru_cache(maxsize=4096)
def _gold(nums: tuple[int, ...], target: int) -> str:
    if len(nums) > SOLVED_UP_TO:
        return f"= {target}"
    solution = solve(nums, target)
    return f"{solution} = {target}" if solution is not None else f"= {target} (no exact solution exists)"


def report_fields(row: Row) -> ReportFields:
    """The numbers and the target as the question; a solution found by the solver as the gold
    (any expression that uses every number once and reaches the target is as good)."""
    task = task_of(row)
    nums, target = task.get("nums"), task.get("target")
    if not (isinstance(nums, list) and all(isinstance(n, int) for n in nums) and isinstance(target, int)):
        return ReportFields()
    shown = ", ".join(map(str, nums))
    return ReportFields(question=f"Numbers: {shown}; target: {target}", gold=_gold(tuple(nums), target))
