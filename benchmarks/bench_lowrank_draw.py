"""The low-rank members' draw (``lowrank.member_draw``) alone and beside a busy interpreter thread.

The engine draws the next generation's members ahead (``lowrank.prefetch``) on threads of the process
that also runs vLLM's scheduling loop. Each member is 252 numpy draws on the 4B shape (one per target),
and each draw gives the interpreter lock back and must take it again; a thread that keeps the lock
busy (pure Python) makes every retake wait for the switch interval. On the H200 at P = 256 x B = 4 the
refresh waited 4.41 s for such draws (docs/scaling.md#folded-into-the-matmul); this measures how much
a busy thread slows them, and how much the draws slow that thread (the engine's loop, during the
rollouts), on the machine at hand, the same draws in both columns; and the same for the draws in a
process of their own (``lowrank.draw_ahead``, what ``prefetch`` runs: it also stacks each target's
factors for the update, so it writes twice the bytes).

    python benchmarks/bench_lowrank_draw.py --members 8 --threads 1,2,0,kept
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "scripts")]  # gpu_engine: bench_lora_kernels's shapes

from agent_envs.es.draw_memory import DrawMemory  # noqa: E402
from agent_envs.es.lowrank import Target, draw_ahead, in_parallel, member_draw  # noqa: E402
from agent_envs.es.lowrank_factors import DRAW_THREADS  # noqa: E402
from bench_lora_kernels import SHAPES, layers  # noqa: E402


def targets(shape: dict[str, int]) -> list[Target]:
    """Every perturbed linear of a dense Qwen3-style shape, one per slice of each packed layer
    (``bench_lora_kernels.layers``): q, k, v, o, gate, up, down per decoder layer."""
    return [
        Target(f"layers.{i}.{name}.{part}.weight", out, inputs)
        for i in range(shape["num_hidden_layers"])
        for name, widths, inputs in layers(shape)
        for part, out in enumerate(widths)
    ]


def kept_memory(all_targets: list[Target], members: int, process_threads: int) -> DrawMemory:
    """A memory that keeps one file, drawn into once already (untimed): what a run's third and later
    generations draw into."""
    memory = DrawMemory(keep=1)
    draw_ahead(list(range(members)), all_targets, 4, 0.01, threads=process_threads, memory=memory)
    return memory


def draw(
    all_targets: list[Target], members: int, threads: str, process_threads: int, memory: DrawMemory | None
) -> tuple[float, float]:
    """Seconds to draw ``members`` members on ``threads`` threads of this process (``threads`` 0 or ``kept``:
    in a process of their own, on ``process_threads`` threads, into a new memory file or into ``memory``'s
    kept one), and seconds to let go of them (the engine lets go of a generation's draws on its drawing
    thread, beside its scheduling loop)."""
    start = time.perf_counter()
    if threads in ("0", "kept"):
        drawn: Any = draw_ahead(list(range(members)), all_targets, 4, 0.01, threads=process_threads, memory=memory)
    else:
        drawn = list(
            in_parallel(lambda seed: member_draw(all_targets, seed, 0.01, 4), list(range(members)), int(threads))
        )
    drawn_at = time.perf_counter()
    del drawn
    return drawn_at - start, time.perf_counter() - drawn_at


@contextmanager
def spinning() -> Iterator[list[int]]:
    """A thread running pure Python (a scheduling loop's stand-in) for the block's length; the list
    holds the rounds it made."""
    stop, counts = threading.Event(), [0]

    def spin() -> None:
        while not stop.is_set():
            sum(range(200))
            counts[0] += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        yield counts
    finally:
        stop.set()
        spinner.join()


def spin_rate(seconds: float) -> float:
    """Rounds per second of the spinning thread alone."""
    with spinning() as counts:
        time.sleep(seconds)  # the measuring window, not a synchronisation
    return counts[0] / seconds


def beside_busy_thread(
    all_targets: list[Target], members: int, threads: str, process_threads: int, memory: DrawMemory | None
) -> tuple[float, float, float]:
    """:func:`draw` beside the spinning thread: its two times, and the thread's rounds per second meanwhile."""
    with spinning() as counts:
        start = time.perf_counter()
        seconds = draw(all_targets, members, threads, process_threads, memory)
        rate = counts[0] / (time.perf_counter() - start)
    return *seconds, rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="4b", choices=sorted(SHAPES))
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument(
        "--threads",
        default="1,2,0,kept",
        help="comma list of drawing threads (0: a process of its own; kept: the same, into a memory file kept from before)",
    )
    ap.add_argument(
        "--process-threads",
        type=int,
        default=DRAW_THREADS,
        help="threads of the process of its own (default: what prefetch uses on this machine, a quarter of the cores)",
    )
    ap.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="the interpreter's switch interval in seconds for the whole run (sys.setswitchinterval; default as it is)",
    )
    args = ap.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    rows = args.threads.split(",")
    if not all(threads == "kept" or threads.isdigit() for threads in rows):
        ap.error(f"--threads takes numbers and 'kept', got {args.threads!r}")
    all_targets = targets(SHAPES[args.shape])
    numbers = sum(4 * (t.out_features + t.in_features) for t in all_targets) * args.members
    print(
        f"{args.shape}: {len(all_targets)} targets, {args.members} members, rank 4, {numbers / 1e6:.0f} M numbers, "
        f"switch interval {sys.getswitchinterval() * 1e3:g} ms"
    )
    alone_rate = spin_rate(2.0)
    print(
        "| where the draws run | draw alone (s) | let go alone (s) | draw beside a busy thread (s) | let go beside it (s) "
        "| both slower by | the busy thread's rate meanwhile |"
    )
    print("|---|---|---|---|---|---|---|")
    for threads in rows:
        # the kept file is drawn into once before either timing, so neither window holds an untimed draw
        memory = kept_memory(all_targets, args.members, args.process_threads) if threads == "kept" else None
        alone = draw(all_targets, args.members, threads, args.process_threads, memory)
        *busy, rate = beside_busy_thread(all_targets, args.members, threads, args.process_threads, memory)
        where = {
            "0": f"a process of its own ({args.process_threads} thread(s)), a new memory file",
            "kept": f"a process of its own ({args.process_threads} thread(s)), a memory file kept from before",
        }.get(threads, f"{threads} thread(s) of this one")
        print(
            f"| {where} | {alone[0]:.2f} | {alone[1]:.2f} | {busy[0]:.2f} | {busy[1]:.2f} "
            f"| {sum(busy) / sum(alone):.1f}x | {rate / alone_rate:.0%} of alone |"
        )


if __name__ == "__main__":
    main()
