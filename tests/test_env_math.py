"""MATH-ReAct-v0 end to end with the real bubblewrap sandbox (issue 2 acceptance)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import agent_envs  # noqa: F401  (registers the environments)
from agent_envs.policy.base import Completion

TASK = {"id": "t42", "question": "6*7?", "answer": "42", "source": "test"}
BASH_42 = 'Action: {"name": "bash", "arguments": {"command": "python3 -c \'print(6*7)\'"}}'


def bash(cmd: str) -> str:
    import json

    return "Action: " + json.dumps({"name": "bash", "arguments": {"command": cmd}})


@pytest.fixture
def env():
    e = gym.make("MATH-ReAct-v0", dataset=[TASK])
    yield e
    e.close()


def test_scripted_episode_scores_one(env):
    messages, info = env.reset(options={"task": TASK})
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "6*7?" in messages[1]["content"]
    messages, reward, terminated, truncated, info = env.step(BASH_42)
    assert (reward, terminated, truncated) == (0.0, False, False)
    obs = messages[-1]["content"]
    assert obs.startswith("Observation from bash:\n")
    assert "42" in obs and "[exit_code] 0" in obs
    messages, reward, terminated, truncated, info = env.step("Final answer: \\boxed{42}")
    assert reward == 1.0 and terminated and not truncated
    assert info["termination_reason"] == "final_answer"
    ep = info["record"]
    assert ep["used_bash"] and ep["prediction"] == "42"
    assert ep["score_method"].startswith("math_paper_react_cli_")
    assert ep["trace_rounds"] == 1 and ep["react_steps"][0]["action"]["name"] == "bash"


def test_final_answer_before_tool_use_is_warned(env):
    env.reset(options={"task": TASK})
    messages, reward, terminated, truncated, info = env.step("Final answer: \\boxed{42}")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert messages[-1]["content"] == (
        "Observation from format_check:\nYou must call the bash Action before answering. "
        "Use command-line Python to compute or verify the solution, then provide Final answer."
    )


def test_prose_until_turn_limit_truncates(env):
    env.reset(options={"task": TASK})
    for turn in range(1, 51):
        messages, reward, terminated, truncated, info = env.step("I am thinking about it.")
        if turn < 50:
            assert not (terminated or truncated)
    assert truncated and not terminated
    assert info["termination_reason"] == "max_turns"
    assert info["record"]["react_error"] == "max_react_turns_exceeded"
    assert reward == 0.0
    assert info["record"]["score_method"] == "math_paper_react_cli_no_bash_tool_use"


def test_turn_seeds_follow_protocol(env):
    _, info = env.reset(options={"task": TASK, "row_index": 7, "sample_index": 2, "base_seed": 20260627})
    assert info["seed_base"] == 22260640
    req = env.unwrapped.generation_request()
    assert req.seed == 22260640 and req.max_tokens == 4096 and req.stop == ["Observation:"]
    env.step("thinking")
    assert env.unwrapped.generation_request().seed == 22260640 + 97


def test_request_error_ends_episode_without_raising(env):
    env.reset(options={"task": TASK})
    env.step(BASH_42)
    _, reward, terminated, truncated, info = env.step(
        Completion(error="request_error", error_message="RuntimeError: engine died")
    )
    assert truncated and not terminated and reward == 0.0
    assert info["termination_reason"] == "request_error"
    assert info["record"]["score_method"] == "math_paper_react_cli_request_error"


def test_step_after_end_is_a_clear_error(env):
    env.reset(options={"task": TASK})
    env.step(BASH_42)
    env.step("Final answer: \\boxed{42}")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("again")


def test_malformed_and_binary_completions_never_raise(env):
    env.reset(options={"task": TASK})
    for text in ["Action: {", 'Action: {"name": 5}', "\x00\xff\ud800", "Action: [1,2]", "", "Action:" * 1000]:
        _, _, terminated, truncated, _ = env.step(text)
        assert not terminated and not truncated


def test_check_env_passes():
    e = gym.make("MATH-ReAct-v0", dataset=[TASK])
    try:
        check_env(e.unwrapped)
    finally:
        e.close()


def test_namespaced_make_without_prior_import():
    code = (
        "import gymnasium as gym\n"
        "e = gym.make('agent_envs:MATH-ReAct-v0', dataset=[{'id':'a','question':'q','answer':'1'}])\n"
        "m, i = e.reset(seed=0)\nprint(m[0]['role'], type(e.unwrapped).__name__)\ne.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "system MathReActEnv"


def test_sandbox_denies_secrets_network_and_reaps_timeouts(env, math_dir):
    env.reset(options={"task": TASK})
    messages, *_ = env.step(bash("cat /etc/shadow"))
    assert "[exit_code] 1" in messages[-1]["content"] and "root:" not in messages[-1]["content"]
    messages, *_ = env.step(bash(f"cat {math_dir / 'dapo_test.jsonl'} | head -c 100"))
    assert "BytedTsinghua" not in messages[-1]["content"] and "No such file" in messages[-1]["content"]

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted: list = []
    server.settimeout(30)
    t = threading.Thread(target=lambda: accepted.append(_accept(server)), daemon=True)
    t.start()
    cmd = (
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('CONNECTED')\""
    )
    messages, *_ = env.step(bash(cmd))
    assert "CONNECTED" not in messages[-1]["content"]
    server.close()
    t.join(5)
    assert accepted in ([], [None])

    t0 = time.monotonic()
    messages, *_ = env.step(bash("sleep 60"))
    elapsed = time.monotonic() - t0
    assert messages[-1]["content"] == "Observation from bash:\nBash timed out after 20.0s."
    assert elapsed < 25
    messages, *_ = env.step(bash("ps -e -o comm= | grep -c sleep || true"))
    assert messages[-1]["content"].startswith("Observation from bash:\n0")


def _accept(server: socket.socket):
    try:
        conn, _ = server.accept()
        conn.close()
        return "accepted"
    except OSError:
        return None


def test_workspace_persists_across_turns(env):
    env.reset(options={"task": TASK})
    env.step(bash("echo 123 > note.txt && cd /tmp && X=5"))
    messages, *_ = env.step(bash("cat /workspace/note.txt; pwd; echo v=$X"))
    assert messages[-1]["content"].startswith("Observation from bash:\n123\n/tmp\nv=5")
    messages, *_ = env.step(bash("python3 -c 'import sympy, numpy; print(sympy.factorint(360))'"))
    assert "{2: 3, 3: 2, 5: 1}" in messages[-1]["content"]


# --- docs/protocol.md#math-tool-cases, adapted to the sandboxed tool ------------------------------
def test_python_arithmetic_observation(env):
    env.reset(options={"task": TASK})
    messages, *_ = env.step(bash("python3 -c 'print(20 + 22)'"))
    assert messages[-1]["content"] == "Observation from bash:\n42\n\n[exit_code] 0"  # math framing: no rstrip


def test_commands_run_in_the_episode_workspace(env):
    env.reset(options={"task": TASK})
    messages, *_ = env.step(bash("pwd"))
    assert messages[-1]["content"].startswith("Observation from bash:\n/workspace\n")


def test_short_timeout_kills_the_nested_process_group():
    e = gym.make("MATH-ReAct-v0", dataset=[TASK], sandbox={"backend": "bwrap", "limits": {"timeout_s": 0.1}})
    try:
        e.reset(options={"task": TASK})
        t0 = time.monotonic()
        cmd = "python3 -c \"import subprocess; subprocess.run(['sleep', '2.3457'])\""
        messages, *_ = e.step(bash(cmd))
        assert time.monotonic() - t0 < 1.0
        assert messages[-1]["content"] == "Observation from bash:\nBash timed out after 0.1s."
        leftover = subprocess.run(["pgrep", "-f", "sleep 2.3457"], capture_output=True, text=True).stdout
        assert leftover == ""
    finally:
        e.close()


def test_unsandboxed_workdirs_do_not_outlive_episodes_or_the_interpreter(tmp_path):
    """sandbox="none" without close(): one folder at most while running, none after exit."""
    script = f"""
import os, gymnasium as gym, agent_envs
act = {bash("touch here; ls")!r}
for seed in range(3):  # an environment per episode, dropped without close()
    e = gym.make("MATH-ReAct-v0", dataset=[{TASK!r}], sandbox="none")
    e.reset(seed=seed)
    e.step(act)
for seed in range(3):  # one environment, episodes cut short by reset()
    e.reset(seed=seed)
    e.step(act)
print(len(os.listdir({str(tmp_path)!r})))
"""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out == "1\n"  # only the running episode's folder
    assert list(tmp_path.iterdir()) == []
