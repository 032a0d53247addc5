"""agent_envs.core.cache.build_once: one builder at a time, a folder never seen half-written, a killed or
failing builder leaves nothing that looks finished, and "someone else finished first" is success."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent_envs.core import cache
from agent_envs.core.cache import MARKER, BuildWaitTimeout, build_once, is_complete

REPO = Path(__file__).resolve().parent.parent
#: a child that builds ``argv[1]`` with 50 files once told "go" on stdin; it appends its pid to
#: ``argv[2]`` when its build function runs, gives a second builder 2 s to show up there (none may,
#: under the lock), and prints whether this call built the folder
CHILD = r"""
import os, sys, time
from pathlib import Path
from agent_envs.core.cache import build_once
target, log = Path(sys.argv[1]), sys.argv[2]
def build(out):
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + 2
    while len(open(log).read().split()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(50):
        (out / f"part{i}").write_text(str(i) * 1000)
    if len(sys.argv) > 3:                 # "hang": stop mid-build until killed
        print("building", flush=True)
        sys.stdin.readline()
print("ready", flush=True)
sys.stdin.readline()
print("built" if build_once(target, build) else "found", flush=True)
"""


def start_child(target: Path, log: Path, *extra: str) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(target), str(log), *extra],
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert child.stdout.readline().strip() == "ready"
    return child


def leftovers(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir() if p.name.endswith(".partial"))


def test_two_processes_at_the_same_moment_build_once_and_both_succeed(tmp_path: Path):
    target, log = tmp_path / "cache" / "thing", tmp_path / "builders.log"
    children = [start_child(target, log) for _ in range(2)]  # both imported and waiting
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    outcomes = sorted(child.communicate(timeout=120)[0].strip() for child in children)
    assert [child.returncode for child in children] == [0, 0]
    assert outcomes == ["built", "found"]  # the lock: the second waited, then found it finished
    assert len(log.read_text().split()) == 1  # the build function ran once
    assert is_complete(target) and len(list(target.glob("part*"))) == 50
    assert leftovers(target) == []


def test_without_locks_the_rename_loser_counts_the_winners_folder_as_success(tmp_path: Path, monkeypatch):
    """Where the file system has no locks both build; the one whose rename loses returns False."""

    @contextlib.contextmanager
    def no_lock(*_):
        yield False

    monkeypatch.setattr(cache, "_exclusive", no_lock)
    target, both_inside = tmp_path / "thing", threading.Barrier(2, timeout=30)
    results, errors = [], []

    def build(out: Path) -> None:
        (out / "data").write_text(threading.current_thread().name)
        both_inside.wait()  # both builders are mid-build at once

    def run() -> None:
        try:
            results.append(build_once(target, build))
        except Exception as exc:  # noqa: BLE001 - the test reports whatever a builder raised
            errors.append(exc)

    threads = [threading.Thread(target=run, name=f"builder{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and sorted(results) == [False, True]
    assert is_complete(target) and (target / "data").read_text() in ("builder0", "builder1")
    assert leftovers(target) == []


def test_an_unfinished_folder_in_the_way_is_rebuilt_not_used(tmp_path: Path):
    target = tmp_path / "thing"
    target.mkdir()
    (target / "config.json").write_text("{}")  # looks like a model folder, but carries no marker
    assert not is_complete(target)
    assert build_once(target, lambda out: (out / "real").write_text("yes")) is True
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "real"]
    assert build_once(target, lambda out: pytest.fail("a finished folder is built again")) is False
    assert leftovers(target) == []


def test_a_failing_build_leaves_nothing_and_the_next_call_builds(tmp_path: Path):
    target = tmp_path / "thing"

    def broken(out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        build_once(target, broken)
    assert not target.exists() and leftovers(target) == []
    assert build_once(target, lambda out: (out / "whole").write_text("y")) is True and is_complete(target)


def test_a_builder_killed_mid_build_blocks_nobody_and_its_staging_is_removed(tmp_path: Path):
    target, log = tmp_path / "thing", tmp_path / "builders.log"
    child = start_child(target, log, "hang")
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "building"
    assert not target.exists() and len(leftovers(target)) == 1  # half-built, and only in staging
    child.kill()
    child.communicate(timeout=30)
    assert build_once(target, lambda out: (out / "whole").write_text("z")) is True  # the lock died with it
    assert is_complete(target) and leftovers(target) == []


def test_the_folder_gets_the_requested_mode(tmp_path: Path):
    build_once(tmp_path / "pages", lambda out: None, mode=0o755)
    assert (tmp_path / "pages").stat().st_mode & 0o777 == 0o755


def test_a_held_lock_is_named_then_given_up_on_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "folder"
    holder = os.open(tmp_path / "folder.lock", os.O_RDWR | os.O_CREAT)
    try:
        os.write(holder, b"4242\n")
        fcntl.flock(holder, fcntl.LOCK_EX)  # another open file: build_once's lock conflicts with it
        with pytest.raises(BuildWaitTimeout, match=r"process 4242 has held .*folder\.lock for over 0 s"):
            build_once(target, lambda out: pytest.fail("built under someone else's lock"), wait_s=0.2)
    finally:
        os.close(holder)
    assert capsys.readouterr().err.startswith(f"[agent-envs] waiting for process 4242 to finish building {target}")
    assert build_once(target, lambda out: (out / "x").write_text("x")) and (target / "x").is_file()
    assert (tmp_path / "folder.lock").read_text() == f"{os.getpid()}\n"  # the holder names itself


def test_lock_file_that_is_a_symlink_is_refused_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "folder.lock").symlink_to(victim)
    with pytest.raises(OSError) as refused:
        build_once(tmp_path / "folder", lambda out: None)
    assert refused.value.errno == errno.ELOOP
    assert victim.read_text() == "keep me"
