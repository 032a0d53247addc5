"""Does a perturbation reach the engine's compiled forward pass, and does its revert undo it?

ES perturbs the weights in place, between ``generate`` calls.  An engine running CUDA graphs (or,
on the CPU, a compiled model) replays kernels captured against the weights' memory, so an in-place
change is seen only if it writes the same storage; a copy or a re-allocation would be silently
ignored.  :func:`roundtrip` checks it on a live ``vllm.LLM``: fixed-seed samples change under a
perturbation and come back token for token after the revert, for the in-place revert (the
reference's subtraction, bf16 rounding residue and all) and for the exact revert (a saved copy).
"""

from __future__ import annotations

from typing import Any, Sequence

from .worker import VLLMPerturbation

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "In 1969 the first",
    "Water boils at",
    "Dear diary, today",
    "The three laws of",
    "Once upon a time",
    "Q: What is 17 * 23?\nA:",
)


def graph_mode(llm: Any) -> dict[str, Any]:
    """How the engine runs its forward pass (CUDA graphs or eager), as its config says."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    compilation = getattr(config, "compilation_config", None)
    sizes = list(getattr(compilation, "cudagraph_capture_sizes", None) or [])
    return {
        "enforce_eager": bool(getattr(getattr(config, "model_config", None), "enforce_eager", False)),
        "cudagraph_mode": str(getattr(compilation, "cudagraph_mode", None)),
        "compilation_mode": str(getattr(compilation, "mode", getattr(compilation, "level", None))),
        "cudagraph_capture_sizes": sorted(sizes)[:4] + (["..."] if len(sizes) > 4 else []),
    }


def roundtrip(
    llm: Any, sigma: float = 1e-3, seed: int = 1571296235, prompts: Sequence[str] = PROMPTS, max_tokens: int = 32
) -> dict[str, Any]:
    """Sample, perturb, sample, revert, sample, for in-place and exact revert; see the module docstring.

    Half the prompts decode greedily, half sample at temperature 1 with a fixed seed each (what
    rollouts do): near-uniform dummy-weight logits can keep a seeded sample's tokens under a
    perturbation, while the greedy argmax between near-equal logits flips.  ``ok`` is true when
    decoding is repeatable, every perturbation changed the outputs, and the exact revert restored
    them token for token with the same weights fingerprint.  The in-place revert is reported as
    it is (its rounding residue may or may not change a token)."""
    from vllm import SamplingParams

    params = [
        SamplingParams(
            temperature=0.0 if i % 2 == 0 else 1.0,
            top_p=1.0,
            top_k=-1,
            seed=1000 + i,
            max_tokens=max_tokens,
            ignore_eos=True,
        )
        for i in range(len(prompts))
    ]

    def sample() -> list[list[int]]:
        return [list(o.outputs[0].token_ids) for o in llm.generate(list(prompts), params, use_tqdm=False)]

    out: dict[str, Any] = {"graph_mode": graph_mode(llm), "batch": len(prompts), "max_tokens": max_tokens}
    base = sample()
    out["repeatable"] = sample() == base
    for label, exact in (("in_place_revert", False), ("exact_revert", True)):
        es = VLLMPerturbation(llm, exact_revert=exact)
        before, start = es.fingerprint(), sample()
        applied = es.apply(seed, sigma)
        perturbed = sample()
        reverted = es.revert(seed, sigma)
        after = sample()
        out[label] = {
            "perturbed_differs": perturbed != start,
            "tokens_changed_by_perturbation": _changed(start, perturbed),
            "restored_token_for_token": after == start,
            "tokens_changed_after_revert": _changed(start, after),
            "fingerprint_restored": es.fingerprint() == before,
            "apply_s": max(r["seconds"] for r in applied),
            "revert_s": max(r["seconds"] for r in reverted),
            "revert_copy": sorted({str(s.get("revert_copy", "none")) for s in es.status()}),
        }
    exact = out["exact_revert"]
    out["ok"] = bool(
        out["repeatable"]
        and out["in_place_revert"]["perturbed_differs"]
        and exact["perturbed_differs"]
        and exact["restored_token_for_token"]
        and exact["fingerprint_restored"]
    )
    return out


def _changed(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x != y for ra, rb in zip(a, b) for x, y in zip(ra, rb)) + sum(
        abs(len(ra) - len(rb)) for ra, rb in zip(a, b)
    )
