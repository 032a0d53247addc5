"""A whole ES population on one engine at once: member i generates through its own low-rank LoRA
adapter (docs/protocol.md#low-rank-es), so all P x B episodes of a generation are in flight together
and the engine batches them (vLLM's multi-LoRA batching).

Per generation: the members' adapters are written to a fresh folder (``/dev/shm`` when there is
one; members drawn in parallel) and registered with the policy (a vLLM policy loads them into the
engine there and then, not in the middle of the rollouts), every member's case batch runs in its own thread through an
:class:`~agent_envs.policy.adapter.AdapterPolicy` view, the adapters are unregistered and their
folder removed, whatever happened, and the update runs in place inside the workers from the seeds.
The base weights never change while members are evaluated, so there is nothing to revert and a
replay (the updates alone) rebuilds the trained weights bit for bit.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from .history import Record
from .lowrank import Target, adapter_root, in_parallel, write_adapter
from .population import ESTrainer, MemberResult

#: ``evaluate(tasks, member_seed, generation, member, adapter=name)``
AdapterEvaluate = Callable[..., MemberResult]


def adapter_name(generation: int, member: int) -> str:
    """Unique per run: vLLM compares adapters by name, so a name must never carry two weights."""
    return f"es-g{generation}-m{member}"


@contextmanager
def member_adapters(
    policy: Any,
    targets: Sequence[Target],
    seeds: Sequence[int],
    sigma: float,
    rank: int,
    generation: int,
    root: str | Path | None = None,
) -> Iterator[list[str]]:
    """Write and register one adapter per member; on exit unregister them and remove the folder."""
    folder = Path(tempfile.mkdtemp(prefix=f"agent-envs-lowrank-g{generation}-", dir=root or adapter_root()))
    names: list[str] = []
    try:
        wanted = [adapter_name(generation, member) for member in range(len(seeds))]
        jobs = list(zip(wanted, seeds))
        # closed before the folder is removed: no writer may still be running then
        with closing(
            in_parallel(lambda job: write_adapter(folder / job[0], targets, job[1], sigma, rank), jobs)
        ) as written:
            for name, path in zip(wanted, written, strict=True):
                policy.add_adapter(name, path)
                names.append(name)
        yield names
    finally:
        try:
            for name in names:
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
        self._timing: dict[str, float] = {}

    def evaluate_population(
        self, batch: Sequence[Any], seeds: Sequence[int], sigma: float, generation: int
    ) -> list[MemberResult]:
        start = time.perf_counter()
        with member_adapters(
            self.policy, self.lowrank.targets, seeds, sigma, self.lowrank.rank, generation, self.adapter_dir
        ) as names:
            written = time.perf_counter()
            with ThreadPoolExecutor(max_workers=len(seeds), thread_name_prefix="es-member") as pool:
                futures = [
                    pool.submit(self.evaluate_through, batch, seed, generation, member, adapter=name)
                    for member, (seed, name) in enumerate(zip(seeds, names))
                ]
                results = [f.result() for f in futures]
        self._timing = {"adapters_s": written - start, "rollouts_s": time.perf_counter() - written}
        return results

    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], sigma: float) -> Any:
        return self.lowrank.update(seeds, weights, self.config.alpha, sigma)

    def step(self, generation: int) -> Record:
        record = super().step(generation)
        self.last_timing.update(self._timing)  # writing the adapters, every member's rollouts
        return record
