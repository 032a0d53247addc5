"""Seconds an ES run spends writing its history between two generations, by generation.

The history gets one record per generation; a record holds every episode's compact row (about 530 KB at
P = 256 x B = 4).  Two ways side by side, on the same records, each timed at the generations asked:

* rewrite: the whole list written again (``es.history.write_history``, atomic), as every generation did
  before ``HistoryWriter``: its cost grows with every generation the run has recorded;
* append: ``es.history.HistoryWriter``, the run's writer: the new record in place of the closing
  bracket, synced.

Both leave the same bytes (checked at every measured generation).  The write happens after a generation's
update and before the next generation's first request, so every second of it is a second the GPU waits.

    python benchmarks/bench_history_write.py --population 256 --case-batch 4 --generations 10,50,100,200
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_envs.es.history import HistoryWriter, write_history  # noqa: E402

#: one episode's compact row as a run records it (MATH-ReAct, two turns; the fields of ``compact_row``)
ROW = {
    "key": "synth_math_0_0:sample00",
    "task_id": "synth_math_0_0",
    "row_index": 0,
    "sample_index": 0,
    "score": 0.0,
    "prediction": "If not found, it says something",
    "latency_s": 22.26694210000278,
    "used_bash": False,
    "termination_reason": "max_turns",
    "answer_status": "missing_final_answer",
    "context_trims": 0,
    "max_context_tokens": 321,
    "generated_tokens": 512,
    "seed": 1271337829,
    "engine_index": 0,
    "trajectory_tokens": 512,
    "trace_rounds": 2,
    "score_method": "math_paper_react_cli_no_bash_tool_use",
}


def generation_record(generation: int, population: int, case_batch: int) -> dict[str, Any]:
    samples = [
        {
            "engine_index": 0,
            "seed": 1000 + m,
            "reward": 0.0,
            "result": [dict(ROW, row_index=i) for i in range(case_batch)],
        }
        for m in range(population)
    ]
    return {"generation": generation, "seeds": [1000 + m for m in range(population)], "samples": samples}


def timed_writes(
    folder: Path, records: list[dict[str, Any]], at: list[int], repeats: int
) -> dict[str, dict[int, float]]:
    """Per way, the median seconds of the write that follows generation ``g`` for each ``g`` of ``at``."""
    out: dict[str, dict[int, float]] = {"rewrite": {}, "append": {}}
    for g in at:
        head = records[: g + 1]  # the config record and g generations, then this generation's
        now = records[: g + 2]
        times: dict[str, list[float]] = {"rewrite": [], "append": []}
        for r in range(repeats):
            whole, appended = folder / f"whole{r}.json", folder / f"appended{r}.json"
            write_history(whole, head)
            writer = HistoryWriter(appended)
            writer.write(head)
            start = time.perf_counter()
            write_history(whole, now)
            times["rewrite"].append(time.perf_counter() - start)
            start = time.perf_counter()
            writer.write(now)
            times["append"].append(time.perf_counter() - start)
            if whole.read_bytes() != appended.read_bytes():
                raise SystemExit(f"generation {g}: the two ways left different files")
        for way, seconds in times.items():
            out[way][g] = statistics.median(seconds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--population", type=int, default=256)
    ap.add_argument("--case-batch", type=int, default=4)
    ap.add_argument("--generations", default="10,50,100,200", help="the generations whose write is timed")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    at = sorted(int(g) for g in args.generations.split(","))
    record = generation_record(0, args.population, args.case_batch)
    records = [{"config": {"population": args.population}}] + [{**record, "generation": g} for g in range(max(at) + 1)]
    with tempfile.TemporaryDirectory(prefix="bench-history-") as tmp:
        got = timed_writes(Path(tmp), records, at, args.repeats)
    size = len(json.dumps(record).encode()) / 1e6
    print(
        f"# history write after generation g: P = {args.population} x B = {args.case_batch} (a record about "
        f"{size:.2f} MB), median of {args.repeats}; both ways leave the same bytes"
    )
    print("| generation | rewrite the whole list (s) | append (s) | rewrite / append |")
    print("|---|---|---|---|")
    for g in at:
        rewrite, append = got["rewrite"][g], got["append"][g]
        print(f"| {g} | {rewrite:.4f} | {append:.4f} | {rewrite / append:.1f}x |")


if __name__ == "__main__":
    main()
