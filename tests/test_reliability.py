"""Promises of docs/reliability.md that no single module owns: how an environment tells the model's
outcome from the machine's fault."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401
from agent_envs.core.types import INVALID_OUTPUT

BASH = "Action: " + json.dumps({"name": "bash", "arguments": {"command": "echo hi"}})


def _env_whose_screen_raises(exc: Exception) -> gym.Env:
    """A real MATH env whose command screening raises ``exc``: stands for any code path that a
    model's text reaches and that has a bug no test has found yet."""
    env = gym.make("MATH-ReAct-v0", dataset="builtin", sandbox="none", max_turns=4)

    def screen(tool, command, runner):
        raise exc

    env.unwrapped._screen = screen
    return env


def test_an_unforeseen_exception_on_the_text_ends_the_episode_as_invalid_output():
    """docs/reliability.md#model-text: the backstop, for what the totality tests have not found."""
    env = _env_whose_screen_raises(OverflowError("int too large to convert to float"))
    try:
        env.reset(seed=0)
        _, reward, terminated, truncated, info = env.step(BASH)
        record = info["record"]
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert record["termination_reason"] == INVALID_OUTPUT == record["score_method"]
        assert record["react_error"] == "OverflowError: int too large to convert to float"
        assert record["score"] == 0.0 and record["turns"] == 1
        with pytest.raises(RuntimeError, match="episode already ended"):
            env.step(BASH)
    finally:
        env.close()


@pytest.mark.parametrize("exc", [OSError("no space left on device"), MemoryError()])
def test_a_machine_fault_leaves_step(exc):
    """... while a machine fault is raised, for the runner to record as ``env_error``."""
    env = _env_whose_screen_raises(exc)
    try:
        env.reset(seed=0)
        with pytest.raises(type(exc)):
            env.step(BASH)
    finally:
        env.close()


def test_step_after_close_is_a_clear_error_and_starts_no_sandbox(tmp_path):
    """``close`` ends the episode's tools; a later ``step`` once started a new sandbox and ran the
    command.  ``reset`` opens the environment again."""
    env = gym.make("MATH-ReAct-v0", dataset="builtin", sandbox="none", max_turns=4)
    touched = tmp_path / "ran"
    env.reset(seed=0)
    env.close()
    with pytest.raises(RuntimeError, match="MATH-ReAct-v0 is closed: call reset"):
        env.step("Action: " + json.dumps({"name": "bash", "arguments": {"command": f"touch {touched}"}}))
    assert not touched.exists()
    env.reset(seed=0)
    env.step(BASH)
    env.close()


@pytest.mark.parametrize("value", ["abc", "1.5", "1e3", "12 MiB", "0", "-5"])
def test_a_bad_tmpfs_budget_is_refused_when_the_env_is_made(monkeypatch, tmp_path, capsys, value):
    """It once made every episode the model's invalid_output (or silently 1 MiB mounts), exit 0."""
    from agent_envs import cli

    monkeypatch.setenv("AGENT_ENVS_TMPFS_BUDGET_MIB", value)
    with pytest.raises(ValueError, match="AGENT_ENVS_TMPFS_BUDGET_MIB must be a whole number of MiB >= 1"):
        gym.make("MATH-ReAct-v0", dataset="builtin", sandbox="bwrap")
    argv = ["eval", "--policy", "scripted", "--env", "MATH-ReAct-v0", "--limit", "1", "--no-progress"]
    assert cli.main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "AGENT_ENVS_TMPFS_BUDGET_MIB" in err and err.count("\n") == 1


# ------------------------------------------------------------------ images over the pixel limit
@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    """A 38 kB PNG of 13,500 x 13,500 pixels: over Pillow's decompression-bomb limit."""
    from PIL import Image

    path = tmp_path_factory.mktemp("bomb") / "bomb.png"
    Image.new("1", (13_500, 13_500), 1).save(path, optimize=True)
    return path


LIMIT = "has 182,250,000 pixels, over the limit of 178,956,970 (Pillow's decompression-bomb guard"


def test_a_page_over_the_pixel_limit_stops_eval_before_the_policy(bomb, tmp_path, capsys, monkeypatch):
    from agent_envs import cli

    monkeypatch.setattr(cli, "make_policy", lambda *a, **k: pytest.fail("the policy was built first"))
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"id": "b", "question": "Title?", "answers": ["x"], "image": str(bomb)}) + "\n")
    assert (
        cli.main(
            [
                "eval",
                "--env",
                "DocVQA-VL-v0",
                "--data",
                str(data),
                "--policy",
                "scripted",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err == (
        f"agent-envs eval: error: cannot load --data {str(data)!r} for DocVQA-VL-v0: {data}:1: the page "
        f"{bomb} {LIMIT}, 2 x PIL.Image.MAX_IMAGE_PIXELS)\n"
    )


def test_a_page_over_the_pixel_limit_is_the_same_error_at_reset_in_view_and_in_the_report(bomb, tmp_path):
    from agent_envs.core.content import ImageTooLarge, decode_image_url
    from agent_envs.envs.docvqa.data import DocDataError
    from agent_envs.report.media import image_data_url
    from agent_envs.rewards.judge import load_images

    task = {"id": "docvqa_b", "question": "Title?", "answers": ["x"], "image": str(bomb)}
    env = gym.make("DocVQA-VL-v0", tasks=[task], sandbox="none")
    with pytest.raises(DocDataError, match=LIMIT.split(",")[0].replace("(", r"\(")):
        env.reset(seed=0)
    env.close()
    # a page that becomes too large during an episode: the view tool says so, the episode goes on
    builtin = gym.make("DocVQA-VL-v0", dataset="builtin").unwrapped.tasks[0]
    page = tmp_path / "page.png"
    page.write_bytes(Path(builtin.image).read_bytes())
    env = gym.make("DocVQA-VL-v0", tasks=[{**builtin.model_dump(), "image": str(page)}], sandbox="none")
    try:
        env.reset(seed=0)
        page.write_bytes(bomb.read_bytes())
        messages, _, terminated, truncated, _ = env.step('Action: {"name": "view", "arguments": {}}')
        assert not (terminated or truncated)
        assert (
            messages[-1]["content"] == f"Observation from view:\n[ERROR] The image cannot be read: "
            f"ImageTooLarge: the image {page} {LIMIT}, 2 x PIL.Image.MAX_IMAGE_PIXELS)"
        )
    finally:
        env.close()
    assert image_data_url(bomb) is None  # the report shows "page image not readable"
    with pytest.raises(ImageTooLarge, match=f"the image {bomb} {LIMIT.split(',')[0]}"):
        load_images([str(bomb)])  # a vision judge: a recorded step-score error
    url = "data:image/png;base64," + __import__("base64").b64encode(bomb.read_bytes()).decode()
    with pytest.raises(ImageTooLarge, match="the image data URL has 182,250,000 pixels"):
        decode_image_url(url)  # the policy server: a 400 with this message


# ------------------------------------------------------------------ the tmpfs budget
def test_the_tmpfs_mounts_of_all_episodes_in_flight_fit_the_budget(monkeypatch):
    """docs/reliability.md#limits: every sandbox's /tmp and /workspace live in RAM; a runner with N
    episodes in flight sizes each mount so that N x 4 of them fit the budget (half the host's RAM,
    or $AGENT_ENVS_TMPFS_BUDGET_MIB), and a full mount is a full disk inside, nothing more."""
    from agent_envs.policy.scripted import ScriptedPolicy
    from agent_envs.rollout.runner import run_episodes
    from agent_envs.sandbox.base import MOUNTS_PER_EPISODE, SandboxLimits, tmpfs_budget_mib, tmpfs_mib
    from agent_envs.core.flight import episodes_in_flight

    with episodes_in_flight(64):  # the defaults cannot exhaust this host, whatever its RAM
        assert 64 * MOUNTS_PER_EPISODE * tmpfs_mib(SandboxLimits()) <= tmpfs_budget_mib()
    monkeypatch.setenv("AGENT_ENVS_TMPFS_BUDGET_MIB", "192")
    fill = (
        "df -k --output=size /tmp /workspace | tail -n 2 | tr '\\n' ' '; "
        "head -c 20000000 /dev/zero > /workspace/big; echo rc=$?"
    )
    script = [f"Action: {json.dumps({'name': 'bash', 'arguments': {'command': fill}})}", "Final answer: 1"]
    tasks = [{"id": f"t{i}", "question": "1?", "answer": "1"} for i in range(6)]
    records = run_episodes(
        "MATH-ReAct-v0",
        tasks,
        ScriptedPolicy(script),
        concurrency=6,
        progress=False,
        env_kwargs={"sandbox": "bwrap", "max_turns": 3},
    )
    size_kib = 192 // (MOUNTS_PER_EPISODE * 6) * 1024  # 8 MiB a mount: 6 x 4 x 8 = 192
    for record in records:
        observation = record.react_steps[0]["observation"]
        assert observation.split()[:2] == [str(size_kib)] * 2 and "No space left on device" in observation
        assert "rc=1" in observation


def test_runners_side_by_side_in_one_process_share_one_tmpfs_budget(monkeypatch):
    """ES runs one runner per endpoint on threads of one process: their episodes add up."""
    from agent_envs.core.flight import episodes_in_flight
    from agent_envs.sandbox.base import MOUNTS_PER_EPISODE, SandboxLimits, tmpfs_mib

    monkeypatch.setenv("AGENT_ENVS_TMPFS_BUDGET_MIB", "960")
    with episodes_in_flight(6):
        assert tmpfs_mib(SandboxLimits()) == 960 // (MOUNTS_PER_EPISODE * 6)
        with episodes_in_flight(6):  # a second runner, started while the first still runs
            assert tmpfs_mib(SandboxLimits()) == 960 // (MOUNTS_PER_EPISODE * 12)
        assert tmpfs_mib(SandboxLimits()) == 960 // (MOUNTS_PER_EPISODE * 6)
