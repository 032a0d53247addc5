"""Where the low-rank update's issuing goes: host work, or waiting (no engine; the update of the ES run).

On the H200 (2026-12-04, tenth session) a 4B update at P = 16 took 0.15-0.22 s to issue its 252 products
and adds while the device then waited 0.000 s for it: the update's kernels are faster than the host issues
them, 0.6-0.9 ms a target, and at P = 16 that is most of what stands between a generation and 85% of raw.
This runs ``LowRankPerturber.update`` itself (factors drawn ahead and page-locked, as the engine's update
finds them) on a model of a shape's fused linear weights (vLLM's ``qkv_proj`` and ``gate_up_proj`` row
blocks, bfloat16) with most of the device's memory held, as an engine's KV cache holds it, and prints per
update: the seconds issuing, this thread's CPU seconds meanwhile (near the seconds: host work; far below:
waiting), and the device's time after; then one update under torch's profiler, the host-side calls ranked
by their own time (allocations, copies, synchronizations and operators apart).  ``--variants eager,graph``
runs the same updates on two models, issued call by call and replayed as one CUDA graph
(``agent_envs.es.update_graph``), and checks that the weights carry the same bits after every update.

    python benchmarks/bench_update_issue.py --shape 4b --members 16 --memory-share 0.85 --variants eager,graph
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "scripts")]

from agent_envs.es import update_graph  # noqa: E402
from agent_envs.es.lowrank import LowRankPerturber  # noqa: E402
from bench_lora_kernels import layers  # noqa: E402
from gpu_engine import QWEN3_4B, SMOLLM2_135M, TINY_QWEN3  # noqa: E402

SHAPES = {"4b": QWEN3_4B, "135m": SMOLLM2_135M, "tiny": TINY_QWEN3}


class Fused(nn.Module):
    """A fused linear layer as vLLM holds it: one weight, its row blocks named by ``output_sizes``."""

    def __init__(self, sizes: list[int], inputs: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.output_sizes = sizes
        self.weight = nn.Parameter(torch.empty(sum(sizes), inputs, dtype=dtype, device=device), requires_grad=False)


#: the module that holds each packed layer in a Qwen3-style decoder layer (vLLM's names)
PARENTS = {"qkv": "self_attn", "o": "self_attn", "gate_up": "mlp", "down": "mlp"}


def model_of(shape: dict[str, int], dtype: torch.dtype, device: torch.device) -> nn.Module:
    """The shape's decoder linears in vLLM's layout (``bench_lora_kernels.layers``: the packed layers and their
    slices; random values: no zeros to hide a missing write)."""
    decoder = nn.ModuleList()
    for _ in range(shape["num_hidden_layers"]):
        layer = nn.Module()
        for parent in dict.fromkeys(PARENTS.values()):
            layer.add_module(parent, nn.Module())
        for name, widths, inputs in layers(shape):
            layer.get_submodule(PARENTS[name]).add_module(f"{name}_proj", Fused(list(widths), inputs, dtype, device))
        decoder.append(layer)
    model = nn.Module()
    model.layers = decoder
    generator = torch.Generator(device=device).manual_seed(0)
    for param in model.parameters():
        param.data.normal_(0.0, 0.02, generator=generator)
    return model


def hold_memory(share: float, device: torch.device) -> torch.Tensor | None:
    """Allocate the device's memory up to ``share`` of it (an engine's KV cache and graphs), so that the
    update's temporaries find as little room as they do beside an engine."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    held = int(share * total) - (total - free)
    return torch.empty(max(held, 0), dtype=torch.uint8, device=device) if held > 0 else None


class Updates:
    """A perturber's updates as the engine runs them: each generation's factors drawn ahead and taken by
    its refresh, the next generation's draws started before the update (the staging buffers alternate)."""

    def __init__(self, perturber: LowRankPerturber, members: int) -> None:
        self.perturber, self.members, self.generation = perturber, members, 0
        self.sigma = 0.001
        perturber.prefetch(self.seeds(0), self.sigma)

    def seeds(self, generation: int) -> list[int]:
        return [1000 + 100 * generation + i for i in range(self.members)]

    def next(self, around: AbstractContextManager[Any] | None = None) -> tuple[dict[str, Any], str]:
        """One update (inside ``around``, the update call alone): its times (``last_update_timing``) and the
        weights' fingerprint after it."""
        g, p = self.generation, self.perturber
        p.take_prefetched(self.seeds(g), self.sigma)
        p.prefetch(self.seeds(g + 1), self.sigma)
        before = p.fingerprint()
        with around or nullcontext():
            p.update(self.seeds(g), [((i + g) % 7 - 3) / 3.0 for i in range(self.members)], 0.001, self.sigma)
        after = p.fingerprint()
        if after == before:  # a timing of nothing would read as a fast update
            raise SystemExit(f"update {g} changed no weight")
        self.generation += 1
        return dict(p.last_update_timing), after


def host_calls(updates: Updates, top: int) -> str:
    """One update under the profiler: the host-side calls by their own time (with CUDA: the runtime's
    calls too, ``cudaMalloc``, ``cudaMemcpyAsync``, ``cudaStreamSynchronize``, as the host spent them)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    recording = profile(activities=activities)
    updates.next(recording)
    rows = sorted(recording.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    total = sum(e.self_cpu_time_total for e in recording.key_averages())
    lines = [f"host-side calls of one update ({total / 1e3:.1f} ms of their own time in all)", ""]
    lines += ["| call | count | ms (own) | us per call |", "|---|---|---|---|"]
    lines += [
        f"| `{e.key[:80]}` | {e.count} | {e.self_cpu_time_total / 1e3:.1f} | {e.self_cpu_time_total / max(e.count, 1):.1f} |"
        for e in rows
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="4b")
    ap.add_argument("--members", type=int, default=16, help="distinct seeds of an update (P)")
    ap.add_argument("--updates", type=int, default=4, help="timed updates after one warm-up")
    ap.add_argument("--memory-share", type=float, default=0.85, help="the device's memory held meanwhile")
    ap.add_argument("--top", type=int, default=20, help="host calls listed")
    ap.add_argument(
        "--variants",
        default="eager",
        help="a list of eager,graph: the update as issued call by call, or replayed as one CUDA graph "
        f"(agent_envs.es.update_graph, {update_graph.ENV}=1); each on a model of its own, the same updates",
    )
    args = ap.parse_args()
    variants = args.variants.split(",")
    if not set(variants) <= {"eager", "graph"}:
        ap.error(f"--variants {args.variants}: a list of eager, graph")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    runs = {
        v: Updates(LowRankPerturber(model_of(SHAPES[args.shape], dtype, device), 4), args.members) for v in variants
    }
    held = hold_memory(args.memory_share, device)
    timings: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    prints: dict[str, list[str]] = {v: [] for v in variants}
    for variant, updates in runs.items():
        os.environ[update_graph.ENV] = "1" if variant == "graph" else "0"
        updates.next()  # the warm-up: the staging buffers locked, the allocator's blocks cached, a graph captured
        for _ in range(args.updates):
            timing, print_ = updates.next()
            timings[variant].append(timing)
            prints[variant].append(print_)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    targets = len(next(iter(runs.values())).perturber.targets)
    print(
        f"{args.shape}: {targets} targets, P = {args.members}, rank 4, {dtype}, {name}, memory held to "
        f"{args.memory_share:.2f} of the device ({(held.numel() if held is not None else 0) / 2**30:.1f} GiB)"
    )
    print(
        "| variant | update | issued (s) | issuing thread's CPU (s) | CPU / issued | device after (s) | ms per target | how |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for variant in variants:
        for i, t in enumerate(timings[variant], 1):
            print(
                f"| {variant} | {i} | {t['issue_s']:.3f} | {t['issue_cpu_s']:.3f} | "
                f"{t['issue_cpu_s'] / max(t['issue_s'], 1e-9):.2f} | {t['device_s']:.3f} | "
                f"{1e3 * t['issue_s'] / targets:.2f} | {t['graph']} |"
            )
    for variant in variants:
        issued = statistics.median(t["issue_s"] + t["device_s"] for t in timings[variant])
        cpu = statistics.median(t["issue_cpu_s"] for t in timings[variant])
        print(
            f"{variant}: median issued + device {issued:.3f} s, issuing CPU {cpu:.3f} s, stacked ahead: "
            f"{all(t['stacked_ahead'] for t in timings[variant])}"
        )
    if len(variants) > 1:
        same = all(len(set(p)) == 1 for p in zip(*prints.values()))
        print(f"the variants' weights after each update: {'the same bits' if same else 'DIFFERENT BITS'}")
        if not same:
            raise SystemExit(1)
    for variant, updates in runs.items():
        os.environ[update_graph.ENV] = "1" if variant == "graph" else "0"
        print(f"\n{variant}: " + host_calls(updates, args.top))


if __name__ == "__main__":
    main()
