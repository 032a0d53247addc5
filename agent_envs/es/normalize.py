"""Normalisation of candidate rewards into update weights (docs/protocol.md#reward-normalisation-and-update).

Normalisation runs in torch float32 because the update weights must be bit-identical between
training and a later replay, which recomputes them from the stored rewards.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

NORMALIZATIONS = ("zscore", "centered_rank", "none")
#: the names the reference accepts, and no others (``rank``, ``z-score`` are refused as there)
_ALIASES = {
    "zscore": "zscore",
    "centered_rank": "centered_rank",
    "none": "none",
    "identity": "none",
    "off": "none",
}


def normalize_method(method: str) -> str:
    key = str(method).strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"unknown reward normalization {method!r}; expected zscore, centered_rank or none")
    return _ALIASES[key]


def check_rewards(rewards: Sequence[float]) -> list[float]:
    """Refuse empty or non-finite rewards before anything is mutated."""
    values = [float(r) for r in rewards]
    if not values:
        raise ValueError("rewards must be a non-empty list")
    bad = [r for r in values if not math.isfinite(r)]
    if bad:
        raise ValueError(f"rewards must be finite, got {bad[:3]}")
    return values


def normalize_rewards(
    rewards: Sequence[float], method: str = "zscore", ddof: int = 0, eps: float = 1e-8
) -> list[float]:
    """Update weights for one population, computed in float32 exactly as the trainer does."""
    kind = normalize_method(method)
    if int(ddof) < 0:
        raise ValueError(f"reward_normalization_ddof must be >= 0, got {ddof!r}")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"reward_normalization_eps must be finite and > 0, got {eps!r}")
    r = torch.tensor(check_rewards(rewards), dtype=torch.float32)
    n = r.numel()
    if kind == "none":
        w = r
    elif kind == "centered_rank":
        if n == 1:
            return [0.0]
        ranks = torch.empty(n, dtype=torch.float32)
        ranks[torch.argsort(r, stable=True)] = torch.arange(n, dtype=torch.float32)
        w = ranks / (n - 1) - 0.5
    elif n <= int(ddof):
        w = torch.zeros(n, dtype=torch.float32)
    else:  # the reference's torch.std(unbiased=bool(ddof)): any ddof >= 1 divides by n - 1
        std = torch.std(r, correction=1 if int(ddof) else 0)
        w = (r - r.mean()) / (std + eps)
    return [float(x) for x in w]


def weight_norm(weights: Sequence[float]) -> float:
    """The update's reported ``weight_norm``: the L2 norm of the weights taken in float32, as the
    reference reports it (about sqrt(N) for z-scores; docs/protocol.md#reward-normalisation-and-update)."""
    return float(torch.linalg.vector_norm(torch.tensor([float(w) for w in weights], dtype=torch.float32)))


def population_std(values: Sequence[float]) -> float:
    """Population (ddof 0) standard deviation, the history's ``reward_std``."""
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
