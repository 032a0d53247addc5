"""Seeded weight perturbation and the ES update, in place on a torch model (docs/protocol.md#per-tensor-noise).

Noise is never stored: tensor ``name`` under member seed ``s`` always yields the same stream, from a
``torch.Generator`` on the parameter's own device seeded with ``s XOR blake2b-8(name)``, drawn in
fixed chunks of 2**23 float32 values.  So a perturbation can be reverted and a whole run replayed
from its seeds and rewards alone.  The sequence of casts is fixed (it decides bf16 bit-parity):
perturbations cast the noise to the parameter dtype, then ``param.add_(noise, alpha=sigma)``;
updates accumulate ``(alpha/N) * w_i * noise_i`` in float32 per chunk, cast once, and add.

Subtracting the noise again does not restore the weights bit for bit (each add rounds), so a
trained model drifts from "base + updates", which is what a replay rebuilds.  ``exact_revert``
keeps a copy of the selected tensors while perturbed and restores it instead, which makes the
trained weights and their replay identical: on the tensors' own device when it has room, else on
the host (:mod:`agent_envs.es.revert_copy`).  :meth:`SeededPerturber.fingerprint` identifies the
weights cheaply after every generation (:mod:`agent_envs.es.fingerprint`).
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any, Iterable, Iterator, Sequence

import torch
from torch import nn

from . import fingerprint as weights_fingerprint
from .normalize import check_rewards, normalize_rewards, weight_norm
from .revert_copy import RevertCopy
from .tensor_seeds import tensor_seed
from .update_rule import Adam

CHUNK = 2**23
SCOPES = ("full", "all_linear", "lora")
_LINEAR_EXCLUDED = ("embed_tokens", "lm_head", "norm")


def select_parameters(
    model_or_named: nn.Module | Iterable[tuple[str, torch.Tensor]],
    scope: str = "full",
    target_modules: Sequence[str] | None = None,
) -> list[tuple[str, torch.Tensor]]:
    """Floating-point tensors of the scope, in iteration order, each object once (tied weights)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown parameter scope {scope!r}; expected one of {', '.join(SCOPES)}")
    named = model_or_named.named_parameters() if isinstance(model_or_named, nn.Module) else model_or_named
    seen: set[int] = set()
    chosen: list[tuple[str, torch.Tensor]] = []
    for name, param in named:
        if id(param) in seen or not torch.is_floating_point(param):
            continue
        if scope == "all_linear" and not _is_linear_weight(name, param, target_modules):
            continue
        if scope == "lora" and "lora_" not in name:
            continue
        seen.add(id(param))
        chosen.append((name, param))
    if not chosen:
        raise ValueError(f"parameter scope {scope!r} selects no floating-point tensors")
    return chosen


def _is_linear_weight(name: str, param: torch.Tensor, targets: Sequence[str] | None) -> bool:
    module, _, leaf = name.rpartition(".")
    if leaf != "weight" or param.dim() != 2 or any(x in module for x in _LINEAR_EXCLUDED):
        return False
    return not targets or module.rpartition(".")[2] in targets


def _raw_bytes(param: torch.Tensor) -> bytes:
    return param.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()


def _finite(label: str, value: float, minimum: float | None = 0.0) -> float:
    value = float(value)
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        raise ValueError(f"{label} must be finite{' and >= 0' if minimum is not None else ''}, got {value!r}")
    return value


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seeds must be non-negative integers, got {seed!r}")
    return seed


class SquareSum:
    """A running sum of squares kept on each tensor's device (read once: no sync per chunk)."""

    def __init__(self) -> None:
        self.parts: dict[torch.device, torch.Tensor] = {}

    def add(self, change: torch.Tensor) -> None:
        part = change.square().sum(dtype=torch.float64)
        self.parts[change.device] = self.parts[change.device] + part if change.device in self.parts else part

    def norm(self) -> float:
        return math.sqrt(sum(float(p) for p in self.parts.values()))


class SeededPerturber:
    """Apply/revert one seeded perturbation and accumulate seeded updates on a model's tensors."""

    def __init__(
        self,
        model_or_named: nn.Module | Iterable[tuple[str, torch.Tensor]],
        scope: str = "full",
        target_modules: Sequence[str] | None = None,
        chunk: int = CHUNK,
        rank: int = 0,
        tp_size: int = 1,
        exact_revert: bool = False,
        revert_copy: str = "auto",
    ) -> None:
        if int(chunk) < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk!r}")
        self._source = model_or_named if isinstance(model_or_named, nn.Module) else list(model_or_named)
        self.chunk, self.rank, self.tp_size = int(chunk), int(rank), int(tp_size)
        self.scope, self.target_modules = scope, list(target_modules or [])
        self.params: list[tuple[str, torch.Tensor]] = []
        self.updates: list[dict[str, Any]] = []
        self.perturbation: dict[str, Any] | None = None
        self.exact_revert, self.revert_copy = bool(exact_revert), revert_copy
        self._copy: RevertCopy | None = None
        self._snapshot: list[torch.Tensor] = []
        #: Adam's moments once an update asked for Adam (agent_envs.es.update_rule); None: plain updates
        self.adam: Adam | None = None
        self.init(scope, target_modules)

    # -- lifecycle ---------------------------------------------------------------------------
    def init(self, scope: str = "full", target_modules: Sequence[str] | None = None) -> dict[str, Any]:
        """(Re)select parameters; earlier updates are undone first so they never silently stack."""
        if self.perturbation is not None:
            raise RuntimeError("cannot re-initialise while a perturbation is applied; revert it first")
        reverted = self.reset()["reverted_updates"] if self.updates else 0
        params = select_parameters(self._source, scope, target_modules)
        strided = [n for n, p in params if not p.is_contiguous()]
        if strided:
            raise ValueError(f"in-place chunked noise needs contiguous tensors; not contiguous: {strided[:5]}")
        self.release()
        self.params = params
        self.scope, self.target_modules = scope, list(target_modules or [])
        self._devices = sorted({p.device for _, p in params if p.device.type == "cuda"}, key=str)
        self._copy = RevertCopy([p for _, p in params], self.revert_copy) if self.exact_revert else None
        return {**self._shape(), "ok": True, "reverted_updates": reverted}

    def release(self) -> None:
        """Free the exact-revert copy (before this perturber is replaced by another)."""
        if self._copy is not None:
            self._copy.release()
            self._copy = None

    def _shape(self) -> dict[str, Any]:
        return {
            "parameter_scope": self.scope,
            "n_tensors": len(self.params),
            "total_params": sum(p.numel() for _, p in self.params),
        }

    def status(self) -> dict[str, Any]:
        return {
            "ok": True,
            "initialized": bool(self.params),
            **self._shape(),
            "update_history": len(self.updates),
            "perturbation": self.perturbation,
            "rank": self.rank,
            "tp_size": self.tp_size,
            "exact_revert": self.exact_revert,
            **(self._copy.describe() if self._copy else {}),
        }

    def coverage(self) -> dict[str, Any]:
        """Selected vs all floating-point elements, and any empty tensor (packed-away weights)."""
        everything = select_parameters(self._source, "full")
        return {
            **self._shape(),
            "model_params": sum(p.numel() for _, p in everything),
            "model_tensors": len(everything),
            "empty_tensors": [n for n, p in self.params if p.numel() == 0],
        }

    def checksum(self) -> str:
        """SHA-256 over the selected tensors' names and raw bytes, in selection order."""
        digest = hashlib.sha256()
        for name, param in self.params:
            digest.update(name.encode("utf-8"))
            digest.update(_raw_bytes(param))
        return digest.hexdigest()

    def fingerprint(self) -> str:
        """The cheap on-device fingerprint of the selected tensors (bit-exact, order-independent)."""
        return weights_fingerprint.fingerprint(self.params)

    def tensor_checksums(self) -> dict[str, str]:
        """SHA-256 (16 hex digits) of each selected tensor: says which tensors differ between engines."""
        return {name: hashlib.sha256(_raw_bytes(param)).hexdigest()[:16] for name, param in self.params}

    def snapshot(self) -> dict[str, Any]:
        """Keep a same-device copy of the selected tensors, for :meth:`max_abs_diff` (diagnostics)."""
        with torch.no_grad():
            self._snapshot = [p.detach().clone() for _, p in self.params]
        return {"ok": True, "n_tensors": len(self._snapshot)}

    def max_abs_diff(self) -> float:
        """Largest absolute element difference from the last :meth:`snapshot` (float32 maths)."""
        if not self._snapshot:
            raise RuntimeError("no snapshot taken; call snapshot() first")
        with torch.no_grad():
            return max(
                (float((p.detach().float() - s.float()).abs().max()) if p.numel() else 0.0)
                for (_, p), s in zip(self.params, self._snapshot)
            )

    # -- noise ------------------------------------------------------------------------------
    def _generator(self, seed: int, name: str, device: torch.device) -> torch.Generator:
        gen = torch.Generator(device=device)
        gen.manual_seed(tensor_seed(seed, name, self.rank, self.tp_size))
        return gen

    def _chunks(self, param: torch.Tensor) -> Iterator[tuple[int, int]]:
        total = param.numel()
        for start in range(0, total, self.chunk):
            yield start, min(self.chunk, total - start)

    def noise(self, seed: int, name: str, param: torch.Tensor) -> torch.Tensor:
        """The full float32 noise tensor for (seed, name) (for inspection and tests)."""
        gen = self._generator(seed, name, param.device)
        parts = [
            torch.randn(k, generator=gen, device=param.device, dtype=torch.float32) for _, k in self._chunks(param)
        ]
        return torch.cat(parts).view(param.shape) if parts else torch.empty_like(param, dtype=torch.float32)

    def _add_noise(self, name: str, param: torch.Tensor, seed: int, sigma: float) -> None:
        gen = self._generator(seed, name, param.device)
        flat = param.data.view(-1)
        for start, k in self._chunks(param):
            eps = torch.randn(k, generator=gen, device=param.device, dtype=torch.float32)
            flat[start : start + k].add_(eps.to(param.dtype), alpha=sigma)

    # -- operations --------------------------------------------------------------------------
    def apply(self, seed: int, sigma: float) -> dict[str, Any]:
        """theta += sigma * eps(seed) (a negative sigma: the second member of a mirrored pair).  A
        second perturbation on top of the first is refused."""
        seed, sigma = _check_seed(seed), _finite("sigma", sigma, None)
        if self.perturbation is not None:
            raise RuntimeError(f"a perturbation is already applied ({self.perturbation}); revert it first")
        start = time.perf_counter()
        done = 0
        with torch.no_grad():
            if self._copy is not None:
                self._copy.save()
            try:
                for name, param in self.params:
                    self._add_noise(name, param, seed, sigma)
                    done += 1
            except BaseException:  # leave no half-perturbed model behind
                if self._copy is not None:
                    self._copy.restore(done)
                else:
                    for name, param in self.params[:done]:
                        self._add_noise(name, param, seed, -sigma)
                raise
        self.perturbation = {"seed": seed, "sigma": sigma}
        return {"ok": True, "seed": seed, "sigma": sigma, "n_tensors": len(self.params), "seconds": self._since(start)}

    def _since(self, start: float) -> float:
        """Seconds since ``start`` once the device has finished the queued work (honest timings)."""
        for device in self._devices:
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    def revert(self, seed: int, sigma: float) -> dict[str, Any]:
        """theta -= sigma * eps(seed); must name the active perturbation.  No-op when none is active."""
        seed, sigma = _check_seed(seed), _finite("sigma", sigma, None)
        if self.perturbation is None:
            return {"ok": True, "reverted": False}
        if self.perturbation != {"seed": seed, "sigma": sigma}:
            raise ValueError(f"revert({seed}, {sigma}) does not match the active perturbation {self.perturbation}")
        start = time.perf_counter()
        with torch.no_grad():
            if self._copy is not None:
                self._copy.restore()
            else:
                for name, param in self.params:
                    self._add_noise(name, param, seed, -sigma)
        self.perturbation = None
        return {"ok": True, "reverted": True, "seed": seed, "sigma": sigma, "seconds": self._since(start)}

    def update(
        self, seeds: Sequence[int], weights: Sequence[float], alpha: float, optimizer: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """theta += (alpha/N) * sum_i w_i * eps(seed_i); no 1/sigma.  Refused while perturbed.  With
        ``optimizer`` (Adam's settings, agent_envs.es.update_rule) theta += alpha * Adam(g) with
        g = (1/N) sum_i w_i * eps(seed_i)."""
        seeds = [_check_seed(s) for s in seeds]
        weights = [_finite("update weights", w, None) for w in weights]
        alpha = _finite("alpha", alpha)
        if not seeds or len(seeds) != len(weights):
            raise ValueError(
                f"seeds and weights must be non-empty and of equal length ({len(seeds)} vs {len(weights)})"
            )
        if self.perturbation is not None:
            raise RuntimeError(f"refusing to update while perturbed ({self.perturbation}); revert first")
        if optimizer is not None:
            self.adam = self.adam or Adam(optimizer)
            self.adam.check(optimizer)
        elif self.adam is not None:
            raise ValueError("this model's earlier updates used Adam; a plain update cannot follow them")
        norm = (
            self._adam_step(seeds, weights, alpha, self.adam) if self.adam else self._accumulate(seeds, weights, alpha)
        )
        self.updates.append({"seeds": seeds, "weights": weights, "alpha": alpha})
        return {
            "ok": True,
            "n": len(seeds),
            "alpha": alpha,
            "weight_norm": weight_norm(weights),
            "update_norm": norm,
        }

    def update_from_rewards(
        self,
        seeds: Sequence[int],
        rewards: Sequence[float],
        alpha: float,
        normalization: str = "zscore",
        ddof: int = 0,
        eps: float = 1e-8,
    ) -> dict[str, Any]:
        """Normalise raw rewards (validated first) and update; the HTTP variant's entry point."""
        weights = normalize_rewards(check_rewards(rewards), normalization, ddof, eps)
        return self.update(seeds, weights, alpha)

    def _accumulate(self, seeds: list[int], weights: list[float], alpha: float) -> float:
        """Add the plain update; return its L2 norm (of the float32 change, before the cast)."""
        coefs = [alpha / len(seeds) * w for w in weights]
        squares = SquareSum()
        with torch.no_grad():
            for _, param, chunk, _, acc in self._noise_sums(seeds, coefs):
                squares.add(acc)
                chunk.add_(acc.to(param.dtype))
        return squares.norm()

    def _noise_sums(
        self, seeds: list[int], coefs: list[float]
    ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor, int, torch.Tensor]]:
        """Per chunk of every parameter: ``(name, param, the chunk's view, its start, sum_i coef_i
        eps_i)``, the sum in float32 with each member's noise drawn in its generator's order; what
        the plain update adds and what Adam's step is computed from.  A caller may change the chunk
        before asking for the next one (the noise does not depend on the weights)."""
        for name, param in self.params:
            gens = [self._generator(s, name, param.device) for s in seeds]
            flat = param.data.view(-1)
            for start, k in self._chunks(param):
                acc = torch.zeros(k, device=param.device, dtype=torch.float32)
                for gen, coef in zip(gens, coefs):
                    acc.add_(torch.randn(k, generator=gen, device=param.device, dtype=torch.float32), alpha=coef)
                yield name, param, flat[start : start + k], start, acc

    def _adam_step(self, seeds: list[int], weights: list[float], alpha: float, adam: Adam) -> float:
        """Per chunk: g = sum_i (w_i/N) eps_i in float32, then theta += alpha * Adam direction (cast
        once); returns the change's L2 norm."""
        coefs = [w / len(seeds) for w in weights]
        corrections = adam.begin()
        squares = SquareSum()
        with torch.no_grad():
            for name, param, chunk, start, g in self._noise_sums(seeds, coefs):
                step = adam.direction(name, g, param.numel(), corrections, start) * alpha
                squares.add(step)
                chunk.add_(step.to(param.dtype))
        return squares.norm()

    def reset(self) -> dict[str, Any]:
        """Undo every update, newest first, by replaying it with -alpha (not Adam's: refused)."""
        if self.perturbation is not None:
            raise RuntimeError(f"refusing to reset while perturbed ({self.perturbation}); revert first")
        if self.adam is not None and self.updates:
            raise RuntimeError("Adam's updates cannot be undone by replaying them; start from fresh weights")
        count = len(self.updates)
        while self.updates:
            last = self.updates.pop()
            self._accumulate(last["seeds"], last["weights"], -last["alpha"])
        return {"ok": True, "reverted_updates": count}
