"""How a generation's rewards become a weight change beyond the reference's plain update (ours, not
the reference's: docs/protocol.md#mirrored-pairs and #optimiser).

- **Mirrored pairs**: members ``2k`` and ``2k + 1`` share seed ``s_k`` and are perturbed by ``+eps``
  and ``-eps``.  Their update ``alpha/N * (w_2k eps_k - w_2k+1 eps_k)`` is applied as ``N/2`` terms
  with weights ``(w_2k - w_2k+1) / 2`` (:func:`pair_update`): the same sum, half the noise draws.
- **Adam** on the update direction ``g`` (the path's plain update before ``alpha``: ``1/N sum w_i
  eps_i`` full-rank, ``1/(N sigma) sum w_i A_i B_i^T`` low-rank): ``theta += alpha * m_hat /
  (sqrt(v_hat) + eps)``.  The moments are float32 tensors beside the weights (on their device), one
  pair per tensor; each operation is its own elementwise float32 kernel (no fused multiply-add), so
  the same ``g`` gives the same bits on a CPU and a GPU.  The state is a pure function of the
  history: a replay (or ``--resume``) recomputes every ``g`` from the seeds and rewards and repeats
  the steps in order.

The history's config holds the settings (``mirrored``, ``optimizer``, ``adam_beta1/2``, ``adam_eps``);
a history without them is the reference's rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

OPTIMIZERS = ("sgd", "adam")
#: the config keys that decide how rewards become updates: a resume must keep them
RULE_KEYS = ("mirrored", "optimizer", "adam_beta1", "adam_beta2", "adam_eps")
ADAM_DEFAULTS = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}


def member_sign(member: int, mirrored: bool) -> int:
    """+1, or -1 for the second member of a mirrored pair."""
    return -1 if mirrored and member % 2 else 1


def pair_update(seeds: Sequence[int], weights: Sequence[float]) -> tuple[list[int], list[float]]:
    """A mirrored population's update as one term per pair: ``(s_k, (w_2k - w_2k+1) / 2)``."""
    if len(seeds) != len(weights) or len(seeds) % 2:
        raise ValueError(f"mirrored pairs need an even number of seeds and weights, got {len(seeds)}/{len(weights)}")
    pairs = range(0, len(seeds), 2)
    if any(int(seeds[i]) != int(seeds[i + 1]) for i in pairs):
        raise ValueError("mirrored members 2k and 2k+1 must share a seed")
    return [int(seeds[i]) for i in pairs], [(float(weights[i]) - float(weights[i + 1])) / 2 for i in pairs]


def update_terms(seeds: Sequence[int], weights: Sequence[float], mirrored: bool) -> tuple[list[int], list[float]]:
    """The ``(seeds, weights)`` the backend's update takes: the members', or one term per mirrored pair."""
    return pair_update(seeds, weights) if mirrored else ([int(s) for s in seeds], [float(w) for w in weights])


def optimizer_settings(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The history config's optimiser as the backends take it: None for the plain update (``sgd``,
    the reference's), else ``{"name": "adam", "beta1", "beta2", "eps"}`` (checked)."""
    name = str(config.get("optimizer", "sgd")).strip().lower()
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZERS)}")
    if name == "sgd":
        return None
    settings = {"name": name, **{k: float(config.get(f"adam_{k}", v)) for k, v in ADAM_DEFAULTS.items()}}
    check_adam(settings)
    return settings


def check_adam(settings: Mapping[str, Any]) -> None:
    for key in ("beta1", "beta2"):
        value = float(settings[key])
        if not 0.0 <= value < 1.0:
            raise ValueError(f"adam_{key} must be in [0, 1), got {value!r}")
    eps = float(settings["eps"])
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"adam_eps must be finite and > 0, got {eps!r}")


class Adam:
    """Adam's moments for a backend's tensors, keyed by tensor name, as flat float32 tensors on the
    tensor's device (created at the first step: a full-size pair per tensor, 8 bytes per weight)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        check_adam(settings)
        self.settings = {k: settings[k] for k in ("name", "beta1", "beta2", "eps")}
        self.beta1, self.beta2, self.eps = (float(settings[k]) for k in ("beta1", "beta2", "eps"))
        self.steps = 0
        self.m: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}

    def check(self, settings: Mapping[str, Any]) -> None:
        """An update must not change the optimiser under way (its moments would mean something else)."""
        if {k: settings[k] for k in self.settings} != self.settings:
            raise ValueError(f"the optimizer changed under way: {self.settings} then {dict(settings)}")

    def begin(self) -> tuple[float, float]:
        """Count one update; return the reciprocals of its bias corrections ``1 - beta^t`` (applied as
        float32 multiplies: a scalar division is a reciprocal multiply on some devices only)."""
        self.steps += 1
        return 1.0 / (1.0 - self.beta1**self.steps), 1.0 / (1.0 - self.beta2**self.steps)

    def direction(
        self, key: str, g: torch.Tensor, size: int, corrections: tuple[float, float], offset: int = 0
    ) -> torch.Tensor:
        """``m_hat / (sqrt(v_hat) + eps)`` for ``g`` (float32), elements ``offset ..`` of tensor ``key``."""
        if key not in self.m:
            self.m[key] = torch.zeros(size, dtype=torch.float32, device=g.device)
            self.v[key] = torch.zeros(size, dtype=torch.float32, device=g.device)
        n = g.numel()
        m = self.m[key][offset : offset + n].view(g.shape)
        v = self.v[key][offset : offset + n].view(g.shape)
        m.mul_(self.beta1).add_(g * (1.0 - self.beta1))
        v.mul_(self.beta2).add_((g * g) * (1.0 - self.beta2))
        return (m * corrections[0]) / ((v * corrections[1]).sqrt() + self.eps)
