"""Tune vLLM's multi-LoRA shrink and expand Triton kernels for one model shape on this GPU.

A low-rank ES generation (docs/protocol.md#low-rank-es) serves every member through its own adapter,
so an engine step runs four LoRA shrink/expand pairs per layer; with vLLM's default kernel settings
they cost the 4B shape about as much again as the model's own matmuls (docs/scaling.md).  This grid
searches those kernels at the batches a generation runs (decode at P x B sequences, prefill chunks at
the engine's token budget), times each setting inside a CUDA graph (as the engine replays them), keeps
vLLM's default wherever it is not beaten, and writes the files vLLM reads from
``VLLM_TUNED_CONFIG_FOLDER`` (``{GPU}_SHRINK.json``, ``{GPU}_EXPAND_TRUE.json``; the layout of vLLM's
``vllm/lora/ops/triton_ops/README_TUNING.md``) with ``tuned_for.json`` (shape, adapter slots, rank
slot, GPU, batches).  The folder is one tuned set: copied into ``agent_envs/es/lora_kernel_configs/``
under the name it prints, ``agent_envs.es.lora_kernels`` gives it to every engine of that shape and
rank slot whose population is nearer to it than to any other set (docs/scaling.md#adding-a-tuned-set).
Compiling is the slow part: worker processes compile every setting first (Triton's disk cache),
then one process times them, so the GPU is timed alone.

    python scripts/tune_lora_kernels.py --out DIR            # Qwen3-4B shape, 16 adapters, rank slot 8
    python scripts/tune_lora_kernels.py --out DIR --model MODEL_DIR --max-loras 32
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_engine import QWEN3_4B  # noqa: E402

from agent_envs.es.lora_kernels import ENV, SHAPE_KEYS, SHIPPED, local_model_shape, model_shape, set_name  # noqa: E402

SHRINK_GRID = dict(block_m=(16, 32, 64), block_k=(32, 64, 128, 256), split_k=(1, 2, 4, 8, 16, 32), num_stages=(2,))
EXPAND_GRID = dict(block_m=(16, 32, 64), block_n=(32, 64, 128, 256), num_warps=(4,), num_stages=(2, 3))
#: batches given vLLM's own default in the files where they are not tuned (the lookup takes the nearest)
DEFAULT_BATCHES = (1, 32, 96, 1024, 4096)
REFUSED: set[str] = set()


def shapes(model: dict[str, int]) -> dict[str, list[tuple[str, tuple[int, ...], int]]]:
    """By op: (layer, slice sizes, input features) of the four LoRA layers of a dense decoder layer."""
    h, q, kv, i = (
        model["hidden_size"],
        model["num_attention_heads"] * model["head_dim"],
        model["num_key_value_heads"] * model["head_dim"],
        model["intermediate_size"],
    )
    layers = [("qkv", (q, kv, kv), h), ("o", (h,), q), ("gate_up", (i, i), h), ("down", (h,), i)]
    return {"shrink": layers, "expand": layers}


def grid(op: str, m: int, max_loras: int) -> list[dict[str, Any]]:
    """Settings worth trying at batch ``m``: a tile of rows no larger than twice one adapter's share."""
    per_lora = max(1, m // max_loras)
    space = SHRINK_GRID if op == "shrink" else EXPAND_GRID
    out = []
    for values in itertools.product(*space.values()):
        cfg = dict(zip(space, values))
        if cfg["block_m"] > max(16, 2 * per_lora):
            continue
        base = (
            {"block_n": 16, "num_warps": 4, "group_size_m": 8}
            if op == "shrink"
            else {"block_k": 16, "group_size_m": 8, "split_k": 1}
        )
        out.append({**base, "num_ctas": 1, "max_nreg": None, **cfg})
    return out


class Case:
    """One kernel call of the model (op, layer, batch) with its tensors, callable under a given setting."""

    def __init__(self, op: str, layer: tuple[str, tuple[int, ...], int], m: int, max_loras: int, rank: int) -> None:
        import torch
        from vllm.lora.ops.triton_ops import LoRAKernelMeta

        self.op, self.name, self.m = op, layer[0], m
        sizes, k_in = layer[1], layer[2]
        gen = torch.Generator().manual_seed(m)
        mapping = (torch.randperm(m, generator=gen) % max_loras).to(torch.int32).cuda()
        self.meta = LoRAKernelMeta.make(max_loras, m, "cuda")
        self.meta.prepare_tensors(mapping)
        self.args = self.meta.meta_args(m, False)
        dev, bf = "cuda", torch.bfloat16
        if op == "shrink":
            self.x = torch.randn(m, k_in, dtype=bf, device=dev)
            self.w = [torch.randn(max_loras, 1, rank, k_in, dtype=bf, device=dev) * 0.02 for _ in sizes]
            self.y = torch.empty(len(sizes), m, rank, dtype=torch.float32, device=dev)
            self.key = (str(self.args[4].size(0)), str(len(sizes)), str(m), str(k_in), str(rank))
        else:
            self.x = torch.randn(len(sizes), m, rank, dtype=torch.float32, device=dev)
            self.w = [torch.randn(max_loras, 1, s, rank, dtype=bf, device=dev) * 0.02 for s in sizes]
            self.y = torch.zeros(m, sum(sizes), dtype=bf, device=dev)
            self.key = (str(self.args[4].size(0)), str(len(sizes)), str(m), str(rank), str(max(sizes)))

    def run(self, cfg: dict[str, Any]) -> None:
        from vllm.lora.ops.triton_ops import lora_expand_op, lora_shrink_op

        module = lora_shrink_op if self.op == "shrink" else lora_expand_op
        module.get_lora_op_configs = lambda *a, **k: cfg  # the setting under test, for this call only
        if self.op == "shrink":
            lora_shrink_op._lora_shrink(self.x, self.w, self.y, *self.args, 1.0)
        else:
            lora_expand_op._lora_expand(self.x, self.w, self.y, *self.args, offset_start=0, add_inputs=True)


def default(op: str, key: tuple[str, ...]) -> dict[str, Any]:
    """vLLM's own setting for the call at ``key`` (max_loras, slices, m, k, n)."""
    from vllm.lora.ops.triton_ops.utils import get_lora_op_configs

    max_loras, slices, m, k, n = (int(v) for v in key)
    hidden, rank = (k, n) if op == "shrink" else (n, k)
    extra = {} if op == "shrink" else {"add_inputs": True}
    return dict(get_lora_op_configs(op, max_loras, m, hidden, rank, slices, **extra))


def cases(model: dict[str, int], batches: list[int], max_loras: int, rank: int) -> list[Case]:
    """Every call of a step, the first batch (decode) first."""
    return [
        Case(op, layer, m, max_loras, rank) for m in batches for op, layers in shapes(model).items() for layer in layers
    ]


def compile_part(job: tuple[dict[str, int], list[int], int, int, int, int]) -> int:
    """Worker ``part`` of ``parts``: run every setting of its share once (Triton compiles and caches)."""
    model, batches, max_loras, rank, part, parts = job
    done = 0
    for index, (case, cfg) in enumerate(
        (c, g) for c in cases(model, batches, max_loras, rank) for g in grid(c.op, c.m, max_loras)
    ):
        if index % parts == part:
            try:
                case.run(cfg)
            except Exception:  # noqa: BLE001  (a setting the kernel refuses is left out when timed)
                pass
            done += 1
    return done


def time_ms(case: Case, cfg: dict[str, Any]) -> float | None:
    """Median milliseconds of one call replayed in a CUDA graph (None: the setting fails)."""
    import torch
    from triton.testing import do_bench_cudagraph

    try:
        case.run(cfg)
        torch.cuda.synchronize()
        return float(do_bench_cudagraph(lambda: case.run(cfg), rep=20, return_mode="median"))
    except Exception as exc:  # noqa: BLE001  (a setting the kernel refuses: left out, said once)
        if type(exc).__name__ not in REFUSED:
            REFUSED.add(type(exc).__name__)
            print(f"a setting failed ({cfg}): {exc!r}"[:600], flush=True)
        torch.cuda.synchronize()
        return None


def put(tree: dict[str, Any], key: tuple[str, ...], value: Any) -> None:
    for part in key[:-1]:
        tree = tree.setdefault(part, {})
    tree[key[-1]] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help=f"folder for the JSON files (what {ENV} names)")
    parser.add_argument("--model", help="a model folder: its config.json's shape (default: the Qwen3-4B shape)")
    parser.add_argument(
        "--max-loras", type=int, default=16, help="the engine's max_loras (agent-envs es: the population)"
    )
    parser.add_argument("--rank-slot", type=int, default=8, help="the engine's max_lora_rank")
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 16384], help="decode batch, prefill chunk")
    parser.add_argument("--compile-workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--budget-s", type=float, default=240, help="stop timing after this long (vLLM defaults kept)")
    args = parser.parse_args()
    os.environ.pop(ENV, None)  # the defaults compared against are vLLM's own
    model = local_model_shape(args.model) if args.model else model_shape(QWEN3_4B)
    if model is None:
        parser.error(f"--model {args.model}: no config.json with {', '.join(SHAPE_KEYS)}")
    start = time.perf_counter()
    jobs = [
        (model, args.batches, args.max_loras, args.rank_slot, p, args.compile_workers)
        for p in range(args.compile_workers)
    ]
    with ProcessPoolExecutor(args.compile_workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        compiled = sum(pool.map(compile_part, jobs))
    print(
        f"compiled {compiled} settings on {args.compile_workers} workers in {time.perf_counter() - start:.0f} s",
        flush=True,
    )
    import torch

    files: dict[str, dict[str, Any]] = {"shrink": {}, "expand": {}}
    rows = []
    for case in cases(model, args.batches, args.max_loras, args.rank_slot):
        vllm_default = default(case.op, case.key)
        for m in DEFAULT_BATCHES:
            key = (*case.key[:2], str(m), *case.key[3:])
            put(files[case.op], key, default(case.op, key))
        base = time_ms(case, vllm_default)
        if base is None or time.perf_counter() - start > args.budget_s:
            print(f"{case.op:6} {case.name:8} m={case.m:6} kept vLLM's default (untimed or out of time)", flush=True)
            put(files[case.op], case.key, vllm_default)
            continue
        best, best_ms = vllm_default, base
        for cfg in grid(case.op, case.m, args.max_loras):
            ms = time_ms(case, cfg)
            if ms is not None and ms < best_ms:
                best, best_ms = cfg, ms
        put(files[case.op], case.key, best)
        rows.append((case.op, case.name, case.m, base, best_ms, best))
        print(
            f"{case.op:6} {case.name:8} m={case.m:6} default {base:.4f} ms  best {best_ms:.4f} ms  {best}", flush=True
        )
    gpu = torch.cuda.get_device_name().replace(" ", "_").replace("-", "_")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{gpu}_SHRINK.json").write_text(json.dumps(files["shrink"], indent=1, sort_keys=True))
    (out / f"{gpu}_EXPAND_TRUE.json").write_text(json.dumps(files["expand"], indent=1, sort_keys=True))
    import triton
    import vllm

    tuned_for = {
        "batches": args.batches,
        "command": " ".join(["python", "scripts/tune_lora_kernels.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "gpus": [torch.cuda.get_device_name()],
        "max_lora_rank": args.rank_slot,
        "max_loras": args.max_loras,
        "shape": model,
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "vllm": vllm.__version__},
    }
    (out / "tuned_for.json").write_text(json.dumps(tuned_for, indent=1, sort_keys=True))
    print("| op | layer | batch | vLLM default (ms) | tuned (ms) | ratio |\n|---|---|---|---|---|---|")
    for op, name, m, base, best_ms, _ in rows:
        print(f"| {op} | {name} | {m} | {base:.4f} | {best_ms:.4f} | {base / best_ms:.2f}x |")
    per_step = {m: sum(b for _, _, mm, b, _, _ in rows if mm == m) for m in args.batches}
    tuned = {m: sum(t for _, _, mm, _, t, _ in rows if mm == m) for m in args.batches}
    for m in sorted({r[2] for r in rows}):
        print(f"batch {m}: one decoder layer's LoRA kernels {per_step[m]:.3f} -> {tuned[m]:.3f} ms")
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s")
    target = SHIPPED / set_name(model, args.max_loras, args.rank_slot)
    print(
        f"ship it as a tuned set: cp -r {out} {target}  (a set of this name exists: copy the {gpu}_*.json "
        "files in and add the GPU to its tuned_for.json's gpus)"
    )


if __name__ == "__main__":
    main()
