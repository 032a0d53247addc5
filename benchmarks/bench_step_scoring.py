"""What a step scorer costs a rollout, and what batching it in the runner saves.

Real ``MATH-ReAct-v0`` environments with real sandboxes; ``SimulatedPolicy`` stands in for the
generating engine (see bench_rollout.py) and ``SimulatedScorer`` for a reward model: one call
costs ``--call-ms`` plus ``--step-ms`` per step in it (a batched forward pass).  Rows, side by
side in one run: no scorer; the environment scoring each step itself (``env_kwargs``: one call
per step, inside the episode); the runner batching (lockstep: one call per turn; async: gathered
calls beside generation).

    PYTHONPATH=. python benchmarks/bench_step_scoring.py --episodes 64 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench_rollout import scripted_reply

from agent_envs.policy.scripted import SimulatedPolicy
from agent_envs.core.steps import StepScore, StepScorer
from agent_envs.rollout.runner import run_episodes


class SimulatedScorer(StepScorer):
    """Costs ``call_s + step_s * len(contexts)`` per call (sleeping *is* the workload here)."""

    def __init__(self, call_s: float, step_s: float) -> None:
        self.call_s, self.step_s = call_s, step_s
        self.batches: list[int] = []

    async def score(self, contexts):
        self.batches.append(len(contexts))
        await asyncio.sleep(self.call_s + self.step_s * len(contexts))
        return [StepScore(0.5) for _ in contexts]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--per-token-ms", type=float, default=0.1)
    p.add_argument("--call-ms", type=float, default=30.0)
    p.add_argument("--step-ms", type=float, default=1.0)
    p.add_argument("--sandbox", default="bwrap")
    p.add_argument("--repeats", type=int, default=3, help="median wall time of this many runs per row")
    args = p.parse_args()
    tasks = [{"id": f"t{i}", "question": f"Task {i}", "answer": "42"} for i in range(args.episodes)]
    env_kwargs = {"sandbox": args.sandbox, "max_turns": 6}

    def once(mode: str, where: str) -> tuple[float, SimulatedScorer | None]:
        scorer = None if where == "none" else SimulatedScorer(args.call_ms / 1000, args.step_ms / 1000)
        kwargs = (
            {"env_kwargs": {**env_kwargs, "step_scorer": scorer}}
            if where == "env"
            else {"env_kwargs": env_kwargs, "step_scorer": scorer}
        )
        policy = SimulatedPolicy(scripted_reply, per_token_s=args.per_token_ms / 1000)
        started = time.perf_counter()
        run_episodes("MATH-ReAct-v0", tasks, policy, mode=mode, concurrency=args.concurrency, progress=False, **kwargs)
        return time.perf_counter() - started, scorer

    def run(mode: str, where: str) -> tuple[float, SimulatedScorer | None]:
        results = sorted((once(mode, where) for _ in range(args.repeats)), key=lambda r: r[0])
        return results[len(results) // 2]

    once("async", "none")  # warm-up: first sandbox start-up, imports

    print(
        f"{args.episodes} episodes, concurrency {args.concurrency}, scorer call {args.call_ms} ms "
        f"+ {args.step_ms} ms/step, sandbox {args.sandbox}, median of {args.repeats}"
    )
    print(f"{'mode':9} {'scorer':22} {'wall s':>7} {'vs none':>8} {'calls':>6} {'steps/call':>10}")
    for mode in ("lockstep", "async"):
        base, _ = run(mode, "none")
        print(f"{mode:9} {'none':22} {base:7.2f} {1.0:8.2f} {'-':>6} {'-':>10}")
        for where, label in (("env", "in the env (per step)"), ("runner", "batched by the runner")):
            wall, scorer = run(mode, where)
            assert scorer is not None  # ``where`` names a place for one
            calls = len(scorer.batches)
            print(
                f"{mode:9} {label:22} {wall:7.2f} {wall / base:8.2f} {calls:6d} "
                f"{sum(scorer.batches) / max(1, calls):10.1f}"
            )


if __name__ == "__main__":
    main()
