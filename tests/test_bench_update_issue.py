"""benchmarks/bench_update_issue.py on this CPU at the tiny shape (the update's issuing against its host
work; on the H200 it tells host work from waiting)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_update_issue_benchmark_times_updates_that_change_the_weights() -> None:
    """benchmarks/bench_update_issue.py (the update's issuing against its host work) at the tiny shape: a
    row per timed update of each variant, the factors taken as the engine takes them (drawn ahead, the
    staging buffers alternating), the host calls of one update ranked; it exits non-zero when an update
    leaves the weights as they were or the variants' weights differ.  Here, with no CUDA device, the graph
    variant runs eagerly and says why."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_update_issue.py"), "--shape", "tiny", "--members", "3"]
        + ["--updates", "2", "--top", "30", "--variants", "eager,graph"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith(("| eager ", "| graph "))]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        ("eager", "1"),
        ("eager", "2"),
        ("graph", "1"),
        ("graph", "2"),
    ]
    assert all(float(r[2]) > 0 and float(r[3]) >= 0 for r in rows), done.stdout
    assert {r[7].strip() for r in rows if r[0].strip() == "graph"} == {"eager: the weights are not on one CUDA device"}
    assert "stacked ahead: True" in done.stdout and "weights after each update: the same bits" in done.stdout
    # one product per target of the tiny shape (2 layers x 7), in each variant's profiled update
    assert done.stdout.count("`aten::mm` | 14 |") == 2, done.stdout
