"""A whole ES population on one engine at once: member i generates through its own low-rank LoRA
adapter (docs/protocol.md#low-rank-es), so all P x B episodes of a generation are in flight together
and the engine batches them (vLLM's multi-LoRA batching).

The first generation writes the members' adapters to a fresh folder (``/dev/shm`` when there is
one; members drawn in parallel) and registers them with the policy (a vLLM policy loads them into the
engine there and then, not in the middle of the rollouts); every member's case batch runs in its own thread through an
:class:`~agent_envs.policy.adapter.AdapterPolicy` view, the folder is removed, and the update runs in
place inside the workers from the seeds.  With a backend that can ``refresh`` (a vLLM engine) the
adapters stay registered under stable names and every later generation rewrites them in place
inside the workers (:mod:`agent_envs.es.lora_slots`: no files, no loading; the workers draw them
while the generation before runs its rollouts, when the backend can ``prefetch``); they are
unregistered when the run ends or fails.  Where the engine cannot, the reason is logged once and every generation
writes, registers and unregisters its own adapters (as with a backend without ``refresh``).
The base weights never change while members are evaluated, so there is nothing to revert and a
replay (the updates alone) rebuilds the trained weights bit for bit.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, closing, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from . import call_path
from .history import Record
from .lowrank import Target, adapter_root, in_parallel, write_adapter
from .population import ESTrainer, MemberResult
from .update_rule import member_sign

#: ``evaluate(tasks, member_seed, generation, member, adapter=name)``
AdapterEvaluate = Callable[..., MemberResult]


def adapter_name(generation: int, member: int) -> str:
    """Unique per run: vLLM compares adapters by name, so a name must never carry two weights."""
    return f"es-g{generation}-m{member}"


def resident_name(member: int) -> str:
    """A resident adapter's name for the whole run (its weights are rewritten in place)."""
    return f"es-m{member}"


#: a worker's refresh answer, timed (``es_lowrank_refresh``): members whose adapters were drawn
#: ahead, the wait for them, the writes into the CPU adapters, the copy into the GPU slots
REFRESH_PARTS = ("prefetched", "wait_s", "write_s", "slots_s")
#: whether a refresh that wrote the CPU adapters itself wrote them a block per module (agent_envs.es.adapter_blocks)
WRITE_PARTS = ("write_blocks",)
#: the slot copy's stages, where the engine reports them (stacking on the host, issuing the copies)
SLOT_STAGES = ("slots_stack_s", "slots_queue_s")
#: a refresh written ahead during the rollouts (agent_envs.es.refresh_ahead): that work's seconds (waiting
#: for the draws, writing the CPU adapters, gathering them for the slots) and whether the CPU adapters were
#: written a block per module, else why it was not written ahead, where asked
AHEAD_PARTS = ("ahead_wait_s", "ahead_write_s", "ahead_stack_s", "ahead_blocks", "ahead_error")
#: how a weight change's cached KV was forgotten (``_WorkerCalls.last_forget``): a new cache salt or a
#: prefix cache reset, its seconds, and how often the reset was asked again
FORGET_PARTS = ("cache", "reset_s", "reset_retries")
#: the driver's times of an update (``VLLMLowRank.last_update``): its products and adds issued, the wait
#: for the device, and :data:`FORGET_PARTS`
UPDATE_PARTS = ("stacked_ahead", "issue_s", "device_s", *FORGET_PARTS)
#: an update that rewrote the next generation's adapters beside it: that work's seconds, and when both were done
BESIDE_PARTS = ("meanwhile_s", "joined_s")
#: optional parts of an update's times: the issuing thread's CPU seconds, :data:`BESIDE_PARTS`, whether it
#: ran as a CUDA graph (``update_graph``: "captured", "replayed", else why not), and the driver's whole call
#: (``call_s``: what the generation waits), where the worker shares the driver's clock that call's way to the
#: worker's method, the time in it and the way back (:data:`call_path.SPLIT`; the way back includes forgetting
#: the cached KV, ``reset_s``), the method's wait for the next adapters' writes ahead (``writer_wait_s``), the
#: update's whole wall in the method (``update_wall_s``: what its own parts leave out shows against them), and the
#: updated weights' fingerprint computed in the same call (``fingerprint_s``)
UPDATE_EXTRAS = (
    "issue_cpu_s", *BESIDE_PARTS, "graph", "call_s", *call_path.SPLIT, "writer_wait_s", "update_wall_s", "fingerprint_s"
)  # fmt: skip


def describe_refresh(parts: dict[str, Any]) -> str:
    """The :data:`REFRESH_PARTS` of one refresh (and the :data:`WRITE_PARTS`, :data:`SLOT_STAGES` and
    :data:`AHEAD_PARTS` given), for a log line or a benchmark note."""
    stages = [f"{k.removeprefix('slots_').removesuffix('_s')} {parts[k]:.3f}" for k in SLOT_STAGES if k in parts]
    if "ahead_write_s" in parts:
        ahead = (
            f" and written during the rollouts (waited {parts['ahead_wait_s']:.3f} s for the draws, wrote "
            f"{parts['ahead_write_s']:.3f} s{_in_blocks(parts, 'ahead_blocks')}, stacked "
            f"{parts['ahead_stack_s']:.3f} s)"
        )
    else:
        ahead = f" (not written ahead: {parts['ahead_error']})" if parts.get("ahead_error") else ""
    return (
        ("during the last update: " if parts.get("with_update") else "")
        + f"{parts['prefetched']} drawn ahead{ahead}; waited {parts['wait_s']:.3f} s, "
        + ("" if "ahead_write_s" in parts else f"wrote {parts['write_s']:.3f} s{_in_blocks(parts, 'write_blocks')}, ")
        + f"slots {parts['slots_s']:.3f} s"
        + (f" ({', '.join(stages)})" if stages else "")
        + (f", {_forget(parts)}" if set(FORGET_PARTS) <= set(parts) else "")
    )


def _in_blocks(parts: dict[str, Any], key: str) -> str:
    """The note's words where the write that ``key`` names went a block per module (:mod:`adapter_blocks`)."""
    return " in blocks" if parts.get(key) else ""


def describe_update(parts: dict[str, Any]) -> str:
    """The :data:`UPDATE_PARTS` of one update, for a log line or a benchmark note."""
    beside = (
        f", the next adapters {parts['meanwhile_s']:.3f} s beside it (both done at {parts['joined_s']:.3f} s)"
        if "meanwhile_s" in parts
        else ""
    )
    cpu = f" (CPU {parts['issue_cpu_s']:.3f} s)" if "issue_cpu_s" in parts else ""
    after = f", then the weights' fingerprint {parts['fingerprint_s']:.3f} s" if "fingerprint_s" in parts else ""
    graph = str(parts.get("graph", ""))
    how = f" as one CUDA graph ({graph})" if graph in ("captured", "replayed") else ""
    call = f", the driver's call {parts['call_s']:.3f} s" if "call_s" in parts else ""
    if set(call_path.SPLIT) <= set(parts):
        call += (
            f" (to the worker {parts['to_worker_s']:.3f} s, in it {parts['in_worker_s']:.3f} s, "
            f"back {parts['back_s']:.3f} s)"
        )
    if parts.get("writer_wait_s", 0.0) >= 0.001:  # the writes ahead still running when the update came
        call += f", waited {parts['writer_wait_s']:.3f} s for the adapters written ahead"
    if "update_wall_s" in parts and "in_worker_s" in parts:  # the method's time its named parts do not cover
        named = parts["update_wall_s"] + parts.get("writer_wait_s", 0.0) + parts.get("fingerprint_s", 0.0)
        call += (
            f", the update's wall there {parts['update_wall_s']:.3f} s"
            f" ({parts['in_worker_s'] - named:.3f} s of the method in no named part)"
        )
    return (
        f"issued{how} {parts['issue_s']:.3f} s{cpu}{beside}, device {parts['device_s']:.3f} s{after}, {_forget(parts)}"
        + call
        + ("" if parts["stacked_ahead"] else ", factors not stacked ahead")
        + (f", {graph}" if graph.startswith("eager") else "")  # asked for, not taken: why
    )


def _forget(parts: dict[str, Any]) -> str:
    if parts["cache"] == "salt":
        return f"new prefix cache salt {parts['reset_s']:.3f} s"
    return f"prefix cache reset {parts['reset_s']:.3f} s" + (
        f" ({parts['reset_retries']} retries)" if parts["reset_retries"] else ""
    )


@contextmanager
def member_adapters(
    policy: Any,
    targets: Sequence[Target],
    seeds: Sequence[int],
    sigma: float,
    rank: int,
    generation: int,
    root: str | Path | None = None,
    names_of: Callable[[int], str] | None = None,
    keep: bool = False,
    signs: Sequence[int] | None = None,
) -> Iterator[list[str]]:
    """Write and register one adapter per member (named ``names_of(member)``, default
    :func:`adapter_name`; member i perturbed by ``signs[i] * sigma``, default +1); on exit remove the
    folder and unregister them (with ``keep`` only after an error: the engine holds them loaded, and
    a reload could only fail, never read stale files)."""
    folder = Path(tempfile.mkdtemp(prefix=f"agent-envs-lowrank-g{generation}-", dir=root or adapter_root()))
    names: list[str] = []
    kept = False
    try:
        wanted = [(names_of or (lambda m: adapter_name(generation, m)))(member) for member in range(len(seeds))]
        jobs = list(zip(wanted, seeds, signs or [1] * len(seeds)))
        # closed before the folder is removed: no writer may still be running then
        with closing(
            in_parallel(lambda job: write_adapter(folder / job[0], targets, job[1], job[2] * sigma, rank), jobs)
        ) as written:
            for name, path in zip(wanted, written, strict=True):
                policy.add_adapter(name, path)
                names.append(name)
        yield names
        kept = keep
    finally:
        try:
            for name in [] if kept else names:
                policy.remove_adapter(name)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


class LowRankESTrainer(ESTrainer):
    """:class:`ESTrainer` with the population evaluated at once through adapters.  ``backend`` is a
    :class:`~agent_envs.es.worker.VLLMLowRank` (or anything with ``targets``, ``rank`` and
    ``update(seeds, weights, alpha, sigma)``); ``policy`` has ``add_adapter``/``remove_adapter``."""

    def __init__(
        self,
        config: Any,
        backend: Any,
        policy: Any,
        tasks: Sequence[Any],
        evaluate: AdapterEvaluate,
        history_path: str,
        adapter_dir: str | Path | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, backend, tasks, evaluate, history_path, **kwargs)
        #: the trainer's backend and evaluate, with the low-rank signatures
        self.lowrank: Any = backend
        self.evaluate_through: AdapterEvaluate = evaluate
        self.policy, self.adapter_dir = policy, adapter_dir
        self._timing: dict[str, Any] = {}
        #: the generation whose members are being evaluated or updated
        self._generation = 0
        #: the adapters kept registered across generations and rewritten in place (empty: none yet)
        self.resident: list[str] = []
        #: the next generation's refresh done with the last update: its arguments and its answer
        self._ahead: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        #: why in-place refresh is off (None while it is on): a backend without ``refresh``, or the engine's reason
        self.refresh_off: str | None = (
            None
            if hasattr(backend, "refresh") and hasattr(policy, "lora_id")
            else "the backend or policy cannot rewrite adapters in place"
        )

    def _adapters(self, seeds: Sequence[int], sigma: float, generation: int) -> AbstractContextManager[list[str]]:
        """The members' adapter names: the resident ones rewritten in place (during the last update
        where the backend could, else now), else freshly written ones (kept resident when refresh is on)."""
        signs = [member_sign(m, self.config.mirrored) for m in range(len(seeds))]
        if self.resident and self.refresh_off is None:
            if self._ahead is not None and self._ahead[0] == self._refresh_key(seeds, sigma, signs):
                self._timing.update(adapters="refreshed", refresh=self._ahead[1])
                self._ahead = None
                return nullcontext(self.resident)
            self._ahead = None
            extra = (signs,) if self.config.mirrored else ()  # the reference's call otherwise
            reason = self.lowrank.refresh([self.policy.lora_id(n) for n in self.resident], seeds, sigma, *extra)
            if reason is None:
                self._timing.update(adapters="refreshed", refresh=dict(getattr(self.lowrank, "last_refresh", {})))
                return nullcontext(self.resident)
            self.refresh_off = f"the engine cannot rewrite adapters in place: {reason}"
            self.log(f"[es] low-rank: {self.refresh_off}; writing and loading adapter folders every generation")
            self.release_adapters()
        keep = self.refresh_off is None
        self._timing["adapters"] = "written"
        return member_adapters(
            self.policy,
            self.lowrank.targets,
            seeds,
            sigma,
            self.lowrank.rank,
            generation,
            self.adapter_dir,
            names_of=resident_name if keep else None,
            keep=keep,
            signs=signs,
        )

    def release_adapters(self) -> None:
        """Unregister the resident adapters (when the run ends, fails, or refresh turns off)."""
        names, self.resident = self.resident, []
        for name in names:
            self.policy.remove_adapter(name)

    def evaluate_population(
        self, batch: Sequence[Any], seeds: Sequence[int], sigma: float, generation: int
    ) -> list[MemberResult]:
        self._generation = generation
        start = time.perf_counter()
        try:
            with self._adapters(seeds, sigma, generation) as names:
                if self.refresh_off is None:
                    self.resident = names
                    self._draw_ahead(generation)
                written = time.perf_counter()
                with ThreadPoolExecutor(max_workers=len(seeds), thread_name_prefix="es-member") as pool:
                    futures = [
                        pool.submit(self.evaluate_through, batch, seed, generation, member, adapter=name)
                        for member, (seed, name) in enumerate(zip(seeds, names))
                    ]
                    results = [f.result() for f in futures]
        except BaseException:
            self.release_adapters()
            raise
        self._timing.update(adapters_s=written - start, rollouts_s=time.perf_counter() - written)
        return results

    def _draw_ahead(self, generation: int) -> None:
        """Have the engine draw the next generation's adapters while this generation's rollouts run
        (its seeds and sigma are known now), and where it can, write them into its CPU adapters there
        too (``writes_ahead``), so its refresh only copies them into the GPU slots."""
        if generation + 1 < self.config.generations and hasattr(self.lowrank, "prefetch"):
            ahead = self._next_refresh() if getattr(self.lowrank, "writes_ahead", False) else None
            extra = {"refresh": ahead} if ahead is not None else {}
            self.lowrank.prefetch(self.seeds.peek(), self.sigma(generation + 1), **extra)

    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], sigma: float) -> Any:
        seeds, weights, extra = self.update_arguments(seeds, weights)
        ahead = self._next_refresh()
        if ahead is not None:
            extra["refresh"] = ahead
        answer = self.lowrank.update(seeds, weights, self.config.alpha, sigma, **extra)
        if ahead is not None:
            done = dict(getattr(self.lowrank, "last_refresh", {}))
            self._ahead = (ahead, done) if done.get("ok") else None  # else the next generation refreshes itself
        return answer

    def _next_refresh(self) -> tuple[Any, ...] | None:
        """The next generation's refresh arguments, for a backend that does it with the update (the next
        members' seeds and sigma are pure functions of the run's config, known now), else None."""
        generation = self._generation + 1
        if not (
            self.resident
            and self.refresh_off is None
            and getattr(self.lowrank, "refreshes_with_update", False)
            and generation < self.config.generations
        ):
            return None
        seeds = self.seeds.peek()
        signs = [member_sign(m, self.config.mirrored) for m in range(len(seeds))]
        return self._refresh_key(seeds, self.sigma(generation), signs)

    def _refresh_key(self, seeds: Sequence[int], sigma: float, signs: Sequence[int]) -> tuple[Any, ...]:
        """``refresh``'s arguments for these members (``signs`` only for a mirrored run)."""
        ids = tuple(self.policy.lora_id(n) for n in self.resident)
        return (ids, tuple(int(s) for s in seeds), float(sigma), tuple(signs) if self.config.mirrored else None)

    def step(self, generation: int) -> Record:
        self._timing = {}
        record = super().step(generation)
        refreshed = self._timing.pop("refresh", {})
        if set(REFRESH_PARTS) <= set(refreshed):  # the engine's own times of the refresh
            kept = (*REFRESH_PARTS, *WRITE_PARTS, *SLOT_STAGES, *AHEAD_PARTS, *FORGET_PARTS, "with_update")
            self._timing["refresh"] = {k: refreshed[k] for k in kept if k in refreshed}
        updated = getattr(self.lowrank, "last_update", {})
        if set(UPDATE_PARTS) <= set(updated):
            self._timing["update"] = {k: updated[k] for k in (*UPDATE_PARTS, *UPDATE_EXTRAS) if k in updated}
        self.last_timing.update(self._timing)  # writing or refreshing the adapters, every member's rollouts
        detail = f" ({describe_refresh(self._timing['refresh'])})" if "refresh" in self._timing else ""
        update = f", update {describe_update(self._timing['update'])}" if "update" in self._timing else ""
        self.log(
            f"[es] low-rank adapters {self._timing['adapters']} in {self._timing['adapters_s']:.3f} s{detail}, "
            f"rollouts {self._timing['rollouts_s']:.1f} s{update}"
        )
        return record

    def run(self) -> list[Record]:
        try:
            return super().run()
        finally:
            self.release_adapters()
