"""What ``--sample-host``'s sampler costs the process it watches, with many threads waiting in it.

An ES driver at P = 256 x B = 4 holds about 1,280 threads (1,024 env workers, 256 members), nearly all
waiting.  Each sampler round reads every thread's frame under the interpreter's lock; on the H200 such
rounds took 29 ms where 2 ms was asked (docs/scaling.md#folded-into-the-matmul).  A busy thread here
makes calls that let the lock go and take it back (a pipe's write and read, a little Python between), as
the driver's socket sends do, and is timed alone and beside the sampler at each ``duty`` (1: rounds back
to back, no back-off; 0.2, the default: the wait after a round grows with the round), side by side:

    python benchmarks/bench_host_sampler.py --threads 1280 --calls 30000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_envs.es.host_sampler import HostSampler  # noqa: E402


def lock_releasing_calls(calls: int) -> float:
    """Seconds for ``calls`` round trips through a pipe, each giving the interpreter's lock up twice."""
    read, write = os.pipe()
    try:
        start = time.perf_counter()
        for _ in range(calls):
            os.write(write, b"x" * 64)
            os.read(read, 64)
            sum(range(200))
        return time.perf_counter() - start
    finally:
        os.close(read)
        os.close(write)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1280, help="waiting threads in the process")
    ap.add_argument("--calls", type=int, default=30000)
    ap.add_argument("--duties", default="1,0.2", help="comma list of the sampler's duty")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    gate = threading.Event()
    waiting = [threading.Thread(target=gate.wait, name=f"idle-{i}", daemon=True) for i in range(args.threads)]
    for t in waiting:
        t.start()
    try:
        alone = statistics.median(lock_releasing_calls(args.calls) for _ in range(args.repeats))
        print(f"{args.threads} waiting threads, {args.calls} lock-releasing calls, median of {args.repeats}")
        print("| sampler | calls (s) | vs alone | rounds, one every (ms) | sampler's share of the wall |")
        print("|---|---|---|---|---|")
        print(f"| none | {alone:.3f} | 1.00x | - | - |")
        for duty in (float(d) for d in args.duties.split(",")):
            runs = []
            for _ in range(args.repeats):
                sampler = HostSampler(duty=duty)
                with sampler:
                    seconds = lock_releasing_calls(args.calls)
                runs.append((seconds, sampler))
            seconds, sampler = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
            every = sampler.seconds / sampler.rounds * 1e3 if sampler.rounds else float("nan")
            share = sampler.cpu_seconds / sampler.seconds
            print(f"| duty {duty:g} | {seconds:.3f} | {seconds / alone:.2f}x | {every:.1f} | {share:.0%} |")
    finally:
        gate.set()
        for t in waiting:
            t.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
