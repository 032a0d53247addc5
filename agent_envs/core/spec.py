"""An environment's protocol as data: everything the shared layers need to know about it.

``protocol/``, ``sandbox/``, ``rollout/`` and the CLI read these frozen records instead of
branching on environment names; a new environment declares one :class:`EnvSpec` in its own
folder and adds it to :mod:`agent_envs.core.registry`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

Row = dict[str, Any]


@dataclass(frozen=True)
class ParserSpec:
    """Which passes the action parser runs and what it accepts (docs/protocol.md#action-parsers).

    All start at the first ``Action: {``: a strict and a greedy pass always run.  The native
    variant reads the model's own tool-call format instead (docs/protocol.md#native-tool-calls).
    """

    #: a third pass for JSON cut off by the token limit, then the relaxed near-JSON bash parser
    truncated_and_relaxed: bool = False
    #: an action object without an ``arguments`` key is not an action
    require_arguments: bool = False
    #: only ``bash`` with a non-blank string ``command`` is an action
    require_bash_command: bool = False
    #: native tool calls (``<tool_call>`` blocks, or a server's ``tool_calls``) instead of ``Action:``
    native_tool_calls: bool = False
    #: native: calls run per turn, in order; later ones are answered without running
    max_calls: int = 8


#: a ``Rules.tools`` entry whose tool takes the action's whole ``arguments`` object (JSON text)
ALL_ARGUMENTS = "*"


@dataclass(frozen=True)
class Rules:
    """How one harness reacts to a completion: parser, warning texts, tools (docs/protocol.md#decision-order).

    ``tools`` maps each action name to the argument holding its input (:data:`ALL_ARGUMENTS`: the
    whole ``arguments`` object, as JSON); any of them counts as the tool use that
    ``tool_required`` asks for before a final answer.
    """

    parser: ParserSpec
    tool_required: str
    format_warning: str
    #: text of the first-turn rule (docs/protocol.md#first-turn-rule); None: the rule is off
    first_turn: str | None = None
    tools: tuple[tuple[str, str], ...] = (("bash", "command"),)
    unknown_action: str = "Unknown action '{name}'. Available action is bash."
    no_input: str = "No shell command was provided."
    #: a final answer needs a tool call first (off in single-turn setups)
    require_tool: bool = True
    #: native tool calls: the OpenAI ``tools`` entries the chat template shows the model
    tool_schemas: tuple[Mapping[str, Any], ...] = ()

    @property
    def tool_args(self) -> Mapping[str, str]:
        return dict(self.tools)


@dataclass(frozen=True)
class Framing:
    """How a command's result becomes observation text (docs/protocol.md#output-framing)."""

    #: name in the "<Label> exited with code N and no output." / "<Label> timed out" texts
    label: str = "Bash"
    #: turn CRLF and CR into LF (a text-mode pipe)
    translate_newlines: bool = False
    #: strip trailing whitespace before the exit-code line
    rstrip: bool = False
    #: truncation keeps exactly ``limit`` characters around the marker (else limit/2 per side)
    exact_limit: bool = False


@dataclass(frozen=True)
class Mount:
    """A host path bound into the sandbox (read-only unless said otherwise)."""

    host: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class ReportSpec:
    """What reports, trace logs and the CLI show for this environment."""

    #: trace-log file names start ``<trace_prefix>_agent_``
    trace_prefix: str
    #: a record counts as a success when ``score >= success_at`` (``score > success_at`` when strict)
    success_at: float = 1.0
    success_strict: bool = False
    #: the trace-log markdown of one record (docs/protocol.md#trace-logs)
    render_trace: Callable[[Row], str] | None = None
    #: the answer the CLI's ``scripted`` baseline gives: ``request -> completion``
    baseline: Callable[[Any], str] | None = None

    def succeeded(self, score: float) -> bool:
        return score > self.success_at if self.success_strict else score >= self.success_at


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model can call: ``build(sandbox, framing, max_output_chars)`` gives an object
    with ``run(text) -> observation`` and ``close()``, one per episode.  The observation is its
    text, or a :class:`agent_envs.core.observation.Observation` when it carries images."""

    build: Callable[[Any, Framing, int], Any]
    framing: Framing = Framing()
    #: observation refusing a blocklisted command without running it (None: no blocklist)
    blocked: str | None = None


@dataclass(frozen=True)
class EnvSpec:
    """One environment's protocol: budgets, prompts, tasks, rules, tools, mounts, report.

    The class at ``entry_point`` adds only its own options and its scorer.
    """

    id: str
    #: ``"module:Class"``, imported when the environment is made
    entry_point: str
    #: rules by ``compat`` (``"es"``: the ES runner; ``"http_eval"``: the HTTP evaluator)
    rules: Mapping[str, Rules]
    tools: Mapping[str, ToolSpec]
    report: ReportSpec
    system_prompt: str
    user_prompt: str
    #: placed between the system prompt and a non-blank skill text
    skill_separator: str = ""
    max_turns: int = 50
    max_tokens_per_turn: int = 4096
    max_trajectory_tokens: int | None = None
    #: ``(spec, **kwargs) -> tasks``: the configured dataset ("builtin", a path, rows)
    load_tasks: Callable[..., list[Any]] | None = None
    #: the pydantic task model a ``reset(options={"task": ...})`` payload is validated with
    task_model: type | None = None
    #: sandbox mounts an episode needs, built from its task
    mounts: Callable[[Any], list[Mount]] = lambda task: []
    #: ``(template, task) -> first user message``; None: ``{question}`` filled with ``task.question``
    user_message: Callable[[str, Any], str] | None = None
    #: host paths of the images a step scorer is shown with every step of a task
    #: (docs/protocol.md#process-rewards)
    step_images: Callable[[Any], list[str]] = lambda task: []
    description: str = ""
