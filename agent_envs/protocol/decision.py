"""What one assistant completion means for the episode (docs/protocol.md#decision-order, #first-turn-rule).

Every environment shares this decision order; they differ only in their :class:`Rules` (parser,
warning wording, tools, first-turn rule). It is pure: running a command, and any blocking, is
the environment's job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, Sequence

from agent_envs.core.spec import Rules, ToolSpec
from agent_envs.protocol import messages as msg
from agent_envs.protocol import native
from agent_envs.protocol.parsing import final_answer_line, is_single_bash_action, parse_action, strip_think

ActKind = Literal["run", "unknown_action", "empty_command", "malformed_call", "skipped_call"]


@dataclass(frozen=True)
class Decision:
    """One of: ``final`` (episode ends), ``warn`` (format_check observation), ``act``.

    For ``act``: ``act_kind`` is ``run`` (run tool ``observation_name`` on ``tool_input``; counts
    as tool use), ``unknown_action`` or ``empty_command`` (reply with ``observation``; no tool
    use).  ``observation_name`` is the name to put in ``Observation from <name>:``.  The tool's
    input is ``command`` (the text of its argument), or ``arguments`` for a tool that takes the
    action's whole ``arguments`` object.  Under a native parser also ``malformed_call`` and
    ``skipped_call`` (reply, no tool use; one for all the calls past the cap), and ``call`` is the
    tool call the decision answers (none for ``skipped_call``).
    """

    kind: Literal["final", "warn", "act"]
    final_answer: str | None = None
    action: dict[str, Any] | None = None
    act_kind: ActKind | None = None
    command: str | None = None
    arguments: dict[str, Any] | None = None
    observation_name: str | None = None
    observation: str | None = None
    call: native.Call | None = None

    @property
    def tool_input(self) -> str | dict[str, Any] | None:
        """What the tool runs on: its argument's text, or the whole arguments object."""
        return self.command if self.command is not None else self.arguments

    def observation_message(self) -> dict[str, str] | None:
        """The user message to append, when the decision already knows its body."""
        if self.observation is None or self.observation_name is None:
            return None
        return msg.observation_message(self.observation_name, self.observation)


def _warn(body: str) -> Decision:
    return Decision("warn", observation_name=msg.FORMAT_CHECK, observation=body)


def _act(action: dict[str, Any], rules: Rules) -> Decision:
    name = action["name"]
    tools = rules.tool_args
    if name not in tools:
        return Decision(
            "act",
            action=action,
            act_kind="unknown_action",
            observation_name=name,
            observation=msg.unknown_action(name, rules.unknown_action),
        )
    key = tools[name]
    if key is None:  # the tool reads the whole object, as data; {} is a valid input
        return Decision("act", action=action, act_kind="run", observation_name=name, arguments=action["arguments"])
    # The ES runner stringifies whatever ``command`` holds (so a number is a command).
    command = str(action["arguments"].get(key, ""))
    if not command.strip():
        return Decision(
            "act", action=action, act_kind="empty_command", observation_name=name, observation=rules.no_input
        )
    return Decision("act", action=action, act_kind="run", command=command, observation_name=name)


def with_tools(rules: Rules, tools: Sequence[ToolSpec]) -> Rules:
    """``rules`` for an environment offering ``tools``: their names and argument keys, and the
    unknown-action text naming them (docs/protocol.md#warning-and-observation-texts)."""
    names = [t.name for t in tools]
    return replace(
        rules, tools=tuple((t.name, t.argument) for t in tools), unknown_action=msg.unknown_action_template(names)
    )


def decide(completion: str, *, used_bash: bool, flavour: Rules) -> Decision:
    """Apply the per-completion decision order (docs/protocol.md#decision-order) to a raw completion.

    ``used_bash``: whether a tool has run this episode.
    """
    cleaned = strip_think(completion)
    final = final_answer_line(cleaned)
    action = parse_action(cleaned, flavour.parser)
    if action is None and final is not None:
        done = used_bash or not flavour.require_tool
        return Decision("final", final_answer=final) if done else _warn(flavour.tool_required)
    if flavour.first_turn is not None and action is not None and not used_bash and not is_single_bash_action(cleaned):
        return _warn(flavour.first_turn)
    if action is None:
        return _warn(flavour.format_warning)
    return _act(action, flavour)


def decide_turn(
    completion: str, *, used_bash: bool, flavour: Rules, tool_calls: Sequence[Any] | None = None
) -> list[Decision]:
    """Every decision one completion calls for: the one of :func:`decide` under a ReAct parser;
    under a native parser one per tool call, in order, up to the cap, and one for all the calls past it
    (docs/protocol.md#native-tool-calls).

    ``tool_calls``: the calls a server parsed out of the text (OpenAI shape), read instead of it."""
    if not flavour.parser.native_tool_calls:
        return [decide(completion, used_bash=used_bash, flavour=flavour)]
    calls = native.parse_server_calls(tool_calls, completion) if tool_calls else native.parse_text_calls(completion)
    if not calls:
        final = final_answer_line(native.without_calls(completion).strip())
        if final is None:
            return [_warn(flavour.format_warning)]
        done = used_bash or not flavour.require_tool
        return [Decision("final", final_answer=final) if done else _warn(flavour.tool_required)]
    limit = flavour.parser.max_calls
    decisions = [_native_act(call, flavour) for call in calls[:limit]]
    if len(calls) > limit:  # one answer for them all: a record grows with the text, not with calls x text
        decisions.append(
            Decision(
                "act",
                act_kind="skipped_call",
                observation_name=msg.FORMAT_CHECK,
                observation=native.skipped_calls(len(calls) - limit, limit),
            )
        )
    return decisions


def _native_act(call: native.Call, rules: Rules) -> Decision:
    if call.error is not None or call.name is None or call.arguments is None:
        return Decision(
            "act",
            act_kind="malformed_call",
            observation_name=call.name or msg.FORMAT_CHECK,
            observation=call.error or native.MALFORMED_CALL,
            call=call,
        )
    return replace(_act({"name": call.name, "arguments": call.arguments}, rules), call=call)
