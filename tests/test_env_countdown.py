"""Countdown-ReAct-v0 end to end: real python and bash tools in bubblewrap, the ast scorer, the
single-turn mode.  What is generic (check_env, garbage, runners, leaks) is in test_conformance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import agent_envs  # noqa: F401
from agent_envs.envs.countdown import texts
from agent_envs.envs.countdown.baseline import SEARCH
from agent_envs.envs.countdown.data import generate
from agent_envs.envs.countdown.solver import solve
from agent_envs.envs.countdown.spec import PROMPTS
from agent_envs.envs.countdown.task import CountdownTask
from agent_envs.core.prompts import load_prompt

REPO = Path(__file__).resolve().parent.parent
TASK = CountdownTask(id="t1", nums=(25, 5, 4, 3), target=83)  # (25 - 5) * 4 + 3


def _act(name: str, text: str) -> str:
    return "Action: " + json.dumps({"name": name, "arguments": {"code" if name == "python" else "command": text}})


@pytest.fixture
def env():
    e = gym.make("Countdown-ReAct-v0", max_turns=6)
    yield e
    e.close()


def _episode(env, *completions: str, task: CountdownTask = TASK):
    env.reset(options={"task": task.model_dump()})
    for text in completions:
        messages, reward, terminated, truncated, info = env.step(text)
        if terminated or truncated:
            return messages, reward, info
    raise AssertionError("episode did not end")


def test_make_works_offline_and_the_builtin_tasks_are_solvable():
    code = (
        "import socket\n"
        "def no_net(*a, **k): raise OSError('network disabled')\n"
        "socket.socket.connect = no_net\n"
        "import gymnasium as gym, agent_envs\n"
        "e = gym.make('Countdown-ReAct-v0'); m, _ = e.reset(seed=3)\n"
        "print(len(e.unwrapped.tasks), m[1]['content'].splitlines()[0]); e.close()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr
    n, first = out.stdout.split(" ", 1)
    assert int(n) == 200 and first.startswith("Numbers: ")
    e = gym.make("Countdown-ReAct-v0")
    try:
        assert all(solve(t.nums, t.target) is not None for t in e.unwrapped.tasks[:50])
        check_env(e.unwrapped)
    finally:
        e.close()


def test_python_tool_keeps_state_and_a_solved_episode_scores_one(env):
    messages, reward, info = _episode(
        env,
        _act("python", "nums = [25, 5, 4, 3]\nexpr = '(25 - 5) * 4 + 3'"),
        _act("python", "print(eval(expr), sorted(nums))"),
        "Checked.\nFinal answer: \\boxed{(25 - 5) * 4 + 3}",
    )
    assert messages[5]["content"] == "Observation from python:\n83 [3, 4, 5, 25]\n\n[exit_code] 0"
    assert reward == 1.0 and info["termination_reason"] == "final_answer"
    record = info["record"]
    assert record["score_method"] == "countdown_exact" and record["value"] == "83" and record["tool_calls"] == 2


@pytest.mark.parametrize("task", generate(4, seed=5) + [CountdownTask(id="div", nums=(9, 3, 7), target=10)])
def test_a_search_run_in_the_python_tool_solves_and_scores_one(env, task):
    env.reset(options={"task": task.model_dump()})
    messages, *_ = env.step(_act("python", f"N = {list(task.nums)}\nT = {task.target}\n{SEARCH}"))
    found = messages[-1]["content"].splitlines()[1]  # the expression the search printed
    _, reward, _, _, info = env.step(f"Final answer: \\boxed{{{found}}}")
    assert reward == 1.0, (found, info["record"]["score_reason"])


def test_bash_satisfies_tool_required_and_its_blocklist_has_countdown_text(env):
    env.reset(options={"task": TASK.model_dump()})
    messages, *_ = env.step("Final answer: \\boxed{(25 - 5) * 4 + 3}")
    assert messages[-1]["content"] == "Observation from format_check:\n" + texts.TOOL_REQUIRED
    messages, *_ = env.step(_act("bash", "sudo ls"))
    assert messages[-1]["content"] == "Observation from bash:\n" + texts.BLOCKED
    messages, *_ = env.step(_act("bash", "echo $(( (25 - 5) * 4 + 3 ))"))
    assert messages[-1]["content"] == "Observation from bash:\n83\n\n[exit_code] 0"
    messages, *_ = env.step(_act("ruby", "1"))
    assert (
        messages[-1]["content"]
        == "Observation from ruby:\nUnknown action 'ruby'. Available actions are python and bash."
    )
    _, reward, _, _, info = env.step("Final answer: \\boxed{(25 - 5) * 4 + 3}")
    assert reward == 1.0 and info["used_bash"]


@pytest.mark.parametrize(
    "answer,reason",
    [
        ("(25 - 5) * 3 + 4", "is not the target"),  # wrong value
        ("(25 - 5) * 4 + 3 + 3 - 3", "numbers used"),  # reused numbers
        ("25 * 4 - 17", "numbers used"),  # missing and foreign numbers
        ("(25 - 5) * 4 + 3 / (5 - 5)", "division by zero"),
        ("__import__('os').system('touch {marker}')", "not allowed"),
        ("open('{marker}', 'w')", "not allowed"),
        ("(lambda: 83)()", "not allowed"),
    ],
)
def test_bad_answers_score_zero_without_executing_anything(env, tmp_path, answer, reason):
    marker = tmp_path / "executed"
    _, reward, info = _episode(
        env, _act("python", "print(1)"), f"Final answer: \\boxed{{{answer.format(marker=marker)}}}"
    )
    assert reward == 0.0 and info["termination_reason"] == "final_answer"
    assert reason in info["record"]["score_reason"]
    assert not marker.exists()


def test_single_turn_mode_needs_no_tool_and_uses_its_own_prompt():
    env = gym.make("Countdown-ReAct-v0", single_turn=True)
    try:
        messages, _ = env.reset(options={"task": TASK.model_dump()})
        assert messages[0]["content"] == load_prompt("system_single_turn", PROMPTS)
        assert env.unwrapped.max_turns == 1
        _, reward, terminated, _, info = env.step("Easy.\nFinal answer: \\boxed{(25 - 5) * 4 + 3}")
        assert (reward, terminated, info["used_bash"]) == (1.0, True, False)
        env.reset(options={"task": TASK.model_dump()})
        _, reward, terminated, truncated, info = env.step("I think it is 83.")
        assert (reward, terminated, truncated, info["termination_reason"]) == (0.0, False, True, "max_turns")
    finally:
        env.close()
    multi = gym.make("Countdown-ReAct-v0")
    assert multi.unwrapped.config_hash != env.unwrapped.config_hash
    multi.close()
    with pytest.raises(ValueError, match="single_turn=True means max_turns=1"):
        gym.make("Countdown-ReAct-v0", single_turn=True, max_turns=3)


def test_loader_takes_public_nums_target_rows(tmp_path):
    path = tmp_path / "cd.jsonl"
    path.write_text('{"nums": [3, 7, 9], "target": 30}\n{"nums": [2, 6, 8, 1], "target": 40, "extra": 1}\n')
    env = gym.make("Countdown-ReAct-v0", dataset=str(path))
    try:
        assert [(t.nums, t.target) for t in env.unwrapped.tasks] == [((3, 7, 9), 30), ((2, 6, 8, 1), 40)]
    finally:
        env.close()


def test_docker_backend_is_refused_at_make_not_mid_episode():
    with pytest.raises(ValueError, match='python tool cannot run on the "docker" sandbox backend'):
        gym.make("Countdown-ReAct-v0", sandbox="docker")


def test_its_own_metrics_summarise_its_records():
    """The valid-expression rate and target distance come from the environment's folder, through its
    spec; real episodes of the scripted baseline solve every built-in task exactly."""
    from agent_envs.envs.registry import spec
    from agent_envs.policy.scripted import ScriptedPolicy
    from agent_envs.rollout.metrics import summarize
    from agent_envs.rollout.runner import run_episodes

    countdown = spec("Countdown-ReAct-v0")
    rows = [
        {"task_id": "a", "sample_index": 0, "score": 1.0, "target": 24, "value": "24"},
        {"task_id": "b", "sample_index": 0, "score": 0.0, "target": 10, "value": "21/2"},
        {"task_id": "c", "sample_index": 0, "score": 0.0, "target": 5, "value": None},
    ]
    assert summarize(rows, 1, spec=countdown)["countdown"] == {
        "valid_expression_rate": 2 / 3,
        "mean_target_distance": 0.25,
    }
    assert "countdown" not in summarize(rows, 1)  # the block is the environment's, through its spec
    records = run_episodes(
        "Countdown-ReAct-v0",
        generate(2, seed=3),
        ScriptedPolicy(countdown.baseline),
        mode="lockstep",
        env_kwargs={"sandbox": "bwrap"},
        progress=False,
    )
    assert summarize(records, 1, spec=countdown)["countdown"] == {
        "valid_expression_rate": 1.0,
        "mean_target_distance": 0.0,
    }
