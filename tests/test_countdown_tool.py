"""Countdown's pure parts with the python tool: a scripted search run in the sandboxed
interpreter (state kept across two calls) finds an expression that scores 1.0."""

from __future__ import annotations

import pytest

from agent_envs.envs.countdown.data import generate
from agent_envs.envs.countdown.scoring import score
from agent_envs.sandbox.base import SandboxConfig
from agent_envs.tools.python import PythonTool

DEFINE = """
from fractions import Fraction
from itertools import permutations, product
SHAPES = {3: ["(({0} {3} {1}) {4} {2})", "({0} {3} ({1} {4} {2}))"],
          4: ["((({0} {4} {1}) {5} {2}) {6} {3})", "(({0} {4} ({1} {5} {2})) {6} {3})",
              "(({0} {4} {1}) {5} ({2} {6} {3}))", "({0} {4} (({1} {5} {2}) {6} {3}))",
              "({0} {4} ({1} {5} ({2} {6} {3})))"]}

def search(nums, target):
    for perm in permutations(nums):
        for ops in product("+-*/", repeat=len(nums) - 1):
            for shape in SHAPES[len(nums)]:
                exact = shape.format(*[f"Fraction({n})" for n in perm], *ops)
                try:
                    if eval(exact) == target:
                        return shape.format(*perm, *ops)
                except ZeroDivisionError:
                    pass
"""


@pytest.mark.parametrize("task", generate(3, seed=11), ids=lambda t: t.id)
def test_scripted_python_tool_search_scores_one(task):
    with PythonTool(SandboxConfig(backend="bwrap")) as tool:
        assert tool.run(DEFINE).returncode == 0
        res = tool.run(f"print(search({list(task.nums)}, {task.target}))")
        answer = res.stdout.decode().strip()
        assert res.returncode == 0 and answer != "None"
        assert score(f"\\boxed{{{answer}}}", task).reward == 1.0
        assert score(answer + " + 0", task).reward == 0.0
