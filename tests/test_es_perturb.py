"""Seeded perturbation and update maths on small real torch models (fp32 and bf16)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from agent_envs.es.perturb import SeededPerturber, select_parameters
from agent_envs.es.tensor_seeds import name_id, tensor_seed


def make_mlp(dtype: torch.dtype = torch.float32, tied: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("embed_tokens", nn.Embedding(11, 6))
    model.add_module("up_proj", nn.Linear(6, 8))
    model.add_module("norm", nn.LayerNorm(8))
    model.add_module("down_proj", nn.Linear(8, 6))
    model.add_module("lm_head", nn.Linear(6, 11, bias=False))
    if tied:
        model.lm_head.weight = model.embed_tokens.weight
    return model.to(dtype)


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def max_diff(model: nn.Module, before: dict[str, torch.Tensor]) -> float:
    return max((p.detach().float() - before[n].float()).abs().max().item() for n, p in model.named_parameters())


def test_linear_apply_revert_restores_fp32() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    before = snapshot(layer)
    es = SeededPerturber(layer)
    es.apply(123, 0.01)
    assert max_diff(layer, before) > 1e-3
    es.revert(123, 0.01)
    assert max_diff(layer, before) <= 1e-7


def test_bf16_apply_revert_within_rounding() -> None:
    model = make_mlp(torch.bfloat16)
    before = snapshot(model)
    es = SeededPerturber(model)
    es.apply(99, 1e-3)
    es.revert(99, 1e-3)
    # Not bit-exact in bf16: each add rounds; the residue is at most ~2 ulp of the weight.
    for name, p in model.named_parameters():
        ulp = torch.finfo(torch.bfloat16).eps * before[name].float().abs().clamp_min(1e-30)
        assert ((p.float() - before[name].float()).abs() <= 2 * ulp + 1e-3 * 2**-8).all(), name


def test_update_then_reset_restores() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        model = make_mlp(dtype)
        before = snapshot(model)
        es = SeededPerturber(model)
        result = es.update([11, 22, 33], [1.0, -0.5, 0.25], 0.05)
        # W1: reported in float32, as the reference (not sqrt(1.3125) = 1.14564392373896 in float64)
        assert result["n"] == 3 and result["weight_norm"] == 1.145643949508667
        assert max_diff(model, before) > 1e-3
        assert es.reset() == {"ok": True, "reverted_updates": 1}
        limit = 1e-7 if dtype == torch.float32 else 0.02
        assert max_diff(model, before) <= limit


def test_nan_inputs_refused_before_mutation() -> None:
    layer = nn.Linear(3, 2)
    before = snapshot(layer)
    es = SeededPerturber(layer)
    for call in (
        lambda: es.apply(1, math.nan),
        lambda: es.apply(1, math.inf),
        lambda: es.update([1, 2], [0.5, math.nan], 0.1),
        lambda: es.update([1, 2], [0.5, 0.5], math.nan),
        lambda: es.update_from_rewards([1, 2], [0.5, math.nan], 0.1),
        lambda: es.update([1, 2], [0.5], 0.1),
    ):
        with pytest.raises(ValueError):
            call()
        assert max_diff(layer, before) == 0.0
    assert es.status()["perturbation"] is None and es.status()["update_history"] == 0


def test_guards_while_perturbed() -> None:
    layer = nn.Linear(3, 2)
    es = SeededPerturber(layer)
    es.apply(5, 0.1)
    with pytest.raises(RuntimeError, match="update while perturbed"):
        es.update([1], [1.0], 0.1)
    with pytest.raises(RuntimeError, match="already applied"):
        es.apply(6, 0.1)
    with pytest.raises(ValueError, match="does not match"):
        es.revert(6, 0.1)
    es.revert(5, 0.1)
    assert es.revert(5, 0.1) == {"ok": True, "reverted": False}


def test_reinit_undoes_updates() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    before = snapshot(layer)
    es = SeededPerturber(layer)
    es.update([1, 2], [1.0, -1.0], 0.1)
    assert es.init("full")["reverted_updates"] == 1
    assert max_diff(layer, before) <= 1e-7


def test_coverage_and_tied_weights() -> None:
    model = make_mlp(tied=True)
    es = SeededPerturber(model)
    cover = es.coverage()
    distinct = {id(p): p.numel() for p in model.parameters()}
    assert cover["total_params"] == cover["model_params"] == sum(distinct.values())
    assert cover["empty_tensors"] == []
    assert [n for n, _ in es.params].count("lm_head.weight") == 0  # tied: moved once, as embed_tokens
    before = model.embed_tokens.weight.detach().clone()
    es.apply(3, 0.5)
    one_step = (model.embed_tokens.weight - before).abs().max().item()
    es.revert(3, 0.5)
    assert 0 < one_step < 0.5 * 6  # a single sigma-step, not two stacked ones


def test_empty_tensor_is_reported() -> None:
    named = [("a.weight", torch.zeros(4, 3)), ("b.weight", torch.empty(0))]
    assert SeededPerturber(named).coverage()["empty_tensors"] == ["b.weight"]


def test_all_linear_scope() -> None:
    names = [n for n, _ in select_parameters(make_mlp(), "all_linear")]
    assert names == ["up_proj.weight", "down_proj.weight"]
    assert [n for n, _ in select_parameters(make_mlp(), "all_linear", ["down_proj"])] == ["down_proj.weight"]
    with pytest.raises(ValueError, match="selects no"):
        select_parameters(make_mlp(), "lora")


def test_noise_determinism_and_independence() -> None:
    param = torch.zeros(1000)
    es = SeededPerturber([("x", param)], chunk=64)
    a, b = es.noise(42, "layer.weight", param), es.noise(42, "layer.weight", param)
    assert torch.equal(a, b)
    assert not torch.equal(a, es.noise(42, "layer.bias", param))
    assert not torch.equal(a, es.noise(43, "layer.weight", param))
    other_rank = SeededPerturber([("x", param)], chunk=64, rank=1, tp_size=2)
    rank0 = SeededPerturber([("x", param)], chunk=64, rank=0, tp_size=2)
    assert not torch.equal(other_rank.noise(42, "layer.weight", param), rank0.noise(42, "layer.weight", param))
    assert a.std().item() == pytest.approx(1.0, abs=0.1)


def test_tensor_seed_formula() -> None:
    tid = int.from_bytes(__import__("hashlib").blake2b(b"model.w", digest_size=8).digest(), "little")
    assert name_id("model.w") == tid
    assert tensor_seed(12345, "model.w") == (12345 ^ tid) % 2**64
    assert tensor_seed(12345, "model.w", rank=0, tp_size=2) != tensor_seed(12345, "model.w")


def test_update_matches_reference_formula() -> None:
    param = torch.zeros(300)
    es = SeededPerturber([("w", param)], chunk=128)
    seeds, weights, alpha = [7, 8, 9], [0.5, -1.0, 2.0], 0.3
    expected = sum(alpha / 3 * w * es.noise(s, "w", param) for s, w in zip(seeds, weights))
    es.update(seeds, weights, alpha)
    assert torch.allclose(param, expected, atol=1e-6)


def test_exact_revert_is_bit_exact_in_bf16() -> None:
    model = make_mlp(torch.bfloat16)
    before = snapshot(model)
    es = SeededPerturber(model, exact_revert=True)
    es.apply(99, 1e-2)
    assert max_diff(model, before) > 0
    es.revert(99, 1e-2)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_snapshot_diff_sees_perturbation_and_its_revert() -> None:
    es = SeededPerturber(make_mlp())
    with pytest.raises(RuntimeError, match="snapshot"):
        es.max_abs_diff()
    es.snapshot()
    es.apply(7, 0.01)
    assert es.max_abs_diff() > 1e-3
    es.revert(7, 0.01)
    assert es.max_abs_diff() <= 1e-7
