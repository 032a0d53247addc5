"""benchmarks/bench_slot_writes.py on this CPU at a tiny size: every layout and slot order gives a row,
and every timed path leaves each slot holding its own adapter (the benchmark checks, and exits non-zero
otherwise)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_layout_and_order_writes_each_adapter_into_its_slot() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_slot_writes.py"), "--shape", "135m", "--slots", "3,5"]
        + ["--layers", "1", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [
        line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| 3 ") or line.startswith("| 5 ")
    ]
    assert len(rows) == 8
    assert {(r[1].strip(), r[2].strip()) for r in rows} == {
        (layout, order)
        for layout in ("widened weight's B views", "vLLM's own (contiguous)")
        for order in ("consecutive (slice)", "reversed (index)")
    }
    assert all(float(r[3]) > 0 for r in rows)
