"""One decoder layer's LoRA work on the GPU, side by side: vLLM's multi-LoRA kernels against the population
kernels (agent_envs/es/population_lora.py), with the layer's own matmuls as the yardstick.

For each model shape, population P and batch M (a decode step of P x B sequences, a prefill chunk), the four
packed linear layers of a decoder layer (qkv, o, gate_up, down) are run as an engine step runs them, each
timed inside a CUDA graph (as the engine replays it):

- ``base``: the four matmuls ``x @ W^T`` (bfloat16, what the engine runs with no adapter);
- ``vllm``: vLLM's ``lora_shrink`` + ``lora_expand`` for every layer, as ``add_lora_linear`` calls them,
  with the settings vLLM picks (``VLLM_TUNED_CONFIG_FOLDER`` if set, else its defaults);
- ``population``: the population kernels for every layer (their tiles by the batch's token count);
- ``matmuls then population``: each matmul followed by its layer's population kernels, what an engine
  step runs; ``on two streams``: the population kernels on a second CUDA stream into zeros while the
  matmul runs, then added (vLLM's ``VLLM_LORA_ENABLE_DUAL_STREAM`` arrangement); ``A stacked under W``: one
  matmul with every member's ``A`` under the layer's weight, whose extra columns are the shrink, then the
  expand alone (``expand_columns``): what folding the shrink into the layer's matmul would cost, measured
  before building it into an engine (``max_abs_diff_stacked``: against the matmul and the two launches);
- ``folded into the matmul``: what agent_envs/es/population_matmul.py runs, ``widen`` (``[x | h]``) then one
  matmul with the widened weight ``[W | B_all]`` (``max_abs_diff_folded``: against the matmul and the two
  launches), with ``widen``'s best tiles (tokens, features) from a small grid beside it, and the best of its
  two-launch form (a program per step of features, the parts added by a second launch); then its matmuls
  alone on a prebuilt ``[x | h]`` (the folded path's cost beyond ``widen``), and the same with the inner size
  padded by zero columns to a multiple of 128 (whether cuBLAS wants the aligned shape: 4B's qkv widens
  2,560 to 2,752 at P = 16);
- ``folded, packed layers in planes``: the same with qkv and gate_up in planes
  (``population_matmul.planes_for``): the slices share one block of member columns, ``widen`` writes a plane
  ``[x | h_s]`` per slice and each slice is a GEMM of its own (``max_abs_diff_folded_planes``: against the
  matmul and the two launches).

Columns ``+vllm`` and ``+population`` are the LoRA time over ``base`` (what adapters add to the layer's
matmuls); ``max |diff|`` compares the two LoRA outputs (both accumulate in float32, round to bfloat16).
Tokens are spread over the members as an engine's batch is: a decode step one token per sequence,
members interleaved; a prefill chunk whole prompts, each a run of one member's tokens.

    python benchmarks/bench_lora_kernels.py                       # 4B and 135M shapes, P 16,64,256
    python benchmarks/bench_lora_kernels.py --shape 4b --population 16 --batches 256,16384
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from gpu_engine import QWEN3_4B, SMOLLM2_135M  # noqa: E402

SHAPES = {"4b": QWEN3_4B, "135m": SMOLLM2_135M}
#: tile sizes tried for the population kernels (tokens, columns, features); the table's column is the default's
BLOCK_GRID = [{"tokens": t, "columns": c, "features": f} for t in (16, 32, 64) for c in (64, 128) for f in (128, 256)]
#: the multiple the widened matmuls' inner size is padded to in the comparison row
PAD_TO = 128
#: ``widen``'s tiles tried (tokens per program, input features per step)
#: (the third session's grid stopped at 1,024 features, still getting faster: 0.193, 0.153, 0.138 ms for 256,
#: 512, 1,024 at P = 16; from 2,048 each step's products are summed at once, population_lora_triton.SUM_EACH_STEP_FROM)
#: Tiles of more than 2,048 token-features stay out: with them this benchmark sat on the H200 host for 9 minutes
#: without a row or a busy GPU (2026-12-04, ninth session, its main thread waiting on a child process, most
#: likely the compiler: each program holds tokens x rank x features products before it sums them)
WIDEN_GRID = [{"tokens": t, "features": f} for t in (1, 2, 4, 8) for f in (256, 512, 1024, 2048) if t * f <= 2048]
#: the same for ``widen``'s two-launch form (split 1: a program per token tile and step of features, then the
#: parts added), whose ``tl.dot`` needs token tiles of 16 and more
WIDEN_SPLIT_GRID = [{"tokens": t, "features": f, "split": 1} for t in (16, 32) for f in (64, 128, 256, 512)]


def layers(shape: dict[str, int]) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, slice widths, input features) of a dense decoder layer's packed linear layers."""
    h, i = shape["hidden_size"], shape["intermediate_size"]
    q, kv = shape["num_attention_heads"] * shape["head_dim"], shape["num_key_value_heads"] * shape["head_dim"]
    return [("qkv", (q, kv, kv), h), ("o", (h,), q), ("gate_up", (i, i), h), ("down", (h,), i)]


def token_slots(m: int, population: int, decode: bool) -> Any:
    import torch

    t = torch.arange(m)
    return (t % population if decode else (t * population // m) % population).cuda()


class Layer:
    """One packed linear layer's tensors for ``m`` tokens, ``population`` adapter slots."""

    def __init__(self, spec: tuple[str, tuple[int, ...], int], m: int, population: int, rank: int, slot: int) -> None:
        import torch

        self.name, self.widths, k = spec
        gen = torch.Generator(device="cuda").manual_seed(m + k)
        bf = dict(dtype=torch.bfloat16, device="cuda")
        self.x = torch.randn(m, k, generator=gen, **bf)
        self.w = torch.randn(sum(self.widths), k, generator=gen, **bf) * 0.02
        self.a = [torch.zeros(population, 1, slot, k, **bf) for _ in self.widths]
        self.b = [torch.zeros(population, 1, w, slot, **bf) for w in self.widths]
        for a, b in zip(self.a, self.b):
            a[:, :, :rank].normal_(generator=gen)
            b[:, :, :, :rank].normal_(generator=gen).mul_(0.01)
        self.y = torch.zeros(m, sum(self.widths), **bf)


def run_vllm(layer: Layer, meta_args: tuple[Any, ...]) -> None:
    import torch
    from vllm.lora.ops.triton_ops import lora_expand_op, lora_shrink_op

    rank_slot = layer.b[0].shape[-1]
    buffer = torch.empty((len(layer.widths), layer.x.shape[0], rank_slot), dtype=torch.float32, device="cuda")
    lora_shrink_op._lora_shrink(layer.x, layer.a, buffer, *meta_args, 1.0)
    lora_expand_op._lora_expand(buffer, layer.b, layer.y, *meta_args, offset_start=0, add_inputs=True)


def measure(
    shape_name: str, population: int, m: int, decode: bool, rank: int, slot: int, grid: bool = True
) -> dict[str, Any]:
    import torch
    from triton.testing import do_bench_cudagraph
    from vllm.lora.ops.triton_ops import LoRAKernelMeta

    from agent_envs.es.population_lora_triton import expand_columns, launch, widen
    from agent_envs.es.population_matmul import widened_weight

    specs = layers(SHAPES[shape_name])
    slots = token_slots(m, population, decode)
    meta = LoRAKernelMeta.make(population, m, "cuda")
    meta.prepare_tensors(slots.to(torch.int32))
    meta_args = meta.meta_args(m, False)
    order = (meta.token_indices_sorted_by_lora_ids, meta.lora_token_start_loc)  # as the engine's wrapper gives them
    group = [Layer(spec, m, population, rank, slot) for spec in specs]

    def base() -> None:
        for layer in group:
            torch.matmul(layer.x, layer.w.t(), out=layer.y)

    def vllm() -> None:
        for layer in group:
            run_vllm(layer, meta_args)

    def population_kernels(blocks: dict[str, int] | None = None) -> None:
        for layer in group:
            launch(layer.y, layer.x, slots, layer.a, layer.b, layer.widths, rank, blocks=blocks, order=order)

    def base_then_population() -> None:  # what an engine step runs: each matmul, then its members' terms added
        for layer in group:
            torch.matmul(layer.x, layer.w.t(), out=layer.y)
            launch(layer.y, layer.x, slots, layer.a, layer.b, layer.widths, rank, order=order)

    stacked = [  # every member's A stacked under W: one GEMM gives y and h, then the expand alone
        torch.cat([layer.w, *(a.reshape(-1, a.shape[-1]) for a in layer.a)]) for layer in group
    ]
    wide = [torch.empty(m, w.shape[0], dtype=layer.y.dtype, device="cuda") for w, layer in zip(stacked, group)]

    def stacked_then_expand() -> None:
        for layer, w, out in zip(group, stacked, wide):
            torch.matmul(layer.x, w.t(), out=out)
            n = sum(layer.widths)
            expand_columns(out[:, :n], out[:, n:], slots, layer.b, layer.widths, rank, order=order)

    widened = [widened_weight(layer.w, layer.b, layer.widths, rank) for layer in group]
    folded_out = [torch.empty_like(layer.y) for layer in group]

    def folded(blocks: dict[str, int] | None = None) -> None:
        for layer, w, out in zip(group, widened, folded_out):
            torch.matmul(widen(layer.x, slots, layer.a, rank, order=order, blocks=blocks), w.t(), out=out)

    # in planes (population_matmul.planes_for): a packed layer's slices share one block of member columns,
    # each slice a GEMM of its own; a layer of one slice stays as it is
    in_planes = [len(layer.widths) > 1 for layer in group]
    widened_planes = [
        widened_weight(layer.w, layer.b, layer.widths, rank, planes) for layer, planes in zip(group, in_planes)
    ]
    planes_out: list[Any] = [None] * len(group)

    def folded_planes() -> None:
        for i, (layer, w, planes) in enumerate(zip(group, widened_planes, in_planes)):
            x = widen(layer.x, slots, layer.a, rank, order=order, planes=planes)
            if planes:
                planes_out[i] = torch.ops.agent_envs.population_plane_linear(x, w, list(layer.widths), None)
            else:
                planes_out[i] = torch.matmul(x, w.t())

    # the widened matmuls alone, on a prebuilt [x | h] (what folding costs beyond ``widen``), and with the
    # inner size padded by zero columns to a multiple of PAD_TO (whether the GEMM wants aligned shapes)
    widened_in = [widen(layer.x, slots, layer.a, rank, order=order) for layer in group]
    padded = [torch.nn.functional.pad(t, (0, -t.shape[1] % PAD_TO)) for t in widened]
    padded_in = [torch.nn.functional.pad(t, (0, -t.shape[1] % PAD_TO)) for t in widened_in]

    def widened_matmuls(weights: list[Any], inputs: list[Any]) -> None:
        for w, x, out in zip(weights, inputs, folded_out):
            torch.matmul(x, w.t(), out=out)

    side = torch.cuda.Stream()
    terms = [torch.zeros_like(layer.y) for layer in group]
    events = [(torch.cuda.Event(), torch.cuda.Event()) for _ in group]

    def two_streams() -> None:
        """vLLM's ``VLLM_LORA_ENABLE_DUAL_STREAM`` arrangement: the members' terms computed on a second
        stream into zeros while the matmul runs, then added to its output."""
        for layer, term, (forked, joined) in zip(group, terms, events):
            forked.record()
            side.wait_event(forked)
            torch.matmul(layer.x, layer.w.t(), out=layer.y)
            with torch.cuda.stream(side):
                term.zero_()
                launch(term, layer.x, slots, layer.a, layer.b, layer.widths, rank, add=False, order=order)
                joined.record()
            torch.cuda.current_stream().wait_event(joined)
            layer.y.add_(term)

    diff = 0.0
    for layer in group:
        layer.y.zero_()
        run_vllm(layer, meta_args)
        want = layer.y.clone()
        layer.y.zero_()
        launch(layer.y, layer.x, slots, layer.a, layer.b, layer.widths, rank, order=order)
        diff = max(diff, (want.float() - layer.y.float()).abs().max().item())
    torch.cuda.synchronize()
    times: dict[str, float | None] = {
        f"{name}_ms": float(do_bench_cudagraph(fn, rep=50, return_mode="median"))
        for name, fn in (
            ("base", base),
            ("vllm", vllm),
            ("population", population_kernels),
            ("base_population", base_then_population),
            ("stacked", stacked_then_expand),
            ("folded", folded),
            ("folded_planes", folded_planes),
            ("widened_matmuls", functools.partial(widened_matmuls, widened, widened_in)),
            ("widened_padded", functools.partial(widened_matmuls, padded, padded_in)),
        )
    }
    stacked_diff = 0.0  # the stacked GEMM's output against each matmul followed by the two launches
    for layer in group:
        torch.matmul(layer.x, layer.w.t(), out=layer.y)
        launch(layer.y, layer.x, slots, layer.a, layer.b, layer.widths, rank, order=order)
    stacked_then_expand()
    folded()
    folded_planes()
    folded_diff = planes_diff = 0.0
    for layer, out, fold, plane in zip(group, wide, folded_out, planes_out):
        stacked_diff = max(stacked_diff, (layer.y.float() - out[:, : sum(layer.widths)].float()).abs().max().item())
        folded_diff = max(folded_diff, (layer.y.float() - fold.float()).abs().max().item())
        planes_diff = max(planes_diff, (layer.y.float() - plane.float()).abs().max().item())
    failed = None
    try:  # a second stream inside a captured graph: kept apart, so a failure costs this column only
        times["two_streams_ms"] = float(do_bench_cudagraph(two_streams, rep=50, return_mode="median"))
    except Exception as exc:  # reported in the row and printed
        times["two_streams_ms"], failed = None, f"{type(exc).__name__}: {exc}"
        print(f"two streams failed: {failed}", file=sys.stderr)

    def best_of(fn: Any, settings: list[dict[str, int]]) -> tuple[str | None, dict[str, float]]:
        tried = {}
        for blocks in settings:
            started = time.perf_counter()
            fn(blocks)
            key = ",".join(str(v) for v in blocks.values())
            tried[key] = float(do_bench_cudagraph(functools.partial(fn, blocks), rep=20, return_mode="median"))
            # one line a setting, so a run cut short still shows how far it got and what each one took
            print(
                f"  {fn.__name__} {key}: {tried[key]:.3f} ms ({time.perf_counter() - started:.1f} s)", file=sys.stderr
            )
        return (min(tried, key=tried.__getitem__) if tried else None), tried

    # the population kernels' tile sizes (which would suit this batch better), then widen's
    best, tried = best_of(population_kernels, BLOCK_GRID if grid else [])
    best_widen, tried_widen = best_of(folded, WIDEN_GRID if grid else [])
    best_split, tried_split = best_of(folded, WIDEN_SPLIT_GRID if grid else [])
    return {
        "shape": shape_name,
        "population": population,
        "m": m,
        **times,
        "max_abs_diff": diff,
        "max_abs_diff_stacked": stacked_diff,
        "max_abs_diff_folded": folded_diff,
        "max_abs_diff_folded_planes": planes_diff,
        "two_streams_failed": failed,
        "best_blocks": best,
        "best_ms": tried[best] if best else None,
        "tried": tried,
        "best_widen": best_widen,
        "best_folded_ms": tried_widen[best_widen] if best_widen else None,
        "tried_widen": tried_widen,
        "best_split": best_split,
        "best_split_ms": tried_split[best_split] if best_split else None,
        "tried_split": tried_split,
    }


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| shape | P | batch M (tokens) | base matmuls (ms) | vLLM LoRA (ms) | population (ms) | +vllm | +population "
        "| population / vLLM | max abs diff | best tiles (tokens,columns,features): ms "
        "| matmuls then population (ms) | on two streams (ms) | A stacked under W, then the expand (ms) "
        "| folded into the matmul (ms) | +folded | folded, best widen tiles (tokens,features): ms "
        "| folded, widen in two launches, best tiles (tokens,features,split): ms "
        f"| widened matmuls alone (ms) | the same, inner size padded to {PAD_TO} (ms) "
        "| folded, packed layers in planes (ms) | planes / folded |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['shape']} | {r['population']} | {r['m']} | {r['base_ms']:.3f} | {r['vllm_ms']:.3f} | "
            f"{r['population_ms']:.3f} | {r['vllm_ms'] / r['base_ms']:.0%} | {r['population_ms'] / r['base_ms']:.0%} | "
            f"{r['population_ms'] / r['vllm_ms']:.2f}x | {r['max_abs_diff']:.2e} | "
            + (f"{r['best_blocks']}: {r['best_ms']:.3f} | " if r["best_blocks"] else "- | ")
            + f"{r['base_population_ms']:.3f} | "
            + (f"{r['two_streams_ms']:.3f} |" if r["two_streams_ms"] is not None else "failed |")
            + f" {r['stacked_ms']:.3f} | {r['folded_ms']:.3f} | {r['folded_ms'] / r['base_ms'] - 1:.0%} "
            + "".join(
                f"| {r[best]}: {r[ms]:.3f} " if r[best] else "| - "
                for best, ms in (("best_widen", "best_folded_ms"), ("best_split", "best_split_ms"))
            )
            + f"| {r['widened_matmuls_ms']:.3f} | {r['widened_padded_ms']:.3f} "
            f"| {r['folded_planes_ms']:.3f} | {r['folded_planes_ms'] / r['folded_ms']:.2f}x |"
        )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="4b,135m", help="comma list of 4b, 135m")
    ap.add_argument("--population", default="16,64,256", help="comma list of P")
    ap.add_argument("--case-batch", default="16", help="comma list of B: decode batches P x B")
    ap.add_argument("--prefill", type=int, default=16384, help="the prefill chunk's tokens (0: none)")
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--rank-slot", type=int, default=8, help="the engine's max_lora_rank")
    ap.add_argument("--out", type=Path, help="JSON rows written here too")
    ap.add_argument(
        "--no-grid", action="store_true", help="skip the tile grids (the population kernels', widen's: minutes a row)"
    )
    args = ap.parse_args()
    rows = []
    for shape in args.shape.split(","):
        for p in (int(v) for v in args.population.split(",")):
            batches = [(p * int(b), True) for b in args.case_batch.split(",")]
            for m, decode in batches + ([(args.prefill, False)] if args.prefill else []):
                row = measure(shape, p, m, decode, args.rank, args.rank_slot, grid=not args.no_grid)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(table(rows))
    if args.out:
        args.out.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
