"""benchmarks/bench_history_write.py at a tiny size: a row per asked generation, both ways timed, and the
two ways leave the same file (the benchmark checks, and exits non-zero otherwise)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_both_ways_are_timed_at_every_asked_generation_and_leave_the_same_file() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_history_write.py"), "--population", "4"]
        + ["--case-batch", "2", "--generations", "2,5", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "both ways leave the same bytes" in done.stdout
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith(("| 2 ", "| 5 "))]
    assert [int(r[0]) for r in rows] == [2, 5]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
