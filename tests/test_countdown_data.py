"""Countdown task model, solver, seeded generator, loader (JSONL and parquet) and prompts."""

from __future__ import annotations

import json
from fractions import Fraction

import gymnasium as gym
import pytest
from pydantic import ValidationError

from agent_envs.envs.countdown.data import generate, load
from agent_envs.envs.countdown.scoring import evaluate, score
from agent_envs.envs.countdown.solver import solve
from agent_envs.envs.countdown.spec import PROMPTS
from agent_envs.envs.countdown.task import CountdownTask
from agent_envs.core.prompts import load_prompt


@pytest.mark.parametrize(
    "nums,target",
    [((25, 5, 4, 3), 83), ((1, 3, 3, 3), 10), ((8, 3, 3, 8), 24), ((4, 4, 10, 10), 24), ((2, 7), 14), ((5, 5, 5), 0)],
)
def test_solver_finds_exact_solutions(nums, target):
    expr = solve(nums, target)
    assert expr is not None
    value, used = evaluate(expr)
    assert value == Fraction(target) and sorted(used) == sorted(nums)


@pytest.mark.parametrize("nums,target", [((1, 1, 1), 100), ((2, 2), 5), ((1, 2, 3), 1000)])
def test_solver_reports_unsolvable(nums, target):
    assert solve(nums, target) is None


def test_generator_is_seeded_solvable_and_scored_one():
    tasks = generate(50, seed=7)
    assert tasks == generate(50, seed=7) and tasks != generate(50, seed=8)
    assert len({t.id for t in tasks}) == 50
    for t in tasks:
        assert len(t.nums) in (3, 4) and all(1 <= n <= 99 for n in t.nums) and 1 <= t.target <= 100
        assert score(solve(t.nums, t.target), t).reward == 1.0
    assert {len(t.nums) for t in tasks} == {3, 4}
    assert generate(0) == []
    with pytest.raises(ValueError, match="n must be"):
        generate(-1)


ROWS = [{"nums": [44, 19, 35], "target": 98}, {"nums": [63, 95, 96], "target": 64, "id": "x"}]


def test_jsonl_loader(tmp_path):
    path = tmp_path / "cd.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    tasks = load(path)
    assert [(t.id, t.nums, t.target) for t in tasks] == [("cd-0", (44, 19, 35), 98), ("x", (63, 95, 96), 64)]
    assert len(load(path, limit=1)) == 1


def test_parquet_loader(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow comes with datasets")
    import pyarrow.parquet as pq

    path = tmp_path / "train-00000.parquet"
    pq.write_table(pa.table({"target": [98, 64], "nums": [[44, 19, 35], [63, 95, 96]]}), path)
    tasks = load(path)
    assert [(t.nums, t.target) for t in tasks] == [((44, 19, 35), 98), ((63, 95, 96), 64)]
    assert tasks[0].id == "train-00000-0"


@pytest.mark.parametrize(
    "line,message",
    [
        ('{"nums": [1, 2]}', "needs 'nums' and 'target'"),
        ("[1, 2, 3]", "needs 'nums' and 'target'"),
        ('{"nums": [1, "2", 3], "target": 6}', "not a valid task"),
        ('{"nums": [1, -2, 3], "target": 6}', "not a valid task"),
        ('{"nums": [1], "target": 1}', "not a valid task"),
        ('{"nums": 5, "target": 1}', "not a valid task"),
        ('{"nums": [1, 2], "target": 1.5}', "not a valid task"),
        ("{nums: [1, 2]}", "line 1 is not JSON"),
    ],
)
def test_loader_errors_are_specific(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        load(path)


def test_loader_rejects_missing_files_and_other_formats(tmp_path):
    with pytest.raises(FileNotFoundError, match="countdown data not found"):
        load(tmp_path / "nope.jsonl")
    (tmp_path / "a.csv").write_text("nums,target\n")
    with pytest.raises(ValueError, match="expected a .jsonl or .parquet"):
        load(tmp_path / "a.csv")


def test_task_model_is_strict():
    with pytest.raises(ValidationError):
        CountdownTask(id="t", nums=(1, 2), target=3, extra=1)
    with pytest.raises(ValidationError):
        CountdownTask(id="", nums=(1, 2), target=3)


def test_prompts_teach_the_react_grammar_with_both_tools():
    env = gym.make("Countdown-ReAct-v0", sandbox="none")
    system, user = env.unwrapped.system_prompt, load_prompt("user", PROMPTS)  # the tool list filled in
    env.close()
    single = load_prompt("system_single_turn", PROMPTS)
    assert 'Action:\n{"name": "python", "arguments": {"code": "<python code>"}}' in system
    assert 'Action:\n{"name": "bash", "arguments": {"command": "<shell command>"}}' in system
    for text in (system, single):
        assert "Final answer: \\boxed{<expression>}" in text
    assert "Action:" not in single
    task = CountdownTask(id="t", nums=(25, 5, 4, 3), target=83)
    assert task.fill(user).startswith("Numbers: 25, 5, 4, 3\nTarget: 83\n")
