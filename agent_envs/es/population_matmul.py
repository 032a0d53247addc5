"""A low-rank ES population's adapters folded into each layer's own matmul (docs/scaling.md#folded-into-the-matmul).

The population kernels (:mod:`population_lora`) run after each packed linear layer's matmul: a shrink, then
an expand that reads and writes the layer's whole output again.  On the 4B shape at P = 16 x B = 16 those
two launches cost 0.08 ms a layer beside the matmuls' 0.10 ms, and no tiling brought them much lower
(docs/scaling.md#population-kernels).  Here the expand is part of the matmul:

- the layer's weight ``W`` (out x in) lives in a widened tensor ``[W | B_all]``: for slice ``s`` of a packed
  layer and member slot ``m``, columns ``in + (s * slots + m) * rank + k`` hold column ``k`` of that
  member's ``B`` on the slice's output rows, zeros on the others;
- ``population_lora_triton.widen`` writes ``[x | h]`` for the step's tokens: ``x`` copied, and for a token
  of member ``m`` its ``h = x @ A_m^T`` in member ``m``'s columns, zeros in everyone else's (two small
  launches: the partial sums per step of features, then their sum into the columns);
- one GEMM ``[x | h] @ [W | B_all]^T = x W^T + h B_m^T`` gives every token its own member's output,
  summed in float32 and rounded once.

At large populations a packed layer (qkv, gate_up) goes in planes instead (:func:`planes_for`): its slices
share one block of ``slots x rank`` columns (each slice's rows hold its own ``B`` there), ``widen`` writes a
plane ``[x | h_s]`` per slice, and each slice is a GEMM of its own into its columns of the output, so no
token is multiplied by another slice's block of zeros.

The base weight stays the parameter it was, now a view of the widened tensor's first ``in`` columns, so
updates, fingerprints and checkpoints see it unchanged.  What grows is the matmul's inner size: by
``slices x slots x rank`` columns (192 on the 4B qkv at P = 16, rank 4: 4% more weight bytes a layer;
above ``population_lora.MATMUL_UP_TO`` members the population kernels serve, ``population_lora.choose``).
vLLM's request-to-member mapping and its per-step metadata stay vLLM's, and so do its LoRA slots' tensors
by name: each slot's ``B`` is a view of its columns of the widened weight (one copy, written where the
matmul reads it), each slot's ``A`` holds the members' rank and no more.  Tensor parallel size 1 and
unquantized layers only: any other layer keeps the population kernels.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

#: the attributes a widened layer carries: the widened weight, the members' rank its columns hold, and
#: whether its slices share one block of member columns (:func:`planes_for`)
WIDE, RANK, PLANES = "es_widened_weight", "es_widened_rank", "es_widened_planes"

#: ``1``/``0``: every packed layer in planes, or none, in place of :func:`planes_for`'s rule
PLANES_ENV = "AGENT_ENVS_WIDEN_PLANES"
#: a packed layer's member columns (``slots x rank``) from which its slices each take a GEMM of their own
PLANES_FROM_COLUMNS = 256

#: ``tokens,features[,split]``: ``widen``'s tiles in place of ``population_lora_triton.WIDEN_BY_TOKENS``
#: (split 1: its two-launch form), e.g. to try another on a GPU in an engine
WIDEN_BLOCKS_ENV = "AGENT_ENVS_WIDEN_BLOCKS"
WIDEN_TILES = (
    dict(zip(("tokens", "features", "split"), map(int, os.environ[WIDEN_BLOCKS_ENV].split(","))))
    if os.environ.get(WIDEN_BLOCKS_ENV)
    else None
)

_state: dict[str, Any] = {"rank": None, "layers": 0, "layers_in_planes": 0, "widen_tiles": WIDEN_TILES}


def planes_for(n_slices: int, n_slots: int, rank: int) -> bool:
    """Whether a packed layer's slices share one block of member columns, each slice its own GEMM.  One GEMM
    over ``[x | h_0 | h_1 | ...]`` multiplies every token by every slice's block, zeros on the other
    slices' rows: at P = 256, rank 4, qkv's inner size grows by 3,072 columns for 1,024 that any output row
    uses, and the 4B layer's extra products are 63% of its matmuls' instead of 31%.  A GEMM per slice
    costs launches and smaller tiles, so small populations keep the one GEMM (on an H100, per 4B layer:
    1.09-1.10x the one GEMM at P = 16, 0.88-0.89x at P = 256; docs/scaling.md, fourteenth session).
    :data:`PLANES_ENV` decides instead where set."""
    asked = planes_asked()
    return n_slices > 1 and (n_slots * rank >= PLANES_FROM_COLUMNS if asked is None else asked)


def planes_asked() -> bool | None:
    """What :data:`PLANES_ENV` asks for (every packed layer in planes, or none), None where it is unset;
    any other value is refused by name."""
    chosen = os.environ.get(PLANES_ENV, "").strip()
    if not chosen:
        return None
    if chosen not in ("0", "1"):
        raise ValueError(f"{PLANES_ENV}={os.environ[PLANES_ENV]!r}: 1 (every packed layer in planes) or 0 (none)")
    return chosen == "1"


def widened_columns(stacked: Sequence[torch.Tensor], rank: int, planes: bool = False) -> int:
    """The columns a layer (or in ``planes``, each slice's plane) is widened by: a block of ``slots x rank``
    per slice of vLLM's ``stacked`` factors, or one block shared by the slices."""
    return (1 if planes else len(stacked)) * stacked[0].shape[0] * rank


def widen_reference(
    x: torch.Tensor, slots: torch.Tensor, lora_a: Sequence[torch.Tensor], rank: int, planes: bool = False
) -> torch.Tensor:
    """``[x | h]`` for ``x`` (tokens x in): per slice ``s``, a block of ``slots x rank`` columns where a token
    of slot ``m`` (in ``[0, slots)``) has ``x @ a_s[m, 0, :rank]^T`` (float32, rounded to ``x``'s dtype) in
    its member's ``rank`` columns and zeros elsewhere; a token of no slot has zeros only.  With ``planes``:
    ``(slices, tokens, in + slots x rank)``, slice ``s``'s plane ``[x | h_s]``."""
    tokens = x.shape[0]
    n_slots = lora_a[0].shape[0]
    h = torch.zeros(tokens, len(lora_a), n_slots, rank, dtype=torch.float32, device=x.device)
    token_slots = slots[:tokens]
    for slot in torch.unique(token_slots).tolist():
        if not 0 <= slot < n_slots:
            continue
        rows = (token_slots == slot).nonzero(as_tuple=True)[0]
        for s, a in enumerate(lora_a):
            h[rows, s, slot] = x[rows].float() @ a[slot, 0, :rank].float().t()
    if planes:
        return torch.stack([torch.cat([x, h[:, s].flatten(1).to(x.dtype)], dim=1) for s in range(len(lora_a))])
    return torch.cat([x, h.flatten(1).to(x.dtype)], dim=1)


@torch.library.custom_op("agent_envs::population_widen", mutates_args=())
def _population_widen(
    x: torch.Tensor,
    slots: torch.Tensor,
    lora_a: list[torch.Tensor],
    rank: int,
    no_adapter: torch.Tensor | None,
    sorted_tokens: torch.Tensor | None,
    starts: torch.Tensor | None,
    planes: bool,
) -> torch.Tensor:
    """The graph's view of the widening: one opaque op (compile and CUDA graphs capture it as they do
    vLLM's LoRA ops).  ``no_adapter``: vLLM's host flag that no token of the step has a member (held-out
    episodes): ``x`` and zeros.  ``sorted_tokens``/``starts``: vLLM's kernel metadata for the step."""
    if no_adapter is not None and bool(no_adapter.item()):
        flat = torch.cat([x, x.new_zeros(x.shape[0], widened_columns(lora_a, rank, planes))], dim=1)
        return flat.expand(len(lora_a), *flat.shape).contiguous() if planes else flat
    if x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        from .population_lora_triton import widen

        order = (sorted_tokens, starts) if sorted_tokens is not None and starts is not None else None
        return widen(x, slots, lora_a, rank, order=order, blocks=WIDEN_TILES, planes=planes)
    return widen_reference(x, slots, lora_a, rank, planes)


@_population_widen.register_fake
def _(
    x: torch.Tensor,
    slots: torch.Tensor,
    lora_a: list[torch.Tensor],
    rank: int,
    no_adapter: torch.Tensor | None,
    sorted_tokens: torch.Tensor | None,
    starts: torch.Tensor | None,
    planes: bool,
) -> torch.Tensor:
    columns = x.shape[1] + widened_columns(lora_a, rank, planes)
    return x.new_empty(len(lora_a), x.shape[0], columns) if planes else x.new_empty(x.shape[0], columns)


@torch.library.custom_op("agent_envs::population_plane_linear", mutates_args=())
def _plane_linear(
    planes: torch.Tensor, wide: torch.Tensor, widths: list[int], bias: torch.Tensor | None
) -> torch.Tensor:
    """A packed layer in planes: slice ``s``'s output columns ``[x | h_s] @ wide[rows_s]^T``, each GEMM
    writing its columns of the one output in place (a column range of a row-major matrix is a matrix
    cuBLAS takes as it is: no copy, no pass over the output to join them)."""
    out = planes.new_empty(planes.shape[1], wide.shape[0])
    row = 0
    for s, width in enumerate(widths):
        rows = slice(row, row + width)
        if bias is None:
            torch.mm(planes[s], wide[rows].t(), out=out[:, rows])
        else:
            torch.addmm(bias[rows], planes[s], wide[rows].t(), out=out[:, rows])
        row += width
    return out


@_plane_linear.register_fake
def _(planes: torch.Tensor, wide: torch.Tensor, widths: list[int], bias: torch.Tensor | None) -> torch.Tensor:
    return planes.new_empty(planes.shape[1], wide.shape[0])


def widen_layer(module: Any, rank: int | None) -> bool:
    """Give a vLLM LoRA linear layer its widened weight (the base weight copied in, the parameter re-pointed
    at it) and make its slots live there: ``lora_b_stacked`` becomes views of the widened weight's ``B``
    columns and ``lora_a_stacked`` is cut to ``rank`` (vLLM sizes both for its rank slot, 8 for rank 4: at
    P = 256 on the 4B shape a second copy of ``B`` and the unused half of ``A`` held 6.4 GB the KV cache
    lacked).  Slot writes then need no mirroring; they are trimmed to ``rank`` (:func:`_trimmed`).  False,
    changing nothing, where the layer is not one this serves (tensor parallel, quantized, not laid out as
    vLLM's linear LoRA)."""
    base = getattr(module, "base_layer", None)
    weight = getattr(base, "_parameters", {}).get("weight") if base is not None else None
    stacked = getattr(module, "lora_b_stacked", None)
    lora_a = getattr(module, "lora_a_stacked", None)
    if (
        weight is None
        or weight.dim() != 2
        or not weight.is_floating_point()
        or getattr(module, "tp_size", 1) != 1
        or not isinstance(stacked, tuple)
        or not isinstance(lora_a, tuple)
        or len(lora_a) != len(stacked)
        or sum(getattr(module, "output_slices", ())) != weight.shape[0]
        or len(stacked) != len(module.output_slices)
        or (rank or 0) > stacked[0].shape[-1]
        or type(getattr(base, "quant_method", None)).__name__ != "UnquantizedLinearMethod"
    ):
        return False
    rank = rank or stacked[0].shape[-1]
    for kind, cut in (("B", [b[..., rank:] for b in stacked]), ("A", [a[:, :, rank:] for a in lora_a])):
        if any(part.any() for part in cut):
            raise ValueError(f"a slot's {kind} already holds values past rank {rank}: widen before loading adapters")
    features = weight.shape[1]
    planes = planes_for(len(stacked), stacked[0].shape[0], rank)
    wide = widened_weight(weight.data, stacked, module.output_slices, rank, planes)
    weight.data = wide[:, :features]
    module.lora_b_stacked = slot_views(wide, stacked[0].shape[0], module.output_slices, rank, planes)
    module.lora_a_stacked = tuple(a[:, :, :rank].contiguous() for a in lora_a)
    setattr(module, WIDE, wide)
    setattr(module, RANK, rank)
    setattr(module, PLANES, planes)
    for name in ("set_lora", "reset_lora"):
        write = getattr(module, name)
        setattr(module, name, _trimmed(module, write))
    _state["layers"] += 1
    _state["layers_in_planes"] += planes
    return True


#: the axis of an adapter's rank in each factor vLLM's ``set_lora`` takes (``lora_a``: R x in, ``lora_b``: out x R)
_AXES = {"lora_a": 0, "lora_b": 1}


def _trimmed(module: Any, write: Any) -> Any:
    """``write`` (``set_lora``/``reset_lora``) with the adapter cut to the widened rank: vLLM's warm-up
    adapters come in its rank slot, zeros past the members' rank; any other adapter wider than the rank
    would lose columns and is refused before anything is written."""

    def written(index: int, *args: Any, **kwargs: Any) -> Any:
        rank = getattr(module, RANK)
        given = {n: kwargs.pop(n) if n in kwargs else (args[k] if len(args) > k else None) for k, n in enumerate(_AXES)}
        if all(v is None for v in given.values()):  # reset_lora
            return write(index, *args, **kwargs)
        trimmed = {}
        for name, value in given.items():
            axis = _AXES[name]
            kept: list[torch.Tensor | None] = []
            for part in value if isinstance(value, list) else [value]:
                if part is None:  # a packed layer's slice this adapter leaves out
                    kept.append(None)
                    continue
                keep, drop = part.tensor_split([rank], dim=axis)
                if drop.any():
                    raise ValueError(
                        f"an adapter of rank {part.shape[axis]} in a layer widened for rank {rank} "
                        "(agent_envs.es.population_matmul serves the ES members' adapters only)"
                    )
                kept.append(keep)
            trimmed[name] = kept if isinstance(value, list) else kept[0]
        return write(index, trimmed["lora_a"], trimmed["lora_b"], *args[2:], **kwargs)

    return written


def slot_views(
    wide: torch.Tensor, n_slots: int, widths: Sequence[int], rank: int, planes: bool = False
) -> tuple[torch.Tensor, ...]:
    """vLLM's stacked ``lora_b`` (per slice, ``(slots, 1, width, rank)``) as views of the widened weight's
    ``B`` columns: slot ``m``'s column ``k`` of slice ``s`` is column ``in + (s * slots + m) * rank + k`` on
    the slice's rows (in ``planes``: column ``in + m * rank + k``, every slice on its own rows).  A write
    into a slot is a write into the matmul's weight."""
    block_columns = n_slots * rank
    start = wide.shape[1] - (1 if planes else len(widths)) * block_columns
    row, views = 0, []
    for s, width in enumerate(widths):
        first = start + (0 if planes else s * block_columns)
        block = wide[row : row + width, first : first + block_columns]
        views.append(block.unflatten(1, (n_slots, rank)).permute(1, 0, 2).unsqueeze(1))
        row += width
    return tuple(views)


def widened_weight(
    weight: torch.Tensor, lora_b: Sequence[torch.Tensor], widths: Sequence[int], rank: int, planes: bool = False
) -> torch.Tensor:
    """``[W | B_all]`` for ``weight`` (out x in) and vLLM's stacked ``lora_b`` (one per slice of ``widths``
    output rows, ``(slots, 1, width, rank slot)``): every slot's first ``rank`` columns of ``B``, in the
    layout of :func:`slot_views`."""
    rows, features = weight.shape
    wide = weight.new_zeros(rows, features + widened_columns(lora_b, rank, planes))
    wide[:, :features] = weight
    for view, b in zip(slot_views(wide, lora_b[0].shape[0], widths, rank, planes), lora_b):
        view.copy_(b[..., :rank])
    return wide


def apply_sync(self: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``BaseLinearLayerWithLoRA._apply_sync`` for a widened layer: the widening, then one matmul."""
    wide = getattr(self, WIDE, None)
    if wide is None:
        return _ORIGINAL["apply_sync"](self, x, bias)
    flat = x.reshape(-1, x.shape[-1])
    wrapper = self.punica_wrapper
    meta = getattr(wrapper, "token_mapping_meta", None)  # the GPU wrapper's kernel metadata (not on CPU)
    planes = getattr(self, PLANES)
    widened = torch.ops.agent_envs.population_widen(
        flat, wrapper._token_lora_indices[: flat.shape[0]], list(self.lora_a_stacked), getattr(self, RANK),
        getattr(meta, "no_lora_flag_cpu", None), getattr(meta, "token_indices_sorted_by_lora_ids", None),
        getattr(meta, "lora_token_start_loc", None), planes,
    )  # fmt: skip
    if planes:
        out = torch.ops.agent_envs.population_plane_linear(widened, wide, list(self.output_slices), bias)
    else:
        out = torch.nn.functional.linear(widened, wide, bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])


_ORIGINAL: dict[str, Any] = {}


def install(rank: int | None) -> list[str]:
    """Patch vLLM so every LoRA linear layer its LoRA manager registers is widened for members of rank
    ``rank`` (None: the engine's rank slot), and such layers run :func:`apply_sync`.  Before an engine
    builds its model."""
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
    from vllm.lora.model_manager import LoRAModelManager

    _state["rank"] = rank
    if not _ORIGINAL:
        _ORIGINAL["apply_sync"] = BaseLinearLayerWithLoRA._apply_sync
        _ORIGINAL["register_module"] = LoRAModelManager.register_module
    register = _ORIGINAL["register_module"]

    def register_module(manager: Any, module_name: str, module: Any) -> None:
        register(manager, module_name, module)
        if isinstance(module, BaseLinearLayerWithLoRA):
            widen_layer(module, _state["rank"])

    LoRAModelManager.register_module = register_module
    BaseLinearLayerWithLoRA._apply_sync = apply_sync
    return ["LoRAModelManager.register_module", "BaseLinearLayerWithLoRA._apply_sync"]


def status() -> dict[str, Any]:
    """The members' rank this process widens for, how many layers it widened and how many of those in planes."""
    return dict(_state)
