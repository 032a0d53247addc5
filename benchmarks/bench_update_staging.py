"""The low-rank update's products from pageable and from page-locked stacked factors, side by side.

``LowRankPerturber.update`` multiplies each target's stacked factors ``[A_1 | ... | A_U]`` and
``[B_1 | ... | B_U]`` on the weights' device.  Drawn ahead they lie in the draws' memory file, pageable:
on the H200 at P = 256 x B = 4 (4B shape) their 757 host-to-device copies took 1.56 s of device time.
``pinned_staging`` copies them into a page-locked buffer while the rollouts run.  This draws ``--members``
members of a shape's targets once, then times the update's products (``lowrank.deltas``, the same call
the update makes) from each source, and the staging itself (off the critical path), on the machine at
hand; the products' bits are checked equal.

    python benchmarks/bench_update_staging.py --shape 4b --members 64 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "scripts")]

from agent_envs.es.lowrank import deltas, draw_ahead  # noqa: E402
from agent_envs.es.pinned_staging import PinnedStaging  # noqa: E402
from bench_lora_kernels import SHAPES  # noqa: E402
from bench_lowrank_draw import targets  # noqa: E402


def products_seconds(stacked: dict, seeds: list[int], all_targets: list, device: torch.device) -> tuple[float, float]:
    """Seconds for every target's product from ``stacked`` (synchronized at the end, as the update's norm
    is), and the products' sum of squares (the bits compared across sources)."""
    torch.cuda.synchronize() if device.type == "cuda" else None
    start = time.perf_counter()
    total = torch.zeros((), dtype=torch.float64, device=device)
    coefs = [1.0 / (i + 1) for i in range(len(seeds))]
    for change in deltas(seeds, coefs, all_targets, 4, [device] * len(all_targets), stacked=lambda t: stacked[t.name]):
        total += change.square().sum(dtype=torch.float64)
    value = float(total)
    return time.perf_counter() - start, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="4b")
    ap.add_argument("--members", type=int, default=64, help="distinct seeds of the update")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    all_targets = targets(SHAPES[args.shape])
    seeds = list(range(args.members))
    pageable = draw_ahead(seeds, all_targets, 4, 0.01)
    staging = PinnedStaging() if device.type == "cuda" else PinnedStaging(lambda buffer: False, lambda: None)
    stage_s, busy = [], None
    for _ in range(2):  # the first stage locks its buffer, the second uses the other one: both costs shown
        start = time.perf_counter()
        staged = draw_ahead(seeds, all_targets, 4, 0.01, staging, busy)
        stage_s.append(time.perf_counter() - start)
        busy = staged.staged
    gigabytes = sum(a.numel() + b.numel() for a, b in staged.stacked.values()) * 4 / 1e9
    rows = {"pageable (the draws' memory file)": pageable.stacked, "page-locked (pinned_staging)": staged.stacked}
    times, sums = {}, {}
    for name, stacked in rows.items():
        runs = [products_seconds(stacked, seeds, all_targets, device) for _ in range(args.repeats + 1)][1:]
        times[name] = statistics.median(t for t, _ in runs)
        sums[name] = {s for _, s in runs}
    base = times["pageable (the draws' memory file)"]
    print(
        f"{args.shape}: {len(all_targets)} targets, {args.members} members, {gigabytes:.2f} GB of stacked factors, "
        f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, locked {staging.locked}"
    )
    print(f"| stacked factors from | update's products (s), median of {args.repeats} | GB/s | vs pageable |")
    print("|---|---|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {seconds:.3f} | {gigabytes / seconds:.1f} | {base / seconds:.2f}x |")
    print(
        f"draw ahead with staging (in the background during the rollouts): {stage_s[0]:.2f} s first (locks), "
        f"{stage_s[1]:.2f} s next; the products' bits equal: {len(set().union(*sums.values())) == 1}"
    )


if __name__ == "__main__":
    main()
