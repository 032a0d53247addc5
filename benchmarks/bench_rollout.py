"""Lockstep vs async rollouts on real environments with real sandboxes.

``SimulatedPolicy`` stands in for the GPU: each completion takes ``tokens * per_token`` seconds,
with long-tailed (lognormal, seeded) lengths.  A lockstep batch returns when its longest
completion is done (one batched call per turn, as the reference runner); in async mode every
request finishes on its own (continuous batching).  The environments are real
``MATH-ReAct-v0`` instances: every episode runs python3 in its sandbox, then answers.

Printed: episodes/s per mode, the async/lockstep ratio, and the share of wall time the engine
sat idle waiting on environment work (tool calls, resets, bookkeeping), which is the cost the
async runner exists to hide.

    PYTHONPATH=. python benchmarks/bench_rollout.py --episodes 64 --concurrency 16 --sandbox bwrap
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Sequence

from agent_envs.policy.base import Completion, GenerationRequest, Policy
from agent_envs.policy.scripted import SimulatedPolicy
from agent_envs.rollout.runner import run_episodes


def scripted_reply(request: GenerationRequest) -> str:
    """One to three python3 tool calls (chosen by the episode seed), then a final answer."""
    turns = sum(1 for m in request.messages if m["role"] == "assistant")
    rounds = 1 + (request.seed or 0) % 3
    if turns < rounds:
        cmd = f"python3 -c 'print(sum(i*i for i in range({1000 * (turns + 1)})))'"
        return "Let me compute.\nAction: " + json.dumps({"name": "bash", "arguments": {"command": cmd}})
    return "Final answer: \\boxed{42}"


class BusyMeter(Policy):
    """Wraps a policy and measures the wall time during which at least one request is in flight,
    i.e. the time the engine is busy; the rest of the run it waits on the environments."""

    def __init__(self, inner: Policy):
        self.inner = inner
        self.name = inner.name
        self._lock = threading.Lock()
        self._in_flight = 0
        self._busy_since = 0.0
        self.busy_s = 0.0

    def _enter(self) -> None:
        with self._lock:
            if self._in_flight == 0:
                self._busy_since = time.perf_counter()
            self._in_flight += 1

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self.busy_s += time.perf_counter() - self._busy_since

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self._enter()
        try:
            return self.inner.generate(requests)
        finally:
            self._leave()

    async def agenerate(self, request: GenerationRequest) -> Completion:
        self._enter()
        try:
            return await self.inner.agenerate(request)
        finally:
            self._leave()


def bench(mode: str, args: argparse.Namespace) -> dict:
    policy = BusyMeter(
        SimulatedPolicy(
            scripted_reply, per_token_s=args.per_token_ms / 1000, median_tokens=args.median_tokens, sigma=args.sigma
        )
    )
    tasks = [{"id": f"bench-{i}", "question": f"Compute problem {i}.", "answer": "42"} for i in range(args.episodes)]
    start = time.perf_counter()
    records = run_episodes(
        "MATH-ReAct-v0",
        tasks,
        policy,
        samples=1,
        mode=mode,
        base_seed=args.seed,
        env_kwargs={"sandbox": args.sandbox},
        concurrency=args.concurrency,
        progress=False,
    )
    wall = time.perf_counter() - start
    assert all(r.used_bash and r.termination_reason == "final_answer" for r in records), "episodes went wrong"
    rows = [r.row() for r in records]  # with the environment's extra fields
    steps = sum(row["policy_calls"] for row in rows)
    return {
        "mode": mode,
        "episodes": len(records),
        "tool_calls": sum(len(r.react_steps) for r in records),
        "wall_s": wall,
        "episodes_per_s": len(records) / wall,
        "engine_idle_share": max(0.0, 1 - policy.busy_s / wall),
        "env_ms_per_step": 1000 * sum(row["env_seconds"] for row in rows) / max(steps, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--per-token-ms", type=float, default=2.0)
    parser.add_argument("--median-tokens", type=int, default=300)
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of completion lengths")
    parser.add_argument("--sandbox", default="bwrap", choices=("bwrap", "none", "docker"))
    parser.add_argument("--seed", type=int, default=20260627)
    args = parser.parse_args()
    rows = [bench("lockstep", args), bench("async", args)]
    cols = ["mode", "episodes", "tool_calls", "wall_s", "episodes_per_s", "engine_idle_share", "env_ms_per_step"]
    print(
        f"# {args.episodes} episodes, concurrency {args.concurrency}, {args.per_token_ms} ms/token, "
        f"lognormal lengths (median {args.median_tokens}, sigma {args.sigma}), sandbox {args.sandbox}"
    )
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    ratio = rows[1]["episodes_per_s"] / rows[0]["episodes_per_s"]
    print(f"\nasync / lockstep throughput: {ratio:.2f}x (target >= 1.5x)")
    print(f"async engine idle share: {rows[1]['engine_idle_share']:.1%} (target < 5%)")


if __name__ == "__main__":
    main()
