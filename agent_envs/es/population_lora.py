"""A low-rank ES population's adapters applied by kernels made for it (docs/scaling.md#population-kernels).

vLLM's multi-LoRA path serves any mix of adapters: its shrink and expand kernels launch one block per
(token tile of the *whole* batch, adapter slot), and most of those blocks return at once because each
adapter owns only its members' tokens; the shrink zeroes a float32 buffer first.  On the 4B shape at
P = 16 x B = 16 that path cost 1.41x the raw engine step (docs/scaling.md#measured-ceiling-of-each-path).
An ES population is narrower: one rank, one set of targets, every slot a member.  Here each packed
linear layer gets two launches whose grids follow the batch's tokens, not tokens x slots: a shrink
``h = x @ A[slot(t)]^T`` per token (every slice of a packed layer in one launch), and an expand
``y += h @ B[slot(t)]^T`` that adds into the layer's output in place.  The tokens are taken in vLLM's own
order sorted by slot (its kernel metadata for the step), so a tile of tokens holds one member or a few and
reads each member's factors once.  The adapters, their slots, the in-place refresh (:mod:`lora_slots`)
and the request-to-member mapping all stay vLLM's; only the arithmetic changes.

The kernels replace ``add_lora_linear`` of vLLM's Punica wrappers before the engine builds its model, so
vLLM's compile and CUDA graphs capture them like its own.  In a worker process started by vLLM (tensor
parallel), the worker extension's import installs them when :data:`ENV` says so (:func:`install` sets it).
On a GPU the kernels are Triton (:mod:`population_lora_triton`); on a CPU the same arithmetic runs in
torch (:func:`reference`), the definition the Triton kernels are tested against.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from . import population_matmul

#: ``population`` or ``population:R`` (R: the members' rank, below the engine's rank slot) installs the kernels;
#: ``matmul[:R]`` the same and the members' expand folded into each layer's matmul (:mod:`population_matmul`)
ENV = "AGENT_ENVS_LORA_KERNEL"
#: the choices of ``agent-envs es --lora-kernel`` (auto: :func:`choose`)
KERNELS = ("auto", "vllm", "population", "matmul")
#: the Punica wrappers whose ``add_lora_linear`` is replaced (module, class); those missing are skipped
WRAPPERS = (
    ("vllm.lora.punica_wrapper.punica_gpu", "PunicaWrapperGPU"),
    ("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU"),
)
#: the wrapper whose per-step kernel metadata is prepared on the host instead (:mod:`lora_step_metadata`)
HOST_METADATA = ("vllm.lora.punica_wrapper.punica_gpu", "PunicaWrapperGPU")
#: the most slices a packed layer has (qkv); the Triton kernels take each slice's factors as an argument
MAX_SLICES = 3
#: ``tokens,columns,features``: the Triton kernels' tile sizes in place of their default
#: (``population_lora_triton.tiles_for``: by the step's token count), e.g. to try another on a GPU
BLOCKS_ENV = "AGENT_ENVS_POPULATION_BLOCKS"
TILES = (
    dict(zip(("tokens", "columns", "features"), map(int, os.environ[BLOCKS_ENV].split(","))))
    if os.environ.get(BLOCKS_ENV)
    else None
)

_state: dict[str, Any] = {"rank": None, "installed": [], "calls": 0, "kernel": None}


def reference(
    y: torch.Tensor,
    x: torch.Tensor,
    slots: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    lora_b: Sequence[torch.Tensor],
    output_slices: Sequence[int],
    rank: int,
    add: bool = True,
) -> None:
    """``y[t, slice s] (+)= x[t] @ a_s[slot(t), :rank]^T @ b_s[slot(t), :, :rank]^T`` for every token whose
    slot is in ``[0, slots)``; other rows of ``y`` are left as they are.

    ``lora_a[s]`` is vLLM's stacked ``(slots, 1, rank slot, in)``, ``lora_b[s]`` ``(slots, 1, out_s, rank slot)``;
    the products accumulate in float32 and ``y`` is rounded once, as the Triton kernels do.
    """
    n_slots = lora_a[0].shape[0]
    token_slots = slots[: x.shape[0]]
    members = [
        (slot, (token_slots == slot).nonzero(as_tuple=True)[0])
        for slot in torch.unique(token_slots).tolist()
        if 0 <= slot < n_slots
    ]
    offset = 0
    for a, b, width in zip(lora_a, lora_b, output_slices):
        for slot, rows in members:
            h = x[rows].float() @ a[slot, 0, :rank].float().t()
            delta = h @ b[slot, 0, :, :rank].float().t()
            part = y[rows, offset : offset + width]
            y[rows, offset : offset + width] = (part.float() + delta if add else delta).to(y.dtype)
        offset += width


def apply(
    y: torch.Tensor,
    x: torch.Tensor,
    slots: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    lora_b: Sequence[torch.Tensor],
    output_slices: Sequence[int],
    rank: int,
    add: bool = True,
    order: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """:func:`reference`'s arithmetic on the device's kernels: Triton on CUDA (or under ``TRITON_INTERPRET=1``,
    how the CPU tests run them), torch elsewhere.  ``order``: vLLM's tokens sorted by slot for this step
    (``population_lora_triton.launch``)."""
    _state["calls"] += 1
    if x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        from .population_lora_triton import launch

        launch(y, x, slots, lora_a, lora_b, output_slices, rank, add, blocks=TILES, order=order)
    else:
        reference(y, x, slots, lora_a, lora_b, output_slices, rank, add)


@torch.library.custom_op("agent_envs::population_lora", mutates_args=("y",))
def _population_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    slots: torch.Tensor,
    lora_a: list[torch.Tensor],
    lora_b: list[torch.Tensor],
    output_slices: list[int],
    rank: int,
    add: bool,
    no_adapter: torch.Tensor | None,
    sorted_tokens: torch.Tensor | None,
    starts: torch.Tensor | None,
) -> None:
    """The graph's view of :func:`apply`: one opaque op that writes ``y`` in place (what compile and CUDA
    graphs capture, as they do vLLM's own LoRA ops).  ``no_adapter``: vLLM's host-side flag that no token
    of this step has an adapter (held-out episodes on the ES engine): nothing is launched, as vLLM's own
    kernels do, and the CUDA graphs vLLM captures for steps without adapters hold no LoRA kernel.
    ``sorted_tokens``, ``starts``: vLLM's kernel metadata for the step (tokens sorted by slot, cumulative
    counts), which the GPU wrapper prepares once per step outside the graph; None on a CPU wrapper."""
    if no_adapter is not None and bool(no_adapter.item()):
        return
    order = (sorted_tokens, starts) if sorted_tokens is not None and starts is not None else None
    apply(y, x, slots, lora_a, lora_b, output_slices, rank, add, order)


@_population_lora.register_fake
def _(
    y: torch.Tensor,
    x: torch.Tensor,
    slots: torch.Tensor,
    lora_a: list[torch.Tensor],
    lora_b: list[torch.Tensor],
    output_slices: list[int],
    rank: int,
    add: bool,
    no_adapter: torch.Tensor | None,
    sorted_tokens: torch.Tensor | None,
    starts: torch.Tensor | None,
) -> None:
    return None


#: the largest population ``auto`` folds into the matmuls: the widened matmul grows by slices x P x rank
#: inner columns, and per layer it was measured no slower than the population kernels up to P = 256 only
MATMUL_UP_TO = 256


def choose(kernel: str, population: int | None = None) -> str:
    """``auto``: on a CUDA GPU the members' expand folded into each layer's matmul (``matmul``), which one H200
    run measured at 77% of raw generation on the 4B shape at P = 16 x B = 16 where the population kernels
    alone gave 69%, and per layer at or below the population kernels' time at P = 16 and 256
    (docs/scaling.md#folded-into-the-matmul); above :data:`MATMUL_UP_TO` members the population kernels,
    whose cost does not grow with the population; vLLM's kernels elsewhere (a CPU engine would run the
    torch definitions, a loop over members)."""
    if kernel != "auto":
        return kernel
    if not torch.cuda.is_available():
        return "vllm"
    return "matmul" if population is None or population <= MATMUL_UP_TO else "population"


def add_lora_linear(
    wrapper: Any,
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: tuple[torch.Tensor, ...],
    lora_b_stacked: tuple[torch.Tensor, ...],
    scale: float,
    output_slices: tuple[int, ...],
    *,
    buffer: Any = None,
    **kwargs: Any,
) -> torch.Tensor:
    """The Punica wrappers' ``add_lora_linear`` (same arguments), on the population kernels."""
    if scale != 1.0 or buffer is not None or len(output_slices) > MAX_SLICES:
        raise ValueError(
            f"population LoRA kernels: scale {scale}, buffer {buffer is not None}, {len(output_slices)} slices "
            f"(they serve linear layers of at most {MAX_SLICES} slices at scale 1)"
        )
    rank = _state["rank"] or lora_b_stacked[0].shape[-1]
    x = x.reshape(-1, x.shape[-1])
    slots = wrapper._token_lora_indices[: x.shape[0]]
    meta = getattr(wrapper, "token_mapping_meta", None)  # the GPU wrapper's kernel metadata (not on CPU)
    torch.ops.agent_envs.population_lora(
        y, x, slots, list(lora_a_stacked), list(lora_b_stacked), list(output_slices), rank,
        bool(kwargs.get("add_inputs", True)), getattr(meta, "no_lora_flag_cpu", None),
        getattr(meta, "token_indices_sorted_by_lora_ids", None), getattr(meta, "lora_token_start_loc", None),
    )  # fmt: skip
    return y


def install(rank: int | None = None, kernel: str = "population") -> str:
    """Replace vLLM's ``add_lora_linear`` in this process (and, through :data:`ENV`, in the worker processes
    vLLM starts) before an engine is built, and the GPU wrapper's ``update_metadata`` by one that waits for
    nothing (:mod:`lora_step_metadata`); ``rank``: the members' rank when it is below the engine's
    rank slot (the slot's padding rows are zero, so they are skipped).  ``kernel`` ``matmul``: also fold
    the members' expand into each layer's matmul (:mod:`population_matmul`; layers it does not serve keep
    the population kernels).  Returns what was installed."""
    import importlib

    from .lora_step_metadata import update_metadata

    if kernel not in ("population", "matmul"):
        raise ValueError(f"population LoRA kernels: kernel {kernel!r} is not population or matmul")
    os.environ[ENV] = f"{kernel}:{rank}" if rank else kernel
    _state["rank"], _state["kernel"] = rank, kernel
    done = []
    for module_name, cls_name in WRAPPERS:
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
        except (ImportError, AttributeError):
            continue
        cls.add_lora_linear = add_lora_linear  # a method: the wrapper comes in as ``wrapper``
        if (module_name, cls_name) == HOST_METADATA:
            cls.update_metadata = update_metadata
        done.append(cls_name)
    if not done:
        raise RuntimeError("population LoRA kernels: this vLLM has none of the Punica wrappers they replace")
    if kernel == "matmul":
        done += population_matmul.install(rank)
    _state["installed"] = done
    planes = population_matmul.planes_asked() if kernel == "matmul" else None
    return (
        ("members' expand folded into the layers' matmuls, " if kernel == "matmul" else "")
        + f"population LoRA kernels in {', '.join(done)}"
        + (", step metadata on the host" if HOST_METADATA[1] in done else "")
        + (f", rank {rank}" if rank else "")
        + (f", tiles {os.environ[BLOCKS_ENV]}" if TILES else "")
        # the packed layers' layout, where set instead of population_matmul.planes_for's rule
        + (f", {population_matmul.PLANES_ENV}={int(planes)}" if planes is not None else "")
    )


def install_from_env() -> str | None:
    """In a worker process: :func:`install` when :data:`ENV` asks for it (set by the driver's :func:`install`)."""
    kernel, _, rank = os.environ.get(ENV, "").partition(":")
    if kernel not in ("population", "matmul"):
        return None
    return install(int(rank) if rank else None, kernel)


def status() -> dict[str, Any]:
    """What this process installed and how many layer calls went through the kernels (eager calls only: a
    CUDA graph replays its kernels without Python)."""
    return {**_state, "kernel": _state["kernel"] or "vllm", "widened": population_matmul.status()}
