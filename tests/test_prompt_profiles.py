"""Published prompt hashes and prompt profiles (docs/protocol.md#prompt-hashes, #prompt-profiles)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401  (registers the environments)
from agent_envs.cli import main
from agent_envs.core.prompts import PUBLISHED_PROMPTS, PUBLISHED_TEXTS, PublishedText, fill, load_prompt, sha256
from agent_envs.envs import registry
from agent_envs.envs.docvqa.spec import PROMPTS as DOCVQA_PROMPTS
from agent_envs.envs.docvqa.texts import DOCVQA_FORMAT_WARNING_HTTP, DOCVQA_TOOL_REQUIRED

DOCS = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
#: a stand-in for the reference's Math system prompt, which the repository may not hold
ORIGINAL = "You are a stand-in for the original Math system prompt.\nAvailable action:\n"


def _docs_table() -> list[tuple[str, int, str]]:
    section = DOCS.read_text().split("### Prompt hashes", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| (.+?) \| (\d+) \| `([0-9a-f]{64})` \|$", section, re.M)
    return [(label, int(chars), sha) for label, chars, sha in rows]


def shipped_prompt(name: str) -> str:
    """The shipped system prompt a published name stands for, from the environment that uses it."""
    (found,) = {(s.system_prompt, s.prompt_dir) for s in registry.SPECS.values() if s.system_prompt == name}
    return load_prompt(*found)


def test_the_docs_list_the_code_table_of_published_hashes():
    assert _docs_table() == [(t.label, t.chars, t.sha256) for t in PUBLISHED_TEXTS]


def test_shipped_protocol_texts_hash_as_published_and_shipped_system_prompts_are_ours():
    by_label = {t.label: t for t in PUBLISHED_TEXTS}
    shipped = {
        "DocVQA user message for the question `What is the invoice number?`": fill(
            load_prompt("user", DOCVQA_PROMPTS), "What is the invoice number?"
        ),
        "DocVQA format warning, HTTP wording": DOCVQA_FORMAT_WARNING_HTTP,
        "DocVQA tool-required warning": DOCVQA_TOOL_REQUIRED,
    }
    for label, text in shipped.items():
        assert (len(text), sha256(text)) == (by_label[label].chars, by_label[label].sha256), label
    for name, published in PUBLISHED_PROMPTS.items():  # our own wording: docs/protocol.md#prompts says so
        assert sha256(shipped_prompt(name)) != published.sha256, name


@pytest.fixture
def profile(tmp_path, monkeypatch):
    """A profile folder whose Math system prompt the test registers as the published text."""
    folder = tmp_path / "profile"
    (folder / "math_react").mkdir(parents=True)
    (folder / "math_react" / "system.txt").write_text(ORIGINAL + "\n")  # the editor's final newline is dropped
    registered = PublishedText("Math system prompt", len(ORIGINAL), sha256(ORIGINAL), "math_react/system")
    monkeypatch.setitem(PUBLISHED_PROMPTS, "math_react/system", registered)
    return folder


def test_a_profile_with_the_published_text_runs_and_is_recorded(profile, tmp_path):
    env = gym.make("MATH-ReAct-v0", prompts=str(profile), sandbox="none", max_turns=1, tasks=[_task()])
    plain = gym.make("MATH-ReAct-v0", sandbox="none", max_turns=1, tasks=[_task()])
    obs, _ = env.reset(options={"row_index": 0})
    assert obs[0]["content"] == ORIGINAL
    *_, info = env.step("Final answer: \\boxed{2}")
    assert info["termination_reason"] == "max_turns"
    assert env.unwrapped.env_settings["prompt_profile"] == "published"
    assert info["record"]["env_config_hash"] != plain.unwrapped.config_hash
    out = tmp_path / "run"
    argv = ["eval", "--env", "MATH-ReAct-v0", "--policy", "scripted", "--limit", "1", "--max-turns", "1"]
    argv += ["--no-progress", "--no-report", "--no-trace-logs", "--sandbox", "none", "--out", str(out)]
    assert main([*argv, "--prompts", str(profile)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["prompts"] == str(profile) and config["env_settings"]["prompt_profile"] == "published"
    record = json.loads((out / "records.jsonl").read_text().splitlines()[0])
    assert record["env_config_hash"] == env.unwrapped.config_hash


def test_a_profile_that_hashes_differently_is_refused_naming_both_hashes(profile, capsys):
    (profile / "math_react" / "system.txt").write_text(ORIGINAL + "edited\n")
    with pytest.raises(ValueError) as err:
        gym.make("MATH-ReAct-v0", prompts=str(profile), sandbox="none")
    assert sha256(ORIGINAL + "edited") in str(err.value) and sha256(ORIGINAL) in str(err.value)
    argv = ["eval", "--env", "MATH-ReAct-v0", "--policy", "scripted", "--sandbox", "none", "--no-progress"]
    assert main([*argv, "--out", str(profile.parent / "x"), "--prompts", str(profile)]) == 2
    assert sha256(ORIGINAL) in capsys.readouterr().err
    with pytest.raises(ValueError, match="no published SHA-256 for 'countdown/system'"):
        gym.make("Countdown-ReAct-v0", prompts=str(profile), sandbox="none")


def test_es_train_checks_the_profile_before_engines_and_records_it(profile, monkeypatch):
    from agent_envs.esrun.run import make_env_kwargs, prompt_settings
    from agent_envs.esrun.settings import parse_settings

    args = parse_settings(["--model", "m", "--train", "t", "--history", "h", "--prompts", str(profile)])
    assert make_env_kwargs(args)["prompts"] == str(profile)
    assert prompt_settings(args) == {
        "prompts": str(profile),
        "prompt_profile": "published",
        "system_prompt_sha256": sha256(ORIGINAL),
    }
    (profile / "math_react" / "system.txt").write_text("not the original")
    with pytest.raises(SystemExit, match=f"{sha256('not the original')}.*{sha256(ORIGINAL)}"):
        prompt_settings(args)


def _task() -> dict:
    return {"id": "t1", "question": "What is 1+1?", "answer": "2"}
