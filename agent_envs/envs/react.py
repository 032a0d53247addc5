"""The one episode loop of every environment, ES-runner semantics (docs/protocol.md#decision-order, #budgets-and-termination).

One environment instance is one trajectory at a time.  Everything environment-specific (budgets,
prompts, tasks, rules, tools, mounts) is read from the class's :class:`EnvSpec`; a subclass adds
its own options (a pydantic model) and its scorer.  Everything a model writes is handled here
without raising: malformed completions become warnings, failed generations end the episode with a
termination reason.  What to generate next travels one way, :meth:`ReActEnv.generation_request`.
"""

from __future__ import annotations

import abc
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym

from agent_envs.core.content import copy_message, text_of, text_part, transcript
from agent_envs.core.observation import Observation, Shown, split
from agent_envs.core.prompts import PROFILE, few_shot_turns, fill, load_prompt, profile_prompt, sha256
from agent_envs.core.spec import EnvSpec, Rules, Tool, fill_tools
from agent_envs.core.steps import StepContext, StepScore, StepScorer
from agent_envs.core.tasks import episode_key
from agent_envs.core.tokens import PromptTally, TokenCounter
from agent_envs.core.trajectory import TokenTrajectory, first_drift
from agent_envs.core.types import (
    CONTEXT_LENGTH_EXCEEDED,
    INVALID_OUTPUT,
    MACHINE_FAULTS,
    Completion,
    GenerationRequest,
    InfrastructureError,
    error_text,
)
from agent_envs.envs.args import EnvArgs, EnvOptions, ResetOptions
from agent_envs.envs.spaces import Chat, CompletionText, Conversation
from agent_envs.protocol import messages as msgs
from agent_envs.protocol import native
from agent_envs.protocol.blocklist import is_blocked
from agent_envs.protocol.budget import context_detail, exceeds_context
from agent_envs.protocol.decision import Decision, decide_turn, with_tools
from agent_envs.protocol.messages import STOP
from agent_envs.protocol.nesting import bounded_copy
from agent_envs.protocol.seeds import DEFAULT_BASE_SEED, TURN_STRIDE, trajectory_seed
from agent_envs.sandbox.base import SandboxConfig
from agent_envs.sandbox.factory import backends_with, missing_capabilities, resolve_config
from agent_envs.scoring.process import process_fields
from agent_envs.scoring.result import ScoreResult


@dataclass
class EpisodeState:
    """Mutable state of the running trajectory (reset on every ``reset``)."""

    task: Any
    row_index: int
    sample_index: int
    base_seed: int
    seed_base: int
    messages: list[dict[str, Any]]
    #: prompt-token count of ``messages``, kept up to date message by message
    tally: PromptTally
    turn: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)
    generated_tokens: int = 0
    trajectory_tokens: int = 0
    #: the last trajectory count tried against the cap (above ``trajectory_tokens`` only when an
    #: observation crossed the cap and was not counted)
    attempted_trajectory_tokens: int = 0
    max_context_tokens: int = 0
    last_completion: str = ""
    termination_reason: str | None = None
    react_error: str | None = None
    #: what a ``context_length_exceeded`` says beside ``react_error``: the numbers that did not fit
    react_error_detail: str | None = None
    #: set at ``reset`` when the first prompt cannot fit the context window (that detail): the first
    #: ``step`` ends the episode whatever it is given, before any generation counts
    overflow: str | None = None
    tool_calls: int = 0
    #: what records keep of the images in the first user message (docs/protocol.md#image-observations)
    prompt_images: list[dict[str, Any]] = field(default_factory=list)
    #: per-turn facts for reports (seed, tokens, finish reason, decision); ``turn_tool_s`` the
    #: matching sandbox wall times, kept apart because timings differ between identical runs
    turn_log: list[dict[str, Any]] = field(default_factory=list)
    turn_tool_s: list[float] = field(default_factory=list)
    #: message count after each ``steps`` entry (its conversation so far), and its step score
    step_ends: list[int] = field(default_factory=list)
    step_scores: list[StepScore] = field(default_factory=list)
    #: what this ``step`` call adds to ``info`` (the step's score)
    step_info: dict[str, Any] = field(default_factory=dict)
    #: the conversation as token ids, with ``token_trajectories=True`` (docs/rl.md#token-trajectories)
    trajectory: TokenTrajectory | None = None

    @property
    def used_bash(self) -> bool:
        """Whether a tool has run this episode (gates the final answer and the score)."""
        return self.tool_calls > 0

    @property
    def turn_seed(self) -> int:
        """Sampling seed of the next generation (docs/protocol.md#sampling-and-seeds)."""
        return self.seed_base + TURN_STRIDE * self.turn


class ReActEnv(gym.Env[Chat, str], abc.ABC):
    """Text-in, text-out ReAct environment: observations are the chat, actions are completions."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    #: the environment's protocol as data (set by each subclass)
    env_spec: EnvSpec
    #: the environment's own arguments (each subclass sets its model)
    Options: type[EnvOptions] = EnvOptions

    @property
    def env_id(self) -> str:
        return self.env_spec.id

    def __init__(
        self,
        *,
        dataset: Any = "builtin",
        tasks: Sequence[Any] | None = None,
        max_turns: int | None = None,
        max_tokens_per_turn: int | None = None,
        max_trajectory_tokens: int | None | str = "default",
        max_model_len: int | None = None,
        tokenizer: Any = None,
        processor: Any = None,
        enable_thinking: bool = False,
        sandbox: Any = "bwrap",
        system_prompt: str | None = None,
        prompt_file: str | None = None,
        prompts: str | Path | None = None,
        skill: str | None = None,
        few_shot: str | Path | list[Any] | None = None,
        compat: str = "es",
        render_mode: str | None = None,
        dataset_kwargs: dict[str, Any] | None = None,
        step_scorer: StepScorer | None = None,
        token_trajectories: bool = False,
        **options: Any,
    ):
        self.options = self.Options.checked(f"{self.env_spec.id} argument", options)
        self.env_spec = es = self._spec_for(self.options)
        args = EnvArgs.checked(
            f"{self.env_id} argument",
            {
                "max_turns": es.max_turns if max_turns is None else max_turns,
                "max_tokens_per_turn": es.max_tokens_per_turn if max_tokens_per_turn is None else max_tokens_per_turn,
                "max_trajectory_tokens": es.max_trajectory_tokens
                if max_trajectory_tokens == "default"
                else max_trajectory_tokens,
                "max_model_len": max_model_len,
                "enable_thinking": enable_thinking,
                "compat": compat,
                "render_mode": render_mode,
                "processor": processor,
                "token_trajectories": token_trajectories,
            },
        )
        self.render_mode = render_mode
        if step_scorer is not None and not isinstance(step_scorer, StepScorer):
            raise TypeError(f"step_scorer must be a StepScorer, got {type(step_scorer).__name__}")
        #: scores each step as it happens (docs/protocol.md#process-rewards); the runner batches instead
        self.step_scorer = step_scorer
        self.max_turns = args.max_turns
        self.max_tokens_per_turn = args.max_tokens_per_turn
        self.max_trajectory_tokens = args.max_trajectory_tokens or None
        #: observation and warning tokens join ``trajectory_tokens`` where the protocol has a trajectory
        #: cap (DocVQA), also when it is lifted (0 or None, as the reference's ``max_total_tokens=0``)
        self.counts_observations = es.max_trajectory_tokens is not None or self.max_trajectory_tokens is not None
        self.max_model_len = args.max_model_len
        self.compat = compat
        self.sandbox_config: SandboxConfig = resolve_config(sandbox)
        self._check_sandbox()
        self.rules: Rules = with_tools(es.rules[compat], es.tools)
        #: tool schemas the chat template shows the model (native tool calls only)
        self.tool_schemas = [dict(t) for t in self.rules.tool_schemas] or None
        self.counter = TokenCounter(
            tokenizer, enable_thinking=enable_thinking, processor=processor, tools=self.tool_schemas
        )
        #: keep each episode as the token ids the engine sees and samples (records grow by them);
        #: ``reset`` refuses it without a tokenizer
        self.token_trajectories = args.token_trajectories
        #: the prompt profile folder (docs/protocol.md#prompt-profiles), or None for the shipped prompts
        self.prompts = None if prompts is None else str(prompts)
        self.system_prompt = self._system_prompt(system_prompt, prompt_file, skill)
        self.user_template = load_prompt(es.user_prompt, es.prompt_dir)
        #: worked examples sent as earlier chat turns, before the task (docs/protocol.md#few-shot-turns)
        self.few_shot = () if few_shot is None else few_shot_turns(few_shot)
        self._dataset_spec = dataset if tasks is None else list(tasks)
        self._dataset_kwargs = dict(dataset_kwargs or {})
        self._tasks: list[Any] | None = None
        self._tools: dict[str, Tool] = {}
        self._ep: EpisodeState | None = None
        #: set by ``close`` until the next ``reset``: no tool starts meanwhile (a runner closing its
        #: environments on Ctrl-C must not see a step start a sandbox after that)
        self._closed = False
        # a reply and its observation; under native calls a tool message per call run and one for
        # all the calls past the cap (docs/protocol.md#native-tool-calls)
        parser = self.rules.parser
        per_turn = 1 + (parser.max_calls + 1 if parser.native_tool_calls else 1)
        self.observation_space = Conversation(max_messages=self._prompt_len + per_turn * self.max_turns)
        self.action_space = CompletionText()

    # ----- subclass hooks -------------------------------------------------------------------------
    @abc.abstractmethod
    def _score(self, ep: EpisodeState) -> ScoreResult:
        """The episode's score; its :meth:`~ScoreResult.record_fields` go into the final record."""

    def _spec_for(self, options: Any) -> EnvSpec:
        """The spec these options select (default: the class's own)."""
        return self.env_spec

    def _load_tasks(self, spec: Any, **kwargs: Any) -> list[Any]:
        """Load the configured dataset (called lazily, once)."""
        if self.env_spec.load_tasks is None:
            raise ValueError(f"{self.env_id} has no dataset loader; pass tasks=[...]")
        return self.env_spec.load_tasks(spec, **kwargs)

    def _coerce_task(self, payload: Any) -> Any:
        """Validate a task payload given through ``reset(options={"task": ...})``."""
        model = self.env_spec.task_model
        if model is None or isinstance(payload, model):
            return payload
        return model.model_validate(payload)

    def _sandbox_config_for(self, task: Any) -> SandboxConfig:
        mounts = self.env_spec.mounts(task)
        if not mounts:
            return self.sandbox_config
        return self.sandbox_config.model_copy(update={"mounts": [*self.sandbox_config.mounts, *mounts]})

    def _prompt_images(self, task: Any) -> tuple[Shown, ...]:
        """Images that follow the task text in the first user message (none by default)."""
        return ()

    def _screen(self, tool: str, tool_input: Any, runner: Any) -> str | None:
        """Observation body refusing ``tool_input`` without running it, or None to run it."""
        text = self.env_spec.tool(tool).blocked
        return text if text is not None and isinstance(tool_input, str) and is_blocked(tool_input) else None

    # ----- Gymnasium API --------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Chat, dict[str, Any]]:
        super().reset(seed=seed)
        self._close_sandbox()
        self._closed = False
        opts = ResetOptions.checked("reset options", dict(options or {}))
        if "task" in opts.model_fields_set:
            task = self._coerce_task(opts.task)
            row_index = opts.row_index or 0
        else:
            tasks = self.tasks
            if opts.row_index is not None:
                row_index = opts.row_index
                if row_index >= len(tasks):
                    raise IndexError(f"row_index {row_index} out of range for {len(tasks)} tasks")
            else:
                row_index = int(self.np_random.integers(len(tasks)))
            task = tasks[row_index]
        sample_index = opts.sample_index
        base_seed = opts.base_seed if opts.base_seed is not None else (seed if seed is not None else DEFAULT_BASE_SEED)
        self._check_task(task)
        user = self._user_message(task)
        images = self._prompt_images(task)
        messages: Chat = [
            {"role": "system", "content": self.system_prompt},
            *(dict(m) for m in self.few_shot),
            {"role": "user", "content": [text_part(user), *(i.part for i in images)] if images else user},
        ]
        self._ep = EpisodeState(
            task=task,
            row_index=row_index,
            sample_index=sample_index,
            base_seed=base_seed,
            seed_base=trajectory_seed(base_seed, row_index, sample_index) if opts.seed_base is None else opts.seed_base,
            messages=messages,
            tally=PromptTally(self.counter, messages),
            prompt_images=[i.facts for i in images],
            trajectory=TokenTrajectory.start(self.counter, messages) if self.token_trajectories else None,
        )
        self._ep.overflow = self._overflow()
        info = self._info()
        if self._ep.overflow is not None:  # a driver ends it without asking its policy (the reference's order)
            info["context_overflow"] = self._ep.overflow
        return _copy_chat(messages), info

    def step(self, action: str | Completion | dict[str, Any]) -> tuple[Chat, float, bool, bool, dict[str, Any]]:
        ep = self._require_running()
        completion = _as_completion(action)
        try:
            return self._step(ep, completion)
        except MACHINE_FAULTS:
            raise
        except Exception as exc:  # docs/reliability.md#model-text: the text's outcome, not the machine's
            return self._finish(INVALID_OUTPUT, error_text(exc), scored=False)

    def _step(self, ep: EpisodeState, completion: Completion) -> tuple[Chat, float, bool, bool, dict[str, Any]]:
        ep.step_info = {}
        if ep.overflow is not None:  # the environment's outcome, whatever the policy made of the prompt
            return self._finish(CONTEXT_LENGTH_EXCEEDED, CONTEXT_LENGTH_EXCEEDED, detail=ep.overflow)
        if completion.error == CONTEXT_LENGTH_EXCEEDED:
            return self._finish(CONTEXT_LENGTH_EXCEEDED, CONTEXT_LENGTH_EXCEEDED, detail=completion.error_message)
        if completion.error is not None:  # the failed turn's prompt counts (docs/protocol.md#records)
            prompt_tokens = completion.prompt_tokens
            ep.max_context_tokens = max(
                ep.max_context_tokens, ep.tally.prompt_tokens() if prompt_tokens is None else prompt_tokens
            )
            return self._finish("request_error", completion.error_message or completion.error)
        text = completion.text
        turn_info: dict[str, Any] = {
            "turn": ep.turn + 1,
            "seed": ep.turn_seed,
            "finish_reason": completion.finish_reason,
        }
        ep.turn_log.append(turn_info)
        ep.turn_tool_s.append(0.0)
        ep.turn += 1
        n = completion.num_tokens
        if n is None:
            n = self.counter.text_tokens(text)
        prompt_tokens = completion.prompt_tokens
        if prompt_tokens is None:
            prompt_tokens = ep.tally.prompt_tokens()
        ep.max_context_tokens = max(ep.max_context_tokens, prompt_tokens + n)
        turn_info.update(tokens=n, prompt_tokens=prompt_tokens)
        ep.generated_tokens += n
        ep.trajectory_tokens += n
        ep.attempted_trajectory_tokens = ep.trajectory_tokens
        ep.last_completion = text
        reply: dict[str, Any] = {"role": "assistant", "content": text}
        if completion.tool_calls and self.rules.parser.native_tool_calls:  # a server's calls, as it sent them
            # up to the cap: each call the chat keeps has its tool message (docs/protocol.md#native-tool-calls)
            reply["tool_calls"] = [dict(c) for c in completion.tool_calls[: self.rules.parser.max_calls]]
        ep.messages.append(reply)
        if ep.trajectory is not None:
            ep.trajectory.add_completion(completion)
        cap = self.max_trajectory_tokens
        if cap is not None and ep.trajectory_tokens >= cap:
            return self._finish("max_response_tokens_exceeded", "max_response_tokens_exceeded")

        decisions = decide_turn(text, used_bash=ep.used_bash, flavour=self.rules, tool_calls=completion.tool_calls)
        turn_info["decision"] = ",".join(d.act_kind or d.kind for d in decisions)
        if decisions[0].kind == "final":
            return self._finish("final_answer", None)
        new_messages = [self._act(ep, text, d) for d in decisions]
        if ep.trajectory is not None:
            ep.trajectory.add_observations(ep.messages[: self._prompt_len], new_messages)
        if self.step_scorer is not None:
            scores = self.step_scorer.score_sync(self.step_contexts(len(ep.step_scores)))
            ep.step_scores += scores
            ep.step_info = {"step_score": scores[-1].score, "step_score_error": scores[-1].error}
        if self.counts_observations:
            attempted = ep.trajectory_tokens + sum(self.counter.message_tokens(m) for m in new_messages)
            ep.attempted_trajectory_tokens = attempted
            if cap is not None and attempted >= cap:
                return self._finish("max_response_tokens_exceeded", "max_response_tokens_exceeded")
            ep.trajectory_tokens = attempted
        if ep.turn >= self.max_turns:
            return self._finish("max_turns", "max_react_turns_exceeded")
        overflow = self._overflow()
        if overflow is not None:
            return self._finish(CONTEXT_LENGTH_EXCEEDED, CONTEXT_LENGTH_EXCEEDED, detail=overflow)
        return _copy_chat(ep.messages), 0.0, False, False, self._info()

    def end_episode(self, reason: str, react_error: str) -> tuple[Chat, float, bool, bool, dict[str, Any]]:
        """End the running episode from outside, scored like ``max_turns``: what a wrapper that cut
        it calls (Gymnasium's ``TimeLimit`` through :class:`~agent_envs.envs.time_limit.RecordTruncation`),
        so that the cut episode still gets its record and a reason of its own."""
        self._require_running()
        return self._finish(reason, react_error)

    def generation_request(self) -> GenerationRequest:
        """What to generate next: the chat, the turn's seed, the token budget and the stop string;
        with token trajectories also the exact prompt ids and a request for log-probabilities."""
        ep = self._require_running()
        trajectory = ep.trajectory if ep.trajectory is not None and ep.trajectory.active else None
        extra: dict[str, Any] = {} if trajectory is None else {"prompt_token_ids": list(trajectory.ids)}
        if ep.trajectory is not None:
            extra["logprobs"] = True
        if self.tool_schemas is not None:
            extra["tools"] = [dict(t) for t in self.tool_schemas]
        return GenerationRequest(
            messages=_copy_chat(ep.messages),
            seed=ep.turn_seed,
            max_tokens=self.max_tokens_per_turn if self.max_tokens_per_turn > 0 else None,
            stop=list(STOP),
            key=self._key(ep),
            row_index=ep.row_index,
            sample_index=ep.sample_index,
            **extra,
        )

    def step_contexts(self, start: int = 0) -> list[StepContext]:
        """What a step scorer sees for ``react_steps[start:]`` of the current episode (also after it ended)."""
        ep = self._ep
        if ep is None:
            raise RuntimeError("call reset() before step_contexts()")
        task = ep.task.model_dump(mode="json")
        images = tuple(self.env_spec.step_images(ep.task))
        return [
            StepContext(
                env_id=self.env_id,
                key=self._key(ep),
                turn=step["turn"],
                question=text_of(ep.messages[self._prompt_len - 1]["content"]),
                task=task,
                messages=_copy_chat(ep.messages[:end]),
                assistant=step["assistant"],
                action=step.get("action"),
                observation=step["observation"],
                images=images,
            )
            for step, end in zip(ep.steps[start:], ep.step_ends[start:])
        ]

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self._ep is None:
            return None
        return transcript(self._ep.messages, image_marker="\n[image]")

    def close(self) -> None:
        self._closed = True
        self._close_sandbox()
        super().close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled and copied (subprocess vector envs, Ray) whole, except a running episode's tools:
        their processes and sandbox files cannot be copied, so that is refused with a reason."""
        if self._tools:
            raise TypeError(
                f"{self.env_id}: cannot pickle or copy the environment while its episode's tools are running "
                f"({', '.join(self._tools)}); do it before the first tool call of an episode or after it ends"
            )
        return self.__dict__.copy()

    # ----- properties -----------------------------------------------------------------------------
    @property
    def tasks(self) -> list[Any]:
        if self._tasks is None:
            spec = self._dataset_spec
            self._tasks = list(self._load_tasks(spec, **self._dataset_kwargs))  # lists of rows too
            if not self._tasks:
                raise ValueError(f"dataset {spec!r} has no tasks")
        return self._tasks

    @property
    def config_hash(self) -> str:
        """Stable hash of everything that changes the protocol outcome (not the dataset)."""
        cfg = {
            "env_id": self.env_id,
            "max_turns": self.max_turns,
            "max_tokens_per_turn": self.max_tokens_per_turn,
            "max_trajectory_tokens": self.max_trajectory_tokens,
            "max_model_len": self.max_model_len,
            "sandbox": self.sandbox_config.model_dump(mode="json", exclude={"mounts"}),
            "system_prompt_sha256": sha256(self.system_prompt),
            "user_template_sha256": sha256(self.user_template),
            **({"prompt_profile": PROFILE} if self.prompts is not None else {}),
            **({"few_shot_sha256": sha256(json.dumps(self.few_shot))} if self.few_shot else {}),
            "compat": self.compat,
            # the engine sees the token history instead of the re-rendered chat (docs/rl.md#token-trajectories)
            **({"token_trajectories": True} if self.token_trajectories else {}),
            **self.options.model_dump(mode="json"),
        }
        return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def env_settings(self) -> dict[str, Any]:
        """The environment's own options that change outcomes (e.g. Math's ``scorer``): what a run
        records so that its card can say how it was scored."""
        own = self.options.model_dump(mode="json")
        return own if self.prompts is None else {**own, "prompt_profile": PROFILE}

    # ----- internals ------------------------------------------------------------------------------
    @property
    def _prompt_len(self) -> int:
        """Messages before the model's first reply: the system prompt, the few-shot turns, the task."""
        return 2 + len(self.few_shot)

    def _system_prompt(self, text: str | None, prompt_file: str | None, skill: str | None) -> str:
        if sum(x is not None for x in (text, prompt_file, self.prompts)) > 1:
            raise ValueError("give one of system_prompt, prompt_file and prompts")
        if self.prompts is not None:  # the reference's text, checked (docs/protocol.md#prompt-profiles)
            base = profile_prompt(self.prompts, self.env_spec.system_prompt)
        elif text is not None:
            base = text
        elif prompt_file:  # a template file: its {tools} are this environment's, as for the shipped one
            base = fill_tools(load_prompt(prompt_file), self.env_spec.tools)
        else:
            base = fill_tools(load_prompt(self.env_spec.system_prompt, self.env_spec.prompt_dir), self.env_spec.tools)
        return msgs.with_skill(base, skill or "", self.env_spec.skill_separator)

    def _user_message(self, task: Any) -> str:
        render = self.env_spec.user_message
        return fill(self.user_template, task.question) if render is None else render(self.user_template, task)

    def _check_task(self, task: Any) -> None:
        """Hook for per-task validation before the episode starts (e.g. the image exists)."""

    def _require_running(self) -> EpisodeState:
        if self._closed:
            raise RuntimeError(f"{self.env_id} is closed: call reset() to start a new episode before step()")
        if self._ep is None:
            raise RuntimeError("call reset() before step()")
        if self._ep.termination_reason is not None:
            raise RuntimeError(
                f"episode already ended ({self._ep.termination_reason}); call reset() to start a new one"
            )
        return self._ep

    def _act(self, ep: EpisodeState, text: str, decision: Decision) -> dict[str, Any]:
        """Carry out one decision of this turn (run its tool, if it says so), record it as a react
        step and append its observation message, which is returned."""
        step: dict[str, Any] = {"turn": ep.turn, "assistant": text}
        body, name = decision.observation, decision.observation_name
        assert name is not None  # every decision but a final answer names its observation
        images: tuple[Shown, ...] = ()
        if decision.kind == "act":
            step["action"] = bounded_copy(decision.action)  # the model decides how deep it nests
            if decision.act_kind == "run":
                started = time.perf_counter()
                body, images = split(self._run_tool(name, decision.tool_input))
                ep.turn_tool_s[-1] += time.perf_counter() - started
                ep.tool_calls += 1
        assert body is not None  # a tool's output, or the decision's warning text
        step["observation"] = body
        if images:
            step["images"] = [i.facts for i in images]
        ep.steps.append(step)
        parts = [i.part for i in images]
        if decision.call is not None:
            message = native.tool_message(decision.call, body)
            if parts:
                message["content"] = [text_part(body), *parts]
        else:
            message = msgs.observation_message(name, body, parts)
        ep.messages.append(message)
        ep.step_ends.append(len(ep.messages))
        return message

    def _run_tool(self, name: str, tool_input: Any) -> str | Observation:
        """Run tool ``name`` on ``tool_input`` (the tool is built on first use, one per episode)."""
        ep = self._ep
        assert ep is not None
        if self._closed:  # closed by another thread during this step
            raise InfrastructureError(f"{self.env_id} was closed during the step; the {name} tool was not run")
        tool = self._tools.get(name)
        if tool is None:
            spec = self.env_spec.tool(name)
            tool = spec.build(
                self._sandbox_config_for(ep.task), spec.framing, self.sandbox_config.limits.max_output_chars
            )
            self._tools[name] = tool
        refusal = self._screen(name, tool_input, tool)
        return refusal if refusal is not None else tool.run(tool_input)

    def _check_sandbox(self) -> None:
        """Refuse, when the environment is made, a sandbox backend that lacks what a tool needs."""
        for tool in self.env_spec.tools:
            missing = missing_capabilities(self.sandbox_config, tool.needs)
            if missing:
                usable = ", ".join(f'"{b}"' for b in backends_with(tool.needs))
                raise ValueError(
                    f'{self.env_id}: the {tool.name} tool cannot run on the "{self.sandbox_config.backend}" '
                    f"sandbox backend, which lacks {', '.join(missing)}; use {usable}"
                )

    def _overflow(self) -> str | None:
        """Why the next prompt cannot fit the context window, or None when it fits or the window or
        an exact count is unknown (docs/protocol.md#budgets-and-termination)."""
        ep = self._ep
        assert ep is not None
        if self.max_model_len is None:
            return None
        if ep.trajectory is not None and ep.trajectory.active:  # the ids the next request sends
            prompt_tokens = len(ep.trajectory.ids)
        elif self.counter.exact_for(ep.messages):
            prompt_tokens = ep.tally.prompt_tokens()
        else:
            return None
        if not exceeds_context(prompt_tokens, self.max_tokens_per_turn, self.max_model_len):
            return None
        return context_detail(prompt_tokens, self.max_tokens_per_turn, self.max_model_len)

    def _finish(
        self, reason: str, react_error: str | None, scored: bool = True, detail: str | None = None
    ) -> tuple[Chat, float, bool, bool, dict[str, Any]]:
        """End the episode; ``scored=False`` (text that could not be handled) skips the scorer: 0;
        ``detail``: what the record says beside ``react_error``."""
        ep = self._ep
        assert ep is not None
        ep.termination_reason = reason
        ep.react_error = react_error
        ep.react_error_detail = detail
        self._close_sandbox()
        result = self._score(ep) if scored else _UNHANDLED
        record = self._record(ep, result)
        info = self._info()
        info.update(result.record_fields())
        info["record"] = record  # not "episode": Gymnasium's RecordEpisodeStatistics writes that key
        reward = float(record["score"])
        terminated = reason == "final_answer"
        return _copy_chat(ep.messages), reward, terminated, not terminated, info

    def _record(self, ep: EpisodeState, result: ScoreResult) -> dict[str, Any]:
        task = ep.task
        record: dict[str, Any] = {
            "key": self._key(ep),
            "task_id": task.id,
            "row_index": ep.row_index,
            "sample_index": ep.sample_index,
            "seed": ep.seed_base,
            "base_seed": ep.base_seed,
            "task": task.model_dump(mode="json"),
            "response": ep.last_completion,
            "completion": ep.last_completion,
            "mode": "paper_react_cli",
            "used_bash": ep.used_bash,
            "termination_reason": ep.termination_reason,
            "react_error": ep.react_error,
            "react_error_detail": ep.react_error_detail,
            "context_trims": 0,
            "max_context_tokens": ep.max_context_tokens,
            "generated_tokens": ep.generated_tokens,
            "trajectory_tokens": ep.trajectory_tokens,
            "attempted_trajectory_tokens": ep.attempted_trajectory_tokens,
            "react_steps": _record_steps(ep.steps),
            "trace_rounds": len(ep.steps),
            "turns": ep.turn,
            "tool_calls": ep.tool_calls,
            "turn_log": [dict(t) for t in ep.turn_log],
            "turn_tool_s": list(ep.turn_tool_s),
            "tool_seconds": sum(ep.turn_tool_s),
            "token_counts_exact": self.counter.exact_for(ep.messages),
            "env_id": self.env_id,
            "env_config_hash": self.config_hash,
        }
        if ep.prompt_images:
            record["prompt_images"] = bounded_copy(ep.prompt_images)
        if ep.trajectory is not None:
            record["token_trajectory"] = self._trajectory_record(ep)
        record.update(self.env_spec.task_fields(task))
        record.update(result.record_fields())
        if self.step_scorer is not None:
            record.update(process_fields(ep.step_scores, self.step_scorer.aggregation))
        return record

    def _trajectory_record(self, ep: EpisodeState) -> dict[str, Any]:
        """The episode's token trajectory and where a re-rendered chat first departs from it."""
        trajectory = ep.trajectory
        assert trajectory is not None
        drift = None
        if trajectory.active:
            try:
                drift = first_drift(self.counter, ep.messages, trajectory.as_record(None))
            except Exception as exc:  # a template that cannot render the chat: say so, do not fail the episode
                drift = {"position": None, "error": f"{type(exc).__name__}: {exc}"}
        return trajectory.as_record(drift)

    def _info(self) -> dict[str, Any]:
        ep = self._ep
        assert ep is not None
        return {
            "task_id": ep.task.id,
            "row_index": ep.row_index,
            "sample_index": ep.sample_index,
            "turn": ep.turn,
            "seed": ep.turn_seed,
            "seed_base": ep.seed_base,
            "used_bash": ep.used_bash,
            "react_steps": len(ep.steps),
            "generated_tokens": ep.generated_tokens,
            "trajectory_tokens": ep.trajectory_tokens,
            "termination_reason": ep.termination_reason,
            **ep.step_info,
        }

    @staticmethod
    def _key(ep: EpisodeState) -> str:
        return episode_key(ep.task.id, ep.sample_index)

    def _close_sandbox(self) -> None:
        tools, self._tools = self._tools, {}
        for tool in tools.values():
            tool.close()


#: the score of an episode whose text could not be handled (docs/reliability.md#model-text): the
#: scorer does not look at text that already made the environment fail
_UNHANDLED = ScoreResult(
    score=0.0,
    method=INVALID_OUTPUT,
    label=INVALID_OUTPUT,
    status="skipped",
    answer_status="missing_final_answer",
    prediction="",
)


def _copy_chat(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy the caller may change freely (image part lists are copied too)."""
    return [copy_message(m) for m in messages]


def _copy_step(step: dict[str, Any]) -> dict[str, Any]:
    """A step the record owns: its action and image facts copied, its strings shared."""
    copied = dict(step)
    for key in ("action", "images"):
        if key in step:
            copied[key] = bounded_copy(step[key])
    return copied


def _record_steps(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The record's copy of ``steps``, a turn's text kept on its first step only (the steps of one
    turn share it): a record grows with what the model wrote, not with its calls times that."""
    out = []
    for i, step in enumerate(steps):
        copied = _copy_step(step)
        if i and steps[i - 1]["turn"] == step["turn"]:
            del copied["assistant"]
        out.append(copied)
    return out


def _as_completion(action: Any) -> Completion:
    if isinstance(action, Completion):
        return action
    if isinstance(action, str):
        return Completion(text=action)
    if isinstance(action, dict):
        return Completion(**action)
    raise TypeError(f"step() takes the completion text (str) or a Completion, got {type(action).__name__}")
