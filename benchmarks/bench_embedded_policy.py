"""Decoding speed of the embedded CPU policy (TransformersPolicy, SmolLM2-135M) against plain
``transformers`` ``model.generate`` on the same weights, prompts, lengths and batch sizes.

Both sides sample (temperature 1, top-k 40) exactly ``--tokens`` new tokens per prompt (no stop
string can fire: plain generate gets ``min_new_tokens``, the policy a stop string that never
occurs and an EOS it ignores only when ``--tokens`` is reached first), and the two are timed
alternately, repetition by repetition, so load from other processes hits both alike.

    python benchmarks/bench_embedded_policy.py                # batch 1 and 4, 64 tokens, 3 reps
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from agent_envs.policy import GenerationRequest, SamplingConfig
from agent_envs.policy.hf import TransformersPolicy, default_cpu_policy
from agent_envs.core.prompts import load_prompt
from agent_envs.envs.math_react.spec import PROMPTS

QUESTIONS = [
    "What is the remainder when 60^865 is divided by 1009?",
    "How many integers k with 1 <= k <= 5000 satisfy gcd(k, 300) = 1?",
    "What is the tax amount on the invoice?",
    "Find the sum of all primes below 200.",
]


def requests(batch: int, tokens: int) -> list[GenerationRequest]:
    system = load_prompt("system", PROMPTS)
    return [
        GenerationRequest(
            messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]},
            ],
            seed=1000 + i,
            max_tokens=tokens,
            stop=["\x00never\x00"],
        )
        for i in range(batch)
    ]


def time_policy(policy, batch: int, tokens: int) -> tuple[float, int]:
    started = time.perf_counter()
    out = policy.generate(requests(batch, tokens))
    return time.perf_counter() - started, sum(len(c.token_ids or []) for c in out)


def time_generate(policy, batch: int, tokens: int) -> tuple[float, int]:
    tok = policy.tokenizer
    tok.padding_side = "left"
    prompts = [policy.counter.prompt_ids(r.messages) for r in requests(batch, tokens)]
    width = max(map(len, prompts))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.inference_mode():
        out = policy.model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=40,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            pad_token_id=pad,
        )
    return time.perf_counter() - started, int(out[:, width:].numel())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (1 on a busy machine: spinning thread pools stall under contention)",
    )
    args = parser.parse_args()
    policy = default_cpu_policy(sampling=SamplingConfig(), num_threads=args.threads)  # eval's protocol sampling
    batched = TransformersPolicy(
        policy.source, model=policy.model, tokenizer=policy.tokenizer, sampling=policy.sampling, batch_decode=True
    )
    time_policy(policy, 1, 4)  # warm-up
    time_generate(policy, 1, 4)
    print(
        f"torch threads: {torch.get_num_threads()}; {args.tokens} new tokens per prompt; median of {args.reps}",
        flush=True,
    )
    print("| batch | plain generate tok/s | policy, per request tok/s | policy, batch_decode tok/s | best / generate |")
    print("|---|---|---|---|---|")
    for batch in args.batches:
        sides = {"generate": (time_generate, policy), "policy": (time_policy, policy)}
        if batch > 1:
            sides["batched"] = (time_policy, batched)
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.reps):
            for name, (fn, target) in sides.items():
                seconds, count = fn(target, batch, args.tokens)
                rates[name].append(count / seconds)
        med = {name: statistics.median(r) for name, r in rates.items()}
        best = max(med.get("batched", 0.0), med["policy"])
        print(
            f"| {batch} | {med['generate']:.1f} | {med['policy']:.1f} | {med['batched']:.1f} | "
            if "batched" in med
            else f"| {batch} | {med['generate']:.1f} | {med['policy']:.1f} | (same as per request) | ",
            end="",
        )
        print(f"{best / med['generate']:.0%} |", flush=True)


if __name__ == "__main__":
    main()
