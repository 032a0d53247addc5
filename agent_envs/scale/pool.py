"""A pool of engines as Ray actors (docs/scaling.md).

Each engine gets its own placement group of one bundle, ``{"GPU": tp, "CPU": c}``: a bundle never
spans nodes, so a tensor-parallel group stays on one node, and Ray sets the actor's
``CUDA_VISIBLE_DEVICES`` to exactly its GPUs.  Work is handed to whichever engine is idle; an
engine that dies is dropped and the job it held goes back to the queue, so every job's result is
collected exactly once.  A job names the function that runs it on the engine by its dotted path
(``"module:function"``), so the pool knows nothing of what its jobs do.  ``broadcast`` runs a call
on every live engine (ES updates).
"""
from __future__ import annotations

import collections
import importlib
import os
import socket
import sys
from typing import Any, Callable, Sequence

from .engines import EngineSpec

Monitor = Callable[[str, dict[str, Any]], None]


class EnginesLost(RuntimeError):
    """No live engine is left to run the remaining work."""


class WeightsDiverged(RuntimeError):
    """Engines that must hold identical weights report different checksums."""


class EngineHost:
    """The actor: builds its engine in its own process and runs jobs on it."""

    def __init__(self, spec: dict[str, Any], index: int) -> None:
        self.index = index
        self.engine = EngineSpec.model_validate(spec).build()

    def ready(self) -> dict[str, Any]:
        import ray

        return {"index": self.index, "host": socket.gethostname(), "pid": os.getpid(),
                "gpus": [str(g) for g in ray.get_gpu_ids()], "tp_size": self.engine.tp_size}

    def es_init(self, scope: str, exact_revert: bool) -> str:
        self.engine.es_init(scope, exact_revert)
        return self.engine.checksum()

    def es_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float) -> dict[str, Any]:
        return {"update": self.engine.update(seeds, weights, alpha), "checksum": self.engine.checksum()}

    def checksum(self) -> str:
        return self.engine.checksum()

    def run(self, function: str, job: Any, engine_index: int) -> Any:
        """``function(engine, job, engine_index)``, ``function`` given as ``"module:name"``."""
        module, sep, name = function.partition(":")
        if not sep:
            raise ValueError(f"a job's function must look like 'module:name', got {function!r}")
        return getattr(importlib.import_module(module), name)(self.engine, job, engine_index)

    def close(self) -> None:
        self.engine.close()


def _stderr(event: str, fields: dict[str, Any]) -> None:
    if event in ("started", "lost"):
        print(f"[pool] {event}: {fields}", file=sys.stderr, flush=True)


class EnginePool:
    """``engines`` actors built from ``spec``; joins the Ray cluster at ``ray_address`` (or starts a
    local one) unless Ray is already initialised.  ``monitor(event, fields)`` sees every
    ``started`` / ``dispatch`` / ``done`` / ``lost`` event."""

    def __init__(self, spec: EngineSpec, engines: int, *, ray_address: str | None = None,
                 start_timeout_s: float | None = None, monitor: Monitor | None = None,
                 ray_init: dict[str, Any] | None = None) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if engines < 1:
            raise ValueError(f"an engine pool needs at least one engine, got {engines}")
        self.spec, self.monitor = spec, monitor or _stderr
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            ray.init(address=ray_address, include_dashboard=False, **(ray_init or {}))
        self.actors: list[Any] = []
        self.groups: list[Any] = []
        self.lost: list[int] = []
        try:
            self._check_resources(ray.cluster_resources(), engines)
            bundle = {"CPU": spec.cpus, **({"GPU": spec.gpus} if spec.gpus else {})}
            timeout = start_timeout_s or (900.0 if spec.gpus > 1 else 600.0)
            self.groups = [placement_group([bundle], strategy="STRICT_PACK") for _ in range(engines)]
            ray.get([g.ready() for g in self.groups], timeout=timeout)
            host = ray.remote(EngineHost)
            self.actors = [
                host.options(num_cpus=spec.cpus, num_gpus=spec.gpus, max_restarts=0,
                             scheduling_strategy=PlacementGroupSchedulingStrategy(g, placement_group_bundle_index=0))
                .remote(spec.model_dump(), i)
                for i, g in enumerate(self.groups)]
            self.info = ray.get([a.ready.remote() for a in self.actors], timeout=timeout)
        except BaseException:
            self.close()
            raise
        self.live = list(range(engines))
        for info in self.info:
            self.monitor("started", info)

    def _check_resources(self, total: dict[str, float], engines: int) -> None:
        """Refuse at once when the cluster cannot hold the pool (instead of waiting forever)."""
        need = {"CPU": self.spec.cpus * engines, "GPU": self.spec.gpus * engines}
        short = [f"{k}: needs {v:g}, cluster has {total.get(k, 0):g}" for k, v in need.items() if total.get(k, 0) < v]
        if short:
            raise ValueError(f"{engines} engine(s) of {self.spec.gpus} GPU(s) and {self.spec.cpus:g} CPU(s) "
                             f"do not fit this Ray cluster ({'; '.join(short)})")

    # ------------------------------------------------------------------ work
    def _drop(self, index: int, exc: BaseException) -> None:
        if index in self.live:
            self.live.remove(index)
            self.lost.append(index)
            self.monitor("lost", {"engine": index, "error": f"{type(exc).__name__}: {exc}"[:300]})

    def map(self, function: str, jobs: Sequence[Any], on_result: Callable[[int, Any], None] | None = None,
            engines: Sequence[int] | None = None) -> list[Any]:
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

    @staticmethod
    def agree(checksums: dict[int, str], what: str) -> str:
        """The one checksum every engine reports, or :class:`WeightsDiverged` naming them all."""
        if len(set(checksums.values())) != 1:
            detail = ", ".join(f"engine {i}: {c[:16]}" for i, c in sorted(checksums.items()))
            raise WeightsDiverged(f"engines hold different weights {what} ({detail})")
        return next(iter(checksums.values()))

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Close every engine (quietly for dead ones), free the placement groups, and shut Ray
        down if this pool started it."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for index, actor in enumerate(self.actors):
            if index not in self.lost:
                try:
                    ray.get(actor.close.remote(), timeout=120)
                except Exception as exc:  # an engine that cannot close is killed below anyway
                    print(f"[pool] engine {index} did not close cleanly: {type(exc).__name__}", file=sys.stderr)
            ray.kill(actor)
        for group in self.groups:
            remove_placement_group(group)
        self.actors, self.groups = [], []
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> "EnginePool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
