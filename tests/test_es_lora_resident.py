"""Resident low-rank adapters rewritten in place (agent_envs/es/batched.py, agent_envs/es/lora_slots.py,
LowRankPerturber's kept factors), without vLLM: the trainer's lifecycle with a backend that can
refresh and one whose engine cannot (falls back to adapter folders, saying why once), the update
from kept factors, and lora_slots' checks on vLLM-shaped LoRA structures.  The real engine's refresh
is checked bit for bit by scripts/es_lowrank_check.py (tests/test_es_lowrank_vllm.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from test_es_lowrank import AdapterRegistry, lowrank_config, tiny_llama

from agent_envs.es import lora_slots, population_matmul
from agent_envs.es.batched import LowRankESTrainer
from agent_envs.es.history import load_history
from agent_envs.es.lowrank import LowRankPerturber, Target, adapter_tensors, factors, member_draw
from agent_envs.es.population import MemberResult

FIRST = "model.layers.0.self_attn.q_proj"


class IdRegistry(AdapterRegistry):
    """A policy that gives adapters engine ids and reads what each one holds (its first target's lora_B)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[str, int] = {}
        self.held: dict[int, torch.Tensor] = {}

    def add_adapter(self, name: str, path: Path) -> None:
        from safetensors.torch import load_file

        super().add_adapter(name, path)
        self.ids[name] = len(self.added)
        self.held[self.ids[name]] = load_file(str(Path(path) / "adapter_model.safetensors"))[
            f"base_model.model.{FIRST}.lora_B.weight"
        ]

    def remove_adapter(self, name: str) -> None:
        super().remove_adapter(name)
        self.held.pop(self.ids.pop(name, -1), None)

    def lora_id(self, name: str) -> int:
        return self.ids[name]


class Refreshing(LowRankPerturber):
    """The toy backend with the engine's ``refresh``: rewrites what the registry's adapters hold."""

    def __init__(self, model: torch.nn.Module, registry: IdRegistry, unsupported: str | None = None) -> None:
        super().__init__(model, 2)
        self.registry, self.unsupported, self.calls = registry, unsupported, []
        #: per refresh: how many members came from the adapters drawn ahead
        self.prefetched: list[int] = []
        #: the seeds each prefetch was asked for, and the refresh it was asked to write ahead (None: none)
        self.asked: list[list[int]] = []
        self.ahead: list[Any] = []

    def prefetch(self, seeds: list[int], sigma: float, refresh: Any = None) -> dict[str, Any]:
        self.asked.append(list(seeds))
        self.ahead.append(refresh)
        return super().prefetch(seeds, sigma)

    def refresh(self, lora_ids: list[int], seeds: list[int], sigma: float) -> str | None:
        self.calls.append((list(lora_ids), list(seeds)))
        if self.unsupported:
            return self.unsupported
        ready = self.take_prefetched(seeds, sigma)  # as the worker's es_lowrank_refresh
        self.prefetched.append(sum(s in ready for s in seeds))
        for lora_id, seed in zip(lora_ids, seeds):
            self.registry.held[lora_id] = self.member_adapter(seed, sigma, ready)[FIRST][1]
        return None


class RefreshingWithUpdate(Refreshing):
    """The toy backend with the engine's ``refresh=`` on ``update``: the next generation's adapters
    rewritten once the update's products are issued, as ``ESWorkerExtension.es_lowrank_update`` does."""

    refreshes_with_update = True
    writes_ahead = True

    def __init__(self, model: torch.nn.Module, registry: IdRegistry) -> None:
        super().__init__(model, registry)
        self.last_refresh: dict[str, Any] = {}
        #: per update: the refresh arguments it was given (None: none)
        self.with_update: list[Any] = []

    def update(self, seeds: Any, weights: Any, alpha: float, sigma: float, refresh: Any = None, **kw: Any) -> Any:
        self.with_update.append(refresh)

        def meanwhile() -> None:
            ids, next_seeds, next_sigma, _ = refresh
            self.refresh(list(ids), list(next_seeds), next_sigma)
            self.last_refresh = {"ok": True, "prefetched": self.prefetched[-1], "wait_s": 0.0, "write_s": 0.0,
                                 "slots_s": 0.0, "with_update": True}  # fmt: skip

        return super().update(seeds, weights, alpha, sigma, kw.get("optimizer"), meanwhile if refresh else None)


def train(tmp_path: Path, backend_of: Any) -> tuple[Any, IdRegistry, list[dict[str, Any]], list[str]]:
    registry, logs, seen = IdRegistry(), [], []
    backend = backend_of(tiny_llama(), registry)

    def evaluate(tasks: Any, seed: int, generation: int, member: int, adapter: str | None = None) -> MemberResult:
        seen.append(adapter)
        reward = float(registry.held[registry.lora_id(adapter)].sum())
        return MemberResult(generation=generation, member=member, seed=seed, reward=reward, rows=[])

    history = tmp_path / f"h{len(list(tmp_path.iterdir()))}.json"
    (tmp_path / "adapters").mkdir(exist_ok=True)
    config = lowrank_config(backend.targets, base_checksum=backend.checksum())
    tasks = [{"id": f"t{i}"} for i in range(5)]
    trainer = LowRankESTrainer(
        config, backend, registry, tasks, evaluate, str(history), adapter_dir=tmp_path / "adapters", log=logs.append
    )
    trainer.run()
    assert registry.paths == {} and list((tmp_path / "adapters").iterdir()) == []  # unregistered, folders gone
    return backend, registry, [r for r in load_history(history) if "rewards" in r], logs


def test_resident_adapters_are_loaded_once_and_refreshed_with_the_same_records(tmp_path: Path) -> None:
    plain, _, files_records, files_logs = train(tmp_path, lambda model, registry: LowRankPerturber(model, 2))
    backend, registry, records, logs = train(tmp_path, Refreshing)
    assert registry.added == ["es-m0", "es-m1", "es-m2", "es-m3"]  # loaded once, in generation 0
    ids = [1, 2, 3, 4]
    assert backend.calls == [(ids, records[1]["seeds"]), (ids, records[2]["seeds"])]
    assert records == files_records and backend.checksum() == plain.checksum()
    assert backend.kept_factors == 4 and backend.drawn == {}
    assert backend.prefetched == [4, 4]  # each refresh took the adapters drawn during the generation before
    assert backend.asked == [records[1]["seeds"], records[2]["seeds"]]  # none after the last generation
    assert backend.ahead == [None, None]  # a backend that cannot write ahead is not asked to
    assert sum("adapters refreshed" in line for line in logs) == 2
    assert not any("refreshed" in line for line in files_logs)


def test_the_next_adapters_refreshed_during_the_update_give_the_same_records(tmp_path: Path) -> None:
    plain, _, files_records, _ = train(tmp_path, lambda model, registry: LowRankPerturber(model, 2))
    backend, registry, records, logs = train(tmp_path, RefreshingWithUpdate)
    ids = (1, 2, 3, 4)
    # generation 0 writes the adapters; its update rewrites them as generation 1's members, generation 1's
    # update as generation 2's; the last update has no next generation
    assert backend.calls == [(list(ids), records[1]["seeds"]), (list(ids), records[2]["seeds"])]
    assert backend.with_update == [
        (ids, tuple(records[1]["seeds"]), records[1]["sigma"], None),
        (ids, tuple(records[2]["seeds"]), records[2]["sigma"], None),
        None,
    ]
    # each prefetch was asked to write ahead the very refresh the update then asks for
    assert backend.ahead == backend.with_update[:-1]
    assert records == files_records and backend.checksum() == plain.checksum()
    assert backend.prefetched == [4, 4] and backend.kept_factors == 4  # drawn ahead, kept for the update
    assert sum("adapters refreshed" in line and "during the last update" in line for line in logs) == 2


class FailingWithUpdate(RefreshingWithUpdate):
    """Its refresh during the update fails (answered, not raised, as the worker does)."""

    def update(self, seeds: Any, weights: Any, alpha: float, sigma: float, refresh: Any = None, **kw: Any) -> Any:
        self.with_update.append(refresh)
        self.last_refresh = {"ok": False, "error": "RuntimeError: no room"}
        return LowRankPerturber.update(self, seeds, weights, alpha, sigma, kw.get("optimizer"))


def test_a_failed_refresh_during_the_update_leaves_it_to_the_next_generation(tmp_path: Path) -> None:
    _, _, files_records, _ = train(tmp_path, lambda model, registry: LowRankPerturber(model, 2))
    backend, _, records, logs = train(tmp_path, FailingWithUpdate)
    assert [r is not None for r in backend.with_update] == [True, True, False]
    assert backend.calls == [([1, 2, 3, 4], records[1]["seeds"]), ([1, 2, 3, 4], records[2]["seeds"])]
    assert records == files_records
    assert not any("during the last update" in line for line in logs)


def test_an_engine_that_cannot_refresh_falls_back_to_folders_and_says_why_once(tmp_path: Path) -> None:
    _, _, files_records, _ = train(tmp_path, lambda model, registry: LowRankPerturber(model, 2))
    backend, registry, records, logs = train(
        tmp_path, lambda model, registry: Refreshing(model, registry, "unsupported: no slots here")
    )
    assert len(backend.calls) == 1  # asked once, in generation 1, then never again
    assert registry.added == [f"es-m{m}" for m in range(4)] + [f"es-g{g}-m{m}" for g in (1, 2) for m in range(4)]
    assert records == files_records
    reasons = [line for line in logs if "no slots here" in line]
    assert len(reasons) == 1 and "writing and loading adapter folders" in reasons[0]


def test_the_update_from_kept_factors_has_the_bits_of_drawing_again() -> None:
    seeds, weights = [11, 12, 13], [0.5, -1.0, 0.25]
    drawn_again, kept, poisoned = (LowRankPerturber(tiny_llama(), 2) for _ in range(3))
    base = kept.checksum()
    for seed in seeds:
        kept.member_adapter(seed, 0.02)
        poisoned.member_adapter(seed, 0.02)
    for factors_of in poisoned.drawn.values():  # the update must read the kept arrays, not draw anew
        for name, (a, b) in factors_of.items():
            factors_of[name] = (a * 0, b)
    drawn_again.update(seeds, weights, 0.01, 0.02)
    kept.update(seeds, weights, 0.01, 0.02)
    assert kept.kept_factors == 3 and drawn_again.kept_factors == 0 and kept.drawn == {}
    assert kept.checksum() == drawn_again.checksum() != base
    poisoned.update(seeds, weights, 0.01, 0.02)
    assert poisoned.checksum() == base


# -- lora_slots on vLLM-shaped structures (LoRAModel.loras, packed lists, GPU slots) ---------------
class Layer:
    """A LoRA-wrapped layer's ``set_lora``/``reset_lora`` into its slots, as vLLM's layers do."""

    def __init__(self) -> None:
        self.slots: dict[int, Any] = {}

    def set_lora(self, index: int, a: Any, b: Any) -> None:
        self.slots[index] = (a, b)

    def reset_lora(self, index: int) -> None:
        self.slots[index] = None


def fake_manager(dtype: torch.dtype = torch.bfloat16, scaling: float = 1.0) -> tuple[Any, list[Target]]:
    targets = [Target("m.qkv.q.weight", 6, 4), Target("m.qkv.k.weight", 2, 4), Target("m.o.weight", 4, 6)]

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype)

    loras = {
        "m.qkv": SimpleNamespace(lora_a=[zeros(2, 4), zeros(2, 4)], lora_b=[zeros(6, 2), zeros(2, 2)], scaling=[1, 1]),
        "m.o": SimpleNamespace(lora_a=zeros(2, 6), lora_b=zeros(4, 2), scaling=scaling),
    }
    model = SimpleNamespace(loras=loras)
    manager = SimpleNamespace(
        get_adapter={7: model}.get,
        capacity=2,
        lora_index_to_id=[None, 7],
        modules={"m.qkv": Layer(), "m.o": Layer(), "lm_head": Layer()},
        packed_modules={"m.qkv": ["m.qkv.q", "m.qkv.k"]},
        _get_lora_layer_weights=lambda lora_model, name: lora_model.loras.get(name),
    )
    return manager, targets


def test_lora_slots_rewrite_packed_and_plain_modules_as_a_load_casts_them() -> None:
    manager, targets = fake_manager()
    runner = SimpleNamespace(lora_manager=SimpleNamespace(_adapter_manager=manager))
    assert lora_slots.adapter_manager(runner) is manager
    [adapter] = lora_slots.plan(manager, [7], targets, 2)
    adapter.write_all(member_draw(targets, 5, 0.1, 2)[1])
    loras = manager.get_adapter(7).loras
    k_a, k_b = adapter_tensors(*factors(5, targets[1], 2), 0.1)
    assert torch.equal(loras["m.qkv"].lora_a[1], k_a.to(torch.bfloat16))
    assert torch.equal(loras["m.qkv"].lora_b[1], k_b.to(torch.bfloat16))
    assert lora_slots.copy_into_slots(manager, [7]) == 1
    assert manager.modules["m.o"].slots[1][0] is loras["m.o"].lora_a and manager.modules["lm_head"].slots[1] is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda m, t: m.get_adapter(7).loras["m.o"].__setattr__("lora_a", torch.zeros(6, 2)), "lora_a/lora_b are"),
        (lambda m, t: m.get_adapter(7).loras["m.o"].__setattr__("scaling", 0.5), "scaling 0.5"),
        (lambda m, t: t.pop(), "modules differ"),
        (lambda m, t: m.__setattr__("capacity", 0), "max_cpu_loras"),
        (lambda m, t: m.__setattr__("get_adapter", {}.get), "not resident"),
    ],
)
def test_lora_slots_refuse_what_they_do_not_know_before_writing(change: Any, reason: str) -> None:
    manager, targets = fake_manager()
    change(manager, targets)
    with pytest.raises(lora_slots.Unsupported, match=reason):
        lora_slots.plan(manager, [7], targets, 2)
    with pytest.raises(lora_slots.Unsupported, match="no LoRA manager"):
        lora_slots.adapter_manager(SimpleNamespace())
    with pytest.raises(lora_slots.Unsupported, match="lacks"):
        lora_slots.adapter_manager(SimpleNamespace(lora_manager=SimpleNamespace(_adapter_manager=object())))


class StackedLayer:
    """vLLM's slot layout (``lora_*_stacked``: per slice ``[slot, 1, rows, cols]``) and its per-adapter
    ``set_lora``: reset the slot, copy each slice into its corner."""

    def __init__(self, a_shapes: list[tuple[int, int]], b_shapes: list[tuple[int, int]], slots: int = 3) -> None:
        self.lora_a_stacked = tuple(torch.full((slots, 1, *s), 9.0, dtype=torch.bfloat16) for s in a_shapes)
        self.lora_b_stacked = tuple(torch.full((slots, 1, *s), 9.0, dtype=torch.bfloat16) for s in b_shapes)
        self.set_calls = 0

    def reset_lora(self, index: int) -> None:
        for stacked in (*self.lora_a_stacked, *self.lora_b_stacked):
            stacked[index] = 0

    def set_lora(self, index: int, a: Any, b: Any) -> None:
        self.set_calls += 1
        self.reset_lora(index)
        for stacks, parts in ((self.lora_a_stacked, a), (self.lora_b_stacked, b)):
            for stacked, part in zip(stacks, parts if isinstance(parts, list) else [parts]):
                stacked[index, 0, : part.shape[0], : part.shape[1]].copy_(part)


@pytest.mark.parametrize(
    ("index_to_id", "widened"),
    [
        ([8, None, 7], False),  # scattered slots (2, 0): written through an index
        ([None, 7, 8], False),  # consecutive ascending slots (1, 2): one slice per stacked tensor
        ([None, 7, 8], True),  # the same into population_matmul's strided B views of a widened weight
    ],
)
def test_stacked_slots_are_written_at_once_exactly_as_set_lora_writes_them(
    index_to_id: list, widened: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every adapter's slot of a stacked layer at once: the same contents as vLLM's per-adapter
    ``set_lora`` (zero padding beyond the rank included), no ``set_lora`` call, the slot of no refreshed
    adapter untouched; a layer of another layout still gets ``set_lora``.  Strided slot tensors (a
    widened layer's ``B`` views) are written in place, through their views."""
    untouched = index_to_id.index(None)

    def manager_with_two_adapters() -> Any:
        manager, targets = fake_manager()
        other = SimpleNamespace(loras={k: copy_weights(v) for k, v in manager.get_adapter(7).loras.items()})
        models = {7: manager.get_adapter(7), 8: other}
        for seed, model in ((5, models[7]), (6, models[8])):
            for weights in model.loras.values():
                for part in (weights.lora_a if isinstance(weights.lora_a, list) else [weights.lora_a]) + (
                    weights.lora_b if isinstance(weights.lora_b, list) else [weights.lora_b]
                ):
                    part.copy_(torch.randn(part.shape, generator=torch.Generator().manual_seed(seed)))
        manager.get_adapter, manager.lora_index_to_id = models.get, list(index_to_id)
        manager.modules = {
            "m.qkv": StackedLayer([(8, 4), (8, 4)], [(6, 8), (2, 8)]),  # max rank 8 > the adapters' 2
            "m.o": StackedLayer([(8, 6)], [(4, 8)]),
            "lm_head": Layer(),
        }
        return manager

    batched, one_by_one = manager_with_two_adapters(), manager_with_two_adapters()
    wide = {}
    if widened:  # B slots as strided views of one widened weight per layer (rank 2), filled with 9 as vLLM's
        for name, widths in (("m.qkv", [6, 2]), ("m.o", [4])):
            layer = batched.modules[name]
            wide[name] = torch.full((sum(widths), 5 + len(widths) * 3 * 2), 9.0, dtype=torch.bfloat16)
            layer.lora_b_stacked = population_matmul.slot_views(wide[name], 3, widths, 2)
            one_by_one.modules[name].lora_b_stacked = tuple(
                b[..., :2].clone() for b in one_by_one.modules[name].lora_b_stacked
            )
    times: dict[str, float] = {}
    assert lora_slots.copy_into_slots(batched, [7, 8], times) == 2
    assert set(times) == {"stack_s", "queue_s"} and all(t >= 0 for t in times.values())
    kept = [slot for slot in range(3) if slot != untouched]
    for lora_id in (7, 8):
        slot, model = one_by_one.lora_index_to_id.index(lora_id), one_by_one.get_adapter(lora_id)
        for name in ("m.qkv", "m.o"):
            one_by_one.modules[name].set_lora(slot, model.loras[name].lora_a, model.loras[name].lora_b)
    for name in ("m.qkv", "m.o"):
        layer, reference = batched.modules[name], one_by_one.modules[name]
        assert layer.set_calls == 0
        for kind in ("lora_a_stacked", "lora_b_stacked"):
            for got, want in zip(getattr(layer, kind), getattr(reference, kind)):
                assert torch.equal(got[kept], want[kept]) and bool((got[untouched] == 9).all())
        if widened:  # the writes landed in the widened weight itself; its base columns untouched
            assert all(b.data_ptr() >= wide[name].data_ptr() for b in layer.lora_b_stacked)
            assert bool((wide[name][:, :5] == 9).all())
    assert batched.modules["lm_head"].slots == {k: None for k in kept}  # no weights there: reset as before
    assert lora_slots.copy_into_slots(batched, [99]) == 0  # an adapter without a GPU slot: nothing to copy
    # the next refresh: new values through the same staging buffer, the slots again exactly set_lora's,
    # written only once the last refresh's copies out of it are done (on a GPU: an event recorded then)
    staging = dict(batched._agent_envs_staging)
    waited: list[bool] = []
    batched.__dict__[lora_slots._COPIED] = SimpleNamespace(synchronize=lambda: waited.append(True))
    for manager in (batched, one_by_one):
        for weights in manager.get_adapter(8).loras.values():
            for part in weights.lora_a if isinstance(weights.lora_a, list) else [weights.lora_a]:
                part.mul_(-3)
    # the first refresh made every CPU adapter part of a stacked layer a view of its place in the buffer,
    # so the in-place rewrite above already put the new values there: nothing is gathered again
    [places] = staging.values()  # the buffer's places, one per stacked slot tensor, made with it
    buffer = places[0].untyped_storage()
    lo, hi = buffer.data_ptr(), buffer.data_ptr() + buffer.nbytes()
    cpu_parts = [
        part
        for lora_id in (7, 8)
        for name in ("m.qkv", "m.o")
        for kind in ("lora_a", "lora_b")
        for part in _parts(getattr(batched.get_adapter(lora_id).loras[name], kind))
    ]
    assert all(lo <= part.data_ptr() < hi for part in cpu_parts)
    stacked_calls = []
    monkeypatch.setattr(torch.Tensor, "copy_", _counting(torch.Tensor.copy_, stacked_calls, lo, hi))
    monkeypatch.setattr(torch, "stack", lambda *a, **k: stacked_calls.append("stack"))
    assert lora_slots.copy_into_slots(batched, [7, 8]) == 2
    monkeypatch.undo()
    assert stacked_calls == []  # no copy into the buffer: the values were there
    assert waited == [True] and lora_slots._COPIED not in batched.__dict__  # waited for once, then dropped
    assert len(staging) == 1 and all(batched._agent_envs_staging[k] is v for k, v in staging.items())
    model = one_by_one.get_adapter(8)
    for name in ("m.qkv", "m.o"):
        one_by_one.modules[name].set_lora(index_to_id.index(8), model.loras[name].lora_a, model.loras[name].lora_b)
        for kind in ("lora_a_stacked", "lora_b_stacked"):
            for got, want in zip(getattr(batched.modules[name], kind), getattr(one_by_one.modules[name], kind)):
                assert torch.equal(got[kept], want[kept])
    # another layout (adapter 8 alone) gets a buffer of its own: adapter 7's parts, views of the old one,
    # keep their values while 8's are gathered into the new one
    sevens = [part.clone() for part in cpu_parts[: len(cpu_parts) // 2]]
    assert lora_slots.copy_into_slots(batched, [8]) == 1
    [(key, alone)] = batched._agent_envs_staging.items()
    assert alone[0].untyped_storage().data_ptr() != buffer.data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(cpu_parts[: len(cpu_parts) // 2], sevens))


def _parts(value: Any) -> list[torch.Tensor]:
    return value if isinstance(value, list) else [value]


def _counting(copy: Any, calls: list[int], lo: int, hi: int) -> Any:
    """``Tensor.copy_`` that notes every copy into ``[lo, hi)`` (the staging buffer)."""

    def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if lo <= self.data_ptr() < hi:
            calls.append(self.data_ptr())
        return copy(self, *args, **kwargs)

    return counted


def copy_weights(weights: Any) -> Any:
    def clone(value: Any) -> Any:
        return [v.clone() for v in value] if isinstance(value, list) else value.clone()

    return SimpleNamespace(lora_a=clone(weights.lora_a), lora_b=clone(weights.lora_b), scaling=weights.scaling)


def test_adapters_drawn_ahead_are_the_bits_of_drawing_now_and_only_for_their_seeds_and_sigma() -> None:
    ahead, now = LowRankPerturber(tiny_llama(), 2), LowRankPerturber(tiny_llama(), 2)
    ahead.prefetch([5, 6], 0.02)
    ready = ahead.take_prefetched([5, 6], 0.02)
    assert sorted(ready) == [5, 6] and ahead.take_prefetched([5, 6], 0.02) == {}  # used once
    for seed in (5, 6):
        got, fresh = ahead.member_adapter(seed, 0.02, ready), now.member_adapter(seed, 0.02)
        assert got.keys() == fresh.keys() and len(got) == len(ahead.targets)
        for module, (lora_a, lora_b) in got.items():
            assert torch.equal(lora_a, fresh[module][0]) and torch.equal(lora_b, fresh[module][1])
    for name, (a, b) in ahead.drawn[5].items():  # the update's kept factors too
        assert np.array_equal(a, now.drawn[5][name][0]) and np.array_equal(b, now.drawn[5][name][1])
    now.update([5, 6], [1.0, -0.5], 0.01, 0.02)  # drew nothing ahead: stacks the kept factors itself
    ahead.update([5, 6], [1.0, -0.5], 0.01, 0.02)  # the factors the prefetch stacked
    assert ahead.kept_factors == 2 and ahead.checksum() == now.checksum()
    ahead.prefetch([5, 6], 0.02)
    assert ahead.take_prefetched([6, 5], 0.02) == {}  # another order: other members in the slots
    ahead.prefetch([5, 6], 0.02)
    assert ahead.take_prefetched([5, 6], 0.03) == {}  # another sigma: other adapter tensors


def test_stacked_factors_drawn_ahead_serve_only_the_update_of_the_same_seeds_in_order() -> None:
    ahead, plain = LowRankPerturber(tiny_llama(), 2), LowRankPerturber(tiny_llama(), 2)
    ahead.prefetch([7, 8], 0.02)
    for seed in (7, 8):
        ahead.member_adapter(seed, 0.02, ahead.take_prefetched([7, 8], 0.02) if seed == 7 else None)
    ahead.update([8, 7], [0.5, 1.0], 0.01, 0.02)  # another order: the stacks do not fit, factors re-stacked
    plain.update([8, 7], [0.5, 1.0], 0.01, 0.02)
    assert ahead.checksum() == plain.checksum()
    # the update's times say whether its factors came stacked from the prefetch (its recorded answer does not)
    assert not ahead.last_update_timing["stacked_ahead"]
    ahead.prefetch([7, 8], 0.02)
    ready = ahead.take_prefetched([7, 8], 0.02)
    for seed in (7, 8):
        ahead.member_adapter(seed, 0.02, ready)
    answer = ahead.update([7, 8], [0.5, 1.0], 0.01, 0.02)
    assert ahead.last_update_timing["stacked_ahead"] and "stacked_ahead" not in answer
    assert min(ahead.last_update_timing["issue_s"], ahead.last_update_timing["device_s"]) >= 0


def test_an_updates_draws_are_let_go_of_on_the_drawing_thread() -> None:
    """The draws an update used are views of the prefetch's memory file; unmapping it took 0.1-0.2 s of a GPU
    host's update call, so the update hands them to the drawing thread, and nothing else keeps them."""
    import mmap
    import threading
    import weakref

    state = LowRankPerturber(tiny_llama(), 2)
    state.prefetch([5, 6], 0.02)
    ready = state.take_prefetched([5, 6], 0.02)
    for seed in (5, 6):
        state.member_adapter(seed, 0.02, ready)
    del ready
    memory = state.drawn[5][FIRST + ".weight"][0]
    while not isinstance(memory, mmap.mmap):  # a view's bases, down to the memory file's mapping
        memory = memory.base
    freed: list[str] = []
    weakref.finalize(memory, lambda: freed.append(threading.current_thread().name))
    del memory
    state.update([5, 6], [1.0, -0.5], 0.01, 0.02)
    assert state._background is not None
    state._background.submit(lambda: None).result()  # the drawing thread's queue done
    assert len(freed) == 1 and freed[0].startswith("es-prefetch"), freed
    plain = LowRankPerturber(tiny_llama(), 2)  # never prefetched: no drawing thread, let go of at once
    plain.member_adapter(5, 0.02)
    freed_plain: list[str] = []
    weakref.finalize(plain.drawn[5][FIRST + ".weight"][0], lambda: freed_plain.append("done"))
    plain.update([5], [1.0], 0.01, 0.02)
    assert freed_plain == ["done"] and plain._background is None


def test_generations_draw_into_two_memory_files_in_turn_with_the_bits_of_drawing_now() -> None:
    """As the trainer does: the next generation's draws start before this one's update, so they cannot take the
    file this generation's factors are in; from the third generation on each draw takes a file kept from before."""
    state, plain = LowRankPerturber(tiny_llama(), 2), LowRankPerturber(tiny_llama(), 2)
    generations = [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    state.prefetch(generations[0], 0.02)
    for g, seeds in enumerate(generations):
        ready = state.take_prefetched(seeds, 0.02)
        assert sorted(ready) == seeds
        for seed in seeds:
            got, fresh = state.member_adapter(seed, 0.02, ready), plain.member_adapter(seed, 0.02)
            assert all(torch.equal(got[m][0], fresh[m][0]) and torch.equal(got[m][1], fresh[m][1]) for m in got)
        del ready, got
        if g + 1 < len(generations):
            state.prefetch(generations[g + 1], 0.02)
        state.update(seeds, [1.0, -0.5], 0.01, 0.02)
        plain.update(seeds, [1.0, -0.5], 0.01, 0.02)
        assert state.last_update_timing["stacked_ahead"] and state.checksum() == plain.checksum()
    assert (state._memory.made, state._memory.reused) == (2, 3)


def test_write_all_refuses_modules_and_shapes_the_adapter_does_not_hold() -> None:
    targets = [Target(f"{FIRST}.weight", 8, 6)]
    held = SimpleNamespace(
        lora_a=torch.zeros(2, 6, dtype=torch.bfloat16), lora_b=torch.zeros(8, 2, dtype=torch.bfloat16), scaling=1
    )
    manager = SimpleNamespace(get_adapter=lambda i: SimpleNamespace(loras={FIRST: held}), packed_modules={})
    adapter = lora_slots.AdapterTensors(manager, 1, targets, 2)
    lora_a, lora_b = torch.randn(2, 6), torch.randn(8, 2)
    adapter.write_all({FIRST: (lora_a, lora_b)})
    assert torch.equal(held.lora_a, lora_a.to(torch.bfloat16)) and torch.equal(held.lora_b, lora_b.to(torch.bfloat16))
    with pytest.raises(KeyError, match="no modules"):
        adapter.write_all({"model.layers.0.mlp.up_proj": (lora_a, lora_b)})
    with pytest.raises(ValueError, match=r"a \(8, 3\) tensor"):
        adapter.write_all({FIRST: (lora_a, torch.randn(8, 3))})
