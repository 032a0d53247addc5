"""MATH-ReAct-v0 tool parity with the reference math runner: blocklist, newlines, command log.

Real bubblewrap for the default sandbox, real host shells for the ``sandbox="none"`` parity runner.
"""

from __future__ import annotations

import json
import re

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401  (registers the environments)
from protocol_specs import msg as msgs

TASK = {"id": "t42", "question": "6*7?", "answer": "42", "source": "test"}
BLOCKED = "Observation from bash:\n" + msgs.MATH_BLOCKED
LOG_ENTRY = r"\n\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\] timeout=20\.0\n"


def bash(cmd: str) -> str:
    return "Action: " + json.dumps({"name": "bash", "arguments": {"command": cmd}})


def observe(env, *commands: str) -> list[str]:
    """Run each command in one episode; return each observation message."""
    env.reset(options={"task": TASK})
    out = []
    for cmd in commands:
        messages, *_ = env.step(bash(cmd))
        out.append(messages[-1]["content"])
    return out


@pytest.fixture(params=["bwrap", "none"])
def backend(request):
    return request.param


def test_blocklist_is_on_by_default(backend):
    env = gym.make("MATH-ReAct-v0", dataset=[TASK], sandbox=backend)
    try:
        blocked, allowed = observe(env, "sudo true; echo RAN", "echo killing")
        assert blocked == BLOCKED
        assert allowed == "Observation from bash:\nkilling\n\n[exit_code] 0"
        assert env.unwrapped.config_hash != gym.make("MATH-ReAct-v0", blocklist=False).unwrapped.config_hash
    finally:
        env.close()


def test_blocklist_can_be_switched_off_in_a_sandbox_only():
    env = gym.make("MATH-ReAct-v0", dataset=[TASK], blocklist=False)
    try:
        (ran,) = observe(env, "echo su")
        assert ran == "Observation from bash:\nsu\n\n[exit_code] 0"
    finally:
        env.close()
    with pytest.raises(ValueError, match='blocklist=False needs a sandbox: with sandbox="none"'):
        gym.make("MATH-ReAct-v0", sandbox="none", blocklist=False)
    with pytest.raises(ValueError, match="invalid MATH-ReAct-v0 argument: blocklist='no'"):
        gym.make("MATH-ReAct-v0", blocklist="no")


def test_cr_and_crlf_become_newlines(backend):
    env = gym.make("MATH-ReAct-v0", dataset=[TASK], sandbox=backend)
    try:
        (obs,) = observe(env, r"printf 'a\r\nb\rc\n'; printf 'e\r\n' >&2")
        assert obs == "Observation from bash:\na\nb\nc\n\n[stderr]\ne\n\n[exit_code] 0"
    finally:
        env.close()


def test_parity_runner_keeps_the_reference_command_log():
    """Every command, blocked ones too, is appended before it runs; ``ls -a`` shows the file."""
    env = gym.make("MATH-ReAct-v0", dataset=[TASK], sandbox="none")
    try:
        listing, blocked, log = observe(env, "ls -a", "kill -9 1", "cat .math_tool_commands.log")
        assert listing == "Observation from bash:\n.\n..\n.math_tool_commands.log\n\n[exit_code] 0"
        assert blocked == BLOCKED
        pattern = "".join(
            LOG_ENTRY + re.escape(c) + r"\n" for c in ("ls -a", "kill -9 1", "cat .math_tool_commands.log")
        )
        assert re.fullmatch("Observation from bash:\n" + pattern + r"\n\[exit_code\] 0", log), log
    finally:
        env.close()


def test_default_sandbox_keeps_no_command_log():
    env = gym.make("MATH-ReAct-v0", dataset=[TASK])
    try:
        (listing,) = observe(env, "ls -A /workspace; echo end")
        assert listing == "Observation from bash:\nend\n\n[exit_code] 0"
    finally:
        env.close()


def test_cli_passes_the_blocklist_switch_and_rejects_it_unsandboxed(tmp_path, capsys):
    from agent_envs.cli import main

    def run(*extra: str) -> int:
        return main(
            [
                "eval",
                "--env",
                "MATH-ReAct-v0",
                "--policy",
                "scripted",
                "--limit",
                "1",
                "--no-progress",
                "--env-arg",
                "blocklist=false",
                *extra,
            ]
        )

    assert run("--sandbox", "none", "--out", str(tmp_path / "host")) == 2
    assert "invalid settings for MATH-ReAct-v0: blocklist=False needs a sandbox" in capsys.readouterr().err
    assert run("--sandbox", "bwrap", "--out", str(tmp_path / "ok")) == 0
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    assert config["env_args"] == {"blocklist": False}
