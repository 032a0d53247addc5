#!/usr/bin/env python3
"""A member served through its LoRA adapter == the engine with that member's perturbation merged in
(docs/protocol.md#low-rank-es).  Runs on vllm-cpu (``--cpu``: float32) and on a GPU (bfloat16).

One engine (``enable_lora``, the ES worker extension).  For each of ``--members`` seeds an adapter is
written and registered as the low-rank trainer does (``member_adapters``: loaded into the engine at
registration; a folder without weights is refused there, by name); every prompt of every member goes to the engine in ONE batch, mixed, each with its own
adapter (greedy, ``--tokens`` tokens).  Then, member by member, the same perturbation is merged into
the weights in place (``es_lowrank_apply``), the prompts are generated without adapter, and the
weights are restored bit for bit.  Compared per member:

- greedy tokens: adapter vs merged (must be equal) and base vs merged (the perturbation is visible);
- log-probabilities: at every step where the two sequences still share their prefix (so both were
  conditioned on the same tokens), the largest absolute difference over the tokens in both top-5
  lists: adapter vs merged (the tolerance), next to base vs merged (the size of the effect it is
  measured against).  (Prompt log-probabilities are not used: vllm-cpu 0.32 fails them with LoRA.)

Then the resident adapters are rewritten in place as NEW members twice (drawn and written into the CPU
adapters ahead, ``VLLMLowRank.prefetch(refresh=)``, then ``VLLMLowRank.refresh``, as the trainer does from
its second generation on: the loaded adapters one by one, then, gathered for their slots by then, each
module's in one block, ``agent_envs.es.adapter_blocks``) and the second members compared with the same
members freshly written and loaded: greedy tokens equal, and the CPU and GPU-slot LoRA tensors equal bit for bit
(``slot_digest``); the refresh must call no ``add_lora``.  Its seconds are printed next to the
write-and-load path's.

    python scripts/es_lowrank_check.py --model <hf folder> [--cpu] [--rank 4] [--sigma 0.01]
        [--load-format dummy]   # a config and tokenizer folder is enough (scripts/gpu_engine.dense_qwen3)

Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Any
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpu_engine import vllm_cpu_env  # noqa: E402

if "--cpu" in sys.argv:  # before the worker extension is imported: keep vLLM-CPU's weights unpacked
    vllm_cpu_env()

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "Q: What is 17 + 25?\nA:",
]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--cpu", action="store_true", help="vllm-cpu: float32, unpacked linear weights")
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--sigma", type=float, default=0.01)
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--eager", action="store_true", help="enforce_eager=True (no CUDA graphs)")
    ap.add_argument(
        "--lora-kernel",
        choices=("vllm", "population", "matmul"),
        default="vllm",
        help="the adapters' kernels: vLLM's multi-LoRA ones, agent_envs.es.population_lora's, or those with the "
        "expand folded into the matmul (agent_envs.es.population_matmul)",
    )
    ap.add_argument(
        "--load-format", default="auto", help="vLLM load_format: 'dummy' takes a config-only folder (random weights)"
    )
    return ap.parse_args()


def build_llm(args: argparse.Namespace):
    from vllm import LLM

    from agent_envs.es.lowrank import lora_engine_keywords
    from agent_envs.es.worker import EXTENSION
    from agent_envs.policy.vllm import whole_prompts_on_cpu

    kwargs: dict = {
        "model": args.model,
        "worker_extension_cls": EXTENSION,
        "max_model_len": 512,
        "seed": 0,
        # the resident adapters and, to compare, freshly loaded ones
        **lora_engine_keywords(2 * args.members, args.rank),
        "enforce_eager": args.eager or args.cpu,
        "load_format": args.load_format,
    }
    if args.tokenizer:
        kwargs["tokenizer"] = args.tokenizer
    if args.cpu:
        kwargs["dtype"] = "float32"
    else:
        kwargs.update(dtype="bfloat16", gpu_memory_utilization=0.3)
    whole_prompts_on_cpu(kwargs)  # a bare engine: vllm-cpu fails seeded requests whose prefill is split
    return LLM(**kwargs)


def bad_adapter_refused(policy, root: Path) -> str | None:
    """A folder with a config but no weights: refused when registered, by name (None if accepted)."""
    folder = root / "no-weights"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 4, "target_modules": ["q_proj"]})
    )
    try:
        policy.add_adapter("check-no-weights", folder)
    except ValueError as exc:
        return str(exc) if "check-no-weights" in str(exc) and "check-no-weights" not in policy.adapters else None
    policy.remove_adapter("check-no-weights")
    return None


def refreshed_equals_fresh(llm, policy, es, loras, generate, args, root: Path) -> dict:
    """Rewrite the resident ``loras`` in place as new members, from adapters drawn ahead as the trainer
    does; compare with the same members loaded from freshly written folders (tokens, and the LoRA
    tensors bit for bit)."""
    from agent_envs.es.batched import member_adapters

    seeds = [2038074743 + 104729 * i for i in range(len(loras))]
    ids = [lora.lora_int_id for lora in loras]
    engine, add_lora, calls = llm.llm_engine, llm.llm_engine.add_lora, []

    def counted_add_lora(*a: Any, **k: Any) -> Any:
        calls.append(a)
        return add_lora(*a, **k)

    engine.add_lora = counted_add_lora
    try:
        # drawn and written into the CPU adapters ahead, as the trainer has it done during the rollouts: a
        # generation's members first (the loaded adapters written one by one, then gathered for their slots),
        # then the members compared (each module's adapters in one block since: agent_envs.es.adapter_blocks)
        first = [s + 1 for s in seeds]
        es.prefetch(first, args.sigma, refresh=(ids, first, args.sigma, None))
        first_unsupported = es.refresh(ids, first, args.sigma)
        first_in_blocks = es.last_refresh.get("ahead_blocks")
        before = [es.slot_digest(i) for i in ids]
        es.prefetch(seeds, args.sigma, refresh=(ids, seeds, args.sigma, None))
        start = time.perf_counter()
        unsupported = es.refresh(ids, seeds, args.sigma) or first_unsupported
        refresh_s = time.perf_counter() - start
    finally:
        engine.add_lora = add_lora
    refreshed = generate(loras)
    after = [es.slot_digest(i) for i in ids]
    start = time.perf_counter()
    with member_adapters(policy, es.targets, seeds, args.sigma, args.rank, 1, root=root) as names:
        files_s = time.perf_counter() - start
        fresh_loras = [policy.adapters[name] for name in names]
        fresh = generate(fresh_loras)
        fresh_digests = [es.slot_digest(lora.lora_int_id) for lora in fresh_loras]
    return {
        "unsupported": unsupported,
        "add_lora_calls": len(calls),
        "worker": es.last_refresh,
        "written_ahead": "ahead_write_s" in es.last_refresh,
        "first_in_blocks": first_in_blocks,
        "in_blocks": es.last_refresh.get("ahead_blocks"),
        "seconds": round(refresh_s, 4),
        "files_seconds": round(files_s, 4),
        "changed": all(a != b for a, b in zip(before, after)),
        "tokens_equal_fresh": [[s[0] for s in m] for m in refreshed] == [[s[0] for s in m] for m in fresh],
        "tensors_equal_fresh": after == fresh_digests,
    }


def main() -> None:
    args = parse_args()
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from agent_envs.es.batched import member_adapters
    from agent_envs.es.lowrank import adapter_root
    from agent_envs.es.worker import VLLMLowRank
    from agent_envs.policy.vllm import VLLMPolicy

    start = time.perf_counter()
    if args.lora_kernel != "vllm":  # before the engine builds (and compiles) its model
        from agent_envs.es.population_lora import install

        install(args.rank, args.lora_kernel)
    llm = build_llm(args)
    started = time.perf_counter()
    es = VLLMLowRank(llm, args.rank)
    tok = llm.get_tokenizer()
    prompts = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.tokens, seed=0, logprobs=5)
    seeds = [1571296235 + 7919 * i for i in range(args.members)]

    def generate(loras=None):
        """Per member (or the base), per prompt: (greedy token ids, top-5 log-probabilities per step)."""
        batch = [TokensPrompt(prompt_token_ids=p) for p in prompts] * (len(loras) if loras else 1)
        outs = llm.generate(
            batch, greedy, lora_request=loras and [lora for lora in loras for _ in prompts], use_tqdm=False
        )
        seqs = [
            (
                list(o.outputs[0].token_ids),
                [{t: lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs],
            )
            for o in outs
        ]
        return [seqs[i * len(prompts) : (i + 1) * len(prompts)] for i in range(len(loras) if loras else 1)]

    def max_logprob_diff(a, b) -> float:
        """Largest |log p| difference over shared top-5 tokens, at steps with a shared prefix."""
        worst = 0.0
        for (ids_a, lps_a), (ids_b, lps_b) in zip(a, b):
            for step, (la, lb) in enumerate(zip(lps_a, lps_b)):
                if ids_a[:step] != ids_b[:step]:
                    break
                worst = max([worst, *(abs(la[t] - lb[t]) for t in la.keys() & lb.keys())])
        return worst

    policy = VLLMPolicy(llm=llm)  # the trainer's path: adapters written in parallel, loaded at registration
    with (
        tempfile.TemporaryDirectory(prefix="agent-envs-lowrank-check-", dir=adapter_root()) as root,
        member_adapters(policy, es.targets, seeds, args.sigma, args.rank, 0, root=root) as names,
    ):
        loras = [policy.adapters[name] for name in names]
        loaded_at_registration = {lora.lora_int_id for lora in loras} <= llm.llm_engine.list_loras()
        refused = bad_adapter_refused(policy, Path(root))
        base = generate()[0]
        mixed = generate(loras)  # every member's prompts in one batch, each through its own adapter
        c0 = es.checksum()[0]
        members = []
        for seed, through_adapter in zip(seeds, mixed):
            es.apply(seed, args.sigma)
            merged = generate()[0]
            es.revert()
            members.append(
                {
                    "seed": seed,
                    "tokens_equal": [s[0] for s in merged] == [s[0] for s in through_adapter],
                    "prompts_equal": sum(a[0] == b[0] for a, b in zip(merged, through_adapter)),
                    "base_differs": [s[0] for s in merged] != [s[0] for s in base],
                    "max_abs_logprob_diff_adapter_vs_merged": max_logprob_diff(through_adapter, merged),
                    "max_abs_logprob_diff_base_vs_merged": max_logprob_diff(base, merged),
                }
            )
        restored = es.checksum()[0] == c0
        refresh = refreshed_equals_fresh(llm, policy, es, loras, generate, args, Path(root))
    out = {
        "device": "cpu" if args.cpu else "gpu",
        "dtype": "float32" if args.cpu else "bfloat16",
        "rank": args.rank,
        "sigma": args.sigma,
        "n_targets": len(es.targets),
        "lora_layers": es.init_result[0]["lora_layers"],
        "prompts": len(prompts),
        "engine_start_s": round(started - start, 1),
        "restored_bit_exact": restored,
        "loaded_at_registration": loaded_at_registration,
        "bad_adapter_refused": refused,
        "members": members,
        "max_abs_logprob_diff": max(m["max_abs_logprob_diff_adapter_vs_merged"] for m in members),
        "all_tokens_equal": all(m["tokens_equal"] for m in members),
        "refresh": refresh,
        "lora_kernel": es.lora_kernel(),
    }
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
