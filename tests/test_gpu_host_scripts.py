"""The GPU host's shell tools, run here on their own: ``scripts/gpu_background.sh`` (jobs in the background,
every output line time-stamped, exit codes kept, the compile caches sent back once) and
``scripts/gpu_caches.sh`` (a host's compile caches packed into parts that come back, unpacked on the next).

On the H200 these decide how much of a session's 30 device minutes measure anything: a fresh host spent
about two minutes compiling kernels before its first engine's first request (2026-12-04), and a step log
without times could not say where a phase's minutes went.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BACKGROUND = REPO / "scripts" / "gpu_background.sh"
CACHES = REPO / "scripts" / "gpu_caches.sh"


def run(script: Path, *args: str, env: dict[str, str], cwd: Path | None = None) -> str:
    done = subprocess.run(
        ["bash", str(script), *args], env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_background_steps_are_time_stamped_and_keep_exit_codes_and_caches_go_back_once(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "scripts" / "gpu_background.sh").write_bytes(BACKGROUND.read_bytes())
    (checkout / "marker.txt").write_text("snapshot\n")
    jobs = tmp_path / "jobs.txt"
    jobs.write_text(
        "cat marker.txt; printf 'no newline at the end'\n"
        "# a comment, skipped\n"
        'read -r line; echo "stdin gave [$line]"; exit 3\n'
        "mkdir -p $CACHES_OUT && echo part > $CACHES_OUT/caches.tgz.part_aa"  # no newline: still a step
    )
    env = {
        "GPU_RES": str(tmp_path / "res"),
        "GPU_SNAP": str(tmp_path / "snap"),
        "CACHES_OUT": str(tmp_path / "caches-out"),
    }
    assert "started: 3 steps" in run(BACKGROUND, "start", str(jobs), env=env, cwd=checkout)
    out = tmp_path / "out"
    out.mkdir()
    polled = run(BACKGROUND, "poll", "60", env={**env, "OUT": str(out)})
    assert "== all done" in polled and "caches sent" in polled
    res = tmp_path / "res"
    steps = (res / "steps.log").read_text()
    assert "== 1 rc=0" in steps and "== 2 rc=3" in steps and "== 3 rc=0" in steps, steps  # step 2's own code
    stamp = r"\d\d:\d\d:\d\d "
    first = (res / "step1.log").read_text().splitlines()
    assert [re.sub(stamp, "", line, count=1) for line in first] == ["snapshot", "no newline at the end"], first
    assert all(re.match(stamp, line) for line in first), first
    # a step reads no job line from its standard input (it is /dev/null, not the jobs file)
    assert re.fullmatch(stamp + r"stdin gave \[\]\n", (res / "step2.log").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["caches.tgz.part_aa", "res.tgz"]
    again = tmp_path / "again"
    again.mkdir()
    assert "caches sent" not in run(BACKGROUND, "poll", "5", env={**env, "OUT": str(again)})
    assert sorted(p.name for p in again.iterdir()) == ["res.tgz"]  # sent once, not with every poll


def test_caches_round_trip_in_parts_and_refuse_what_would_not_come_back(tmp_path: Path) -> None:
    kernels = tmp_path / "home" / ".triton" / "cache" / "k1"
    kernels.mkdir(parents=True)
    cubin = os.urandom(3 * 2**20 + 12345)  # random: gzip does not shrink it (2 parts of 2 MiB, 4 of 1)
    (kernels / "kernel.cubin").write_bytes(cubin)
    (kernels / "kernel.json").write_text('{"name": "k1"}')
    missing = tmp_path / "not-there"
    env = {
        "CACHES_OUT": str(tmp_path / "out"),
        "CACHES_IN": str(tmp_path / "in"),
        "CACHE_DIRS": f"{tmp_path / 'home' / '.triton' / 'cache'} {missing}",
        "CACHES_PART_MIB": "2",
    }
    packed = run(CACHES, "pack", env=env)
    parts = sorted((tmp_path / "out").glob("caches.tgz.part_*"))
    assert len(parts) == 2 and "in 2 parts" in packed, packed
    (tmp_path / "in").mkdir()
    for part in parts:
        (tmp_path / "in" / part.name).write_bytes(part.read_bytes())
    # the next host: nothing there until unpacked, then every file as it was, where it was
    (kernels / "kernel.cubin").unlink()
    (kernels / "kernel.json").unlink()
    assert "unpacked" in run(CACHES, "unpack", env=env)
    assert (kernels / "kernel.cubin").read_bytes() == cubin
    assert (kernels / "kernel.json").read_text() == '{"name": "k1"}'
    (kernels / "kernel.json").write_text("changed since")
    assert run(CACHES, "unpack", env=env) == ""  # once a host: a later step's setup leaves them be
    assert (kernels / "kernel.json").read_text() == "changed since"
    # what would not come back (3 parts at most) is not packed at all: the next host compiles as before
    refused = run(CACHES, "pack", env={**env, "CACHES_PART_MIB": "1"})
    assert "not sent" in refused and not list((tmp_path / "out").glob("caches.tgz.part_*")), refused
    assert "none uploaded" in run(CACHES, "unpack", env={**env, "CACHES_IN": str(tmp_path / "empty")})


def test_background_poll_returns_when_every_step_ended(tmp_path: Path) -> None:
    """A poll ends as soon as the last step has, not at its timeout: each call holds the device."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "scripts" / "gpu_background.sh").write_bytes(BACKGROUND.read_bytes())
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("true\n")
    env = {"GPU_RES": str(tmp_path / "res"), "GPU_SNAP": str(tmp_path / "snap"), "CACHES_OUT": str(tmp_path / "c")}
    run(BACKGROUND, "start", str(jobs), env=env, cwd=checkout)
    started = time.monotonic()
    assert "== all done" in run(BACKGROUND, "poll", "100", env=env)
    assert time.monotonic() - started < 30


def test_check_dry_runs_each_benchmark_step_and_names_the_refused_ones(tmp_path: Path) -> None:
    """A job list the benchmark refuses costs a GPU host's whole start (2026-12-07: ``--timed-generations 1``
    in an H100 list, caught only by hand); ``check`` runs each benchmark step here with ``--dry-run`` first."""
    bench = "python3 benchmarks/bench_es_generation.py --results $R/es.jsonl --shape 135m --phase fullrank"
    jobs = tmp_path / "jobs.txt"
    jobs.write_text(
        "# a comment, not a step\n"
        "echo not a benchmark\n"
        f"source scripts/gpu_lowrank_setup.sh && {bench} --population 16 --case-batch 16 --timed-generations 1\n"
        f"source scripts/gpu_lowrank_setup.sh && {bench} --population 16 --case-batch 16 --timed-generations 2\n"
        "python3 benchmarks/bench_es_generation.py --phase table --results $R/es.jsonl > $R/table.md\n"
        f"{bench} --population 16 --case-batch 16 --timed-generations 2 > $R/out.log\n"
    )
    done = subprocess.run(
        ["bash", str(BACKGROUND), "check", str(jobs)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    refusal = "error: --timed-generations: at least 2 (the spread of one generation is not a spread)"
    assert lines[0] == f"step 2: refused: bench_es_generation.py: {refusal}", lines
    assert lines[1] == "step 3: ok", lines
    assert lines[2].startswith("step 5: cannot dry-run (a redirection"), lines  # not run: it would write here
    assert lines[3] == f"checked 5 steps of {jobs}: 2 refused", lines
    jobs.write_text(f"{bench} --population 16 --case-batch 16 --timed-generations 2\n")
    done = subprocess.run(
        ["bash", str(BACKGROUND), "check", str(jobs)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.endswith("1 steps of " + str(jobs) + ": 0 refused\n"), done.stdout


def test_staging_on_a_machine_without_agent_envs_stops_before_any_download(tmp_path: Path) -> None:
    """Both staging scripts take the tokenizer or the model from the SmolLM2 GGUF through agent-envs; on a fresh
    machine (2026-12-06) stage_ray.sh downloaded everything, then died on a bare ``No module named 'PIL'``."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    (checkout / ".gpu" / "r1").mkdir(parents=True)
    (checkout / ".gpu" / "r1" / "kept").write_text("an earlier staging\n")
    calls = tmp_path / "calls.log"
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "python3").write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexit 1\n')  # a python3 without the package
    (fake_bin / "python3").chmod(0o755)
    for name in ("stage_ray.sh", "stage_smol.sh"):
        (checkout / "scripts" / name).write_bytes((REPO / "scripts" / name).read_bytes())
        done = subprocess.run(
            ["bash", f"scripts/{name}"],
            cwd=checkout,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"},
        )
        assert done.returncode == 1, done.stderr
        assert "bash scripts/install.sh" in done.stderr and "SmolLM2 GGUF" in done.stderr
    assert "pip" not in calls.read_text()  # nothing was downloaded
    assert (checkout / ".gpu" / "r1" / "kept").read_text() == "an earlier staging\n"
    assert not (checkout / ".gpu" / "smol1").exists()
