"""A tool declares its own prompt text (ToolSpec.call_example, .prompt_text) and a system prompt
template's ``{tools}`` is filled from the environment's declared tools, without changing the
bytes of any shipped prompt; a prompt that words a tool its own way still shows the declared call."""

from __future__ import annotations

import gymnasium as gym
import pytest

from agent_envs.core.prompts import load_prompt, sha256
from agent_envs.core.spec import TOOLS_PLACEHOLDER, fill_tools
from agent_envs.envs import registry
from agent_envs.tools.bash import BASH
from agent_envs.tools.python import PYTHON
from agent_envs.tools.view import view_tool

#: the SHA-256 of each environment's system prompt as the model sees it, taken before the tool
#: lists were built from the tools: the same bytes after
SYSTEM_PROMPT_SHA256 = {
    "MATH-ReAct-v0": "df8abb79529b6dcd59bbd366c09b391d26c207c158cd8e94f1bd2a455c098bc7",
    "MATH-Tools-v0": "70e6bf525d5761b18443dd594f5a0666be21340b5bd4fe17bab81bab06abf56f",
    "DocVQA-CLI-v0": "665c460554ab290ca9069949f4b0fb0049dc93ca5aee7712cb94e9bc71fec9e8",
    "DocVQA-VL-v0": "a7939b3dfec38da9080dd7daee1322a980f18e9886c24c0b40feaa9b102461fa",
    "Countdown-ReAct-v0": "c7091d2a9ad61e71f18ab810cdb51361a8eda1281cb58d5da19c94971c9a2d7e",
    "Countdown-Tools-v0": "8e4c384cbd87ec6895a539d7a6ea82c95515e3940ff0d63088fce663ffa088b2",
    "PrimeCount-Python-v0": "2c1d5e21a90b8e9f9573d8a355d7cb558025a84039abd78910929da573273365",
}


def _system_prompt(env_id: str, **kwargs: object) -> str:
    env = gym.make(env_id, sandbox="none", **kwargs)
    try:
        return str(env.unwrapped.system_prompt)  # type: ignore[attr-defined]
    finally:
        env.close()


@pytest.mark.parametrize("env_id", sorted(SYSTEM_PROMPT_SHA256))
def test_the_system_prompts_keep_their_bytes(env_id):
    assert sha256(_system_prompt(env_id)) == SYSTEM_PROMPT_SHA256[env_id]


def test_a_tool_declares_its_call_and_its_text():
    assert BASH.call_example() == '{"name": "bash", "arguments": {"command": "<shell command>"}}'
    assert PYTHON.prompt_text() == (
        'Action:\n{"name": "python", "arguments": {"code": "<python code>"}}\n\n'
        "runs code in a Python interpreter that keeps its variables and imports between calls; "
        "print what you want to see."
    )
    assert view_tool("/workspace/document.png").call_example() == '{"name": "view", "arguments": {}}'


def test_a_template_lists_the_declared_tools():
    template = f"Tools:\n\n{TOOLS_PLACEHOLDER}\n\nBraces {{question}} stay."
    told = PYTHON.with_(description="runs Python.")
    assert fill_tools(template, (told, BASH)) == (
        'Tools:\n\nAction:\n{"name": "python", "arguments": {"code": "<python code>"}}\n\nruns Python.\n\n'
        'Action:\n{"name": "bash", "arguments": {"command": "<shell command>"}}\n\nruns a shell command.\n\n'
        "Braces {question} stay."
    )


@pytest.mark.parametrize("env_id", ["Countdown-ReAct-v0", "PrimeCount-Python-v0"])
def test_a_shipped_prompt_is_built_from_its_tools(env_id):
    spec = registry.spec(env_id)
    template = load_prompt(spec.system_prompt, spec.prompt_dir)
    assert TOOLS_PLACEHOLDER in template and "Action:" not in template
    assert _system_prompt(env_id) == fill_tools(template, spec.tools)


def test_a_prompt_file_lists_its_environments_tools(tmp_path):
    prompt = tmp_path / "system.txt"
    prompt.write_text(f"Use these.\n\n{TOOLS_PLACEHOLDER}\n")
    text = _system_prompt("Countdown-ReAct-v0", prompt_file=str(prompt))
    assert text == f"Use these.\n\n{PYTHON.prompt_text()}\n\n{BASH.prompt_text()}"


#: the environments whose prompts show ``Action:`` calls (the native variants show none)
REACT_IDS = [
    env_id
    for env_id in sorted(SYSTEM_PROMPT_SHA256)
    if not all(rules.parser.native_tool_calls for rules in registry.spec(env_id).rules.values())
]


@pytest.mark.parametrize("env_id", REACT_IDS)
def test_a_react_prompt_shows_each_declared_call(env_id):
    """Where a prompt words a tool its own way (DocVQA's workspace, Math's python3 -c, the view
    tool's box), the call it shows is still the tool's declared one."""
    spec = registry.spec(env_id)
    prompt = _system_prompt(env_id)
    for tool in spec.tools:
        assert f"Action:\n{tool.call_example()}\n" in prompt, (env_id, tool.name)
