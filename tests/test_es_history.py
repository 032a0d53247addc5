"""history.json: selection rules, atomic writes, replay onto a fresh model, resume, trainer loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from agent_envs.envs.math_react.task import MathTask
from agent_envs.es.history import (
    ESConfig,
    HistoryWriter,
    ReplayMismatch,
    checked_generations,
    history_prefix,
    load_history,
    replay,
    replay_is_exact,
    resume,
    update_records,
    write_history,
)
from agent_envs.es.perturb import SeededPerturber
from agent_envs.es.population import ESTrainer, GenerationFailed, evaluate_member
from agent_envs.es.seeds import population_seeds
from agent_envs.esrun.run import replay_source
from agent_envs.esrun.settings import parse_settings
from agent_envs.scale.toy import TorchToyEngine, WeightChoicePolicy


def gen(g: int, seeds: list[int], **extra: Any) -> dict[str, Any]:
    return {
        "generation": g,
        "seeds": seeds,
        "rewards": [0.1 * (i + 1) for i in range(len(seeds))],
        "alpha": 0.1,
        **extra,
    }


def test_round_trip_selection(tmp_path: Path) -> None:
    seeds = population_seeds(7, 2, 3)
    history = [
        {"config": {"seed": 7}},
        {"generation": -1, "dapo_eval": {"mean_score": 0.5}},
        gen(0, seeds[0]),
        gen(1, seeds[1]),
        gen(2, seeds[2], update_applied=False),
    ]
    path = tmp_path / "history.json"
    write_history(path, history)
    loaded = load_history(path)
    assert loaded == history and not list(tmp_path.glob(".*tmp"))
    assert len(update_records(loaded)) == 2
    assert [r.get("generation") for r in history_prefix(loaded, 1)] == [None, -1, 0]
    with pytest.raises(ValueError, match="contiguous"):
        update_records([gen(1, seeds[1])])
    with pytest.raises(ValueError, match="only|cannot keep"):
        update_records(loaded, 3)


def test_load_rejects_non_list(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"generation": 0}))
    with pytest.raises(ValueError, match="JSON list"):
        load_history(path)


def records_like_a_run(n: int) -> list[dict[str, Any]]:
    """A config record and ``n`` generation records whose texts hold what JSON must escape (a newline, a
    quote, non-ASCII), so a record never spans two lines."""
    config: dict[str, Any] = {"config": {"seed": 7}}
    rows = [{"prediction": 'line one\nline "two" \u00e9\u2028', "score": 0.5, "sample_index": i} for i in range(3)]
    return [config, *({"generation": g, "rewards": [0.1 * g], "samples": rows} for g in range(n))]


def test_a_run_appends_each_generation_and_the_file_reads_as_one_rewritten_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent_envs.es.history as history_module

    path, rewrites = tmp_path / "history.json", []
    atomic = history_module.atomic_write
    monkeypatch.setattr(history_module, "atomic_write", lambda *a: (rewrites.append(a[0]), atomic(*a)))
    writer, records = HistoryWriter(path), records_like_a_run(6)
    writer.write(records[:2])
    inode = path.stat().st_ino
    for n in range(3, len(records) + 1):
        writer.write(records[:n])
        assert load_history(path) == records[:n]
    writer.write(records)  # nothing new: nothing written
    assert len(rewrites) == 1 and path.stat().st_ino == inode  # replaced once, then appended in place
    appended = path.read_bytes()
    write_history(tmp_path / "whole.json", records)
    assert appended == (tmp_path / "whole.json").read_bytes()  # the same bytes as the whole list written at once
    assert len(appended.splitlines()) == len(records) + 2  # one record to a line, between the brackets
    # a file changed under the writer (an evaluation's rewrite, another process) is replaced, not appended to
    write_history(path, records[:3])
    more = [*records, {"generation": 6, "rewards": [0.6]}]
    writer.write(more)
    assert load_history(path) == more and len(rewrites) == 4


def test_a_history_whose_last_append_was_cut_short_reads_its_whole_records(tmp_path: Path) -> None:
    path, records = tmp_path / "history.json", records_like_a_run(3)
    writer = HistoryWriter(path)
    writer.write(records[:-1])
    before = path.read_bytes()
    writer.write(records)
    after = path.read_bytes()
    cut_at = len(before) - len(b"\n]\n")  # where the append began writing
    whole_at = after.index(b"\n", cut_at + len(b",\n"))  # the appended record's line written through
    for size in range(cut_at, len(after) - 1):  # the last size lacks only the final newline: valid JSON
        path.write_bytes(after[:size])
        with pytest.warns(UserWarning, match="cut short"):
            got = load_history(path)
        assert got == (records if size >= whole_at else records[:-1]), size
    # damage anywhere before the last line is not a cut append: refused
    path.write_bytes(after.replace(b'"generation": 0', b'"generation": 0,,', 1))
    with pytest.raises(ValueError, match="not a JSON list of records"):
        load_history(path)


def test_a_history_in_the_one_line_layout_still_loads_and_is_then_rewritten(tmp_path: Path) -> None:
    path, records = tmp_path / "history.json", records_like_a_run(2)
    path.write_text(json.dumps(records[:-1], ensure_ascii=False))  # as runs before the writer wrote it
    loaded = load_history(path)
    assert loaded == records[:-1]
    HistoryWriter(path).write([*loaded, records[-1]])
    assert load_history(path) == records


class Scorer:
    """A tiny real objective: a task's score is the model's sigmoid output on that task's input."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(
        self, env_id: str, tasks: list[dict[str, Any]], policy: Any, samples: int, base_seed: int, **_: Any
    ) -> list[dict[str, Any]]:
        rows = []
        with torch.no_grad():
            for row, task in enumerate(tasks):
                x = torch.full((1, 4), float(task["x"]))
                score = torch.sigmoid(self.model(x)).item() - 0.4  # some negatives, clamped to 0
                rows.append(
                    {
                        "task_id": task["id"],
                        "row_index": row,
                        "sample_index": 0,
                        "seed": base_seed + row,
                        "score": score,
                        "termination_reason": "final_answer",
                    }
                )
        return rows


def make_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def train(tmp_path: Path, generations: int = 3, exact: bool = True) -> tuple[nn.Module, ESTrainer, ESConfig]:
    model = make_model()
    backend = SeededPerturber(model, exact_revert=exact)
    cfg = ESConfig(
        env_id="toy",
        generations=generations,
        population=4,
        case_batch_size=3,
        seed=7,
        sigma_start=0.05,
        sigma_end=0.02,
        alpha=0.05,
        eval_interval=2,
        exact_revert=exact,
    )
    tasks = [{"id": f"t{i}", "x": i / 5} for i in range(5)]
    evaluate = lambda batch, seed, g, m: evaluate_member(  # noqa: E731
        None, cfg.env_id, batch, seed, generation=g, member=m, rollout=Scorer(model)
    )
    evals: list[int] = []
    trainer = ESTrainer(
        cfg,
        backend,
        tasks,
        evaluate,
        str(tmp_path / "history.json"),
        eval_hook=lambda g: evals.append(g) or {"probe_eval": {"after": g}},
        log=lambda _: None,
    )
    trainer.run()
    assert evals == ([1, 2] if generations == 3 else [1])
    return model, trainer, cfg


def test_trainer_writes_history_and_replay_is_exact(tmp_path: Path) -> None:
    model, trainer, cfg = train(tmp_path)
    history = load_history(tmp_path / "history.json")
    records = update_records(history)
    assert [r["generation"] for r in records] == [0, 1, 2]
    assert records[0]["case_batch"] == ["t0", "t1", "t2"] and records[1]["case_batch"] == ["t3", "t4", "t0"]
    assert records[0]["seeds"] == population_seeds(7, 4, 1)[0]
    assert all(0.0 <= r <= 1.0 for rec in records for r in rec["rewards"])
    # an interval evaluation's summary sits at its generation record's top level, as the reference's
    assert records[2]["sigma"] == 0.02 and records[1]["probe_eval"] == {"after": 1} and "eval" not in records[1]
    trained = trainer.backend.checksum()
    assert trained != SeededPerturber(make_model()).checksum()

    fresh = make_model()
    backend = SeededPerturber(fresh)
    assert replay_is_exact(history)
    assert replay(history, backend, seed=7, population=4) == 3
    assert backend.checksum() == trained
    with pytest.raises(ValueError, match="original --seed"):
        replay(history, SeededPerturber(make_model()), seed=8, population=4)
    with pytest.raises(ValueError, match="tp_size"):
        replay(history, SeededPerturber(make_model()), seed=7, population=4, tp_size=2)


def test_replay_recomputes_weights(tmp_path: Path) -> None:
    _, trainer, _ = train(tmp_path)
    history = load_history(tmp_path / "history.json")
    for record in history:
        if "weights" in record:
            record["weights"] = [0.0 for _ in record["weights"]]  # stored weights are never used
    backend = SeededPerturber(make_model())
    replay(history, backend, seed=7, population=4)
    assert backend.checksum() == trainer.backend.checksum()


def test_resume_continues_identically(tmp_path: Path) -> None:
    full_dir, part_dir = tmp_path / "full", tmp_path / "part"
    _, full, cfg = train(full_dir, generations=3)
    train(part_dir, generations=2)
    model = make_model()
    backend = SeededPerturber(model, exact_revert=True)
    head, done = resume(part_dir / "history.json", cfg, backend, generations=1)
    assert done == 1 and head[-1] == {
        "resume": {"source": str(part_dir / "history.json"), "replayed_generations": 1, "fingerprints_checked": 1}
    }
    assert [r.get("generation") for r in head[1:-1]] == [0]
    tasks = [{"id": f"t{i}", "x": i / 5} for i in range(5)]
    evaluate = lambda batch, seed, g, m: evaluate_member(  # noqa: E731
        None, cfg.env_id, batch, seed, generation=g, member=m, rollout=Scorer(model)
    )
    trainer = ESTrainer(
        cfg,
        backend,
        tasks,
        evaluate,
        str(tmp_path / "resumed.json"),
        history=head,
        start_generation=done,
        log=lambda _: None,
    )
    trainer.run()
    assert backend.checksum() == full.backend.checksum()
    resumed = load_history(tmp_path / "resumed.json")
    assert [r["generation"] for r in update_records(resumed)] == [0, 1, 2]


def test_every_generation_records_the_weights_fingerprint(tmp_path: Path) -> None:
    _, trainer, _ = train(tmp_path)
    history = load_history(tmp_path / "history.json")
    assert history[0]["config"]["start_fingerprint"] == SeededPerturber(make_model()).fingerprint()
    fingerprints = [r["weights_fingerprint"] for r in update_records(history)]
    assert len(set(fingerprints)) == 3 and fingerprints[-1] == trainer.backend.fingerprint()
    assert trainer.last_timing["fingerprint_s"] >= 0 and len(trainer.last_timing["perturb_s"]) == 4
    assert checked_generations(history) == 3


def test_replay_stops_at_the_first_generation_whose_weights_differ(tmp_path: Path) -> None:
    train(tmp_path)
    history = load_history(tmp_path / "history.json")
    second = next(r for r in history if r.get("generation") == 1)
    second["rewards"] = [second["rewards"][0] + 0.5, *second["rewards"][1:]]  # edited: another update
    backend = SeededPerturber(make_model())
    with pytest.raises(ReplayMismatch, match="generation 1's replayed weights have fingerprint wf1:"):
        replay(history, backend, seed=7, population=4)
    assert len(backend.updates) == 2  # generation 0 checked out; nothing after generation 1 ran
    torch.manual_seed(2)
    other = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    with pytest.raises(ReplayMismatch, match="the weights the replay starts from"):
        replay(load_history(tmp_path / "history.json"), SeededPerturber(other), seed=7, population=4)


def test_resuming_an_edited_history_exits_naming_the_file_and_generation(tmp_path: Path) -> None:
    """``agent-envs es train --resume`` (``esrun.run.replay_source``) turns the replay's mismatch into
    an exit that names the history and the first generation whose weights differ, before any training.
    (tests/test_es_vllm.py checks on a vLLM engine that every update moves the fingerprint and that
    an unedited history replays to the same fingerprints.)"""
    _, _, cfg = train(tmp_path)
    history = load_history(tmp_path / "history.json")
    second = next(r for r in history if r.get("generation") == 1)
    second["rewards"] = [second["rewards"][1], second["rewards"][0], *second["rewards"][2:]]  # another update
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(history))
    settings = parse_settings(["--model", "unused", "--history", str(tmp_path / "new.json"), "--resume", str(edited)])
    backend = SeededPerturber(make_model(), exact_revert=True)
    with pytest.raises(SystemExit, match=rf"--resume {edited}: generation 1's replayed weights have fingerprint"):
        replay_source(settings, cfg, backend)
    assert len(backend.updates) == 2 and not (tmp_path / "new.json").exists()


class BatchSizes(WeightChoicePolicy):
    """The toy policy, recording how many requests each lockstep turn sent at once."""

    def generate(self, requests):
        self.sizes.append(len(requests))
        return super().generate(requests)


def test_a_members_episodes_are_all_in_flight_at_once() -> None:
    engine = TorchToyEngine()
    policy = BatchSizes(engine.model, engine.policy.features)
    tasks = [MathTask(id=f"b{i}", question=f"Pick box {i}.", answer=str(i % 4)) for i in range(20)]
    env = {"max_turns": 3, "sandbox": "bwrap"}
    policy.sizes = []
    result = evaluate_member(policy, "MATH-ReAct-v0", tasks, 5, generation=0, member=0, samples=2, env_kwargs=env)
    assert len(result.rows) == 40 and policy.sizes[0] == 40  # case batch x samples, not a fixed 16 or 64
    policy.sizes = []
    evaluate_member(policy, "MATH-ReAct-v0", tasks[:10], 5, generation=0, member=0, env_kwargs=env, concurrency=4)
    assert max(policy.sizes) == 4  # unless set


def test_member_reward_counts_missing_rows_as_zero() -> None:
    def short_runner(env_id: str, tasks: list[Any], policy: Any, samples: int, base_seed: int) -> list[dict]:
        return [{"task_id": "a", "score": 1.0}]  # two jobs, one row came back

    result = evaluate_member(None, "x", [{"id": "a"}, {"id": "b"}], 5, generation=3, member=1, rollout=short_runner)
    assert result.reward == 0.5 and result.rows[0]["generation"] == 3 and result.rows[0]["member"] == 1


def test_config_rejects_bad_shape() -> None:
    with pytest.raises(ValueError, match="population"):
        ESConfig(env_id="toy", population=0)
    with pytest.raises(ValueError, match="reward_normalization"):
        ESConfig(env_id="toy", reward_normalization="softmax")
    with pytest.raises(ValueError, match="env_id"):
        ESConfig()


def test_subtractive_revert_drifts_only_by_rounding(tmp_path: Path) -> None:
    """The reference's revert (subtract the noise) leaves fp32 rounding residue, nothing more."""
    trained, _, _ = train(tmp_path, exact=False)
    replayed = make_model()
    history = load_history(tmp_path / "history.json")
    assert not replay_is_exact(history)  # agent-envs es says so on --resume
    assert checked_generations(history) == 0  # the residue makes every generation differ: nothing to check
    replay(history, SeededPerturber(replayed), seed=7, population=4)
    drift = max((a - b).abs().max().item() for a, b in zip(trained.parameters(), replayed.parameters()))
    assert 0 < drift < 1e-6


class DiesAfter(Scorer):
    """The scorer's episodes until ``generation``, then every episode a request error (a dead engine);
    before it, one episode of each call is a request error (a bad request, not a dead engine)."""

    def __init__(self, model: nn.Module, generation: int) -> None:
        super().__init__(model)
        self.calls, self.dies_at = 0, generation

    def __call__(self, env_id: str, tasks: list[dict[str, Any]], policy: Any, samples: int, base_seed: int, **kw: Any):
        rows = super().__call__(env_id, tasks, policy, samples, base_seed, **kw)
        generation, self.calls = self.calls // 4, self.calls + 1  # population 4: one call per member
        failed = {"termination_reason": "request_error", "react_error": "EngineFailed: the engine failed", "score": 0.0}
        return [{**row, **failed} if generation >= self.dies_at or i == 0 else row for i, row in enumerate(rows)]


def test_a_generation_with_no_episode_answered_stops_the_run_before_its_update(tmp_path: Path) -> None:
    model = make_model()
    backend = SeededPerturber(model, exact_revert=True)
    cfg = ESConfig(env_id="toy", generations=3, population=4, case_batch_size=3, seed=7, alpha=0.05, exact_revert=True)
    tasks = [{"id": f"t{i}", "x": i / 5} for i in range(5)]
    scorer = DiesAfter(model, generation=1)
    evaluate = lambda batch, seed, g, m: evaluate_member(  # noqa: E731
        None, cfg.env_id, batch, seed, generation=g, member=m, rollout=scorer
    )
    trainer = ESTrainer(cfg, backend, tasks, evaluate, str(tmp_path / "history.json"), log=lambda _: None)
    after_first: list[str] = []
    trainer.progress = lambda record, timing: after_first.append(backend.checksum())
    with pytest.raises(GenerationFailed, match=r"generation 1: all 12 episodes ended in request_error \(first: Engine"):
        trainer.run()
    assert [r["generation"] for r in update_records(load_history(tmp_path / "history.json"))] == [0]
    assert after_first == [backend.checksum()]  # generation 1's rewards updated nothing
