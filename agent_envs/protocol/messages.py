"""Protocol strings every environment shares (docs/protocol.md#warning-and-observation-texts).

An environment's own warning texts live in its folder (``envs/<name>/texts.py``); these are the
pieces of the conversation format itself, reproduced byte for byte.
"""

from __future__ import annotations

import json
from typing import Sequence

from agent_envs.core.content import Message, Part, text_of, text_part

#: The two-line action block every prompt and format warning shows (docs/protocol.md#action-grammar).
ACTION_BLOCK = 'Action:\n{"name": "bash", "arguments": {"command": "<shell command>"}}'

NO_COMMAND = "No shell command was provided."
FORMAT_CHECK = "format_check"  # observation name of every protocol warning
#: the stop string of every generation: the model must not write the observation itself
STOP = ("Observation:",)


def unknown_action(name: str, template: str = "Unknown action '{name}'. Available action is bash.") -> str:
    """Observation body for an action whose name is not one of the environment's tools."""
    return template.replace("{name}", name)


def unknown_action_template(tools: Sequence[str]) -> str:
    """The unknown-action text for an environment offering ``tools``, in their order:
    ``Available action is bash.``, ``Available actions are python and bash.``."""
    if len(tools) == 1:
        return f"Unknown action '{{name}}'. Available action is {tools[0]}."
    return f"Unknown action '{{name}}'. Available actions are {', '.join(tools[:-1])} and {tools[-1]}."


def observation_message(name: str, body: str, images: Sequence[Part] = ()) -> Message:
    """The user message that carries a tool observation or a ``format_check`` warning (docs/protocol.md#conversation);
    with images, its content is the same text as a part followed by the image parts
    (docs/protocol.md#image-observations)."""
    text = f"Observation from {name}:\n{body}"
    return {"role": "user", "content": [text_part(text), *images] if images else text}


def task_turn_text(messages: Sequence[Message]) -> str | None:
    """The task's user message when ``messages`` ends with it (an episode's first turn), else None:
    every later turn ends with an observation.  Worked examples sent as earlier chat turns
    (docs/protocol.md#few-shot-turns) come before the task, so the first message is not it."""
    last = messages[-1]
    text = text_of(last["content"])
    return None if last["role"] != "user" or text.startswith("Observation from ") else text


def with_skill(system_prompt: str, skill: str, suffix: str) -> str:
    """Append ``suffix`` + the stripped skill; an empty or blank skill leaves the prompt as is."""
    skill = skill.strip()
    return f"{system_prompt}{suffix}{skill}" if skill else system_prompt


def action_text(name: str, arguments: dict[str, str]) -> str:
    """A well-formed action block (what a scripted baseline writes)."""
    return "Action:\n" + json.dumps({"name": name, "arguments": arguments})


def last_observation_body(messages: Sequence[Message]) -> str:
    """The body of the last message without its ``Observation from <name>:`` line."""
    content = text_of(messages[-1]["content"])
    return content.split("\n", 1)[1] if "\n" in content else ""
