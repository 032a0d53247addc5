"""What one pool actor holds: a policy, and for ES the weights that policy runs on.

The pool calls only :class:`Engine`'s methods, so vLLM engines on GPUs and a deterministic CPU
policy in tests are driven by the same code.  An engine is named by an import path plus keyword
arguments (:class:`EngineSpec`) because each Ray actor builds its own in its own process.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from agent_envs.envs import registry
from agent_envs.es.fingerprint import combine_checksums
from agent_envs.es.worker import EXTENSION, VLLMPerturbation
from agent_envs.policy.base import Policy
from agent_envs.policy.factory import BACKENDS, PolicySettings, build_policy
from agent_envs.policy.sampling import SamplingConfig
from agent_envs.policy.vllm import DEFAULT_ROLLOUT_TOKEN_BUDGET, VLLMPolicy


#: vLLM's own default ``gpu_memory_utilization``, made explicit so that the pool knows each engine's ask
VLLM_MEMORY_SHARE = 0.9


class EngineSpec(BaseModel):
    """How to build one engine, and what it needs from the cluster."""

    model_config = ConfigDict(extra="forbid")

    factory: str = Field(description='"module:callable" returning an Engine, called with kwargs')
    kwargs: dict[str, Any] = Field(default_factory=dict)
    #: GPUs of one engine (its tensor-parallel group, always on one node); 0 for CPU engines; a
    #: fraction (1/k) packs k engines on one GPU, started one after another (agent_envs.scale.pool)
    gpus: float = 0
    cpus: float = 1.0
    #: "module:function" ``(gpu id, node folder) -> DeviceMemory | None``: a GPU's free and total memory,
    #: read around each build on a shared GPU (agent_envs.scale.gpu_memory)
    memory_probe: str = "agent_envs.scale.gpu_memory:nvml_memory"

    def build(self) -> "Engine":
        module, sep, name = self.factory.partition(":")
        if not sep:
            raise ValueError(f"engine factory must look like 'module:callable', got {self.factory!r}")
        engine = getattr(importlib.import_module(module), name)(**self.kwargs)
        if not isinstance(engine, Engine):
            raise TypeError(f"{self.factory} returned {type(engine).__name__}, not an Engine")
        return engine


class Engine:
    """A policy; engines with weights set ``es`` (a SeededPerturber-like backend) in ``es_init``."""

    policy: Policy
    tp_size: int = 1
    es: Any = None
    #: the share of its GPU's memory the engine must find free to start (vLLM's gpu_memory_utilization);
    #: None where it asks for none
    gpu_memory_share: float | None = None

    def es_init(self, scope: str = "full", exact_revert: bool = False, revert_copy: str = "auto") -> None:
        raise RuntimeError(f"{type(self).__name__} has no weights to perturb; ES needs a weight-backed engine")

    def _backend(self) -> Any:
        if self.es is None:
            raise RuntimeError("ES is not initialised on this engine; call es_init first")
        return self.es

    def apply(self, seed: int, sigma: float) -> Any:
        return self._backend().apply(seed, sigma)

    def revert(self, seed: int, sigma: float) -> Any:
        return self._backend().revert(seed, sigma)

    def update(
        self, seeds: Sequence[int], weights: Sequence[float], alpha: float, optimizer: dict[str, Any] | None = None
    ) -> Any:
        return self._backend().update(seeds, weights, alpha, optimizer)

    def checksum(self) -> str:
        return combine_checksums(self._backend().checksum())

    def fingerprint(self) -> str:
        return self._backend().fingerprint()

    def close(self) -> None:
        self.policy.close()


class PolicyEngine(Engine):
    """A policy without perturbable weights (evaluation only)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy


def scripted_engine(env_id: str) -> PolicyEngine:
    """The environment's model-free ``scripted`` baseline (one tool call, then an answer)."""
    return PolicyEngine(build_policy("scripted", PolicySettings(script=registry.spec(env_id).baseline)))


class VLLMEngine(Engine):
    """``vllm.LLM`` with the ES worker extension; ES methods are called by name on every worker
    (``collective_rpc``), so they work in-process and with multiprocess / tensor-parallel workers."""

    def __init__(
        self,
        model: str,
        sampling: dict[str, Any] | None = None,
        rollout_token_budget: int = DEFAULT_ROLLOUT_TOKEN_BUDGET,
        **engine_kwargs: Any,
    ) -> None:
        engine_kwargs.setdefault("worker_extension_cls", EXTENSION)
        engine_kwargs.setdefault("gpu_memory_utilization", VLLM_MEMORY_SHARE)
        self.tp_size = int(engine_kwargs.get("tensor_parallel_size", 1))
        self.gpu_memory_share = float(engine_kwargs["gpu_memory_utilization"])
        if self.tp_size > 1:  # one process per rank on this node, not vLLM's own Ray executor
            engine_kwargs.setdefault("distributed_executor_backend", "mp")
        self.policy = build_policy(
            "vllm",
            PolicySettings(
                model=model,
                mode="lockstep",
                sampling=SamplingConfig(**(sampling or {})),
                rollout_token_budget=rollout_token_budget,
                engine_args=engine_kwargs,
            ),
        )

    def es_init(self, scope: str = "full", exact_revert: bool = False, revert_copy: str = "auto") -> None:
        if not isinstance(self.policy, VLLMPolicy):
            raise TypeError(f"ES needs the offline vLLM engine, not {type(self.policy).__name__}")
        self.es = VLLMPerturbation(self.policy, scope=scope, exact_revert=exact_revert, revert_copy=revert_copy)


def vllm_spec(
    model: str,
    engine_kwargs: dict[str, Any],
    sampling: dict[str, Any] | None = None,
    rollout_token_budget: int = DEFAULT_ROLLOUT_TOKEN_BUDGET,
    engines_per_gpu: int = 1,
) -> EngineSpec:
    """A :class:`VLLMEngine` per actor from the same keyword arguments ``vllm.LLM`` takes;
    ``tensor_parallel_size`` GPUs per engine, on one node.  ``engines_per_gpu=k`` packs k single-GPU
    engines on each GPU: each asks Ray for 1/k of a GPU and gets 1/k of ``gpu_memory_utilization``."""
    tp = int(engine_kwargs.get("tensor_parallel_size") or 1)
    k = int(engines_per_gpu)
    if k < 1:
        raise ValueError(f"engines_per_gpu must be >= 1, got {engines_per_gpu!r}")
    kwargs = dict(engine_kwargs)
    if k > 1:
        if tp > 1:
            raise ValueError(f"engines_per_gpu={k} needs single-GPU engines; tensor_parallel_size is {tp}")
        kwargs["gpu_memory_utilization"] = float(kwargs.get("gpu_memory_utilization", VLLM_MEMORY_SHARE)) / k
    return EngineSpec(
        factory=f"{__name__}:VLLMEngine",
        gpus=tp / k,
        kwargs={"model": model, "sampling": sampling, "rollout_token_budget": rollout_token_budget, **kwargs},
    )


def vllm_pool_spec(settings: PolicySettings, env_id: str) -> EngineSpec:
    """The vllm backend's engines in a pool: one offline engine per actor."""
    if settings.model is None:
        raise ValueError("the vllm policy needs a model")
    return vllm_spec(settings.model, dict(settings.engine_args), sampling=settings.sampling.model_dump())


def scripted_pool_spec(settings: PolicySettings, env_id: str) -> EngineSpec:
    """The scripted backend's engines in a pool: the environment's baseline."""
    return EngineSpec(factory=f"{__name__}:scripted_engine", kwargs={"env_id": env_id})


#: ``(settings, env_id) -> EngineSpec`` of each backend row that runs in a pool (``Backend.pooled``),
#: by the row's name: the pool's layer owns this, so the policy rows never name a layer above them
PoolSpec = Callable[[PolicySettings, str], EngineSpec]
POOL_SPECS: dict[str, PoolSpec] = {"vllm": vllm_pool_spec, "scripted": scripted_pool_spec}


def register_pool_spec(kind: str, make: PoolSpec) -> None:
    """How a pool builds the engines of backend ``kind`` (registered with ``pooled=True``)."""
    POOL_SPECS[kind] = make


def pool_spec(kind: str, settings: PolicySettings, env_id: str) -> EngineSpec:
    """The engine spec of backend ``kind`` for a pool; a ValueError naming the backends that run in
    a pool when ``kind``'s row does not, or naming :func:`register_pool_spec` when no spec is
    registered for a row that does."""
    if not BACKENDS[kind].pooled:
        pooled = ", ".join(name for name, row in BACKENDS.items() if row.pooled)
        raise ValueError(f"the {kind} policy does not run in an engine pool (these do: {pooled})")
    make = POOL_SPECS.get(kind)
    if make is None:
        raise ValueError(f"the {kind} row runs in a pool but has no engine spec: register_pool_spec({kind!r}, ...)")
    spec = make(settings, env_id)
    if not isinstance(spec, EngineSpec):
        raise TypeError(f"the {kind} pool spec returned {type(spec).__name__}, not an EngineSpec")
    return spec
