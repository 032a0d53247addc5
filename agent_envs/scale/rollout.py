"""Evaluation over an engine pool: the task rows are cut into chunks handed to idle engines.

Every chunk keeps its rows' indices, so trajectory seeds and record keys are those of a one-engine
run.  Records are written (fsynced) as chunks come back; a chunk whose engine died is run again
elsewhere, and only a finished chunk's records are ever written, so none is lost or doubled.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict

from agent_envs.rollout.records import EpisodeRecord, JsonlWriter, as_row
from agent_envs.rollout.runner import finished_records, make_jobs, run_episodes, strip_timings

from .engines import Engine
from .pool import EnginePool

#: which engine ran an episode: the only field besides timings where runs on N engines differ
PLACEMENT_FIELDS = ("engine_index",)


class RowsJob(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    env_id: str
    tasks: list[Any]
    rows: list[int]
    samples: int = 1
    run_kwargs: dict[str, Any] = {}


def run_rows_on(engine: Engine, job: RowsJob, engine_index: int) -> list[dict[str, Any]]:
    """On the actor: run the chunk's episodes (sandboxes on this node) and return their rows."""
    kwargs = dict(job.run_kwargs)
    kwargs["tags"] = {**kwargs.get("tags", {}), "engine_index": engine_index}
    records = run_episodes(
        job.env_id, job.tasks, engine.policy, samples=job.samples, row_indices=job.rows, progress=False, **kwargs
    )
    return [as_row(r) for r in records]


def comparable(record: EpisodeRecord | dict[str, Any]) -> dict[str, Any]:
    """A record without timings or engine placement: equal for runs on 1 or N engines."""
    row = strip_timings(record)
    for key in PLACEMENT_FIELDS:
        row.pop(key, None)
        if isinstance(row.get("tags"), dict):
            row["tags"] = {k: v for k, v in row["tags"].items() if k != key}
    return row


def pool_run_episodes(
    pool: EnginePool,
    env_id: str,
    tasks: Sequence[Any],
    *,
    samples: int = 1,
    out_path: str | Path | None = None,
    resume: bool = False,
    chunk_rows: int | None = None,
    progress: bool = True,
    **run_kwargs: Any,
) -> list[EpisodeRecord]:
    """:func:`~agent_envs.rollout.run_episodes` over the pool (same arguments, same records)."""
    keys = [j.key for j in make_jobs(tasks, samples)]
    done = finished_records(out_path, resume)
    rows = sorted({j.row_index for j in make_jobs(tasks, samples) if j.key not in done})
    size = chunk_rows or max(1, math.ceil(len(rows) / (4 * len(pool.live))))
    jobs = [
        RowsJob(
            env_id=env_id,
            tasks=[tasks[r] for r in rows[i : i + size]],
            rows=rows[i : i + size],
            samples=samples,
            run_kwargs=run_kwargs,
        )
        for i in range(0, len(rows), size)
    ]
    got: dict[str, EpisodeRecord] = {}
    writer = JsonlWriter(out_path) if out_path is not None else None

    def collect(index: int, chunk: list[dict[str, Any]]) -> None:
        for row in chunk:
            if row["key"] in done:  # a finished sample of a partly finished row, run again
                continue
            record = EpisodeRecord.model_validate(row)
            got[record.key] = record
            if writer is not None:
                writer.write(record)
        if progress:
            print(
                f"[pool] chunk {index + 1}/{len(jobs)}: {len(got)} of {len(keys) - len(done)} episodes done",
                file=sys.stderr,
                flush=True,
            )

    try:
        pool.map(f"{__name__}:run_rows_on", jobs, collect)
    finally:
        if writer is not None:
            writer.close()
    merged = {**done, **got}
    return [merged[k] for k in keys if k in merged]
