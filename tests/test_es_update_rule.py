"""Mirrored pairs, member sampling and Adam on the ES update (ours, not the reference's): each
recorded in the history's config and replayed bit for bit, on the torch toy models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_es_history import Scorer, make_model
from test_es_lowrank import AdapterRegistry, lowrank_config, tiny_llama

from agent_envs.core.types import GenerationRequest
from agent_envs.es import lowrank
from agent_envs.es.batched import LowRankESTrainer
from agent_envs.es.history import ESConfig, load_history, replay, resume, update_records
from agent_envs.es.member_sampling import GREEDY_SETTINGS, member_sampling_settings, normalize_member_sampling
from agent_envs.es.perturb import SeededPerturber
from agent_envs.es.population import ESTrainer, MemberResult, evaluate_member
from agent_envs.es.seeds import SeedStream
from agent_envs.es.update_rule import pair_update
from agent_envs.policy.hf import process_logits
from agent_envs.policy.sampling import SamplingConfig
from agent_envs.scale.toy import TorchToyEngine

TASKS = [{"id": f"t{i}", "x": i / 5} for i in range(5)]
POLICY = TorchToyEngine().policy  # never asked to generate here: the Scorer reads the weights itself
ADAM: dict[str, Any] = {"optimizer": "adam", "adam_beta1": 0.8, "adam_beta2": 0.95, "adam_eps": 1e-6}


class Recorded(SeededPerturber):
    """The toy backend, recording every member's (seed, signed sigma)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.applied: list[tuple[int, float]] = []

    def apply(self, seed: int, sigma: float) -> dict[str, Any]:
        self.applied.append((seed, sigma))
        return super().apply(seed, sigma)


def config(generations: int = 3, **extra: Any) -> ESConfig:
    return ESConfig(
        env_id="toy",
        generations=generations,
        population=4,
        case_batch_size=3,
        seed=7,
        sigma_start=0.05,
        sigma_end=0.02,
        alpha=0.05,
        exact_revert=True,
        **extra,
    )


def trainer(path: Path, cfg: ESConfig, backend: SeededPerturber, **kwargs: Any) -> ESTrainer:
    model = backend._source
    sampling = member_sampling_settings(cfg.member_sampling)

    def evaluate(batch: Any, seed: int, g: int, m: int) -> MemberResult:
        return evaluate_member(
            POLICY, cfg.env_id, batch, seed, generation=g, member=m, rollout=Scorer(model), sampling=sampling
        )

    return ESTrainer(cfg, backend, TASKS, evaluate, str(path), log=lambda _: None, **kwargs)


def train(tmp_path: Path, generations: int = 3, **extra: Any) -> tuple[Recorded, Path, ESConfig]:
    cfg, backend, path = config(generations, **extra), Recorded(make_model(), exact_revert=True), tmp_path / "h.json"
    trainer(path, cfg, backend).run()
    return backend, path, cfg


def replayed(path: Path, **kwargs: Any) -> SeededPerturber:
    fresh = SeededPerturber(make_model())
    replay(load_history(path), fresh, seed=7, population=4, **kwargs)
    return fresh


# -- mirrored pairs ------------------------------------------------------------------------------
def test_mirrored_seeds_come_in_pairs_and_need_an_even_population() -> None:
    stream = SeedStream(7, 4, mirrored=True)
    first = stream.next_generation()
    assert first[0] == first[1] != first[2] == first[3]
    assert first[::2] == SeedStream(7, 2).next_generation()  # half the draws of the same stream
    assert stream.peek() == stream.next_generation()
    with pytest.raises(ValueError, match="even population"):
        SeedStream(7, 3, mirrored=True)
    with pytest.raises(ValueError, match="even population"):
        ESConfig(env_id="toy", population=5, mirrored=True)
    assert pair_update([3, 3, 9, 9], [1.0, -1.0, 0.5, 0.25]) == ([3, 9], [1.0, 0.125])
    with pytest.raises(ValueError, match="share a seed"):
        pair_update([3, 4], [1.0, 0.0])


def test_mirrored_members_are_plus_and_minus_eps_and_the_update_uses_both(tmp_path: Path) -> None:
    backend, path, _ = train(tmp_path, mirrored=True)
    history = load_history(path)
    assert history[0]["config"]["mirrored"] is True
    records = update_records(history)
    for record in records:
        seeds = record["seeds"]
        assert seeds[0] == seeds[1] != seeds[2] == seeds[3]
    first = backend.applied[:4]
    assert [s for s, _ in first] == records[0]["seeds"]
    assert [sigma for _, sigma in first] == [0.05, -0.05, 0.05, -0.05]
    # the update is alpha/N sum_i w_i sign_i eps_i over all four members (applied as two pair terms)
    explicit = SeededPerturber(make_model())
    for r in records:
        signed = [w * (-1 if i % 2 else 1) for i, w in enumerate(r["weights"])]
        explicit.update(r["seeds"], signed, r["alpha"])
    assert (
        max(float((a - b).detach().abs().max()) for (_, a), (_, b) in zip(explicit.params, backend.params, strict=True))
        < 1e-6
    )
    assert replayed(path).checksum() == backend.checksum()  # replay: bit for bit
    unmirrored = [{"config": {**history[0]["config"], "mirrored": False}}, *history[1:]]
    with pytest.raises(ValueError, match="do not match the seed stream"):  # a mirrored run's stream is its own
        replay(unmirrored, SeededPerturber(make_model()), seed=7, population=4)


def test_mirrored_low_rank_members_are_opposite_adapters_and_replay_bit_exactly(tmp_path: Path) -> None:
    (tmp_path / "adapters").mkdir()
    model = tiny_llama()
    backend = lowrank.LowRankPerturber(model, 2)
    registry, seen = AdapterRegistry(), dict[tuple[int, int], float]()

    def evaluate(tasks: Any, seed: int, generation: int, member: int, adapter: str | None = None) -> MemberResult:
        tensors = load_file(str(registry.paths[str(adapter)] / "adapter_model.safetensors"))
        first = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
        seen[generation, member] = float(first.sum())
        return MemberResult(generation=generation, member=member, seed=seed, reward=float(first.sum()), rows=[])

    history = tmp_path / "history.json"
    cfg = lowrank_config(backend.targets, mirrored=True, base_checksum=backend.checksum())
    LowRankESTrainer(
        cfg, backend, registry, TASKS, evaluate, str(history), adapter_dir=tmp_path / "adapters", log=lambda _: None
    ).run()
    assert len(seen) == 12 and all(seen[g, m] == -seen[g, m + 1] != 0 for g, m in seen if m % 2 == 0)  # lora_B negated
    assert [len(u["seeds"]) for u in backend.updates] == [2, 2, 2]  # one update term per pair
    fresh = lowrank.LowRankPerturber(tiny_llama(), 2)
    assert replay(load_history(history), fresh, 20260627, 4) == 3
    assert fresh.checksum() == backend.checksum()
    assert [u["seeds"] for u in lowrank.lowrank_updates(load_history(history))] == [u["seeds"] for u in backend.updates]
    a, b = lowrank.factors(11, backend.targets[0], 2)
    mirrored = backend.member_adapter(11, 0.01, sign=-1)["model.layers.0.self_attn.q_proj"]
    assert torch.equal(mirrored[1], lowrank.adapter_tensors(a, b, -0.01)[1])


# -- member sampling -------------------------------------------------------------------------------
class SamplingSeen:
    """A rollout recording the sampling every member request would carry, through the real policy view."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.scorer, self.seen = Scorer(model), list[Any]()

    def __call__(self, env_id: str, tasks: Any, policy: Any, **kwargs: Any) -> list[dict[str, Any]]:
        request = GenerationRequest(messages=[{"role": "user", "content": "1+1"}], seed=1)
        self.seen.append(policy.route(request).sampling if hasattr(policy, "route") else None)
        return self.scorer(env_id, tasks, policy, **kwargs)


def test_member_sampling_names_and_greedy_settings() -> None:
    assert normalize_member_sampling(" Greedy ") == "greedy"
    assert normalize_member_sampling("temperature=0.5") == "temperature=0.5"
    assert member_sampling_settings("temperature=1") == {"temperature": 1.0}
    assert member_sampling_settings("protocol") is None
    for bad in ("hot", "temperature=-1", "temperature=x", "temperature=nan"):
        with pytest.raises(ValueError, match="member sampling"):
            normalize_member_sampling(bad)
    with pytest.raises(ValueError, match="member sampling"):
        ESConfig(env_id="toy", member_sampling="beam")
    request = GenerationRequest(messages=[{"role": "user", "content": "x"}], sampling=GREEDY_SETTINGS)
    greedy = SamplingConfig().for_request(request)
    assert (greedy.temperature, greedy.top_p, greedy.top_k, greedy.presence_penalty) == (0.0, 1.0, -1, 2.0)
    logits = torch.tensor([0.1, 2.0, 1.9, -1.0])
    kept = process_logits(logits, torch.tensor([0]), torch.tensor([], dtype=torch.long), greedy)
    assert torch.isfinite(kept).tolist() == [False, True, False, False]


def test_greedy_members_and_held_out_sampling(tmp_path: Path) -> None:
    model = make_model()
    rollout = SamplingSeen(model)
    result = evaluate_member(
        POLICY, "toy", TASKS[:2], 5, generation=0, member=0, rollout=rollout, sampling=GREEDY_SETTINGS
    )
    plain = evaluate_member(POLICY, "toy", TASKS[:2], 5, generation=0, member=0, rollout=SamplingSeen(model))
    assert rollout.seen == [GREEDY_SETTINGS] and result.reward == plain.reward
    with pytest.raises(ValueError):
        evaluate_member(POLICY, "toy", TASKS[:2], 5, generation=0, member=0, rollout=rollout, sampling={"top_p": 2})
    backend, path, _ = train(tmp_path, member_sampling="greedy")
    assert load_history(path)[0]["config"]["member_sampling"] == "greedy"
    assert replayed(path).checksum() == backend.checksum()


# -- Adam -------------------------------------------------------------------------------------------
def test_adam_step_is_torch_adam_on_the_update_direction() -> None:
    es = SeededPerturber(make_model())
    reference = make_model()
    params = [p for _, p in select(reference)]
    opt = torch.optim.Adam(params, lr=0.05, betas=(0.8, 0.95), eps=1e-6, maximize=True)
    settings = {"name": "adam", "beta1": 0.8, "beta2": 0.95, "eps": 1e-6}
    for seeds, weights in (([3, 4], [1.0, -0.5]), ([5, 6], [0.2, 0.7])):
        for (name, p), ref in zip(es.params, params, strict=True):
            ref.grad = sum(w * es.noise(s, name, p) for s, w in zip(seeds, weights)) / len(seeds)
        opt.step()
        es.update(seeds, weights, 0.05, settings)
    assert max(float((p - r).detach().abs().max()) for (_, p), r in zip(es.params, params, strict=True)) < 1e-6
    with pytest.raises(ValueError, match="plain update cannot follow"):
        es.update([1], [1.0], 0.05)
    with pytest.raises(ValueError, match="optimizer changed"):
        es.update([1], [1.0], 0.05, {**settings, "beta1": 0.9})
    with pytest.raises(RuntimeError, match="cannot be undone"):
        es.reset()


def select(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return list(model.named_parameters())


def test_adam_history_replays_and_resumes_bit_exactly(tmp_path: Path) -> None:
    backend, path, cfg = train(tmp_path / "full", **ADAM)
    assert {k: load_history(path)[0]["config"][k] for k in ADAM} == ADAM
    plain, _, _ = train(tmp_path / "plain")
    assert backend.checksum() != plain.checksum()
    assert replayed(path).checksum() == backend.checksum()
    # resume after one generation: the replay rebuilds Adam's moments, the run continues identically
    fresh = Recorded(make_model(), exact_revert=True)
    head, done = resume(path, cfg, fresh, generations=1)
    trainer(tmp_path / "resumed.json", cfg, fresh, history=head, start_generation=done).run()
    assert fresh.checksum() == backend.checksum()
    with pytest.raises(ValueError, match="another update rule"):
        resume(path, config(), SeededPerturber(make_model()), generations=1)
    with pytest.raises(ValueError, match="adam_beta1"):
        config(optimizer="adam", adam_beta1=1.0)


def test_adam_on_the_low_rank_path_replays_onto_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "adapters").mkdir()
    base_dir = tmp_path / "base"
    tiny_llama().save_pretrained(base_dir)
    model = tiny_llama()
    backend = lowrank.LowRankPerturber(model, 2)
    registry = AdapterRegistry()

    def evaluate(tasks: Any, seed: int, generation: int, member: int, adapter: str | None = None) -> MemberResult:
        return MemberResult(generation=generation, member=member, seed=seed, reward=float(seed % 7), rows=[])

    history = tmp_path / "history.json"
    cfg = lowrank_config(backend.targets, base_checksum=backend.checksum(), **ADAM)
    LowRankESTrainer(
        cfg, backend, registry, TASKS, evaluate, str(history), adapter_dir=tmp_path / "adapters", log=lambda _: None
    ).run()
    assert backend.adam is not None and backend.adam.steps == 3
    fresh = lowrank.LowRankPerturber(tiny_llama(), 2)
    replay(load_history(history), fresh, 20260627, 4)
    assert fresh.checksum() == backend.checksum()
    summary = lowrank.replay_onto(base_dir, history, tmp_path / "trained")
    assert summary["checksum"] == backend.checksum() != summary["base_checksum"]


def test_a_history_without_the_new_settings_replays_as_before(tmp_path: Path) -> None:
    backend, path, _ = train(tmp_path)
    history = load_history(path)
    old = {k: v for k, v in history[0]["config"].items() if k not in ("mirrored", "member_sampling", *ADAM)}
    fresh = SeededPerturber(make_model())
    replay([{"config": old}, *history[1:]], fresh, seed=7, population=4)
    assert fresh.checksum() == backend.checksum()
