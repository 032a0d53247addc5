"""An environment's protocol as data: everything the shared layers need to know about it.

``protocol/``, ``sandbox/``, ``rollout/``, ``report/`` and the CLI read these frozen records instead
of branching on environment names; a new environment declares one :class:`EnvSpec` in its own
folder and adds it to :mod:`agent_envs.envs.registry`.  Each tool is declared once in ``tools/``
(a :class:`ToolSpec`) and offered by listing it in the specs that use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from pydantic import BaseModel

from agent_envs.core.observation import Observation

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


@dataclass(frozen=True)
class Rules:
    """How one harness reacts to a completion: parser, warning texts, tools (docs/protocol.md#decision-order).

    ``tools`` maps each action name to the argument holding its input (None: the tool takes the
    action's whole ``arguments`` object); any of them counts as the tool use that
    ``tool_required`` asks for before a final answer.  An environment's rules get ``tools`` and
    ``unknown_action`` from its tool declarations (:func:`agent_envs.protocol.decision.with_tools`).
    """

    parser: ParserSpec
    tool_required: str
    format_warning: str
    #: text of the first-turn rule (docs/protocol.md#first-turn-rule); None: the rule is off
    first_turn: str | None = None
    tools: tuple[tuple[str, str | None], ...] = (("bash", "command"),)
    unknown_action: str = "Unknown action '{name}'. Available action is bash."
    no_input: str = "No shell command was provided."
    #: a final answer needs a tool call first (off in single-turn setups)
    require_tool: bool = True
    #: native tool calls: the OpenAI ``tools`` entries the chat template shows the model
    tool_schemas: tuple[Mapping[str, Any], ...] = ()

    @property
    def tool_args(self) -> Mapping[str, str | None]:
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


class Tool(Protocol):
    """One episode's instance of a tool: its input in (the text of its argument, or the whole
    ``arguments`` object), the observation out (never raising for anything the model wrote)."""

    def run(self, tool_input: Any) -> str | Observation: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model can call, declared once in ``tools/``; a spec offers it by listing it (with
    its own framing or blocklist text through :meth:`with_`).

    ``build(sandbox_config, framing, max_output_chars)`` gives the episode's :class:`Tool`.  The
    observation is its text, or an :class:`~agent_envs.core.observation.Observation` when it
    carries images.

    The tool also says how a ReAct system prompt presents it (:meth:`prompt_text`): a prompt
    template's ``{tools}`` is its tools' texts (:func:`fill_tools`), so the list of actions cannot
    drift from the tools declared.  A prompt that words a tool its own way still shows its
    :meth:`call_example` (tests/test_tool_prompts.py checks both).
    """

    name: str
    build: Callable[[Any, Framing, int], Tool]
    #: the action argument holding the tool's input text; None: the whole ``arguments`` object
    argument: str | None = "command"
    framing: Framing = Framing()
    #: observation refusing a blocklisted command without running it (None: no blocklist)
    blocked: str | None = None
    #: sandbox capabilities the tool needs (:data:`agent_envs.sandbox.base.PROCESSES`, ...); an
    #: environment whose sandbox lacks one is refused when it is made
    needs: frozenset[str] = frozenset()
    #: what a prompt's call example holds in the argument (``"<shell command>"``)
    placeholder: str = ""
    #: what the tool does, in a prompt's list of actions (``"runs a shell command."``)
    description: str = ""

    def with_(self, **changes: Any) -> ToolSpec:
        return replace(self, **changes)

    def call_example(self) -> str:
        """The call as a prompt shows it: ``{"name": "bash", "arguments": {"command": "<shell command>"}}``
        (the arguments object empty for a tool that takes it whole)."""
        arguments = {} if self.argument is None else {self.argument: self.placeholder}
        return json.dumps({"name": self.name, "arguments": arguments}, ensure_ascii=False)

    def prompt_text(self) -> str:
        """The tool's entry in a ReAct prompt's list of actions: ``Action:``, the call, a blank line
        and what it does."""
        return f"Action:\n{self.call_example()}\n\n{self.description}"


#: where a system prompt template lists its environment's tools
TOOLS_PLACEHOLDER = "{tools}"


def fill_tools(template: str, tools: Sequence[ToolSpec]) -> str:
    """``template`` with :data:`TOOLS_PLACEHOLDER` replaced by the tools' prompt texts, a blank
    line between two (``str.replace``, as :func:`agent_envs.core.prompts.fill`: other braces stay)."""
    return template.replace(TOOLS_PLACEHOLDER, "\n\n".join(tool.prompt_text() for tool in tools))


@dataclass(frozen=True)
class ReportFields:
    """What a report shows of one record's task: the question as asked, the gold answer, the page."""

    question: str = ""
    gold: str | None = None
    #: host path of an image to show beside the episode (a document page)
    image: str | None = None
    #: shown beside the score, e.g. the raw value a zeroed score came from
    score_note: str | None = None


def no_fields(row: Row) -> ReportFields:
    return ReportFields()


@dataclass(frozen=True)
class ReportSpec:
    """What reports, trace logs and the CLI show for this environment."""

    #: trace-log file names start ``<trace_prefix>_agent_``
    trace_prefix: str
    #: a record counts as a success when ``score >= success_at`` (``score > success_at`` when strict)
    success_at: float = 1.0
    success_strict: bool = False
    #: the trace-log markdown of one record and its outcome (docs/protocol.md#trace-logs)
    render_trace: Callable[[Row, str], str] | None = None
    #: question, gold answer and page image of a record, for the HTML report
    fields: Callable[[Row], ReportFields] = no_fields

    def succeeded(self, score: float) -> bool:
        return score > self.success_at if self.success_strict else score >= self.success_at

    def outcome(self, row: Row) -> str:
        """``SUCCEED`` or ``FAILED``: the trace logs' word for the record's score."""
        return "SUCCEED" if self.succeeded(float(row.get("score") or 0.0)) else "FAILED"


@dataclass(frozen=True)
class Metric:
    """One number of an environment's summary block, as the CLI table and the report name it."""

    #: key in the block; ``{n}`` stands for the run's sample count (``"anls_mean{n}"``)
    key: str
    #: column of the CLI's table (None: not in the table)
    column: str | None = None
    #: row label in the HTML report (None: not in the report)
    label: str | None = None

    def value(self, block: Row, samples: int) -> Any:
        return block.get(self.key.replace("{n}", str(samples)))


@dataclass(frozen=True)
class MetricsSpec:
    """An environment's own metrics (docs/protocol.md#metrics), computed from its records by
    functions in its folder; the shared summary only places them."""

    #: summary.json key of the block (a published layout)
    key: str
    #: ``(rows, samples) -> block``, None when the rows do not carry the fields it needs
    block: Callable[[Sequence[Row], int], Row | None]
    #: ``(rows, scores per task, k) -> entries`` added to ``at_k`` for each k
    at_k: Callable[[Sequence[Row], Sequence[Sequence[float]], int], Row] | None = None
    #: numbers of the block that the CLI table and the report show
    shown: tuple[Metric, ...] = ()
    #: report labels of the ``at_k`` entries this spec adds, by key prefix (``"acc_pass@"``)
    at_k_labels: Mapping[str, str] = field(default_factory=dict)


# The defaults below, like every callable of a spec, are module-level functions (no lambdas): an
# environment holds its spec, and pickling or copying the environment pickles the spec by reference.
def no_mounts(task: Any) -> list[Mount]:
    return []


def no_images(task: Any) -> list[str]:
    return []


def no_task_fields(task: Any) -> Row:
    return {}


@dataclass(frozen=True)
class EnvSpec:
    """One environment's protocol: budgets, prompts, tasks, rules, tools, mounts, scoring, report.

    The class at ``entry_point`` adds only its own options and its scorer.
    """

    id: str
    #: ``"module:Class"``, imported when the environment is made
    entry_point: str
    #: rules by ``compat`` (``"es"``: the ES runner; ``"http_eval"``: the HTTP evaluator)
    rules: Mapping[str, Rules]
    tools: tuple[ToolSpec, ...]
    report: ReportSpec
    #: prompt names (``"<env>/system"``): the file ``<name's last part>.txt`` in ``prompt_dir``, and
    #: the key of a prompt profile's file and of the published SHA-256 table
    system_prompt: str
    user_prompt: str
    #: the folder of this environment's prompt files (its own folder's ``prompts/``); None: the
    #: package's shared prompt folder, ``<name>.txt``
    prompt_dir: Path | None = None
    #: placed between the system prompt and a non-blank skill text
    skill_separator: str = ""
    max_turns: int = 50
    max_tokens_per_turn: int = 4096
    max_trajectory_tokens: int | None = None
    #: ``(spec, **kwargs) -> tasks``: the configured dataset ("builtin", a path, rows)
    load_tasks: Callable[..., list[Any]] | None = None
    #: the pydantic task model a ``reset(options={"task": ...})`` payload is validated with
    task_model: type[BaseModel] | None = None
    #: sandbox mounts an episode needs, built from its task
    mounts: Callable[[Any], list[Mount]] = no_mounts
    #: ``(template, task) -> first user message``; None: ``{question}`` filled with ``task.question``
    user_message: Callable[[str, Any], str] | None = None
    #: host paths of the images a step scorer is shown with every step of a task
    #: (docs/protocol.md#process-rewards)
    step_images: Callable[[Any], list[str]] = no_images
    #: fields of the task every record repeats at its top level, before its score fields
    task_fields: Callable[[Any], Row] = no_task_fields
    #: the environment's own summary metrics (None: only the shared ones)
    metrics: MetricsSpec | None = None
    #: what the episode score measures (``"anls"``, ``"correct_answer"``): summaries name their
    #: mean score by it, so a run's numbers never pass for another metric
    score_metric: str = "score"
    #: the ``scripted`` policy's answer, ``request -> completion``: one real tool call, then an
    #: answer read off its output (a floor baseline and a model-free smoke test)
    baseline: Callable[[Any], str] | None = None
    description: str = ""

    def tool(self, name: str) -> ToolSpec:
        """The declaration of the tool ``name`` (a KeyError names the tools this spec offers)."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        raise KeyError(f"{self.id} has no tool {name!r}; its tools: {', '.join(self.tool_names)}")

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)
