"""The embedded model's conversion on an empty cache, by two processes at the same moment (as the
main job's evaluations start): both succeed and the folder they leave loads and generates.  One of
them is examples/grpo_trl.py's model resolution (docs/rl.md's GRPO command without --model), and
the folder lands under ``$AGENT_ENVS_CACHE``, not under ``$HOME`` (docs/install.md#caches)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_envs.core.cache import is_complete
from agent_envs.policy.base import GenerationRequest
from agent_envs.policy.hf import TransformersPolicy

REPO = Path(__file__).resolve().parent.parent
#: imports everything first, says so, waits for "go", then converts under $AGENT_ENVS_CACHE: through
#: the example given as its argument (its resolve_model(None)), else through smollm2_hf_dir()
CHILD = r"""
import runpy, sys
import torch, transformers
from agent_envs.policy.hf import smollm2_hf_dir
example = runpy.run_path(sys.argv[1], run_name="example") if len(sys.argv) > 1 else None
print("ready", flush=True)
sys.stdin.readline()
print("folder", example["resolve_model"](None) if example else smollm2_hf_dir(), flush=True)
"""


@pytest.mark.slow
def test_two_processes_convert_at_once_on_an_empty_cache(tmp_path: Path, smollm2_gguf: Path):
    folder = tmp_path / "new-cache" / "smollm2-hf"
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": str(REPO), "AGENT_ENVS_CACHE": str(folder.parent), "HOME": str(home)}
    env.pop("AGENT_ENVS_SMOLLM2_HF", None)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, *via],
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for via in ([str(REPO / "examples" / "grpo_trl.py")], [])
    ]
    for child in children:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()[-3000:]
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    results = [child.communicate(timeout=900) for child in children]
    for child, (out, err) in zip(children, results):
        assert child.returncode == 0, err[-3000:]
        assert out.strip() == f"folder {folder}"
    assert is_complete(folder)
    assert sorted(p.name for p in folder.parent.iterdir()) == ["smollm2-hf", "smollm2-hf.lock"]  # no staging left
    assert not (home / ".cache" / "agent-envs").exists()

    policy = TransformersPolicy(folder, num_threads=1)
    try:
        out = policy.generate(
            [GenerationRequest(messages=[{"role": "user", "content": "Say hi."}], seed=1, max_tokens=4, stop=[])]
        )[0]
    finally:
        policy.close()
    assert out.ok and len(out.token_ids) > 0
