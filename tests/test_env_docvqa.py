"""DocVQA-CLI-v0 on the real DocVQA sample pages with real bubblewrap and tesseract (issue 3)."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import agent_envs  # noqa: F401
from agent_envs.envs.docvqa.data import load_docvqa_tasks
from protocol_specs import msg as msgs

OCR = 'Action: {"name": "bash", "arguments": {"command": "tesseract /workspace/document.png stdout"}}'


def bash(cmd: str) -> str:
    return "Action: " + json.dumps({"name": "bash", "arguments": {"command": cmd}})


@pytest.fixture(scope="module")
def real_tasks(docvqa_dir):
    return load_docvqa_tasks(str(docvqa_dir / "val_v1.0.json"))


def one_per_page(tasks):
    seen, out = set(), []
    for t in tasks:
        if t.image not in seen:
            seen.add(t.image)
            out.append(t)
    return out


def test_real_pages_ocr_then_gold_scores_one(real_tasks):
    pages = one_per_page(real_tasks)
    assert len(pages) == 3
    env = gym.make("DocVQA-CLI-v0", dataset=real_tasks)
    try:
        for task in pages:
            env.reset(options={"task": task.model_dump()})
            messages, reward, terminated, truncated, info = env.step(OCR)
            assert not terminated and "[exit_code] 0" in messages[-1]["content"]
            assert len(messages[-1]["content"]) > 200  # real OCR text came back
            _, reward, terminated, truncated, info = env.step(f"Final answer: {task.answers[0]}")
            assert terminated and reward == 1.0, info
            ep = info["record"]
            assert ep["anls"] == 1.0 and ep["acc"] == 1.0
            assert ep["score_method"] == "docvqa_paper_react_cli_anls"
            assert ep["tool_image"] == "/workspace/document.png"
    finally:
        env.close()


def test_answer_before_tool_use_is_warned(real_tasks):
    env = gym.make("DocVQA-CLI-v0", dataset=real_tasks)
    try:
        for task in one_per_page(real_tasks):
            env.reset(options={"task": task.model_dump()})
            messages, reward, terminated, truncated, _ = env.step(f"Final answer: {task.answers[0]}")
            assert (reward, terminated, truncated) == (0.0, False, False)
            assert messages[-1]["content"] == "Observation from format_check:\n" + msgs.DOCVQA_TOOL_REQUIRED
    finally:
        env.close()


def test_user_message_never_shows_host_path(real_tasks):
    env = gym.make("DocVQA-CLI-v0", dataset=real_tasks)
    try:
        messages, _ = env.reset(options={"row_index": 0})
        user = messages[1]["content"]
        assert user.splitlines()[1] == "Image path: /workspace/document.png"
        assert real_tasks[0].image not in user and "documents/" not in user
    finally:
        env.close()


def test_sandbox_hides_dataset_home_and_network(real_tasks, docvqa_dir):
    env = gym.make("DocVQA-CLI-v0", dataset=real_tasks)
    try:
        env.reset(options={"row_index": 0})
        checks = [
            (f"cat {docvqa_dir / 'val_v1.0.json'} && echo READ-OK", "READ-OK"),
            (f"ls {docvqa_dir.parent} && echo READ-OK", "READ-OK"),
            ("cat /root/.bashrc && echo READ-OK", "READ-OK"),
            ("ls -A /root | grep -v '^.pyenv$' | grep . && echo LISTED", "LISTED"),
            ("python3 -c \"import socket; socket.create_connection(('127.0.0.1', 22), timeout=2); print('UP')\"", "UP"),
            ("touch /usr/x /etc/x /x && echo WROTE", "WROTE"),
        ]
        for cmd, leaked in checks:
            messages, *_ = env.step(bash(cmd))
            assert leaked not in messages[-1]["content"], cmd
        messages, *_ = env.step(bash("echo ok > /workspace/a && echo ok > /tmp/b && cat /workspace/a /tmp/b"))
        assert messages[-1]["content"] == "Observation from bash:\nok\nok\n[exit_code] 0"
    finally:
        env.close()


def test_fresh_mode_keeps_nothing_between_commands(real_tasks):
    env = gym.make("DocVQA-CLI-v0", dataset=real_tasks, sandbox={"backend": "bwrap", "mode": "fresh"})
    try:
        env.reset(options={"row_index": 0})
        env.step(bash("echo hi > /workspace/note"))
        messages, *_ = env.step(bash("cat /workspace/note"))
        assert "No such file" in messages[-1]["content"]
    finally:
        env.close()


def test_trajectory_cap_counts_observations():
    """A tiny cap is hit by the observation message, which is kept but not added to the count."""
    env = gym.make("DocVQA-CLI-v0", max_trajectory_tokens=60)
    try:
        env.reset(seed=0)
        messages, reward, terminated, truncated, info = env.step(bash("python3 -c 'print(400 * chr(120))'"))
        assert truncated and info["termination_reason"] == "max_response_tokens_exceeded"
        ep = info["record"]
        assert ep["attempted_trajectory_tokens"] >= 60 > ep["trajectory_tokens"] == ep["generated_tokens"]
        assert messages[-1]["content"].startswith("Observation from bash:")
    finally:
        env.close()


@pytest.mark.parametrize("completions", [[OCR, "Final answer: x"], ["no action", OCR, "Final answer: x"]])
def test_attempted_trajectory_tokens_is_an_integer_like_the_reference(real_tasks, completions):
    """Without a cap hit it equals trajectory_tokens (the reference keeps the last attempted sum)."""
    env = gym.make("DocVQA-CLI-v0", dataset=real_tasks)
    try:
        env.reset(options={"row_index": 0})
        for text in completions:
            *_, info = env.step(text)
        ep = info["record"]
        assert type(ep["attempted_trajectory_tokens"]) is int
        assert ep["attempted_trajectory_tokens"] == ep["trajectory_tokens"] > ep["generated_tokens"]
    finally:
        env.close()


def test_default_make_works_offline_and_passes_check_env():
    env = gym.make("DocVQA-CLI-v0")
    try:
        messages, info = env.reset(seed=3)
        assert "Question:" in messages[1]["content"]
        check_env(env.unwrapped)
    finally:
        env.close()


def test_skill_is_appended_after_the_protocol(real_tasks):
    env = gym.make("DocVQA-CLI-v0", dataset=real_tasks, skill="  Run tesseract first.  ")
    try:
        messages, _ = env.reset(options={"row_index": 0})
        system = messages[0]["content"]
        assert system.endswith(msgs.DOCVQA_SKILL_SUFFIX + "Run tesseract first.")
        assert "bash/OCR" in system and "<tool_call>" not in system
    finally:
        env.close()


@pytest.mark.parametrize("generated, cut_before_parsing", [(32767, False), (32768, True)])
def test_trajectory_cap_boundary(real_tasks, generated, cut_before_parsing):
    """docs/protocol.md#docvqa-protocol-cases (9): 32,767 tokens stay under the 32,768 cap, 32,768 hit it (before parsing)."""
    from agent_envs.policy.base import Completion

    env = gym.make("DocVQA-CLI-v0", dataset=real_tasks)
    try:
        env.reset(options={"row_index": 0})
        messages, _, _, truncated, info = env.step(Completion(text="thinking", token_ids=[0] * generated))
        assert truncated and info["termination_reason"] == "max_response_tokens_exceeded"
        ep = info["record"]
        assert ep["generated_tokens"] == ep["trajectory_tokens"] == generated
        if cut_before_parsing:
            assert messages[-1]["role"] == "assistant" and ep["attempted_trajectory_tokens"] == generated
        else:  # parsed, warned, and the warning's cost crossed the cap: kept but not counted
            assert messages[-1]["content"].startswith("Observation from format_check:")
            assert ep["attempted_trajectory_tokens"] > 32768 - 1
    finally:
        env.close()


def test_smoke_one_ocr_turn_then_answer(real_tasks):
    """docs/protocol.md#other-cases, stage-1 smoke: one bash tesseract turn, then `Final answer: smoke`."""
    task = {**real_tasks[0].model_dump(), "answers": ["smoke"]}
    env = gym.make("DocVQA-CLI-v0", dataset=real_tasks)
    try:
        env.reset(options={"task": task})
        messages, *_ = env.step(OCR)
        assert "[exit_code] 0" in messages[-1]["content"]
        _, reward, terminated, _, info = env.step("Final answer: smoke")
        ep = info["record"]
        assert terminated and ep["used_bash"] and ep["prediction"] == "smoke" and ep["anls"] == 1.0 == reward
    finally:
        env.close()


def test_make_accepts_the_rows_the_loader_accepts(docvqa_dir):
    """One path for ``dataset=[rows]`` and ``load_docvqa_tasks``: alternative keys, id prefix, paths."""
    page = str(docvqa_dir / "documents" / "ffbg0227_2.png")
    rows = [{"questionId": 7, "query": "What page?", "answer": "2", "image": page}]
    env = gym.make("DocVQA-CLI-v0", dataset=rows)
    try:
        messages, info = env.reset(options={"row_index": 0})
        assert info["task_id"] == "docvqa_7" and messages[1]["content"].endswith(
            "Question: What page?\nYou must call at least one bash action before giving the final answer."
        )
        assert env.unwrapped.tasks == load_docvqa_tasks(rows)
    finally:
        env.close()


def test_a_bad_page_is_reported_at_reset_not_discovered_by_the_model(real_tasks, tmp_path):
    from agent_envs.envs.docvqa.data import DocDataError

    good = real_tasks[0].image
    text_file, truncated, folder = tmp_path / "notes.png", tmp_path / "cut.png", tmp_path / "dir.png"
    text_file.write_text("not an image")
    data = open(good, "rb").read()
    truncated.write_bytes(data[: len(data) // 2])
    folder.mkdir()
    env = gym.make("DocVQA-CLI-v0", dataset=real_tasks)
    try:
        for path, error, message in [
            (text_file, DocDataError, "document image is not a readable image: .*notes.png .*UnidentifiedImageError"),
            (truncated, DocDataError, "document image is not a readable image: .*cut.png .*truncated"),
            (folder, DocDataError, "document image path is not a file: .*dir.png"),
            (tmp_path / "gone.png", FileNotFoundError, "document image not found: .*gone.png"),
        ]:
            with pytest.raises(error, match="task docvqa_26167: " + message):
                env.reset(options={"task": {**real_tasks[0].model_dump(), "image": str(path)}})
        env.reset(options={"task": real_tasks[0].model_dump()})  # the real page still passes
    finally:
        env.close()


def test_cr_and_crlf_are_kept_like_the_reference_bytes_decoding(real_tasks):
    env = gym.make("DocVQA-CLI-v0", dataset=real_tasks)
    try:
        env.reset(options={"row_index": 0})
        messages, *_ = env.step(bash(r"printf 'a\r\nb\rc\n'"))
        assert messages[-1]["content"] == "Observation from bash:\na\r\nb\rc\n[exit_code] 0"
    finally:
        env.close()
