"""benchmarks/bench_update_issue.py on this CPU at the tiny shape (the update's issuing against its host
work; on the H200 it tells host work from waiting)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_update_issue_benchmark_times_updates_that_change_the_weights() -> None:
    """benchmarks/bench_update_issue.py (the update's issuing against its host work) at the tiny shape: a
    row per timed update, the factors taken as the engine takes them (drawn ahead), the host calls ranked;
    it exits non-zero when an update leaves the weights as they were."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_update_issue.py"), "--shape", "tiny", "--members", "3"]
        + ["--updates", "2", "--top", "30"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith(("| 1 ", "| 2 "))]
    assert len(rows) == 2 and all(float(r[1]) > 0 and float(r[2]) >= 0 for r in rows), done.stdout
    assert "stacked ahead: True" in done.stdout
    assert "`aten::mm` | 14 |" in done.stdout  # one product per target of the tiny shape (2 layers x 7)
