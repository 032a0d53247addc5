"""The ES benchmark's results file and table (benchmarks/es_results.py): phases appended as separate
commands give one table, with the spread over timed generations, shares against the raw of the same
phase, and full-rank members per second against linear scaling."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import es_results

BENCH = Path(es_results.__file__).parent


def row(phase: str, kind: str, walls: list[float], tokens: int = 1000, p: int = 16, engines: int = 1) -> dict[str, Any]:
    return {
        "shape": "4b",
        "population": p,
        "case_batch": 16,
        "phase": phase,
        "variant": f"{kind} x{engines}",
        "kind": kind,
        "engines": engines,
        "walls": walls,
        "tokens": [tokens] * len(walls),
        "note": "",
    }


def cells(table: str, variant: str) -> list[str]:
    line = next(line for line in table.splitlines() if f"| {variant} |" in line)
    return [c.strip() for c in line.strip("|").split("|")]


def test_phases_appended_by_separate_commands_make_one_table(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    es_results.append(results, [row("lowrank", "raw_PB", [1.0, 1.0, 1.0]), row("lowrank", "lowrank", [2.0, 1.25, 4.0])])
    es_results.append(results, [row("fullrank", "raw_PB", [0.5]), row("fullrank", "fullrank", [8.0, 10.0, 9.0])])
    es_results.append(results, [row("fullrank", "fullrank", [2.5, 2.5, 2.5], engines=4)])
    # a later command's pool re-measures engine 0 (with less memory): the first one stays the base
    es_results.append(results, [row("fullrank", "raw_PB", [5.0]), row("fullrank", "fullrank", [90.0])])
    es_results.append(results, [row("lowrank", "raw_PB", [1.0], p=64)])
    es_results.append(results, [{**row("lowrank", "other", []), "variant": "note", "note": "engine started in 9 s"}])
    table = es_results.table(es_results.load(results))
    low = cells(table, "lowrank x1")
    assert low[5] == "2.00 (1.25-4.00)"  # the median and the spread of three generations, not the best
    assert low[7] == "50 (25-80)"  # each generation against the raw of its own phase (1000 tok/s)
    one, four = cells(table, "fullrank x1"), cells(table, "fullrank x4")
    assert one[7] == "6 (5-6)"  # against the full-rank phase's raw (2000 tok/s), not the low-rank one's
    assert (one[9], four[9], four[10]) == ("1.78", "6.40", "0.90")  # members/s; 6.40 / (4 x 1.78)
    assert [c[1] for c in (low, one, four)] == ["16 x 16"] * 3
    assert "64 x 16" in table
    assert table.endswith("Notes:\n- 4b 16 x 16, lowrank: note: engine started in 9 s")  # below, not a row


def test_a_row_without_raw_of_its_own_phase_gets_no_share_and_says_why(tmp_path: Path) -> None:
    table = es_results.table(
        [
            row("fullrank", "raw_PB", [1.0]),
            row("old", "old", [3.0]),
            {**row("lowrank", "lowrank", [2.0]), "merged": True},
        ]
    )
    old, merged = cells(table, "old x1"), cells(table, "lowrank x1")
    assert old[7] == "-" and "no raw at P x B in this phase" in old[11]
    assert merged[11].startswith("merged from an earlier run")


def test_a_second_share_against_raw_with_each_members_kv_its_own() -> None:
    """A phase with both raw rows gives each row two shares; without ``raw_PB_own`` the second is ``-``
    and says nothing more (the first share's note says what is missing)."""
    table = es_results.table(
        [row("lowrank", "raw_PB", [1.0]), row("lowrank", "raw_PB_own", [2.0]), row("lowrank", "lowrank", [2.0, 4.0])]
    )
    low = cells(table, "lowrank x1")
    assert (low[7], low[8]) == ("38 (25-50)", "75 (50-100)")
    alone = cells(es_results.table([row("lowrank", "raw_PB", [1.0]), row("lowrank", "lowrank", [2.0])]), "lowrank x1")
    assert (alone[7], alone[8], alone[11]) == ("50", "-", "")


def test_a_case_that_did_not_run_keeps_the_cause_at_the_end_of_a_remote_traceback() -> None:
    """The H100 pool of 2026-12-07: Ray's error text is the remote traceback, the actor's repr (in colour
    codes) first and the cause last; a refusal's advice is at the end of its one line."""

    class RayTaskError(Exception):
        pass

    remote = RayTaskError(
        "\x1b[36mray::EngineHost.start()\x1b[39m (pid=2323, ip=192.0.2.2, repr=<EngineHost object at 0x7fe9>)\n"
        '  File "/tmp/site/flashinfer/sampling.py", line 565, in top_k_mask_logits\n'
        "    mask_logits = torch.empty_like(logits)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 192.00 MiB.\n"
    )
    assert es_results.not_run(remote) == (
        "not run: RayTaskError from torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 192.00 MiB."
    )
    refusal = ValueError("8 engines cannot all be built on one GPU: " + "x" * 200 + "; a share of at most 0.100 fits")
    assert es_results.not_run(refusal).endswith("a share of at most 0.100 fits")


def test_bad_input_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    with pytest.raises(ValueError, match="walls/tokens differ"):
        es_results.append(results, [{**row("lowrank", "lowrank", [1.0, 2.0]), "tokens": [5]}])
    assert es_results.int_list("16,64,256") == [16, 64, 256]
    for bad in ("16,,64", "0", "x"):
        with pytest.raises(ValueError, match="comma-separated positive integers"):
            es_results.int_list(bad)


def test_the_benchmark_prints_the_table_of_a_results_file_and_refuses_a_bad_phase(tmp_path: Path) -> None:
    """``--phase table`` (no engine, no vLLM needed) prints what the phases appended."""
    results = tmp_path / "r.jsonl"
    es_results.append(results, [row("lowrank", "raw_PB", [1.0]), row("lowrank", "lowrank", [2.0, 3.0])])

    def bench(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(BENCH / "bench_es_generation.py"), *flags],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    shown = bench("--phase", "table", "--results", str(results))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == es_results.table(es_results.load(results))
    refused = bench("--phase", "lowrank,table", "--results", str(results))
    assert refused.returncode == 2 and "a list of lowrank, raw, fullrank, old, or table alone" in refused.stderr
    bad_list = bench("--population", "16,x", "--phase", "table", "--results", str(results))
    assert bad_list.returncode == 2 and "--population: invalid int_list value: '16,x'" in bad_list.stderr


def test_each_case_of_one_command_runs_in_a_process_of_its_own_and_every_row_lands(tmp_path: Path) -> None:
    """Issue 35: in one process the second population's engine found the first one's GPU memory still
    held and did not start; each (P, B, phase) case is now a child process (``--dry-run``: no engine)."""
    results = tmp_path / "r.jsonl"
    flags = ["--dry-run", "--shape", "135m", "--population", "16,64", "--phase", "lowrank,raw", "--results"]
    parent = subprocess.Popen(
        [sys.executable, str(BENCH / "bench_es_generation.py"), *flags, str(results)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = parent.communicate(timeout=120)
    assert parent.returncode == 0, err
    rows = es_results.load(results)
    assert [(r["population"], r["note"]) for r in rows] == [
        (16, "dry run (lowrank): no engine started"),
        (16, "dry run (raw): no engine started"),
        (64, "dry run (lowrank): no engine started"),
        (64, "dry run (raw): no engine started"),
    ]
    processes = {r["process"] for r in rows}
    assert len(processes) == 4 and parent.pid not in processes  # four children, none of them the command
    assert "64 x 16, lowrank: note: dry run (raw)" in out  # the parent prints the table of every case


@pytest.mark.parametrize(
    ("cpu", "mode", "env", "graphed"),
    [(False, "env", None, True), (True, "env", None, False), (False, "both", None, False), (False, "env", "0", False)],
)
def test_a_row_says_the_update_is_one_cuda_graph_only_where_it_is(
    monkeypatch: pytest.MonkeyPatch, cpu: bool, mode: str, env: str | None, graphed: bool
) -> None:
    """The row's name and the warm-up default read one rule: on ``--cpu`` the update is never a graph."""
    import argparse

    from agent_envs.es import update_graph
    from benchmarks import bench_es_generation

    if env is None:
        monkeypatch.delenv(update_graph.ENV, raising=False)
    else:
        monkeypatch.setenv(update_graph.ENV, env)
    assert bench_es_generation.update_graphed(argparse.Namespace(cpu=cpu, update_graph=mode)) is graphed


def test_the_readme_headline_is_the_results_table_of_its_run() -> None:
    """The README's ES generation row quotes one results folder: its shares and walls are recomputed here
    from that folder's rows (the table's own arithmetic), so a rerun that changes them changes the README."""
    readme = (BENCH.parent / "README.md").read_text()
    (line,) = [row for row in readme.splitlines() if row.startswith("| ES generation (H200, 4B shape)")]
    (folder,) = re.findall(r"\(benchmarks/results/([^/]+)/table\.md\)", line)
    rows = es_results.load(BENCH / "results" / folder / "rows.jsonl")
    for population, batch in ((16, 16), (256, 4)):
        group = [r for r in rows if r["population"] == population and r["case_batch"] == batch]
        (low,) = [r for r in group if r["kind"] == "lowrank"]
        (raw,) = [r for r in group if r["kind"] == "raw_PB"]
        mid, span = es_results.shares(group, low, "raw_PB")[0].rstrip(")").split(" (")
        walls = f"{statistics.median(low['walls']):.2f} s against {statistics.median(raw['walls']):.2f} s"
        quoted = f"P={population} x B={batch}: **{mid}%** ({span}%; {walls})"
        assert quoted in line, (quoted, line)
