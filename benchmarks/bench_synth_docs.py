"""Time the built-in synthetic DocVQA generator and summarise what it keeps.

Usage (from the repo root, with the package installed or PYTHONPATH=.):
    python benchmarks/bench_synth_docs.py [--questions 200] [--seed 0]
Prints wall and CPU seconds (this process plus its workers and their tesseract children),
pages drawn, questions kept and dropped by the OCR check, and histograms of difficulty,
scan quality and layout.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from collections import Counter
from pathlib import Path

from agent_envs.envs.docvqa.synth import WORKERS, generate_docvqa_tasks


def _cpu_seconds() -> float:
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_synth_docs.") as out:
        cpu0, wall0 = _cpu_seconds(), time.perf_counter()
        tasks = generate_docvqa_tasks(args.questions, args.seed, out)
        wall, cpu = time.perf_counter() - wall0, _cpu_seconds() - cpu0
        manifest = json.loads((Path(out) / "manifest.json").read_text())
        megabytes = sum(p.stat().st_size for p in Path(out).glob("*.png")) / 2**20
    rows = [
        ("questions requested", args.questions),
        ("worker processes", WORKERS),
        ("wall seconds", f"{wall:.1f}"),
        ("CPU seconds (all processes)", f"{cpu:.1f}"),
        ("pages drawn / used", f"{manifest['pages']} / {manifest['pages_used']}"),
        (
            "questions kept / dropped by OCR check",
            f"{manifest['kept']} / {manifest['dropped']}",
        ),
        ("PNG size of used pages (MiB)", f"{megabytes:.1f}"),
    ]
    for field in ("difficulty", "scan_quality", "doc_type"):
        counts = Counter(getattr(t, field) for t in tasks)
        rows.append(
            (
                f"{field} histogram",
                ", ".join(f"{k}={v}" for k, v in sorted(counts.items())),
            )
        )
    width = max(len(name) for name, _ in rows)
    print(f"| {'metric':<{width}} | value")
    print(f"|{'-' * (width + 2)}|------")
    for name, value in rows:
        print(f"| {name:<{width}} | {value}")


if __name__ == "__main__":
    main()
