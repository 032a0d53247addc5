"""Math data: the published JSONL files load intact, bad input fails clearly, synth answers are right."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import sympy

from agent_envs.envs.math_react.data import (
    MathDataError,
    load_math_tasks,
    sha256_file,
    verify_sha256sums,
)
from agent_envs.envs.math_react.synth import FAMILIES, generate_math_tasks
from agent_envs.envs.math_react.task import MathTask

from conftest import MATH_DIR, run_offline  # noqa: E402

EXPECTED_ROWS = {
    "dapo_test.jsonl": 100,
    "aime_2026.jsonl": 30,
    "dapo_evolve.jsonl": 400,
}


def _need_shared() -> None:
    if not MATH_DIR.is_dir():
        pytest.skip(f"shared math data not present at {MATH_DIR}")


@pytest.mark.parametrize("name,rows", sorted(EXPECTED_ROWS.items()))
def test_published_files_load_every_row(name: str, rows: int) -> None:
    _need_shared()
    tasks = load_math_tasks(MATH_DIR / name)
    assert len(tasks) == rows
    assert len({t.id for t in tasks}) == rows
    assert all(t.question and t.answer and t.source for t in tasks)
    prefix = "aime_2026_" if name.startswith("aime") else "dapo_"
    assert all(t.id.startswith(prefix) for t in tasks)
    # extra provenance fields survive (split_source is in every published row)
    assert all(getattr(t, "split_source", None) for t in tasks)
    assert load_math_tasks(MATH_DIR / name, limit=7) == tasks[:7]


def test_published_checksums_match() -> None:
    _need_shared()
    checked = verify_sha256sums(MATH_DIR)
    assert set(checked) == set(EXPECTED_ROWS)
    assert checked["dapo_test.jsonl"] == ("a0e64c93e7801957f0949ab80f5a26233ecd87a02ad5c4628de2da0692b5c4a2")


def test_checksum_mismatch_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": 1, "question": "q", "answer": 2}\n')
    (tmp_path / "SHA256SUMS").write_text(f"{'0' * 64}  a.jsonl\n")
    with pytest.raises(MathDataError, match="SHA-256 mismatch .*a.jsonl"):
        verify_sha256sums(tmp_path)
    (tmp_path / "SHA256SUMS").write_text(f"{sha256_file(tmp_path / 'a.jsonl')}  a.jsonl\n")
    assert list(verify_sha256sums(tmp_path)) == ["a.jsonl"]


def test_corrupt_line_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q", "answer": "1"}\n{"id": "b", "question": \n')
    with pytest.raises(MathDataError, match=r"bad\.jsonl:2: corrupt JSON"):
        load_math_tasks(bad)


def test_missing_field_names_file_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('\n{"id": "a", "question": "q"}\n')
    with pytest.raises(MathDataError, match=r"bad\.jsonl:2: missing field\(s\) answer"):
        load_math_tasks(bad)
    with pytest.raises(MathDataError, match="row 0: expected a JSON object"):
        load_math_tasks([["not", "a", "dict"]])  # type: ignore[list-item]


def test_missing_file_and_rows_spec(tmp_path: Path) -> None:
    with pytest.raises(MathDataError, match="not found"):
        load_math_tasks(tmp_path / "nope.jsonl")
    rows = [
        {"id": 5, "question": "1+1?", "answer": 2, "source": "x"},
        MathTask(id="t", question="q", answer="3"),
    ]
    tasks = load_math_tasks(rows)
    assert [(t.id, t.answer) for t in tasks] == [("5", "2"), ("t", "3")]


def test_hub_specs_fail_offline_with_a_pointer_to_jsonl() -> None:
    """With the hub unreachable (offline mode), "aime" must fail with advice, not a traceback."""
    code = (
        "from agent_envs.envs.math_react.data import load_math_tasks, MathDataError\n"
        "try:\n    load_math_tasks('aime')\nexcept MathDataError as e:\n    print('ERR', e)\n"
    )
    out = run_offline(code, "/nonexistent-agent-envs-test")
    assert out.startswith("ERR ") and "MathArena/aime_2026" in out
    assert "JSONL" in out and '"builtin"' in out


def test_builtin_is_seeded_and_deterministic() -> None:
    a, b = load_math_tasks("builtin", limit=30, seed=3), generate_math_tasks(30, 3)
    assert a == b
    assert [t.id for t in a[:2]] == ["synth_math_3_0", "synth_math_3_1"]
    assert generate_math_tasks(30, 4) != a
    assert len(load_math_tasks("builtin")) == 200
    assert {t.family for t in a} == set(FAMILIES)  # type: ignore[attr-defined]
    assert all(t.answer.lstrip("-").isdigit() for t in a)


def _independent_answer(task: MathTask) -> int:
    """Recompute each family's answer a different way (brute force, DP or sympy)."""
    p = task.params  # type: ignore[attr-defined]
    match task.family:  # type: ignore[attr-defined]
        case "modpow":
            return int(sympy.Integer(p["base"]) ** p["exp"] % p["mod"])
        case "coprime_count":
            return sum(1 for k in range(1, p["n"] + 1) if math.gcd(k, p["m"]) == 1)
        case "lattice_paths":
            w, h, block = p["w"], p["h"], (p["bx"], p["by"])
            ways = [[0] * (h + 1) for _ in range(w + 1)]
            for x in range(w + 1):
                for y in range(h + 1):
                    if (x, y) == block:
                        continue
                    ways[x][y] = 1 if x == y == 0 else (ways[x - 1][y] if x else 0) + (ways[x][y - 1] if y else 0)
            return ways[w][h]
        case "sum_of_divisors":
            return int(sympy.divisor_sigma(p["n"]))
        case "num_divisors":
            return int(sympy.divisor_count(p["n"]))
        case "unit_fractions":
            total = sum(sympy.Rational(1, d) for d in p["denominators"])
            return int(total.p + total.q)
        case "trailing_zeros":
            value, base, zeros = math.factorial(p["n"]), p["base"], 0
            while value % base == 0:
                value //= base
                zeros += 1
            return zeros
    raise AssertionError(f"unknown family {task.family}")  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_synthetic_answers_verified_independently(seed: int) -> None:
    for task in generate_math_tasks(21, seed):
        assert task.answer == str(_independent_answer(task)), task.question
        for value in task.params.values():  # type: ignore[attr-defined]
            for number in value if isinstance(value, list) else [value]:
                assert str(number) in task.question  # the stated problem is the computed one
