#!/usr/bin/env python3
"""Check seeded perturbation on a real vLLM engine (run on a GPU with official vLLM).

Prints: parameter coverage (per rank), the max abs difference after apply + revert (bf16 rounding only),
the same after update + reset, and whether a perturbed model generates differently.

    python scripts/gpu_es_check.py --model <folder> --load-format dummy [--tp 2]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_envs.es.worker import VLLMPerturbation  # noqa: E402
from gpu_engine import add_engine_args, make_llm  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    add_engine_args(ap)
    ap.add_argument("--sigma", type=float, default=1e-3)
    args = ap.parse_args()
    from vllm import SamplingParams

    llm = make_llm(args, max_model_len=2048)
    es = VLLMPerturbation(llm, scope="full")
    out: dict = {"tp_size": es.tp_size, "coverage": es.coverage()}
    es.snapshot()  # every diagnostic below is a worker method called by name: works with TP > 1
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    base = llm.generate(["The capital of France is"], greedy, use_tqdm=False)[0].outputs[0].token_ids
    c0 = es.checksum()
    es.apply(1571296235, args.sigma)
    out["perturbed_max_abs_diff"] = es.max_abs_diff()
    pert = llm.generate(["The capital of France is"], greedy, use_tqdm=False)[0].outputs[0].token_ids
    out["perturbed_output_differs"] = list(pert) != list(base)
    es.revert(1571296235, args.sigma)
    out["apply_revert_max_abs_diff"] = es.max_abs_diff()
    try:
        es.apply(1, args.sigma)
        es.update([1, 2], [1.0, -1.0], 5e-4)
        out["update_while_perturbed"] = "accepted (BUG)"
    except Exception as exc:  # the guard must refuse
        out["update_while_perturbed"] = f"refused: {type(exc).__name__}"
        es.revert(1, args.sigma)
    es.update([11, 12, 13, 14], [1.2, -0.4, 0.1, -0.9], 5e-4)
    out["after_update_max_abs_diff"] = es.max_abs_diff()
    es.reset()
    out["update_reset_max_abs_diff"] = es.max_abs_diff()
    out["checksum_start"], out["checksum_end"] = c0, es.checksum()
    print("RESULT " + json.dumps(out, default=str))


if __name__ == "__main__":
    main()
