"""The ES evaluation workflow (docs/scaling.md#es-evaluation) on the CPU: the in-process trainer over
the torch toy engine (real weights pick the tool call), real MATH-ReAct episodes in bwrap.

Initial evaluation (generation -1), interval evaluations over two held-out sets with
``--eval-samples``, a final report with its own sample count and seeds, per-member and per-evaluation
trace logs in the reference's layout, evaluation-only replays at chosen update counts that
reproduce what training measured, and a frozen key-to-seed map."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from agent_envs.envs.math_react.task import MathTask
from agent_envs.envs.registry import spec
from agent_envs.es.evaluation import (
    Evaluator,
    HeldOutSet,
    add_evaluation_arguments,
    eval_only,
    evaluation_setup,
    formula_key_seeds,
    load_key_seeds,
)
from agent_envs.es.history import ESConfig, load_history
from agent_envs.es.population import ESTrainer, evaluate_member
from agent_envs.esrun.command import main as es_command
from agent_envs.protocol.seeds import trajectory_seed
from agent_envs.rollout import run_episodes
from agent_envs.scale.toy import TorchToyEngine

TRAIN = [MathTask(id=f"toy{i}", question=f"Pick the number of box {i}.", answer=str(i % 4)) for i in range(6)]
DAPO = [MathTask(id=f"dapo_{i}", question=f"Box {i}?", answer=str(i % 4)) for i in range(2)]
AIME = [MathTask(id=f"aime_2026_{i:03d}", question=f"Crate {i}?", answer=str((i + 1) % 4)) for i in range(2)]
SEED = 20260627
CONFIG = ESConfig(
    env_id="MATH-ReAct-v0",
    model="toy",
    generations=2,
    population=3,
    case_batch_size=3,
    seed=SEED,
    sigma_start=0.8,
    sigma_end=0.8,
    sigma_schedule="constant",
    alpha=0.8,
    eval_interval=1,
)
ENV = {"max_turns": 3, "sandbox": "bwrap"}
MATH = spec("MATH-ReAct-v0")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--history", required=True)
    add_evaluation_arguments(parser)
    return parser.parse_args(list(argv))


def _load(path: str) -> list[MathTask]:
    return {"dapo.jsonl": DAPO, "aime.jsonl": AIME}[path]


def _engine() -> TorchToyEngine:
    engine = TorchToyEngine()
    engine.es_init(exact_revert=True)
    return engine


def _held_out(engine: TorchToyEngine):
    def run(tasks, samples, seed, key_seeds):
        return run_episodes(
            "MATH-ReAct-v0",
            tasks,
            engine.policy,
            samples=samples,
            base_seed=seed,
            env_kwargs=ENV,
            mode="lockstep",
            concurrency=8,
            progress=False,
            key_seeds=key_seeds,
        )

    return run


def _train(folder: Path, *flags: str) -> tuple[list[dict], TorchToyEngine, Path]:
    history = folder / "history.json"
    args = _args("--history", str(history), "--eval", "dapo=dapo.jsonl", "--eval", "aime=aime.jsonl", *flags)
    setup = evaluation_setup(args, _load)
    config = CONFIG.model_copy(update=setup.config)
    engine = _engine()
    evaluator = setup.evaluator(_held_out(engine), seed=SEED, spec=MATH, log=lambda _: None)

    def member(batch, seed, generation, index):
        return evaluate_member(
            engine.policy,
            CONFIG.env_id,
            batch,
            seed,
            generation=generation,
            member=index,
            env_kwargs=ENV,
            concurrency=6,
        )

    trainer = ESTrainer(
        config,
        engine,
        TRAIN,
        member,
        str(history),
        history=setup.head(evaluator, config, None, 0),
        eval_hook=setup.hook(evaluator),
        log=lambda _: None,
    )
    setup.train(trainer, evaluator, {"max_turns": 3, "max_tokens": None})
    return load_history(history), engine, history


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("es-eval")
    history, engine, path = _train(
        folder,
        "--initial-eval",
        "--eval-samples",
        "2",
        "--final-eval",
        "--final-eval-samples",
        "4",
        "--write-trace-logs",
    )
    return history, engine.checksum(), path


def _seeds(summary: dict) -> dict[str, int]:
    return {row["key"]: row["seed"] for row in summary["scores"]}


def _expected(tasks: list[MathTask], samples: int, base: int) -> dict[str, int]:
    return {
        f"{t.id}:sample{s:02d}": trajectory_seed(base, row, s) for row, t in enumerate(tasks) for s in range(samples)
    }


def _untimed(summary: dict) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "latency_s"} for row in summary["scores"]]


def test_history_holds_initial_interval_and_final_evaluations_with_their_seeds(trained):
    history, _, _ = trained
    assert "config" in history[0] and history[0]["config"]["eval_datasets"] == ["dapo", "aime"]
    initial, gen0, gen1, final = history[1:]
    assert initial["generation"] == -1
    for name, tasks in (("dapo", DAPO), ("aime", AIME)):
        assert _seeds(initial[f"{name}_eval"]) == _expected(tasks, 2, SEED)  # --eval-samples 2, the eval seed
        assert initial[f"{name}_eval"]["count"] == 4 and initial[f"{name}_eval"]["label"] == f"{name}_eval"
        for record, updates in ((gen0, 1), (gen1, 2)):  # interval: seed + updates (the reference's seed + g + 1)
            # R1: top-level <name>_eval keys in the generation's record, as the reference
            assert _seeds(record[f"{name}_eval"]) == _expected(tasks, 2, SEED + updates) and "eval" not in record
    assert [r["generation"] for r in (gen0, gen1)] == [0, 1] and all("rewards" in r for r in (gen0, gen1))
    assert (final["generation"], final["final_eval"], final["eval_samples"], final["max_turns"]) == (2, True, 4, 3)
    assert _seeds(final["dapo_eval"]) == _expected(DAPO, 4, SEED + 2 + 10_000)
    assert _seeds(final["aime_eval"]) == _expected(AIME, 4, SEED + 2 + 20_000)
    assert final["dapo_eval"]["count"] == 8 and final["dapo_eval"]["samples"] == 4


def test_trace_logs_follow_the_reference_layout(trained):
    _, _, path = trained
    logs = path.parent / "trace_logs"
    assert sorted(p.name for p in logs.iterdir()) == [
        "aime_eval",
        "aime_eval_after_001",
        "aime_eval_after_002",
        "aime_final_eval",
        "dapo_eval",
        "dapo_eval_after_001",
        "dapo_eval_after_002",
        "dapo_final_eval",
        "train",
    ]
    train = sorted(p.name for p in (logs / "train").iterdir())
    history = load_history(path)
    assert len(train) == 2 * 3 * 3  # generations x members x case batch
    for record in history[2:4]:
        for member, seed in enumerate(record["seeds"]):
            prefix = f"math_agent_gen{record['generation']:03d}_candidate{member:02d}_seed{seed}_toy"
            assert sum(name.startswith(prefix) for name in train) == 3
    final = sorted(p.name for p in (logs / "dapo_final_eval").iterdir())
    assert len(final) == 8 and all(
        n.startswith("math_agent_dapo_") and n.endswith(("_SUCCEED.md", "_FAILED.md")) for n in final
    )


def test_eval_only_replay_reproduces_the_interval_and_final_evaluations(trained, tmp_path):
    """interval25-style (replay N updates, evaluate) and final4-style (replay, final evaluation) on a
    fresh engine: the same numbers training measured at those points, and no training."""
    history, trained_checksum, path = trained
    args = _args(
        "--history",
        str(tmp_path / "h.json"),
        "--eval",
        "dapo=dapo.jsonl",
        "--eval",
        "aime=aime.jsonl",
        "--eval-only",
        "--eval-samples",
        "2",
        "--eval-generations",
        "1,2",
        "--final-eval",
        "--final-eval-samples",
        "4",
    )
    setup = evaluation_setup(args, _load)
    engine = _engine()
    evaluator = setup.evaluator(_held_out(engine), seed=SEED, spec=MATH, log=lambda _: None)
    out = eval_only(
        CONFIG.model_copy(update=setup.config),
        engine,
        evaluator,
        args.history,
        source=path,
        marks=args.eval_generations,
        final=True,
        facts={"max_turns": 3, "max_tokens": None},
    )
    assert engine.checksum() == trained_checksum  # replayed, and nothing trained on top
    assert out == load_history(args.history) and out[1]["eval_only"]["marks"] == [1, 2]
    assert not any("rewards" in r for r in out)
    at1, at2, final = out[2:]
    assert (at1["replayed_updates"], at2["replayed_updates"], final["replayed_updates"]) == (1, 2, 2)
    for name in ("dapo", "aime"):
        assert _untimed(at1[f"{name}_eval"]) == _untimed(history[2][f"{name}_eval"])
        assert _untimed(at2[f"{name}_eval"]) == _untimed(history[3][f"{name}_eval"])
        assert _untimed(final[f"{name}_eval"]) == _untimed(history[4][f"{name}_eval"])


def test_frozen_key_seeds_drive_every_held_out_episode(tmp_path):
    frozen = {key: 1000 + i for i, key in enumerate(formula_key_seeds([HeldOutSet("dapo", DAPO)], 2, 7))}
    path = tmp_path / "keys.jsonl"
    path.write_text("".join(json.dumps({"key": k, "seed": s}) + "\n" for k, s in frozen.items()))
    seeds, digest = load_key_seeds(path)
    assert seeds == frozen and load_key_seeds(path, digest.upper())[0] == frozen
    engine = _engine()
    evaluator = Evaluator(
        [HeldOutSet("dapo", DAPO)], _held_out(engine), seed=SEED, samples=2, key_seeds=seeds, log=lambda _: None
    )
    assert _seeds(evaluator.interval(3)["dapo_eval"]) == frozen
    with pytest.raises(ValueError, match="lacks 4 of the 8 keys of 'dapo' at 4 samples"):
        evaluator.check_key_seeds(4)
    with pytest.raises(ValueError, match="is not the expected"):
        load_key_seeds(path, "0" * 64)
    path.write_text(path.read_text() + json.dumps({"key": "dapo_0:sample00", "seed": 5}) + "\n")
    with pytest.raises(ValueError, match="line 5: duplicate key 'dapo_0:sample00'"):
        load_key_seeds(path)
    path.write_text('{"key": "dapo_0:sample00", "seed": true}\n')
    with pytest.raises(ValueError, match="line 1: expected"):
        load_key_seeds(path)


def test_key_seed_files_coerce_integer_text_and_refuse_an_empty_map(tmp_path):
    """K1: the reference's int(seed) reads "12" and 13.0; it refuses an empty file; a boolean, a
    fraction or a negative seed stays refused here (declared in docs/protocol.md)."""
    path = tmp_path / "keys.jsonl"
    path.write_text('{"key": "a:sample00", "seed": "12"}\n\n{"key": "b:sample00", "seed": 13.0}\n')
    assert load_key_seeds(path)[0] == {"a:sample00": 12, "b:sample00": 13}
    for text in ("", "\n  \n"):
        path.write_text(text)
        with pytest.raises(ValueError, match="no key-to-seed lines"):
            load_key_seeds(path)
    for seed in ("x", "1.5", 1.5, -3, False):
        path.write_text(json.dumps({"key": "a:sample00", "seed": seed}) + "\n")
        with pytest.raises(ValueError, match="line 1: expected"):
            load_key_seeds(path)


def test_skill_file_is_recorded_and_reaches_the_prompt(tmp_path):
    skill = tmp_path / "skill.md"
    skill.write_text("Always print the number first.\n")
    setup = evaluation_setup(_args("--history", str(tmp_path / "h.json"), "--skill-file", str(skill)), _load)
    assert setup.skill == "Always print the number first.\n" and len(setup.config["skill_sha256"]) == 64
    engine = _engine()
    plain, skilled = (
        run_episodes("MATH-ReAct-v0", DAPO[:1], engine.policy, env_kwargs={**ENV, "skill": s}, progress=False)[0]
        for s in (None, setup.skill)
    )
    assert plain.env_config_hash != skilled.env_config_hash  # the system prompt changed


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--final-eval",), "need held-out sets"),
        (("--eval", "dapo=dapo.jsonl", "--eval-generations", "3"), "applies to --eval-only"),
        (("--eval", "dapo.jsonl", "--eval", "x/dapo.jsonl"), "names must differ"),
    ],
)
def test_inconsistent_evaluation_flags_are_refused(tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        evaluation_setup(_args("--history", str(tmp_path / "h.json"), *flags), lambda path: _load(Path(path).name))


@pytest.mark.parametrize(
    "flags, message",
    [
        ([], "give --train to train, or --eval-only"),
        (["--train", "builtin", "--eval-only", "--eval", "dapo=x.jsonl"], "give --train to train, or --eval-only"),
        (["--train", "builtin", "--eval-generations", "3"], "applies to --eval-only"),
    ],
)
def test_es_train_checks_its_evaluation_flags_before_any_engine(monkeypatch, flags, message):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # a run sets it for its process
    with pytest.raises(SystemExit, match=message):
        es_command(["train", "--model", "m", "--history", "h", *flags])


def test_es_train_checks_an_eval_only_replay_before_any_engine(trained, monkeypatch, tmp_path):
    """Marks outside the history and another run's seed stream are refused before an engine starts
    (the engine would otherwise load a model first, then fail part-way through the replay)."""
    _, _, path = trained
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    held_out = tmp_path / "dapo.jsonl"
    held_out.write_text(json.dumps({"id": "dapo_0", "question": "1 + 1?", "answer": "2"}) + "\n")
    argv = [
        "evaluate-only",
        "--model",
        "m",
        "--history",
        str(tmp_path / "h.json"),
        "--eval",
        f"dapo={held_out}",
        "--resume",
        str(path),
        "--seed",
        str(SEED),
    ]
    for flags, message in (
        (["--population", "3", "--eval-generations", "1,5"], "counts must lie in 0..2"),
        (["--population", "4"], "stored seeds do not match the seed stream of seed=20260627, population=4"),
        (["--population", "3", "--resume-generations", "3"], "cannot keep 3 updates"),
    ):
        with pytest.raises(SystemExit, match=message):
            es_command([*argv, *flags])


def test_a_key_seed_map_must_cover_every_episode_it_runs():
    with pytest.raises(ValueError, match="the key-to-seed map has no seed for 1 of 2 episodes .e.g. dapo_1:sample00"):
        run_episodes(
            "MATH-ReAct-v0", DAPO, _engine().policy, env_kwargs=ENV, progress=False, key_seeds={"dapo_0:sample00": 5}
        )


def test_eval_out_keeps_every_evaluation_as_a_run_folder_that_compare_reads(tmp_path, capsys):
    from agent_envs import cli

    runs = tmp_path / "runs"
    history, _, _ = _train(tmp_path, "--initial-eval", "--eval-samples", "2", "--eval-out", str(runs))
    assert history[0]["config"]["eval_out"] == str(runs)
    assert sorted(p.name for p in runs.iterdir()) == [
        "aime_eval",
        "aime_eval_after_001",
        "aime_eval_after_002",
        "dapo_eval",
        "dapo_eval_after_001",
        "dapo_eval_after_002",
    ]
    before = [json.loads(line) for line in (runs / "dapo_eval" / "records.jsonl").read_text().splitlines()]
    assert len(before) == 4 and {r["key"] for r in before} == set(_expected(DAPO, 2, SEED))
    assert [r["score"] for r in before] == [r["score"] for r in history[1]["dapo_eval"]["scores"]]
    assert json.loads((runs / "dapo_eval" / "config.json").read_text()) == {"samples": 2}
    assert cli.main(["compare", str(runs / "dapo_eval"), str(runs / "dapo_eval_after_002")]) == 0
    assert "over 2 tasks, 95% CI" in capsys.readouterr().out
