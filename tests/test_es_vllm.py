"""ES weight operations inside a real vLLM engine (vllm-cpu, SmolLM2-135M).

vllm-cpu lives in its own virtual environment (scripts/install_vllm_cpu.sh), so each case runs a
short script under that interpreter; each needs a fresh process because the CPU weight-packing
workaround is chosen when the worker extension is imported, before the model loads.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from vllm_cpu import REPO, es_command, es_train_flags, run_result, script_env, smollm2, vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_tmpdir")]

SCRIPT = r"""
import json, os, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from agent_envs.es.worker import EXTENSION, VLLMPerturbation
from agent_envs.policy.vllm import VLLMPolicy
# a node-memory fraction below the process's own RSS: the engine must start on the explicit KV
# cache size that the vllm_tmpdir fixture sets, whatever the machine's memory
llm = LLM(model=sys.argv[1], worker_extension_cls=EXTENSION, dtype="float32", max_model_len=1024,
          enforce_eager=True, seed=0, gpu_memory_utilization=0.01, enable_prefix_caching=True)
out = {"coverage": llm.collective_rpc("es_init", args=("full", [], 2**23))[0]}
policy = VLLMPolicy(llm=llm)  # the ES backend drives the engine through the policy: new cache salts
try:
    es = VLLMPerturbation(policy, exact_revert=True)
except RuntimeError as exc:
    out["refused"] = str(exc)
    print("RESULT " + json.dumps(out)); sys.exit(0)
prompt = ("Here is a long shared context about cities. " * 40) + "The capital of France is"
ids = llm.get_tokenizer()(prompt)["input_ids"]
sp = SamplingParams(max_tokens=4, temperature=0.0, seed=1, logprobs=0)

def probe(salt):
    # the prompt under a cache salt: its text, the sampled tokens' log-probabilities, the prompt
    # tokens served from the prefix cache
    extra = {"cache_salt": salt} if salt is not None else {}
    o = llm.generate([TokensPrompt(prompt_token_ids=ids, **extra)], sp, use_tqdm=False)[0]
    s = o.outputs[0]
    return {"text": s.text, "logprobs": [lp[t].logprob for lp, t in zip(s.logprobs, s.token_ids)],
            "cached": o.num_cached_tokens}

gen = lambda: probe(policy.cache_salt)  # what the policy's own requests carry
out["base"], out["base_again"], out["c0"] = gen(), gen(), es.checksum()[0]
base_salt = policy.cache_salt
out["apply"] = es.apply(5, 0.05)[0]
out["perturbed"] = gen()
out["stale"] = probe(base_salt)  # the base weights' blocks, still in the cache under the old salt
out["fresh"] = probe("a salt never used: nothing cached")
try:
    es.update([1], [1.0], 0.1)
    out["update_while_perturbed"] = "accepted"
except Exception as exc:
    out["update_while_perturbed"] = str(exc)
es.revert(5, 0.05)
out["reverted"], out["c1"] = gen(), es.checksum()[0]
out["update"] = es.update([11, 22], [1.0, -1.0], 0.05)[0]
out["c2"], out["reset"] = es.checksum()[0], es.reset()[0]
out["status"] = es.status()[0]
out["forget"] = es.last_forget
print("RESULT " + json.dumps(out))
"""


def run_case(plain_linear: bool) -> dict:
    env = script_env(VLLM_ENABLE_V1_MULTIPROCESSING="0", AGENT_ENVS_ES_CPU_PLAIN_LINEAR="1" if plain_linear else None)
    return run_result(["-c", SCRIPT, str(smollm2())], env=env, timeout=1200)[0]


def test_packed_cpu_weights_are_refused() -> None:
    out = run_case(plain_linear=False)
    assert "empty" in out["refused"] and "AGENT_ENVS_ES_CPU_PLAIN_LINEAR" in out["refused"]
    assert out["coverage"]["total_params"] < 50_000_000  # only the unpacked fraction is visible


def test_perturbation_on_vllm_worker() -> None:
    out = run_case(plain_linear=True)
    assert out["coverage"]["total_params"] == 134_515_008 and out["coverage"]["n_tensors"] == 182
    assert out["base_again"]["cached"] >= 128 and out["base_again"]["logprobs"] == out["base"]["logprobs"]
    # the engine sees the perturbed weights, and no KV block of the base weights: after the weight change
    # the policy's salt is new, so nothing is cached for it and it answers as an uncached request does
    assert out["perturbed"]["text"] != out["base"]["text"] and out["perturbed"]["cached"] == 0
    assert out["perturbed"]["logprobs"] == out["fresh"]["logprobs"]
    # what the salt avoids: the base weights' blocks are still in the cache and would change the answer
    assert out["stale"]["cached"] >= 128 and out["stale"]["logprobs"] != out["fresh"]["logprobs"]
    assert out["forget"]["cache"] == "salt"
    assert "while perturbed" in out["update_while_perturbed"]
    assert out["reverted"]["text"] == out["base"]["text"]  # and the restored ones
    assert out["c1"] == out["c0"]  # exact revert: bit-identical weights
    assert out["c2"] != out["c0"] and out["update"]["n"] == 2
    assert out["reset"]["reverted_updates"] == 1 and out["status"]["update_history"] == 0


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_two_generation_es_loop_with_rollouts(tmp_path: Path, mode: str) -> None:
    """agent-envs es train end to end on the CPU engine (compiled, the CPU's counterpart of CUDA
    graphs): real envs, real bwrap, history written with a weights fingerprint per generation,
    replayable onto a fresh engine that checks every generation's fingerprint and ends with the same
    checksum.  ``async``: AsyncVLLMPolicy with its engine core in another process, one
    ``run_episodes`` call per member, perturbed by name.  (An edited history's replay stopping at the
    edited generation: tests/test_es_history.py, on the torch backend.)"""
    python, model = vllm_python(), smollm2()
    env = script_env(VLLM_ENABLE_V1_MULTIPROCESSING="0", AGENT_ENVS_ES_CPU_PLAIN_LINEAR="1")
    common = [
        *es_command("train"),
        *es_train_flags(model, 2, "--train", "builtin", "--exact-revert", "--mode", mode, "--toy-reward"),
    ]  # SmolLM2 scores 0 on every task; the update must really move weights
    history = tmp_path / "history.json"
    train = subprocess.run(
        [python, *common, "--history", str(history)], capture_output=True, text=True, env=env, timeout=1500
    )
    assert train.returncode == 0, train.stderr[-4000:]
    written = json.loads(history.read_text())
    records = [r for r in written if "rewards" in r]
    assert [r["generation"] for r in records] == [0, 1]
    assert written[0]["config"]["start_fingerprint"].startswith("wf1:") and written[0]["config"]["concurrency"] == 2
    assert all(r["weights_fingerprint"].startswith("wf1:") for r in records)
    assert all(len(r["seeds"]) == 2 and len(r["samples"][0]["result"]) == 2 for r in records)
    rows = [row for r in records for sample in r["samples"] for row in sample["result"]]
    assert all(row["termination_reason"] != "request_error" for row in rows)
    assert all(len(set(r["rewards"])) == 2 for r in records)  # toy rewards differ between members
    assert len({r["weights_fingerprint"] for r in records}) == 2  # so every update moved the weights
    trained = [line for line in train.stdout.splitlines() if "final weights checksum" in line][-1].split()[-1]
    replay = subprocess.run(
        [python, *common, "--resume", str(history), "--history", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )
    assert replay.returncode == 0, replay.stderr[-4000:]
    assert "reverted members in place" not in replay.stderr  # an --exact-revert history replays bit for bit
    assert (
        "replayed 2 generations" in replay.stdout
        and "(2 of 2 checked against the history's fingerprints)" in replay.stdout
    )
    assert [line for line in replay.stdout.splitlines() if "final weights checksum" in line][-1].split()[-1] == trained


def test_perturbation_round_trip_on_a_compiled_engine() -> None:
    """scripts/gpu_es_check.py --cpu: the CPU engine compiles its model (its counterpart of CUDA
    graphs); an in-place perturbation must change greedy and fixed-seed outputs, and the in-place
    and exact reverts must restore them token for token (the exact one with the same fingerprint)."""
    script = REPO / "scripts" / "gpu_es_check.py"
    out, proc = run_result([str(script), "--cpu", "--tiny", "--tokenizer", str(smollm2())], timeout=1200)
    trip = out["roundtrip"]
    assert trip["graph_mode"]["enforce_eager"] is False and trip["repeatable"] and trip["ok"], proc.stdout[-2000:]
    for label in ("in_place_revert", "exact_revert"):
        assert trip[label]["tokens_changed_by_perturbation"] > 0 and trip[label]["restored_token_for_token"]
    assert trip["exact_revert"]["fingerprint_restored"] and trip["exact_revert"]["revert_copy"] == ["device"]
    assert not trip["in_place_revert"]["fingerprint_restored"]  # subtraction leaves a rounding residue
    assert out["update_while_perturbed"].startswith("refused")
