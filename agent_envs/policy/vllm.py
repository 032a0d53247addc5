"""vLLM policies: the offline ``LLM`` for lockstep batches, ``AsyncLLM`` for continuous rollouts.

Prompts are rendered here with the chat template (thinking off) and sent as token ids, so the token
counts the environment budgets with are exactly what the engine sees.  Each request carries its own
seed (``SamplingParams.seed``), which makes a completion independent of its batch neighbours.
"""
from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

from .base import Completion, GenerationRequest
from .batching import BatchedEnginePolicy, EnginePolicy, Prepared
from .sampling import SamplingConfig, token_cap


#: a tensor-parallel start was seen taking 163 s on two H200s; vLLM's own limit is 600 s by default
TP_READY_TIMEOUT_S = "900"


def prepare_engine_env(engine_kwargs: dict[str, Any]) -> None:
    """Tensor parallelism needs vLLM's multiprocess engine (one worker process per rank, ES methods
    called by name); the GPU staging turns it off by default for in-process single-GPU engines."""
    if int(engine_kwargs.get("tensor_parallel_size") or 1) > 1:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        os.environ.setdefault("VLLM_ENGINE_READY_TIMEOUT_S", TP_READY_TIMEOUT_S)


def sampling_params(sampling: SamplingConfig, prepared: Prepared) -> Any:
    from vllm import SamplingParams

    request = prepared.request
    return SamplingParams(
        n=1, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
        min_p=sampling.min_p, presence_penalty=sampling.presence_penalty,
        repetition_penalty=sampling.repetition_penalty, seed=request.seed,
        max_tokens=token_cap(request.max_tokens),
        stop=prepared.stop or None, include_stop_str_in_output=False)


def tokens_prompt(prepared: Prepared) -> Any:
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=prepared.prompt_ids)


def to_completion(output: Any, prepared: Prepared, engine: str) -> Completion:
    """``RequestOutput`` -> :class:`Completion` (first and only sample)."""
    sample = output.outputs[0]
    return Completion(text=sample.text, token_ids=list(sample.token_ids), finish_reason=sample.finish_reason,
                      prompt_tokens=len(prepared.prompt_ids), engine=engine)


def engine_max_model_len(engine: Any) -> int | None:
    """The context window across vLLM versions (``LLM``, ``LLMEngine`` or ``AsyncLLM``)."""
    for path in ("model_config", "llm_engine.model_config", "vllm_config.model_config",
                 "llm_engine.vllm_config.model_config"):
        obj = engine
        for attr in path.split("."):
            obj = getattr(obj, attr, None)
        if obj is not None and getattr(obj, "max_model_len", None):
            return int(obj.max_model_len)
    return None


class VLLMPolicy(BatchedEnginePolicy):
    """Wraps ``vllm.LLM``: built here from ``model`` and ``engine_kwargs`` (passed through untouched:
    ``load_format``, ``tensor_parallel_size``, ``dtype``, ``tokenizer`` (a folder: the engine's
    tokenizer; an object: used as is), ``enable_prefix_caching``,
    ``seed``, ``worker_extension_cls`` ...), or an ``llm`` the caller owns, e.g. an ES trainer that
    perturbs the weights between calls."""

    name = "vllm"

    def __init__(self, model: str | None = None, llm: Any = None, *, tokenizer: Any = None,
                 sampling: SamplingConfig | None = None, rollout_token_budget: int = 131072,
                 max_model_len: int | None = None, **engine_kwargs: Any):
        if (model is None) == (llm is None):
            raise ValueError("VLLMPolicy needs exactly one of model= (to build an engine) or llm= (to wrap one)")
        self._owns_engine = llm is None
        if llm is None:
            import vllm

            if isinstance(tokenizer, (str, os.PathLike)):  # a tokenizer folder (``--engine-arg tokenizer=``)
                engine_kwargs["tokenizer"], tokenizer = str(tokenizer), None
            prepare_engine_env(engine_kwargs)
            llm = vllm.LLM(model=model, **engine_kwargs)
        self.llm = llm
        self.model = model or getattr(getattr(llm, "model_config", None), "model", None)
        super().__init__(tokenizer or llm.get_tokenizer(), sampling,
                         max_model_len or engine_max_model_len(llm), rollout_token_budget)

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "model": self.model, "max_model_len": self.max_model_len,
                "rollout_token_budget": self.rollout_token_budget, "sampling": self.sampling.model_dump()}

    def _generate_group(self, group: list[Prepared]) -> list[Completion]:
        outputs = self.llm.generate([tokens_prompt(p) for p in group],
                                    [sampling_params(self.sampling, p) for p in group], use_tqdm=False)
        return [to_completion(o, p, self.name) for o, p in zip(outputs, group)]

    def close(self) -> None:
        if self._owns_engine and self.llm is not None:
            core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            self.llm = None


class AsyncVLLMPolicy(EnginePolicy):
    """Wraps vLLM's ``AsyncLLM`` for continuous batching: every ``agenerate`` call joins the running
    engine at once and returns when its own sequence finishes.

    An ``AsyncLLM`` belongs to the event loop it first ran in.  Use ``agenerate`` from one loop, or
    the synchronous ``generate`` (which runs its own loop); mixing the two raises a clear error.
    """

    name = "vllm-async"

    def __init__(self, model: str | None = None, engine: Any = None, *, tokenizer: Any = None,
                 sampling: SamplingConfig | None = None, max_model_len: int | None = None, **engine_kwargs: Any):
        if (model is None) == (engine is None):
            raise ValueError("AsyncVLLMPolicy needs exactly one of model= or engine= (an AsyncLLM)")
        self._owns_engine = engine is None
        if engine is None:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **engine_kwargs))
        self.engine = engine
        self.model = model or getattr(getattr(engine, "model_config", None), "model", None)
        if tokenizer is None:
            tokenizer = engine.get_tokenizer() if hasattr(engine, "get_tokenizer") else engine.tokenizer
        super().__init__(tokenizer, sampling, max_model_len or engine_max_model_len(engine))
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "model": self.model, "max_model_len": self.max_model_len,
                "sampling": self.sampling.model_dump()}

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("AsyncVLLMPolicy: the AsyncLLM is bound to another event loop; "
                               "call agenerate from a single loop (or only use generate())")

    async def agenerate(self, request: GenerationRequest) -> Completion:
        self._bind_loop()
        prepared = self.prepare(request)
        if isinstance(prepared, Completion):
            return prepared
        try:
            return await self._stream(prepared)
        except Exception as exc:  # one failing stream must not end the others
            return Completion.failed(exc, prompt_tokens=len(prepared.prompt_ids), engine=self.name)

    async def _stream(self, prepared: Prepared) -> Completion:
        final = None
        async for output in self.engine.generate(tokens_prompt(prepared), sampling_params(self.sampling, prepared),
                                                 request_id=f"agent-envs-{next(self._ids)}"):
            final = output
        if final is None:
            raise RuntimeError("the engine finished the request without an output")
        return to_completion(final, prepared, self.name)

    async def _gather(self, requests: list[GenerationRequest]) -> list[Completion]:
        return list(await asyncio.gather(*(self.agenerate(r) for r in requests)))

    def generate(self, requests) -> list[Completion]:
        """All requests at once on the engine (continuous batching), from synchronous code."""
        if self._own_loop is None:
            self._own_loop = asyncio.new_event_loop()
        return self._own_loop.run_until_complete(self._gather(list(requests)))

    def close(self) -> None:
        if self._owns_engine and self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        if self._own_loop is not None:
            self._own_loop.close()
            self._own_loop = None

