"""The host half of a refresh written ahead (``refresh_ahead.write_ahead``): the members' adapters written
into the CPU adapters one by one or a block per module, alone and beside a busy interpreter thread.

At P = 256 on the 4B shape the write ahead runs during the rollouts, in the process whose scheduling loop
drives them: on the H200 it wrote for 0.91 s and gathered for 1.62 s (docs/scaling.md), one adapter after
another, through views made per member and module (about 129,000 torch tensors), let go of after the
update.  Once a refresh has gathered the adapters for their slots, each module's adapters lie in one block
of the staging buffer, so the writes can go in a few copies (``adapter_blocks.write``).  This builds
a vLLM-shaped LoRA manager on the host (every target a module of its own, bfloat16 adapters and slots),
draws mirrored members with the drawing process, gathers once, then times both ways of writing the next
members (the write, the gathering for the slots after it, and letting go of what the write made), each
alone and beside a thread running pure Python (the scheduling loop's stand-in), checks that both wrote
the same bits, and prints a table:

    python benchmarks/bench_refresh_write.py --shape 135m --members 256
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "scripts")]

from agent_envs.es import adapter_blocks, lora_slots  # noqa: E402
from agent_envs.es.lowrank import DrawnAhead, Target, draw_ahead, signed  # noqa: E402
from bench_lora_kernels import SHAPES  # noqa: E402
from bench_lowrank_draw import spin_rate, spinning, targets  # noqa: E402

RANK, SIGMA = 4, 0.01


def engine_manager(all_targets: list[Target], members: int) -> Any:
    """A LoRA manager as ``lora_slots`` reads vLLM's: ``members`` resident adapters (ids 1..P, slot k holding
    adapter k + 1), every target a module of its own with one stacked slot tensor per factor, all bfloat16."""
    modules = {t.name.removesuffix(".weight"): t for t in all_targets}

    def adapter() -> Any:
        return SimpleNamespace(
            loras={
                m: SimpleNamespace(
                    lora_a=torch.zeros(RANK, t.in_features, dtype=torch.bfloat16),
                    lora_b=torch.zeros(t.out_features, RANK, dtype=torch.bfloat16),
                    scaling=1,
                )
                for m, t in modules.items()
            }
        )

    ids = list(range(1, members + 1))
    adapters = {i: adapter() for i in ids}
    return SimpleNamespace(
        get_adapter=adapters.get,
        capacity=members,
        lora_index_to_id=ids,
        modules={
            m: SimpleNamespace(
                lora_a_stacked=(torch.zeros(members, 1, RANK, t.in_features, dtype=torch.bfloat16),),
                lora_b_stacked=(torch.zeros(members, 1, t.out_features, RANK, dtype=torch.bfloat16),),
                tp_size=1,
            )
            for m, t in modules.items()
        },
        packed_modules={},
        _get_lora_layer_weights=lambda lora_model, name: lora_model.loras.get(name),
    )


def write(
    manager: Any, all_targets: list[Target], ahead: DrawnAhead, seeds: list[int], signs: list[int], blocks: bool
) -> list[float]:
    """One write of members ``seeds`` as ``write_ahead`` does it (one by one, or in blocks where the adapters
    lie in them), then the gathering for the slots, then letting go of what the write made: their seconds."""
    ids = list(range(1, len(seeds) + 1))
    start = time.perf_counter()
    places = lora_slots.plan(manager, ids, all_targets, RANK)
    found = adapter_blocks.find(places) if blocks else None
    made: list[Any] = []
    if blocks and not (
        found and adapter_blocks.write(manager, found, ahead.draws, [ahead.draws.index[s] for s in seeds], signs)
    ):
        raise SystemExit("the adapters do not lie in blocks after a gathering")
    if not blocks:

        def tensors_of(i: int) -> Any:
            made.append(signed(ahead.draws[seeds[i]][1], signs[i]))
            return made[-1]

        lora_slots.rewrite(manager, places, tensors_of)
    written = time.perf_counter()
    with torch.no_grad():
        lora_slots.stage_copy(manager, ids)
    gathered = time.perf_counter()
    made.clear()
    del places, found
    return [written - start, gathered - written, time.perf_counter() - gathered]


def staged(manager: Any) -> list[torch.Tensor]:
    """Every CPU adapter's factors, in id and module order (what the two ways must agree on)."""
    return [
        t.clone()
        for i in manager.lora_index_to_id
        for w in manager.get_adapter(i).loras.values()
        for t in (w.lora_a, w.lora_b)
    ]


def timed(run: Callable[[], list[float]], busy: bool) -> list[float]:
    """``run``'s seconds, and with ``busy`` the spinning thread's rounds per second meanwhile (else 0)."""
    if not busy:
        return [*run(), 0.0]
    with spinning() as counts:
        start = time.perf_counter()
        seconds = run()
        rate = counts[0] / (time.perf_counter() - start)
    return [*seconds, rate]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="135m", choices=sorted(SHAPES))
    ap.add_argument("--members", type=int, default=256, help="P: adapters, in mirrored pairs (even)")
    args = ap.parse_args()
    if args.members < 2 or args.members % 2:
        ap.error(f"--members must be even and at least 2, got {args.members}")
    all_targets = targets(SHAPES[args.shape])
    seeds = [1000 + k // 2 for k in range(args.members)]
    signs = [1 if k % 2 == 0 else -1 for k in range(args.members)]
    manager = engine_manager(all_targets, args.members)
    ahead = draw_ahead(sorted(set(seeds)), all_targets, RANK, SIGMA)
    write(manager, all_targets, ahead, seeds, signs, blocks=False)  # the first refresh: gathered, not timed
    alone = spin_rate(2.0)
    print(
        f"shape {args.shape}, {len(all_targets)} targets, P = {args.members} (mirrored pairs), rank {RANK}; "
        f"{args.members * len(all_targets) * 2} adapter parts; the busy thread alone {alone:,.0f} rounds/s"
    )
    print(
        "| write | beside | write (s) | gather for the slots (s) | let go (s) | all (s) | vs one by one "
        "| the busy thread's rate meanwhile | the busy thread's seconds lost |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    bits: dict[bool, list[torch.Tensor]] = {}
    for busy in (False, True):
        base = 0.0
        for blocks in (False, True):
            for places in manager.__dict__[lora_slots._STAGING].values():
                torch._foreach_zero_(places)  # what the adapters held, gone: each way must write every value itself
            *seconds, rate = timed(functools.partial(write, manager, all_targets, ahead, seeds, signs, blocks), busy)
            bits[blocks] = staged(manager)
            total = sum(seconds)
            base = base or total
            # what the busy thread (the engine loop's stand-in) did not get done in the window: its rate's shortfall
            lost = f"{total * (1 - rate / alone):.2f}" if busy else "-"
            print(
                f"| {'all modules in a few copies' if blocks else 'one adapter after another'} | "
                f"{'a busy thread' if busy else 'nothing'} | {seconds[0]:.3f} | {seconds[1]:.3f} | {seconds[2]:.3f} | "
                f"{total:.3f} | {total / base:.2f}x | {f'{rate / alone:.0%} of alone' if busy else '-'} | {lost} |",
                flush=True,
            )
        if not all(torch.equal(a, b) for a, b in zip(bits[False], bits[True])):
            raise SystemExit("the two ways wrote different bits")
    print("both ways wrote the same bits into every CPU adapter")


if __name__ == "__main__":
    main()
