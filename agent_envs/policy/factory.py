"""One table of policy backends: the CLI, ``agent-envs es`` and the engine pools all build
their policies here, so a backend is added as a module in ``policy/`` and one row below.

A row says what the backend needs (a model, an endpoint) and builds it from :class:`PolicySettings`;
the engine-backed modules import their heavy dependencies (torch, vLLM) only when a policy is built.
The row also says what the CLI and the report ask of a backend (is it a real model, which flags it
takes, how the report names it, whether it runs in an engine pool), so they look it up instead of
comparing names, and a backend added with :func:`register` is treated by its row everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from .base import Policy
from .hf import TransformersPolicy, cpu_tuning, default_cpu_policy
from .openai import OpenAIPolicy
from .sampling import SamplingConfig
from .scripted import ScriptedPolicy
from .vllm import AsyncVLLMPolicy, VLLMPolicy


class PolicySettings(BaseModel):
    """Everything a backend may be built from; each uses the fields it needs."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    #: a model folder or id (transformers, vllm) or the served model's name (openai)
    model: str | None = None
    #: OpenAI-compatible API roots (openai)
    base_urls: list[str] = Field(default_factory=list)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    #: passed to ``vllm.LLM`` / ``AsyncLLM`` untouched (vllm)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    #: vllm: "async" is the ``AsyncLLM`` (continuous batching), "lockstep" the offline ``LLM``
    mode: Literal["async", "lockstep"] = "async"
    #: vllm lockstep: prompt + max_tokens per engine call (None: the policy's default)
    rollout_token_budget: int | None = None
    #: openai: samples per task row (routes a row's samples to one endpoint); per-attempt limit, retries
    samples_per_row: int = 1
    timeout_s: float | None = None
    max_retries: int | None = None
    #: openai: the bearer token (None: ``OPENAI_API_KEY`` when set) and the native variants' ``tool_choice``
    api_key: str | None = None
    tool_choice: Literal["none", "auto", "required"] = "none"
    #: scripted: ``request -> completion``, e.g. an environment's baseline
    script: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Backend:
    """One row of the table."""

    build: Callable[[PolicySettings], Policy]
    #: the backend needs ``model``
    needs_model: bool = False
    #: the backend needs at least one of ``base_urls``
    needs_endpoint: bool = False
    description: str = ""
    #: its runs measure a model; False for stand-ins (a toy model, a script): the report then says so
    #: and how to evaluate a real model
    real_model: bool = True
    #: how reports name the policy (None: by the run's model)
    label: str | None = None
    #: what the report tells a first-time reader the policy is ("" : nothing, its model says it)
    words: str = ""
    #: ``eval`` budgets used where the command line gives none (limit, max_turns, max_tokens_per_turn)
    run_defaults: Mapping[str, int] = field(default_factory=dict)
    #: takes the HTTP client's settings (timeout_s, max_retries, api_key, tool_choice)
    http: bool = False
    #: built on the environment's scripted baseline (``PolicySettings.script``)
    scripted_baseline: bool = False
    #: runs in an engine pool (``--engines``); the pool's layer, above this one, maps the row's name
    #: to the engine spec each actor builds (policy knows nothing of pools beyond this flag)
    pooled: bool = False
    #: in a pool, each engine runs its episodes in lockstep (the offline engine)
    pool_lockstep: bool = False
    #: ``model`` may be an exported checkpoint folder whose manifest fixes tensor_parallel_size
    loads_checkpoints: bool = False
    #: picked when no backend is named and this setting is given ("base_urls", "model"), or "default"
    chosen_by: Literal["base_urls", "model", "default"] | None = None


def _scripted(s: PolicySettings) -> Policy:
    if s.script is None:
        raise ValueError("the scripted policy needs a script (an environment's baseline, or a list of replies)")
    return ScriptedPolicy(s.script, sampled=False)  # a baseline's text is no model's sample (docs/rl.md)


def _vllm(s: PolicySettings) -> Policy:
    if s.mode == "async":
        return AsyncVLLMPolicy(s.model, sampling=s.sampling, **s.engine_args)
    budget = {} if s.rollout_token_budget is None else {"rollout_token_budget": s.rollout_token_budget}
    return VLLMPolicy(s.model, sampling=s.sampling, **budget, **s.engine_args)


def _openai(s: PolicySettings) -> Policy:
    http: dict[str, Any] = {
        k: v for k, v in (("timeout_s", s.timeout_s), ("max_retries", s.max_retries)) if v is not None
    }
    assert s.model is not None
    return OpenAIPolicy(
        s.base_urls,
        s.model,
        sampling=s.sampling,
        samples_per_row=s.samples_per_row,
        api_key=s.api_key,
        tool_choice=s.tool_choice,
        **http,
    )


def _transformers(s: PolicySettings) -> Policy:
    assert s.model is not None
    return TransformersPolicy(s.model, sampling=s.sampling, **cpu_tuning())


BACKENDS: dict[str, Backend] = {
    "cpu": Backend(
        lambda s: default_cpu_policy(sampling=s.sampling),
        description="the embedded SmolLM2-135M-Instruct on the CPU",
        real_model=False,
        label="SmolLM2-135M-Instruct (embedded, CPU)",
        words="a 135M-parameter model shipped with the package and run on this CPU, so that nothing needs a "
        "GPU. A model this small seldom follows the tool protocol: expect warnings rather than answers.",
        run_defaults={"limit": 3, "max_turns": 3, "max_tokens_per_turn": 192},
        chosen_by="default",
    ),
    "transformers": Backend(
        _transformers, needs_model=True, description="a Hugging Face model in-process", chosen_by="model"
    ),
    "vllm": Backend(
        _vllm,
        needs_model=True,
        description="a vLLM engine in-process (offline LLM or AsyncLLM)",
        pooled=True,
        pool_lockstep=True,
        loads_checkpoints=True,
    ),
    "openai": Backend(
        _openai,
        needs_model=True,
        needs_endpoint=True,
        description="OpenAI-compatible chat completion servers",
        http=True,
        chosen_by="base_urls",
    ),
    "scripted": Backend(
        _scripted,
        description="scripted replies: an environment's model-free baseline",
        real_model=False,
        label="scripted reference policy (no model)",
        words="a fixed script, not a model. It makes one real tool call and answers from what the tool "
        "printed, to show the tools, the sandbox and the scoring at work; its score is a floor, not a target.",
        scripted_baseline=True,
        pooled=True,
    ),
}
#: the backends' names when this module was imported (:func:`register` adds to ``BACKENDS``)
POLICIES: tuple[str, ...] = tuple(BACKENDS)


def register(name: str, backend: Backend) -> None:
    """Add a backend row (or replace one): ``agent-envs eval --policy NAME``, the pools and the
    report then treat it by this row."""
    BACKENDS[name] = backend


def default_policy(model: str | None, base_urls: Sequence[str]) -> str:
    """The backend used when none is named: the row chosen by an endpoint if one is given, else by
    a model if one is given, else the default row."""
    given = [c for c, on in (("base_urls", bool(base_urls)), ("model", bool(model)), ("default", True)) if on]
    for choice in given:
        for name, backend in BACKENDS.items():
            if backend.chosen_by == choice:
                return name
    raise ValueError("no policy backend is the default")


def build_policy(kind: str, settings: PolicySettings | None = None) -> Policy:
    """The ``kind`` backend built from ``settings``; an unknown kind or a missing requirement is a
    ValueError naming it."""
    backend = BACKENDS.get(kind)
    if backend is None:
        raise ValueError(f"unknown policy {kind!r}; expected one of {', '.join(BACKENDS)}")
    settings = settings or PolicySettings()
    if backend.needs_model and not settings.model:
        raise ValueError(f"the {kind} policy needs a model")
    if backend.needs_endpoint and not settings.base_urls:
        raise ValueError(f"the {kind} policy needs at least one base URL")
    return backend.build(settings)
