#!/usr/bin/env python3
"""Check seeded perturbation on a real vLLM engine (run on a GPU with official vLLM).

Prints: parameter coverage, the max abs difference after apply + revert (bf16 rounding only),
the same after update + reset, and whether a perturbed model generates differently.

    python scripts/gpu_es_check.py --model <folder> --load-format dummy
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # callables below run in-process
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_envs.es.worker import VLLMPerturbation  # noqa: E402
from gpu_engine import add_engine_args, make_llm  # noqa: E402


def _snapshot(worker) -> int:
    params = [p for p in worker.model_runner.model.parameters()]
    worker._es_check_snapshot = [p.detach().clone() for p in params]
    return sum(p.numel() for p in params)


def _max_abs_diff(worker) -> float:
    params = list(worker.model_runner.model.parameters())
    return max(float((p.detach().float() - s.float()).abs().max()) for p, s in zip(params, worker._es_check_snapshot))


def main() -> None:
    ap = argparse.ArgumentParser()
    add_engine_args(ap)
    ap.add_argument("--sigma", type=float, default=1e-3)
    args = ap.parse_args()
    from vllm import SamplingParams

    llm = make_llm(args, max_model_len=2048)
    es = VLLMPerturbation(llm, scope="full")
    out: dict = {"tp_size": es.tp_size, "coverage": es.coverage()[0]}
    out["elements_per_rank"] = llm.collective_rpc(_snapshot)
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    base = llm.generate(["The capital of France is"], greedy, use_tqdm=False)[0].outputs[0].token_ids
    c0 = es.checksum()
    es.apply(1571296235, args.sigma)
    out["perturbed_max_abs_diff"] = max(llm.collective_rpc(_max_abs_diff))
    pert = llm.generate(["The capital of France is"], greedy, use_tqdm=False)[0].outputs[0].token_ids
    out["perturbed_output_differs"] = list(pert) != list(base)
    es.revert(1571296235, args.sigma)
    out["apply_revert_max_abs_diff"] = max(llm.collective_rpc(_max_abs_diff))
    try:
        es.apply(1, args.sigma)
        es.update([1, 2], [1.0, -1.0], 5e-4)
        out["update_while_perturbed"] = "accepted (BUG)"
    except Exception as exc:  # the guard must refuse
        out["update_while_perturbed"] = f"refused: {type(exc).__name__}"
        es.revert(1, args.sigma)
    es.update([11, 12, 13, 14], [1.2, -0.4, 0.1, -0.9], 5e-4)
    out["after_update_max_abs_diff"] = max(llm.collective_rpc(_max_abs_diff))
    es.reset()
    out["update_reset_max_abs_diff"] = max(llm.collective_rpc(_max_abs_diff))
    out["checksum_start"], out["checksum_end"] = c0, es.checksum()
    print("RESULT " + json.dumps(out, default=str))


if __name__ == "__main__":
    main()
