"""First use of DocVQA-CLI-v0 on an empty page cache, from the shapes users write (issues 32 and 37).

The first ``reset`` builds the built-in pages (about half a minute on two cores).  Its worker
processes once came from a ``spawn`` pool, which ran an unguarded script again in every child
(deadlock on the cache lock) and could not start at all under ``python -`` (``<stdin>``).  One cold
build serves every test here, in this order: an unguarded script file starts the build on an empty
cache and is SIGKILLed mid-way; the same lines on standard input take over, clear what the killed
builder left and build every page; a second copy of the file, started meanwhile, waits (saying for
what) and finishes.  The lock's own rules are in tests/test_cache.py.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from agent_envs.core.workers import FreshPool, WorkerError
from agent_envs.envs.docvqa.synth import WORKERS, builtin_cache_dir

SCRIPT = """print("script-start", flush=True)
import gymnasium as gym, agent_envs
env = gym.make("DocVQA-CLI-v0")
env.reset(seed=0)
print(env.step('Action: {"name": "bash", "arguments": {"command": "echo first-use-ok"}}')[0][-1]["content"])
"""
DEADLINE_S = 240  # a cold build takes about 30 s on two busy cores; today's code never ends


@dataclass
class Script:
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")


@dataclass
class FirstUse:
    cache: Path
    killed: Script
    pages_at_kill: int
    workers_of_killed: list[int]
    survivors: list[int]  # of those workers, still running 5 s after the kill
    stdin: Script
    waiter: Script


def _within(timeout: float, condition: Callable[[], object]) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _until(condition: Callable[[], object], what: str, timeout: float = DEADLINE_S) -> None:
    if not _within(timeout, condition):
        raise AssertionError(f"not within {timeout} s: {what}")


def _start(folder: Path, name: str, cache: Path, stdin: IO[bytes] | None = None) -> Script:
    out, err = folder / f"{name}.out", folder / f"{name}.err"
    argv = [sys.executable, "-"] if stdin is not None else [sys.executable, str(folder / "first_use.py")]
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            argv,
            cwd=folder,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=o,
            stderr=e,
            env={**os.environ, "AGENT_ENVS_CACHE": str(cache)},
            start_new_session=True,
        )
    return Script(proc, out, err)


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _staged_pages(cache: Path) -> int:
    return len(list((cache / "synthetic_docs").glob(".*.partial/*.png")))


@pytest.fixture(scope="module")
def first_use(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FirstUse]:
    if shutil.which("tesseract") is None or shutil.which("bwrap") is None:
        pytest.skip("the DocVQA first use needs the tesseract CLI (pages) and bubblewrap (the step)")
    folder = tmp_path_factory.mktemp("first_use")
    cache = folder / "cache"
    (folder / "first_use.py").write_text(SCRIPT)
    (folder / "stdin.py").write_text(SCRIPT)
    scripts: list[Script] = []
    try:
        killed = _start(folder, "killed", cache)
        scripts.append(killed)
        _until(lambda: _staged_pages(cache) > 0, "the unguarded script's build wrote a page")
        workers = _children(killed.proc.pid)
        pages = _staged_pages(cache)
        killed.proc.send_signal(signal.SIGKILL)  # the builder only: its workers must go with it
        killed.proc.wait()
        _within(5, lambda: not any(map(_running, workers)))
        survivors = [pid for pid in workers if _running(pid)]
        with (folder / "stdin.py").open("rb") as source:
            stdin = _start(folder, "stdin", cache, source)
        scripts.append(stdin)
        _until(lambda: "generating" in stdin.stderr(), "the stdin script took the build over")
        waiter = _start(folder, "waiter", cache)
        scripts.append(waiter)
        for script in (stdin, waiter):
            script.proc.wait(timeout=DEADLINE_S)
        yield FirstUse(cache, killed, pages, workers, survivors, stdin, waiter)
    finally:
        for script in scripts:
            if script.proc.poll() is None:
                os.killpg(script.proc.pid, signal.SIGKILL)
                script.proc.wait()


def _finished(script: Script) -> None:
    assert script.proc.returncode == 0, script.stderr()[-3000:]
    assert script.stdout().count("script-start") == 1, script.stdout()  # no child ran the script again
    assert "first-use-ok\n[exit_code] 0" in script.stdout(), script.stdout()


def test_unguarded_script_builds_on_an_empty_cache_without_running_again(first_use: FirstUse) -> None:
    assert first_use.pages_at_kill > 0 and len(first_use.workers_of_killed) == WORKERS
    assert first_use.killed.stdout().count("script-start") == 1
    _finished(first_use.waiter)  # the same file, run to the end once the pages were there


def test_script_on_stdin_builds_the_pages_and_finishes(first_use: FirstUse) -> None:
    _finished(first_use.stdin)
    assert "generating 200 synthetic DocVQA questions" in first_use.stdin.stderr()
    assert "<stdin>" not in first_use.stdin.stderr()


def test_killed_builder_leaves_nothing_the_next_build_trips_over(first_use: FirstUse) -> None:
    assert first_use.survivors == []  # its workers died with it: none writes into a folder being removed
    folder = builtin_cache_dir(200, 0, first_use.cache)
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name, folder.name + ".lock"]  # no .partial
    assert len((folder / "tasks.jsonl").read_text().splitlines()) == 200


def test_waiter_says_what_it_waits_for(first_use: FirstUse) -> None:
    note = f"[agent-envs] waiting for process {first_use.stdin.proc.pid} to finish building"
    assert note in first_use.waiter.stderr() and ".lock)" in first_use.waiter.stderr()


# ---------------------------------------------------------------- the workers, in-process


def test_fresh_pool_keeps_job_order_and_reports_a_job_error() -> None:
    with FreshPool(math.hypot, 2) as pool:
        assert pool.map([(3, 4), (5, 12), (8, 15), (7, 24), (20, 21)]) == [5.0, 13.0, 17.0, 25.0, 29.0]
        with pytest.raises(WorkerError, match="math:hypot: TypeError"):
            pool.map([("three", 4)])
    with pytest.raises(ValueError, match="module-level function"):
        FreshPool(lambda: None, 1)
