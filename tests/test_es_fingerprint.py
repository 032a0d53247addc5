"""The weights fingerprint (exact integer sums over the raw bits) and the exact-revert copy."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn
from vllm_cpu import REPO, run_result, script_env

from agent_envs.es import revert_copy
from agent_envs.es.fingerprint import combine, combine_checksums, fingerprint, raw_words, tensor_sums
from agent_envs.es.perturb import SeededPerturber
from agent_envs.es.revert_copy import DEVICE_MARGIN_BYTES, choose_location


def reference_sums(tensor: torch.Tensor, order: list[int]) -> tuple[int, int]:
    """S1 and S2 by the definition, one word at a time in the given order, in Python integers."""
    words = raw_words(tensor).tolist()
    s1 = s2 = 0
    for i in order:
        s1 += words[i]
        s2 += words[i] * ((i % 2**15) + 1)
    return s1, s2


def flip_bit(tensor: torch.Tensor, byte: int, bit: int) -> torch.Tensor:
    out = tensor.clone()
    raw = out.reshape(-1).view(torch.uint8)
    raw[byte] ^= 1 << bit
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_sums_equal_the_definition_in_any_order_and_step(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    tensor = torch.randn(2**15 + 77, dtype=torch.float32).to(dtype)  # crosses the weights' period
    n = raw_words(tensor).numel()
    shuffled = list(range(n))
    random.Random(1).shuffle(shuffled)
    expected = reference_sums(tensor, list(range(n)))
    assert reference_sums(tensor, shuffled) == expected  # the definition itself is order-free
    for step in (1000, 2**15, 2**15 + 3, 2**24):  # how the device splits the reduction changes nothing
        assert tensor_sums(tensor, step) == expected, step
    small = tensor[:300]
    words = raw_words(small).numel()
    assert {tensor_sums(small, step) for step in (1, 7, words)} == {reference_sums(small, list(range(words)))}
    named = [("a.weight", tensor), ("b.bias", tensor[:5].clone())]
    assert {fingerprint(named, step) for step in (7, 2**15, 2**24)} == {fingerprint(named)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_single_bit_flip_changes_the_fingerprint(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    tensor = torch.randn(2**15 + 9).to(dtype)
    base = fingerprint([("w", tensor)])
    n = tensor.numel() * tensor.element_size()
    for byte in (0, 1, 2, 3, n // 2, n // 2 + 1, n - 2, n - 1):
        for bit in range(8):
            changed = flip_bit(tensor, byte, bit)
            assert not torch.equal(raw_words(changed), raw_words(tensor))
            assert fingerprint([("w", changed)]) != base, (byte, bit)


def test_swaps_names_shapes_and_dtypes_are_seen() -> None:
    torch.manual_seed(0)
    tensor = torch.randn(64, 32).to(torch.bfloat16)
    base = fingerprint([("w", tensor)])
    swapped = tensor.clone().reshape(-1)
    swapped[[3, 900]] = swapped[[900, 3]]
    assert not torch.equal(swapped, tensor.reshape(-1))
    assert fingerprint([("w", swapped.reshape(64, 32))]) != base
    assert fingerprint([("v", tensor)]) != base
    assert fingerprint([("w", tensor.reshape(32, 64))]) != base
    assert fingerprint([("w", tensor.view(torch.float16))]) != base
    assert fingerprint([("w", tensor.clone())]) == base and base.startswith("wf1:") and len(base) == 36


def test_rank_values_combine() -> None:
    assert combine(["wf1:a"]) == "wf1:a" and combine("wf1:a") == "wf1:a"
    assert combine(["wf1:a", "wf1:b"]) != combine(["wf1:b", "wf1:a"])
    assert combine(["wf1:a", "wf1:b"]).startswith("wf1:")
    assert combine_checksums(["x"]) == "x" and len(combine_checksums(["x", "y"])) == 64


def test_perturber_fingerprint_tracks_apply_update_and_exact_revert() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)).to(torch.bfloat16)
    es = SeededPerturber(model, exact_revert=True)
    start = es.fingerprint()
    es.apply(5, 1e-2)
    assert es.fingerprint() != start
    es.revert(5, 1e-2)
    assert es.fingerprint() == start
    es.update([1, 2], [1.0, -1.0], 0.1)
    assert es.fingerprint() != start
    assert SeededPerturber(model).fingerprint() == es.fingerprint()  # a pure function of the weights


# -- where the exact-revert copy lives -------------------------------------------------------------


def test_copy_location_decision() -> None:
    gib = 2**30
    where, why = choose_location("auto", {"cuda:0": 8 * gib}, {"cuda:0": 20 * gib})
    assert where == "device" and "cuda:0 8.00 GiB" in why
    where, why = choose_location("auto", {"cuda:0": 8 * gib}, {"cuda:0": 8 * gib})  # no margin left
    assert where == "host" and "cuda:0 needs 8.00 GiB + 1.00 GiB margin, has 8.00 GiB free" in why
    assert choose_location("host", {"cuda:0": 1}, {"cuda:0": 20 * gib})[0] == "host"
    assert choose_location("auto", {"cpu": 8 * gib}, {"cpu": None})[0] == "device"  # the host is the CPU's device
    with pytest.raises(RuntimeError, match="no room for a device copy"):
        choose_location("device", {"cuda:0": 8 * gib}, {"cuda:0": gib})
    with pytest.raises(ValueError, match="revert copy must be one of"):
        choose_location("gpu", {}, {})
    assert DEVICE_MARGIN_BYTES == gib


def bf16_model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.Linear(64, 8)).to(torch.bfloat16)


def snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_device_copy_is_allocated_once_and_restores_bit_for_bit() -> None:
    model = bf16_model()
    before = snapshot(model)
    es = SeededPerturber(model, exact_revert=True)
    assert es.status()["revert_copy"] == "device" and "cpu" in es.status()["revert_copy_reason"]
    buffers = [b.data_ptr() for b in es._copy._buffers]
    for seed in (11, 12, 13):
        applied = es.apply(seed, 1e-2)
        assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before))
        reverted = es.revert(seed, 1e-2)
        assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
        assert applied["seconds"] >= 0 and reverted["seconds"] >= 0
    assert [b.data_ptr() for b in es._copy._buffers] == buffers  # the same copy for every member


def test_host_copy_when_the_device_has_no_room(monkeypatch, capsys) -> None:
    model = bf16_model()
    before = snapshot(model)
    monkeypatch.setattr(revert_copy, "free_bytes", lambda device: 0)  # a full GPU, as the CPU can simulate it
    es = SeededPerturber(model, exact_revert=True)
    status = es.status()
    assert status["revert_copy"] == "host" and "no room for a device copy" in status["revert_copy_reason"]
    assert "[es] exact revert: no room for a device copy" in capsys.readouterr().err  # the reason is printed
    es.apply(7, 1e-2)
    es.revert(7, 1e-2)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert es._copy._buffers == []  # the host copy lives only while a member is perturbed


def test_failed_apply_restores_from_the_copy(monkeypatch) -> None:
    model = bf16_model()
    before = snapshot(model)
    es = SeededPerturber(model, exact_revert=True)
    calls = {"n": 0}
    real = es._add_noise

    def failing(name, param, seed, sigma):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected")
        real(name, param, seed, sigma)

    monkeypatch.setattr(es, "_add_noise", failing)
    with pytest.raises(RuntimeError, match="injected"):
        es.apply(9, 0.5)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert es.perturbation is None


def test_reinit_frees_the_old_copy_first() -> None:
    es = SeededPerturber(bf16_model(), exact_revert=True)
    old = es._copy
    es.init("all_linear")
    assert old._buffers == [] and es._copy is not old and len(es._copy._buffers) == 2


def test_one_launch_sums_equal_the_torch_form_under_the_interpreter() -> None:
    """The GPU's one launch per tensor (agent_envs/es/fingerprint_triton.py) gives the torch form's
    integers, a strided view of a wider tensor read in place included; 4-byte words and views whose rows
    are not contiguous stay with the torch form (tests/fingerprint_cases.py, Triton's interpreter)."""
    out, _ = run_result([str(REPO / "tests" / "fingerprint_cases.py")], env=script_env(), timeout=300)
    for case in out["cases"]:
        assert case["equal"], case
    served = {c["name"]: c["kernel_served"] for c in out["cases"]}
    assert served["bfloat16, a strided view of a wider tensor"] and served["bfloat16, 1-D, past the weights' period"]
    assert not served["float32"] and not served["bfloat16, transposed"]
    assert out["fingerprints_equal"]


def test_one_launch_sums_compile_for_an_h200() -> None:
    out, _ = run_result(
        [str(REPO / "tests" / "fingerprint_cases.py"), "--compile"], env=script_env(TRITON_INTERPRET=None), timeout=300
    )
    assert out["cubin_bytes"] > 0
