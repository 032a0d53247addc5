"""Low-rank ES (agent_envs/es/lowrank.py, agent_envs/es/batched.py) on small real torch models,
without vLLM: factors, packed-layer splitting, merge/restore, adapters in PEFT format, the
population trainer's adapter lifecycle, updates, and bit-exact replays (engine-style and onto a
checkpoint folder)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from torch import nn

from agent_envs.es import lowrank
from agent_envs.es.batched import LowRankESTrainer, member_adapters
from agent_envs.es.history import ESConfig, load_history, replay
from agent_envs.es.lowrank import (
    LowRankPerturber,
    Target,
    delta,
    factors,
    find_slots,
    lora_rank_slot,
    replay_onto,
    targets_checksum,
    update_coefficients,
    write_adapter,
)
from agent_envs.es.perturb import SeededPerturber
from agent_envs.es.population import MemberResult

transformers = pytest.importorskip("transformers", reason="transformers is installed by the 'cpu' extra")


def tiny_llama(dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


def target_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {s.target.name: s.rows().clone() for s in find_slots(model)}


class PackedAttention(nn.Module):
    """vLLM's layout: q, k and v stacked in one ``qkv_proj`` weight with ``output_sizes``."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv_proj = nn.Linear(8, 8 + 4 + 4, bias=False)
        self.qkv_proj.output_sizes = [8, 4, 4]
        self.o_proj = nn.Linear(8, 8, bias=False)


class PackedModel(nn.Module):
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.self_attn = PackedAttention()


def test_factors_are_seeded_scaled_and_pinned() -> None:
    target = Target("model.layers.0.self_attn.q_proj.weight", 6, 5)
    a, b = factors(1571296235, target, 4)
    a2, b2 = factors(1571296235, target, 4)
    assert a.dtype == b.dtype == np.float32 and a.shape == (6, 4) and b.shape == (5, 4)
    assert np.array_equal(a, a2) and np.array_equal(b, b2)
    assert not np.array_equal(factors(1571296236, target, 4)[0], a)  # the seed matters
    assert not np.array_equal(factors(1571296235, Target("other.weight", 6, 5), 4)[0], a)  # so does the name
    # PCG64's bits, not a device's generator: these values hold on every machine
    assert [round(float(x), 6) for x in a[0]] == PINNED_A0
    big_a, big_b = factors(7, Target("w", 4000, 3000), 8)
    product = big_a @ big_b.T
    assert abs(float(product.var()) - 1.0) < 0.02  # E = A B^T has unit element variance


PINNED_A0 = [-0.187001, 0.456149, 0.069119, -0.082541]


def test_lora_rank_slots_and_bad_ranks() -> None:
    assert [lora_rank_slot(r) for r in (1, 2, 8, 9, 300)] == [1, 8, 8, 16, 320]
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="rank"):
            lora_rank_slot(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="largest"):
        lora_rank_slot(513)


def test_update_coefficients_divide_by_n_sigma_and_validate() -> None:
    assert update_coefficients([1.0, -2.0], 0.5, 0.25) == [1.0, -2.0]
    with pytest.raises(ValueError, match="sigma must be > 0"):
        update_coefficients([1.0], 0.1, 0.0)
    with pytest.raises(ValueError, match="finite"):
        update_coefficients([float("nan")], 0.1, 0.1)
    with pytest.raises(ValueError, match="at least one"):
        update_coefficients([], 0.1, 0.1)


def test_slots_of_a_transformers_model_are_the_hf_linear_weights() -> None:
    slots = find_slots(tiny_llama())
    names = [s.target.name for s in slots]
    assert len(names) == 2 * 7 and names[:7] == [
        f"model.layers.0.{m}.weight"
        for m in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    ]
    assert (slots[1].target.out_features, slots[1].target.in_features) == (16, 32)
    assert [s.target.name for s in find_slots(tiny_llama(), ["down_proj"])] == [
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
    ]
    with pytest.raises(ValueError, match="no 2-D weight"):
        find_slots(tiny_llama(), ["nothing_proj"])


def test_packed_layer_is_split_by_output_sizes() -> None:
    model = PackedModel()
    slots = find_slots(model)
    assert [(s.target.name, s.row, s.target.out_features) for s in slots] == [
        ("self_attn.q_proj.weight", 0, 8),
        ("self_attn.k_proj.weight", 8, 4),
        ("self_attn.v_proj.weight", 12, 4),
        ("self_attn.o_proj.weight", 0, 8),
    ]
    before = model.self_attn.qkv_proj.weight.detach().clone()
    es = LowRankPerturber(model, 2)
    es.apply(5, 0.1)
    after = model.self_attn.qkv_proj.weight.detach()
    for slot in slots[:3]:  # every unpacked weight got its own factors, in its own rows
        expected = before[slot.row : slot.row + slot.target.out_features] + delta([5], [0.1], slot.target, 2)
        assert torch.equal(after[slot.row : slot.row + slot.target.out_features], expected)
    model.self_attn.qkv_proj.output_sizes = [8, 8]  # a tensor-parallel shard would not add up
    with pytest.raises(ValueError, match="tensor_parallel_size=1"):
        find_slots(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_then_revert_is_bit_exact_and_merging_changes_outputs(dtype: torch.dtype) -> None:
    model = tiny_llama(dtype)
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    base_logits, before = model(ids).logits, target_state(model)
    es = LowRankPerturber(model, 4)
    assert es.status()["n_targets"] == 14 and es.status()["merged"] is None
    es.apply(11, 0.05)
    assert (model(ids).logits - base_logits).abs().max() > 1e-3
    with pytest.raises(RuntimeError, match="merged"):
        es.update([1], [1.0], 0.1, 0.05)
    with pytest.raises(RuntimeError, match="merged"):
        es.apply(12, 0.05)
    assert es.revert()["reverted"] and not es.revert()["reverted"]
    assert all(torch.equal(before[n], t) for n, t in target_state(model).items())


def test_adapter_in_peft_format_equals_the_merged_perturbation(tmp_path: Path) -> None:
    """The adapter written for a member, loaded by PEFT onto the base model, gives the logits of
    the base model with that member's perturbation merged in (float32, 1e-5)."""
    peft = pytest.importorskip("peft", reason="peft is installed by the 'rewards' extra (scripts/install.sh --test)")
    model, ids = tiny_llama(), torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    es = LowRankPerturber(model, 4)
    folder = write_adapter(tmp_path / "member", es.targets, 424242, 0.05, 4)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == config["lora_alpha"] == 4 and config["target_modules"] == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    with torch.no_grad():
        base = model(ids).logits
        es.apply(424242, 0.05)
        merged = model(ids).logits
        es.revert()
        adapted = peft.PeftModel.from_pretrained(tiny_llama(), str(folder)).eval()(ids).logits
    assert (merged - base).abs().max() > 1e-2  # the perturbation is visible ...
    assert (adapted - merged).abs().max() < 1e-5  # ... and the adapter reproduces it


def test_update_matches_the_formula_and_replays_onto_a_fresh_model() -> None:
    model = tiny_llama()
    before = target_state(model)
    es = LowRankPerturber(model, 3)
    seeds, weights, alpha, sigma = [21, 22, 23], [1.2, -0.3, -0.9], 0.01, 0.002
    result = es.update(seeds, weights, alpha, sigma)
    assert result["weight_norm"] == float(torch.tensor(weights, dtype=torch.float32).norm())  # W1: float32
    for slot in es.slots:
        expected = torch.zeros(slot.target.out_features, slot.target.in_features, dtype=torch.float64)
        for s, w in zip(seeds, weights):
            a, b = factors(s, slot.target, 3)
            expected += alpha / (len(seeds) * sigma) * w * torch.from_numpy(a).double() @ torch.from_numpy(b).double().T
        got = slot.rows().double() - before[slot.target.name].double()
        assert (got - expected).abs().max() <= 1e-6 * expected.abs().max()  # float32 rounding only
    fresh = LowRankPerturber(tiny_llama(), 3)
    fresh.update(seeds, weights, alpha, sigma)
    assert fresh.checksum() == es.checksum() != targets_checksum(before.items())


def test_factors_drawn_on_threads_give_the_serial_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The update draws its factors on a thread pool, a few targets ahead: the same bits, in target
    order, as one delta after another on one thread (a replay on a 2-core machine of a run trained
    on 16 cores must match it bit for bit)."""
    targets = LowRankPerturber(tiny_llama(), 3).targets
    seeds, coefs = [31, 32, 33, 34], [0.5, -1.25, 2.0, -0.75]
    serial = [delta(seeds, coefs, t, 3) for t in targets]
    monkeypatch.setattr(lowrank, "FACTOR_THREADS", 4)
    threaded = list(lowrank.deltas(seeds, coefs, targets, 3, ["cpu"] * len(targets)))
    assert len(threaded) == len(targets) == 14 and all(torch.equal(a, b) for a, b in zip(serial, threaded))


def test_in_parallel_keeps_order_and_bounds_what_is_in_flight() -> None:
    """Fast workers, a slow consumer: results come in order and the workers never run more than
    twice the threads ahead of what was consumed (a 4B model's terms must not pile up in memory)."""
    import threading
    import time

    started, lock = [0], threading.Lock()

    def square(x: int) -> int:
        with lock:
            started[0] += 1
        return x * x

    consumed, ahead = [], []
    for value in lowrank.in_parallel(square, list(range(40)), threads=3):
        time.sleep(0.002)  # a slow consumer (the products on the device)
        with lock:
            ahead.append(started[0] - len(consumed))
        consumed.append(value)
    assert consumed == [x * x for x in range(40)] and max(ahead) <= 2 * 3
    with pytest.raises(ZeroDivisionError):
        list(lowrank.in_parallel(lambda x: 1 // (x - 7), list(range(20)), threads=3))


# -- the population trainer, with a recording policy and rewards read off the adapters -------------
class AdapterRegistry:
    """Records ``add_adapter``/``remove_adapter`` like a vLLM policy does."""

    def __init__(self) -> None:
        self.paths: dict[str, Path] = {}
        self.added: list[str] = []

    def add_adapter(self, name: str, path: Path) -> None:
        assert name not in self.paths
        self.paths[name] = Path(path)
        self.added.append(name)

    def remove_adapter(self, name: str) -> None:
        self.paths.pop(name, None)


def adapter_reward(registry: AdapterRegistry, seen: list[tuple[int, str]]):
    """A member's reward is read off its adapter file: proof that the right adapter was in place."""
    from safetensors.torch import load_file

    def evaluate(tasks: Any, seed: int, generation: int, member: int, adapter: str | None = None) -> MemberResult:
        tensors = load_file(str(registry.paths[adapter] / "adapter_model.safetensors"))
        seen.append((seed, adapter))
        first = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
        return MemberResult(generation=generation, member=member, seed=seed, reward=float(first.sum()), rows=[])

    return evaluate


def lowrank_config(targets: list[Target], **extra: Any) -> ESConfig:
    return ESConfig(
        env_id="MATH-ReAct-v0",
        generations=3,
        population=4,
        case_batch_size=2,
        sigma_start=0.01,
        sigma_end=0.005,
        alpha=0.002,
        seed=20260627,
        perturbation="lowrank",
        rank=2,
        lowrank_targets=[t.as_list() for t in targets],
        dtype="float32",
        **extra,
    )


def train_toy(
    tmp_path: Path, dtype: torch.dtype = torch.float32
) -> tuple[nn.Module, LowRankPerturber, Path, list[tuple[int, str]]]:
    model = tiny_llama(dtype)
    backend = LowRankPerturber(model, 2)
    registry, seen = AdapterRegistry(), []
    history = tmp_path / "history.json"
    config = lowrank_config(backend.targets, base_checksum=backend.checksum())
    config.dtype = str(dtype).removeprefix("torch.")
    tasks = [{"id": f"t{i}"} for i in range(5)]
    LowRankESTrainer(
        config,
        backend,
        registry,
        tasks,
        adapter_reward(registry, seen),
        str(history),
        adapter_dir=tmp_path / "adapters",
        log=lambda _: None,
    ).run()
    assert registry.paths == {} and list((tmp_path / "adapters").iterdir()) == []  # unregistered and removed
    return model, backend, history, seen


def test_population_trainer_serves_each_member_its_adapter_and_replays_bit_exactly(tmp_path: Path) -> None:
    (tmp_path / "adapters").mkdir()
    model, backend, history, seen = train_toy(tmp_path)
    records = [r for r in load_history(history) if "rewards" in r]
    assert [r["generation"] for r in records] == [0, 1, 2] and len(backend.updates) == 3
    assert sorted(seen) == sorted((s, f"es-g{r['generation']}-m{m}") for r in records for m, s in enumerate(r["seeds"]))
    assert all(len(set(r["rewards"])) == 4 and r["weights_fingerprint"].startswith("wf1:") for r in records)
    assert [u["sigma"] for u in backend.updates] == [r["sigma"] for r in records]
    fresh_model = tiny_llama()
    fresh = LowRankPerturber(fresh_model, 2)
    assert replay(load_history(history), fresh, 20260627, 4) == 3
    assert fresh.checksum() == backend.checksum()
    trained = dict(model.named_parameters())
    assert all(torch.equal(p, trained[n]) for n, p in fresh_model.named_parameters())


def test_replay_refuses_the_other_kind_of_backend(tmp_path: Path) -> None:
    (tmp_path / "adapters").mkdir()
    _, _, history, _ = train_toy(tmp_path)
    with pytest.raises(ValueError, match="lowrank noise; refusing to replay it onto a full backend"):
        replay(load_history(history), SeededPerturber(tiny_llama()), 20260627, 4)
    full_history = [{"config": ESConfig(env_id="MATH-ReAct-v0").model_dump()}]
    with pytest.raises(ValueError, match="full noise; refusing to replay it onto a lowrank backend"):
        replay(full_history, LowRankPerturber(tiny_llama(), 2), 20260627, 16)
    with pytest.raises(ValueError, match="seed stream"):
        replay(load_history(history), LowRankPerturber(tiny_llama(), 2), 1, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replay_onto_a_checkpoint_folder_rebuilds_the_trained_weights(tmp_path: Path, dtype: torch.dtype) -> None:
    """A float32 checkpoint folder + the history -> the trained model, bit for bit on this machine,
    also for a run trained in bfloat16 (the folder is cast first, as the engine casts on load)."""
    (tmp_path / "adapters").mkdir()
    base_dir = tmp_path / "base"
    tiny_llama().save_pretrained(base_dir)
    model, backend, history, _ = train_toy(tmp_path, dtype)
    out = tmp_path / "trained"
    summary = replay_onto(base_dir, history, out)
    assert summary["updates"] == 3 and summary["base_matches_run"] is True
    assert summary["checksum"] == backend.checksum() != summary["base_checksum"]
    rebuilt = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=dtype)
    trained = dict(model.named_parameters())
    assert all(torch.equal(p, trained[n]) for n, p in rebuilt.named_parameters())
    assert json.loads((out / "config.json").read_text())["dtype"] == str(dtype).removeprefix("torch.")
    partial = replay_onto(base_dir, history, tmp_path / "first", generations=1)
    assert partial["updates"] == 1 and partial["checksum"] not in (summary["checksum"], summary["base_checksum"])


def test_replay_onto_fingerprints_every_kth_update_and_the_last(tmp_path: Path) -> None:
    """``check_every`` skips the (costly) fingerprints in between but never the last update's, and each
    fingerprint taken is the one the run recorded for that generation."""
    (tmp_path / "adapters").mkdir()
    base_dir = tmp_path / "base"
    tiny_llama().save_pretrained(base_dir)
    _, _, history, _ = train_toy(tmp_path)
    recorded = [r["weights_fingerprint"] for r in load_history(history) if "rewards" in r]
    seen: list[tuple[int, str]] = []
    replay_onto(base_dir, history, tmp_path / "t", after_update=lambda i, fp: seen.append((i, fp)), check_every=2)
    assert seen == [(1, recorded[1]), (2, recorded[2])]
    every: list[tuple[int, str]] = []
    replay_onto(base_dir, history, tmp_path / "u", after_update=lambda i, fp: every.append((i, fp)))
    assert every == list(enumerate(recorded))
    with pytest.raises(ValueError, match="check_every must be >= 1"):
        replay_onto(base_dir, history, tmp_path / "v", check_every=0)


def test_replay_onto_names_a_missing_or_misshapen_target(tmp_path: Path) -> None:
    (tmp_path / "adapters").mkdir()
    _, _, history, _ = train_toy(tmp_path)
    other = tmp_path / "other"
    transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=40,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
        )
    ).save_pretrained(other)
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.gate_proj.weight \(48x32\) is shape \(40, 32\)"):
        replay_onto(other, history, tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        replay_onto(tmp_path / "adapters", history, tmp_path / "y")


def test_member_adapters_are_removed_when_a_registration_fails(tmp_path: Path) -> None:
    """The engine refuses the third adapter: the two registered are unregistered, no writer is still
    running and the folder is gone."""

    class Refusing(AdapterRegistry):
        def add_adapter(self, name: str, path: Path) -> None:
            if len(self.paths) == 2:
                raise ValueError(f"adapter {name!r} ({path}): the engine could not load it: full")
            super().add_adapter(name, path)

    registry = Refusing()
    targets = LowRankPerturber(tiny_llama(), 2).targets
    with (
        pytest.raises(ValueError, match="es-g3-m2"),
        member_adapters(registry, targets, [5, 6, 7, 8, 9], 0.01, 2, 3, root=tmp_path),
    ):
        pass
    assert registry.added == ["es-g3-m0", "es-g3-m1"] and registry.paths == {} and list(tmp_path.iterdir()) == []


def test_member_adapters_are_removed_even_when_evaluation_fails(tmp_path: Path) -> None:
    registry = AdapterRegistry()
    targets = LowRankPerturber(tiny_llama(), 2).targets
    with (
        pytest.raises(RuntimeError, match="boom"),
        member_adapters(registry, targets, [5, 6], 0.01, 2, 0, root=tmp_path) as names,
    ):
        assert names == ["es-g0-m0", "es-g0-m1"] and all(p.is_dir() for p in registry.paths.values())
        raise RuntimeError("boom")
    assert registry.paths == {} and list(tmp_path.iterdir()) == []


def test_work_alongside_runs_beside_the_body_and_its_error_is_not_lost() -> None:
    import threading

    from agent_envs.es.lowrank import alongside

    started, body_may_end = threading.Event(), threading.Event()

    def work() -> None:
        started.set()
        body_may_end.wait(10)

    with alongside(work, [torch.device("cpu")]) as ran:
        assert started.wait(10)  # the work runs while the body does
        body_may_end.set()
    assert ran.seconds is not None and ran.seconds > 0

    def failing() -> None:
        raise RuntimeError("no room")

    with pytest.raises(RuntimeError, match="no room"):
        with alongside(failing, []):
            pass
    with pytest.raises(ValueError, match="the body's"):  # the body's own error wins
        with alongside(failing, []):
            raise ValueError("the body's")
