"""The runner's progress moves with every turn, and a log file gets whole lines, never a terminal's
carriage-return frames (issue 36)."""

from __future__ import annotations

import io

import pytest

from agent_envs.policy.scripted import ScriptedPolicy
from agent_envs.rollout.progress import Progress
from agent_envs.rollout.runner import run_episodes

TASKS = [{"id": "t0", "nums": [6, 7], "target": 42}, {"id": "t1", "nums": [2, 3], "target": 6}]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_log_the_lines_move_with_each_turn_and_hold_no_carriage_return():
    log = io.StringIO()
    progress = Progress(2, True, "async", stream=log, every_s=0.0)
    progress.turn()
    progress.turn()
    progress.update(1.0, 10)
    progress.turn()
    progress.update(0.0, 6)
    progress.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert [line.split(": ", 1)[1].split(", mean")[0] for line in lines] == [
        "0/2 episodes, 1 turns",
        "0/2 episodes, 2 turns",
        "1/2 episodes, 2 turns",
        "1/2 episodes, 3 turns",
        "2/2 episodes, 3 turns",
    ]
    assert "mean reward 0.500" in lines[-1]


def test_in_a_log_lines_are_spaced_out_but_the_last_is_always_written():
    log = io.StringIO()
    progress = Progress(2, True, "lockstep", stream=log, every_s=3600.0)
    for _ in range(5):
        progress.turn(2)
    progress.update(1.0, 1)
    progress.update(1.0, 1)
    progress.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and "0/2 episodes, 2 turns" in lines[0] and "2/2 episodes, 10 turns" in lines[1]


def test_on_a_terminal_the_bar_moves_with_each_turn():
    screen = Terminal()
    progress = Progress(2, True, "async", stream=screen)
    progress.bar.mininterval = 0  # draw every change
    progress.turn()
    assert "0/2" in screen.getvalue().rsplit("\r", 1)[-1] and "turns=1" in screen.getvalue().rsplit("\r", 1)[-1]
    progress.close()


@pytest.mark.parametrize("mode", ["async", "lockstep"])
def test_a_run_logs_its_turns_without_carriage_returns(mode, capsys):
    policy = ScriptedPolicy(["thinking", "still thinking"])
    records = run_episodes(
        "Countdown-ReAct-v0", TASKS, policy, mode=mode, env_kwargs={"max_turns": 2}, progress=True, concurrency=2
    )
    assert [r.termination_reason for r in records] == ["max_turns", "max_turns"]
    err = capsys.readouterr().err  # not a terminal
    assert "\r" not in err
    assert f"[agent-envs] {mode}: 2/2 episodes, 4 turns" in err.splitlines()[-1]
