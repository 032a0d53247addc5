"""A pool of engines as Ray actors (docs/scaling.md).

Each engine gets its own placement group of one bundle, ``{"GPU": tp, "CPU": c}``: a bundle never
spans nodes, so a tensor-parallel group stays on one node, and Ray sets the actor's
``CUDA_VISIBLE_DEVICES`` to exactly its GPUs.  Work is handed to whichever engine is idle; an
engine that dies is dropped and the job it held goes back to the queue, so every job's result is
collected exactly once.  A job names the function that runs it on the engine by its dotted path
(``"module:function"``), so the pool knows nothing of what its jobs do.  ``broadcast`` runs a call
on every live engine (ES updates).

A bundle of ``{"GPU": 1/k}`` packs k engines on one GPU.  Engines that share a GPU build one after
another (a lock file per GPU on the node, held for the whole engine start): vLLM's memory
profiling measures the free memory while it starts, and engines starting at once on one GPU
disturb each other's measurement.  Engines on different GPUs still start in parallel.  Engines
sharing a GPU run under CUDA MPS when the host offers it (:mod:`agent_envs.scale.mps`).  Once the
first engine on a shared GPU is built, the pool knows what each will take and refuses at once when
they cannot all start (:class:`EnginesDoNotFit`), instead of after every build but the last.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import importlib
import math
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .engines import EngineSpec
from .gpu_memory import BuildMemory, shared_gpu_shortfall
from .mps import MPS, start_mps

Monitor = Callable[[str, dict[str, Any]], None]


class EnginesLost(RuntimeError):
    """No live engine is left to run the remaining work."""


class WeightsDiverged(RuntimeError):
    """Engines that must hold identical weights report different checksums."""


class EnginesDoNotFit(ValueError):
    """The engines sharing a GPU cannot all start there (the first one's build says so)."""


@contextlib.contextmanager
def gpu_start_lock(gpus: Sequence[str], folder: str | None = None) -> Iterator[None]:
    """Hold an exclusive lock per GPU (a file in ``folder``, default the node's temp folder), taken
    in a fixed order, so engines that share a GPU start one at a time."""
    with contextlib.ExitStack() as stack:
        for gpu in sorted(set(gpus)):
            path = Path(folder or tempfile.gettempdir()) / f"agent-envs-engine-start-gpu-{gpu}.lock"
            handle = stack.enter_context(open(path, "a+"))
            fcntl.flock(handle, fcntl.LOCK_EX)
            stack.callback(fcntl.flock, handle, fcntl.LOCK_UN)
        yield


def _function(target: str) -> Callable[..., Any]:
    """The function a ``"module:name"`` string names."""
    module, sep, name = target.partition(":")
    if not sep:
        raise ValueError(f"a job's function must look like 'module:name', got {target!r}")
    return getattr(importlib.import_module(module), name)


class EngineHost:
    """The actor: builds its engine in its own process (one engine per GPU at a time) and runs jobs on it.

    Made in two calls, so that the pool knows which engines share a GPU before any is built: the
    constructor only says where the actor is (:meth:`place`), :meth:`start` builds."""

    def __init__(self, spec: dict[str, Any], index: int, start_lock_dir: str | None = None) -> None:
        import ray

        self.index, self.spec, self.start_lock_dir = index, EngineSpec.model_validate(spec), start_lock_dir
        self.gpus = [str(g) for g in ray.get_gpu_ids()]

    def place(self) -> dict[str, Any]:
        return {"index": self.index, "host": socket.gethostname(), "gpus": self.gpus}

    def start(self) -> dict[str, Any]:
        """Build the engine (holding its GPUs' start locks); what the pool keeps of it, with the GPU's
        memory around the build where the engine shares one GPU and the probe reads it."""
        probe = _function(self.spec.memory_probe) if 0 < self.spec.gpus < 1 and len(self.gpus) == 1 else None
        with gpu_start_lock(self.gpus, self.start_lock_dir):
            before = probe(self.gpus[0], self.start_lock_dir) if probe else None
            started = time.time()
            self.engine = self.spec.build()
            #: wall-clock start and end of the engine's build (engines sharing a GPU never overlap)
            self.build_span = (started, time.time())
            after = probe(self.gpus[0], self.start_lock_dir) if probe else None
        share = self.engine.gpu_memory_share
        memory = (
            dataclasses.asdict(BuildMemory(before.total, before.free, after.free, share))
            if before and after and share is not None
            else None
        )
        return {
            **self.place(),
            "pid": os.getpid(),
            "tp_size": self.engine.tp_size,
            "build_span": self.build_span,
            "start_s": round(self.build_span[1] - self.build_span[0], 3),
            "memory": memory,
        }

    def es_init(self, scope: str, exact_revert: bool, revert_copy: str = "auto") -> dict[str, Any]:
        self.engine.es_init(scope, exact_revert, revert_copy)
        status = self.engine.es.status()
        copies = {str(s.get("revert_copy", "none")) for s in (status if isinstance(status, list) else [status])}
        return {"fingerprint": self.engine.fingerprint(), "revert_copy": "/".join(sorted(copies))}

    def es_update(
        self, seeds: Sequence[int], weights: Sequence[float], alpha: float, optimizer: dict[str, Any] | None = None
    ) -> Any:
        return self.engine.update(seeds, weights, alpha, optimizer)

    def fingerprint(self) -> str:
        return self.engine.fingerprint()

    def checksum(self) -> str:
        return self.engine.checksum()

    def call(self, target: str, *args: Any) -> Any:
        """``module:function(engine, *args)`` on this actor: diagnostics and benchmarks that need the
        engine itself (its policy, its weights) without a method of their own here."""
        return _function(target)(self.engine, *args)

    def run(self, function: str, job: Any, engine_index: int) -> Any:
        """``function(engine, job, engine_index)``, ``function`` given as ``"module:name"``."""
        return _function(function)(self.engine, job, engine_index)

    def close(self) -> None:
        self.engine.close()


def _stderr(event: str, fields: dict[str, Any]) -> None:
    if event in ("started", "lost"):
        print(f"[pool] {event}: {fields}", file=sys.stderr, flush=True)


class EnginePool:
    """``engines`` actors built from ``spec``; joins the Ray cluster at ``ray_address`` (or starts a
    local one) unless Ray is already initialised.  ``monitor(event, fields)`` sees every
    ``started`` / ``dispatch`` / ``done`` / ``lost`` event."""

    def __init__(
        self,
        spec: EngineSpec,
        engines: int,
        *,
        ray_address: str | None = None,
        start_timeout_s: float | None = None,
        monitor: Monitor | None = None,
        ray_init: dict[str, Any] | None = None,
        mps: str = "auto",
        start_lock_dir: str | None = None,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if engines < 1:
            raise ValueError(f"an engine pool needs at least one engine, got {engines}")
        self.spec, self.monitor = spec, monitor or _stderr
        #: engines packed on one GPU (1/gpus of a GPU each); they start one after another
        self.engines_per_gpu = math.floor(1 / spec.gpus + 1e-9) if 0 < spec.gpus < 1 else 1
        self.owns_ray = not ray.is_initialized()
        self.actors: list[Any] = []
        self.groups: list[Any] = []
        self.lost: list[int] = []
        #: engines whose build finished (the others are killed, not closed, when the pool closes early)
        self.built: set[int] = set()
        self.mps = MPS(False, "engines do not share GPUs")
        if self.owns_ray:
            ray.init(address=ray_address, include_dashboard=False, **(ray_init or {}))
        try:
            self._check_resources(ray.cluster_resources(), engines)
            if self.engines_per_gpu > 1:
                self.mps = start_mps(mps)
            print(
                f"[pool] {engines} engine(s), {self.engines_per_gpu} per GPU; {self.mps.describe()}",
                file=sys.stderr,
                flush=True,
            )
            bundle = {"CPU": spec.cpus, **({"GPU": spec.gpus} if spec.gpus else {})}
            timeout = (start_timeout_s or (900.0 if spec.gpus > 1 else 600.0)) * self.engines_per_gpu
            self.groups = [placement_group([bundle], strategy="STRICT_PACK") for _ in range(engines)]
            ray.get([g.ready() for g in self.groups], timeout=timeout)
            host = ray.remote(EngineHost)
            extra = {"runtime_env": {"env_vars": self.mps.env}} if self.mps.env else {}
            self.actors = [
                host.options(
                    num_cpus=spec.cpus,
                    num_gpus=spec.gpus,
                    max_restarts=0,
                    **extra,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(g, placement_group_bundle_index=0),
                ).remote(spec.model_dump(), i, start_lock_dir)
                for i, g in enumerate(self.groups)
            ]
            self.info = self._start(timeout)
        except BaseException:
            self.close()
            raise
        self.live = list(range(engines))
        for info in self.info:
            self.monitor("started", info)

    def _start(self, timeout: float) -> list[dict[str, Any]]:
        """Build every engine; as soon as the first engine on a shared GPU is built, refuse
        (:class:`EnginesDoNotFit`) when the engines sharing it cannot all start there."""
        import ray

        places = ray.get([a.place.remote() for a in self.actors], timeout=timeout)
        sharing = collections.Counter((p["host"], tuple(p["gpus"])) for p in places)
        pending = {a.start.remote(): i for i, a in enumerate(self.actors)}
        info: list[dict[str, Any]] = [{} for _ in self.actors]
        checked: set[tuple[str, tuple[str, ...]]] = set()
        deadline = time.monotonic() + timeout
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(deadline - time.monotonic(), 0))
            if not done:
                raise ray.exceptions.GetTimeoutError(f"{len(pending)} engine(s) not built after {timeout:.0f} s")
            index = pending.pop(done[0])
            info[index] = ray.get(done[0])
            self.built.add(index)
            where = (info[index]["host"], tuple(info[index]["gpus"]))
            if where not in checked and sharing[where] > 1 and info[index]["memory"]:
                checked.add(where)
                short = shared_gpu_shortfall(BuildMemory(**info[index]["memory"]), sharing[where])
                if short:
                    raise EnginesDoNotFit(f"GPU {where[1][0]} of {where[0]}: {short}")
        return info

    def _check_resources(self, total: dict[str, float], engines: int) -> None:
        """Refuse at once when the cluster cannot hold the pool (instead of waiting forever)."""
        need = {"CPU": self.spec.cpus * engines, "GPU": self.spec.gpus * engines}
        short = [f"{k}: needs {v:g}, cluster has {total.get(k, 0):g}" for k, v in need.items() if total.get(k, 0) < v]
        if short:
            raise ValueError(
                f"{engines} engine(s) of {self.spec.gpus} GPU(s) and {self.spec.cpus:g} CPU(s) "
                f"do not fit this Ray cluster ({'; '.join(short)})"
            )

    # ------------------------------------------------------------------ work
    def _drop(self, index: int, exc: BaseException) -> None:
        if index in self.live:
            self.live.remove(index)
            self.lost.append(index)
            self.monitor("lost", {"engine": index, "error": f"{type(exc).__name__}: {exc}"[:300]})

    def map(
        self,
        function: str,
        jobs: Sequence[Any],
        on_result: Callable[[int, Any], None] | None = None,
        engines: Sequence[int] | None = None,
    ) -> list[Any]:
        """Run ``function(engine, job, engine_index)`` (``"module:name"``) for every job on whichever
        engine is idle (of ``engines``, default all); results in job order.  A job whose engine dies is queued again; an exception
        raised by the job itself is re-raised here (after the other running jobs finished)."""
        import ray

        queue = collections.deque(range(len(jobs)))
        results: list[Any] = [None] * len(jobs)
        idle = [i for i in self.live if engines is None or i in engines]
        running: dict[Any, tuple[int, int]] = {}
        failure: BaseException | None = None
        while running or (queue and failure is None):
            while queue and idle and failure is None:
                engine, job = idle.pop(0), queue.popleft()
                self.monitor("dispatch", {"engine": engine, "job": job})
                running[self.actors[engine].run.remote(function, jobs[job], engine)] = (engine, job)
            if not running:
                raise EnginesLost(f"every engine of the pool was lost ({self.lost}); {len(queue)} jobs not run")
            [ref], _ = ray.wait(list(running), num_returns=1)
            engine, job = running.pop(ref)
            try:
                results[job] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                self._drop(engine, exc)
                queue.appendleft(job)
                self.monitor("requeue", {"engine": engine, "job": job})
                continue
            except ray.exceptions.RayTaskError as exc:
                failure = failure or exc.as_instanceof_cause()
                idle.append(engine)
                continue
            idle.append(engine)
            self.monitor("done", {"engine": engine, "job": job})
            if on_result is not None:
                on_result(job, results[job])
        if failure is not None:
            raise failure
        return results

    def broadcast(self, method: str, *args: Any) -> dict[int, Any]:
        """``method(*args)`` on every live engine; engines that die meanwhile are dropped."""
        import ray

        refs = {i: getattr(self.actors[i], method).remote(*args) for i in list(self.live)}
        out: dict[int, Any] = {}
        for index, ref in refs.items():
            try:
                out[index] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                self._drop(index, exc)
        if not out:
            raise EnginesLost(f"every engine of the pool was lost ({self.lost})")
        return out

    def call(self, index: int, target: str, *args: Any) -> Any:
        """``module:function(engine, *args)`` on engine ``index``'s actor (:meth:`EngineHost.call`)."""
        import ray

        return ray.get(self.actors[index].call.remote(target, *args))

    @staticmethod
    def agree(checksums: dict[int, str], what: str) -> str:
        """The one checksum every engine reports, or :class:`WeightsDiverged` naming them all."""
        if len(set(checksums.values())) != 1:
            detail = ", ".join(f"engine {i}: {c[:16]}" for i, c in sorted(checksums.items()))
            raise WeightsDiverged(f"engines hold different weights {what} ({detail})")
        return next(iter(checksums.values()))

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Close every engine (quietly for dead ones; one still building is killed, not waited for),
        free the placement groups, and shut Ray down if this pool started it."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for index, actor in enumerate(self.actors):
            if index in self.built and index not in self.lost:
                try:
                    ray.get(actor.close.remote(), timeout=120)
                except Exception as exc:  # an engine that cannot close is killed below anyway
                    print(f"[pool] engine {index} did not close cleanly: {type(exc).__name__}", file=sys.stderr)
            ray.kill(actor)
        for group in self.groups:
            remove_placement_group(group)
        self.actors, self.groups = [], []
        self.mps.stop()
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> "EnginePool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
