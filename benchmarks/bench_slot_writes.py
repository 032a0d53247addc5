"""The refresh's copy of P adapters into their GPU slots, by the slots' layout and order, side by side.

``lora_slots.copy_into_slots`` writes every resident adapter's factors into vLLM's stacked slot tensors.
With the members folded into the matmuls (``population_matmul``) each ``B`` slot is a strided view of the
widened weight; on the H200 at P = 256 (4B shape) the refresh's slot copies took 5.7-6.1 s with those
views written through index kernels, against 1.3-1.9 s into vLLM's own contiguous slots
(docs/scaling.md#folded-into-the-matmul).  Consecutive slots are now written as one slice per stacked
tensor.  This builds a vLLM-shaped LoRA manager for ``--layers`` decoder layers of a shape (the slot
tensors on the GPU when there is one, the adapters on the host) and times ``copy_into_slots`` until the
device holds the values, for both layouts, with the slots consecutive (the slice path) and reversed
(the index path), on the machine at hand:

    python benchmarks/bench_slot_writes.py --shape 4b --slots 16,256 --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "scripts")]

from agent_envs.es import lora_slots, population_matmul  # noqa: E402
from bench_lora_kernels import SHAPES, layers  # noqa: E402

RANK = 4


def adapters(shape: dict[str, int], n_layers: int, slots: int, pin: bool) -> list[dict[str, Any]]:
    """``slots`` adapters of rank 4 as vLLM's CPU ``LoRAModel`` holds them (bfloat16, page-locked where
    there is a GPU, a list per slice of a packed layer), by module name; drawn once per slot count and
    shared by every layout and order timed."""
    held: list[dict[str, Any]] = [{} for _ in range(slots)]
    for i in range(n_layers):
        for name, widths, inputs in layers(shape):
            for weights in held:
                parts_a = [torch.randn(RANK, inputs).to(torch.bfloat16) for _ in widths]
                parts_b = [torch.randn(w, RANK).to(torch.bfloat16) for w in widths]
                if pin:
                    parts_a, parts_b = [p.pin_memory() for p in parts_a], [p.pin_memory() for p in parts_b]
                packed = len(widths) > 1
                weights[f"layers.{i}.{name}"] = SimpleNamespace(
                    lora_a=parts_a if packed else parts_a[0], lora_b=parts_b if packed else parts_b[0]
                )
    return held


def manager(
    shape: dict[str, int], n_layers: int, held: list[dict[str, Any]], widened: bool, reverse: bool, device: torch.device
) -> Any:
    """A LoRA manager as ``lora_slots`` reads vLLM's, holding ``held`` (:func:`adapters`): each packed layer's
    slot tensors on ``device``; ``B`` as views of a widened weight (``widened``) or vLLM's own contiguous
    slots; slot ``k`` holding adapter ``k`` or, with ``reverse``, adapter ``slots - 1 - k``."""
    slots = len(held)
    modules: dict[str, Any] = {}
    for i in range(n_layers):
        for name, widths, inputs in layers(shape):
            a = tuple(torch.zeros(slots, 1, RANK, inputs, dtype=torch.bfloat16, device=device) for _ in widths)
            if widened:
                wide = torch.zeros(
                    sum(widths), inputs + len(widths) * slots * RANK, dtype=torch.bfloat16, device=device
                )
                b = population_matmul.slot_views(wide, slots, widths, RANK)
            else:
                b = tuple(torch.zeros(slots, 1, w, RANK, dtype=torch.bfloat16, device=device) for w in widths)
            modules[f"layers.{i}.{name}"] = SimpleNamespace(lora_a_stacked=a, lora_b_stacked=b, tp_size=1)
    ids = list(range(1, slots + 1))
    return SimpleNamespace(
        lora_index_to_id=ids[::-1] if reverse else ids,
        get_adapter={k: held[k - 1] for k in ids}.get,
        modules=modules,
        _get_lora_layer_weights=lambda lora_model, name: lora_model.get(name),
    )


def seconds(held: Any, repeats: int, device: torch.device) -> tuple[float, dict[str, float]]:
    """The median call of ``copy_into_slots`` for every adapter: its seconds until the device holds the values
    and its host stages (the first call, which allocates the staging buffer, not counted)."""
    ids = list(range(1, len(held.lora_index_to_id) + 1))
    lora_slots.copy_into_slots(held, ids)
    runs: list[tuple[float, dict[str, float]]] = []
    for _ in range(repeats):
        times: dict[str, float] = {}
        torch.cuda.synchronize() if device.type == "cuda" else None
        start = time.perf_counter()
        lora_slots.copy_into_slots(held, ids, times)
        torch.cuda.synchronize() if device.type == "cuda" else None
        runs.append((time.perf_counter() - start, times))
    return sorted(runs, key=lambda run: run[0])[len(runs) // 2]


def check(held: Any) -> None:
    """Every slot holds its adapter's factors (the timed paths must agree on what they write); each slot
    tensor read back once."""
    in_slots = [held.get_adapter(lora_id) for lora_id in held.lora_index_to_id]
    for name, module in held.modules.items():
        for kind in ("lora_a", "lora_b"):
            for k, stacked in enumerate(getattr(module, f"{kind}_stacked")):
                parts = [getattr(weights[name], kind) for weights in in_slots]
                want = torch.stack([p[k] if isinstance(p, list) else p for p in parts])
                if not torch.equal(stacked[:, 0].cpu(), want):
                    raise SystemExit(f"a slot of {name}.{kind} does not hold its adapter")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="4b")
    ap.add_argument("--slots", default="16,256", help="comma-separated adapter counts")
    ap.add_argument("--layers", type=int, default=0, help="decoder layers (0: the shape's all)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = SHAPES[args.shape]
    n_layers = args.layers or shape["num_hidden_layers"]
    print(f"device {device}, shape {args.shape}, {n_layers} layers, rank {RANK}, median of {args.repeats}")
    print(
        "| slots | slot tensors | slot order (path) | copy into the slots (s) | host: stack / queue (s) | vs widened, consecutive |"
    )
    print("|---|---|---|---|---|---|")
    for slots in (int(s) for s in args.slots.split(",")):
        rows, drawn = [], adapters(shape, n_layers, slots, device.type == "cuda")
        for widened in (True, False):
            for reverse in (False, True):
                held = manager(shape, n_layers, drawn, widened, reverse, device)
                wall, times = seconds(held, args.repeats, device)
                check(held)
                rows.append((widened, reverse, wall, times))
                del held
        base = rows[0][2]
        for widened, reverse, wall, times in rows:
            layout = "widened weight's B views" if widened else "vLLM's own (contiguous)"
            order = "reversed (index)" if reverse else "consecutive (slice)"
            stages = f"{times.get('stack_s', 0):.4f} / {times.get('queue_s', 0):.4f}"
            print(f"| {slots} | {layout} | {order} | {wall:.4f} | {stages} | {wall / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
