"""Tokenising from many env threads at once: the Rust tokenizer's ``encode`` holds the interpreter
lock, a one-text ``encode_batch`` releases it, so only the second scales with the cores.

Each env thread tokenises its episode's new messages (about 600 tokens a step); in lockstep 200
threads do so between two engine calls while the GPU waits.  ``TokenCounter.text_ids`` is what
the environments and policies call.

    python benchmarks/bench_tokenize_threads.py            # SmolLM2's tokenizer, 400 texts
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_envs.policy.hf import smollm2_tokenizer  # noqa: E402
from agent_envs.core.tokens import TokenCounter  # noqa: E402


def timed(fn: Callable[[str], object], texts: list[str], threads: int) -> float:
    chunks = [texts[i::threads] for i in range(threads)]
    workers = [threading.Thread(target=lambda c=c: [fn(t) for t in c]) for c in chunks]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=600, help="random tokens per text")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 8, 64])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tokenizer = smollm2_tokenizer()
    backend, counter = tokenizer.backend_tokenizer, TokenCounter(tokenizer)
    rng = random.Random(0)
    texts = [
        tokenizer.decode([rng.randrange(1000, len(tokenizer) - 1000) for _ in range(args.tokens)])
        for _ in range(args.texts)
    ]
    ways = {
        "Rust encode": lambda t: backend.encode(t, add_special_tokens=False).ids,
        "Rust encode_batch([text])": lambda t: backend.encode_batch([t], add_special_tokens=False)[0].ids,
        "TokenCounter.text_ids": counter.text_ids,
    }
    assert all(ways["Rust encode"](t) == counter.text_ids(t) for t in texts[:20])
    print(
        f"\n# {args.texts} texts x {args.tokens} random tokens, SmolLM2 tokenizer, {os.cpu_count()} cores; "
        f"best of {args.repeat} (seconds)"
    )
    print("| threads | " + " | ".join(ways) + " | encode / text_ids |")
    print("|---" * (len(ways) + 2) + "|")
    for n in args.threads:
        best = {name: min(timed(fn, texts, n) for _ in range(args.repeat)) for name, fn in ways.items()}
        cells = " | ".join(f"{best[name]:.3f}" for name in ways)
        print(f"| {n} | {cells} | {best['Rust encode'] / best['TokenCounter.text_ids']:.2f}x |")


if __name__ == "__main__":
    main()
