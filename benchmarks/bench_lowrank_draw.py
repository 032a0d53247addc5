"""The low-rank members' draw (``lowrank.member_draw``) alone and beside a busy interpreter thread.

The engine draws the next generation's members ahead (``lowrank.prefetch``) on threads of the process
that also runs vLLM's scheduling loop. Each member is 252 numpy draws on the 4B shape (one per target),
and each draw gives the interpreter lock back and must take it again; a thread that keeps the lock
busy (pure Python) makes every retake wait for the switch interval. On the H200 at P = 256 x B = 4 the
refresh waited 4.41 s for such draws (docs/scaling.md#folded-into-the-matmul); this measures how much
a busy thread slows them, and how much the draws slow that thread (the engine's loop, during the
rollouts), on the machine at hand, the same draws in both columns.

    python benchmarks/bench_lowrank_draw.py --members 8 --threads 1,2
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from gpu_engine import QWEN3_4B, SMOLLM2_135M  # noqa: E402

from agent_envs.es.lowrank import Target, in_parallel, member_draw  # noqa: E402

SHAPES = {"4b": QWEN3_4B, "135m": SMOLLM2_135M}


def targets(shape: dict[str, int]) -> list[Target]:
    """Every perturbed linear of a dense Qwen3-style shape: q, k, v, o, gate, up, down per layer."""
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    q, kv = shape["num_attention_heads"] * shape["head_dim"], shape["num_key_value_heads"] * shape["head_dim"]
    sizes = {"q": (q, hidden), "k": (kv, hidden), "v": (kv, hidden), "o": (hidden, q)}
    sizes |= {"gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter)}
    return [
        Target(f"layers.{i}.{n}.weight", o, k) for i in range(shape["num_hidden_layers"]) for n, (o, k) in sizes.items()
    ]


def draw(all_targets: list[Target], members: int, threads: int) -> float:
    start = time.perf_counter()
    for _ in in_parallel(lambda seed: member_draw(all_targets, seed, 0.01, 4), list(range(members)), threads):
        pass
    return time.perf_counter() - start


def spin(stop: threading.Event, counts: list[int]) -> None:
    """Pure Python until ``stop`` (a scheduling loop's stand-in), counting its rounds in ``counts[0]``."""
    while not stop.is_set():
        sum(range(200))
        counts[0] += 1


def spin_rate(seconds: float) -> float:
    """Rounds per second of :func:`spin` alone."""
    stop, counts = threading.Event(), [0]
    spinner = threading.Thread(target=spin, args=(stop, counts), daemon=True)
    spinner.start()
    time.sleep(seconds)  # the measuring window, not a synchronisation
    stop.set()
    spinner.join()
    return counts[0] / seconds


def beside_busy_thread(all_targets: list[Target], members: int, threads: int) -> tuple[float, float]:
    """:func:`draw` while another thread runs :func:`spin` the whole time: the draw's seconds, and
    the spinning thread's rounds per second meanwhile."""
    stop, counts = threading.Event(), [0]
    spinner = threading.Thread(target=spin, args=(stop, counts), daemon=True)
    spinner.start()
    try:
        seconds = draw(all_targets, members, threads)
    finally:
        stop.set()
        spinner.join()
    return seconds, counts[0] / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="4b", choices=sorted(SHAPES))
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--threads", default="1,2", help="comma list of drawing threads")
    args = ap.parse_args()
    all_targets = targets(SHAPES[args.shape])
    numbers = sum(4 * (t.out_features + t.in_features) for t in all_targets) * args.members
    print(f"{args.shape}: {len(all_targets)} targets, {args.members} members, rank 4, {numbers / 1e6:.0f} M numbers")
    alone_rate = spin_rate(2.0)
    print(
        "| drawing threads | draw alone (s) | draw beside a busy thread (s) | draw slower by | the busy thread's rate meanwhile |"
    )
    print("|---|---|---|---|---|")
    for threads in (int(t) for t in args.threads.split(",")):
        alone = draw(all_targets, args.members, threads)
        busy, rate = beside_busy_thread(all_targets, args.members, threads)
        print(f"| {threads} | {alone:.2f} | {busy:.2f} | {busy / alone:.1f}x | {rate / alone_rate:.0%} of alone |")


if __name__ == "__main__":
    main()
