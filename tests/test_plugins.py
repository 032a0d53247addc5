"""Environments are plug-ins (docs/api.md#adding-an-environment): a folder of agent_envs.envs is
found by its ``environments()`` alone, and another package's environment through its entry point
in the group ``agent_envs.environments``; each passes the public conformance checks and runs
``agent-envs eval`` end to end with the scripted reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_envs.core.spec import EnvSpec
from agent_envs.envs import registry

REPO = Path(__file__).resolve().parent.parent
#: an installed third-party package as pip leaves it: the package and its .dist-info
PLUGIN_PATH = REPO / "tests" / "plugin_pkg"
PLUGIN_ENV = "Reverse-Bash-v0"


def _run(args: list[str], *, plugin: bool, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    path = [str(PLUGIN_PATH)] if plugin else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]).strip(os.pathsep))
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _eval(env_id: str, out: Path, *, plugin: bool) -> dict:
    done = _run(
        ["-m", "agent_envs.cli", "eval", "--env", env_id, "--policy", "scripted", "--limit", "2", "--out", str(out)],
        plugin=plugin,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    logs = sorted(p.name for p in (out / "trace_logs").iterdir())
    assert len(logs) == 2 and all(name.endswith("_SUCCEED.md") for name in logs), logs
    assert (out / "report.html").is_file()
    return json.loads((out / "summary.json").read_text())


def test_the_folder_environment_runs_eval_end_to_end(tmp_path):
    """PrimeCount-Python-v0 is its folder alone; the shared trace-log layout and report serve it."""
    assert "PrimeCount-Python-v0" in registry.ENV_IDS
    assert registry.ENV_IDS[0] == "MATH-ReAct-v0"  # the folders' ORDER keeps eval's default
    summary = _eval("PrimeCount-Python-v0", tmp_path / "run", plugin=False)
    assert summary["es"]["mean_score"] == 1.0, summary["es"]


def test_an_entry_point_environment_passes_conformance_and_eval(tmp_path):
    assert PLUGIN_ENV not in registry.ENV_IDS  # not on this process's path
    code = (
        "import agent_envs\n"
        "from agent_envs.testing import check_environment\n"
        f"assert agent_envs.ENV_IDS[-1] == {PLUGIN_ENV!r}, agent_envs.ENV_IDS\n"
        f"print(check_environment({PLUGIN_ENV!r}))\n"
    )
    done = _run(["-c", code], plugin=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "['gym_api', 'total', 'runners_agree', 'leaves_nothing']" in done.stdout
    summary = _eval(PLUGIN_ENV, tmp_path / "run", plugin=True)
    assert summary["es"]["mean_score"] == 1.0, summary["es"]


def _dist(root: Path, name: str, entry_points: str) -> Path:
    """A .dist-info under ``root`` declaring ``entry_points`` (root goes on sys.path)."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return root


def test_a_broken_plugin_is_an_error_naming_it(tmp_path, monkeypatch):
    root = _dist(tmp_path, "broken-plugin", "[agent_envs.environments]\nbroken = no_such_module_here:SPEC\n")
    monkeypatch.syspath_prepend(str(root))
    with pytest.raises(ImportError, match=r"entry point broken = no_such_module_here:SPEC .*failed to load"):
        registry.entry_point_specs()


def test_a_plugin_object_must_be_specs():
    with pytest.raises(TypeError, match="plug-in x gave 3, not an EnvSpec"):
        registry.specs_of(lambda: 3, "x")
    spec = registry.spec("PrimeCount-Python-v0")
    assert registry.specs_of(spec, "x") == registry.specs_of([spec], "x") == registry.specs_of(lambda: (spec,), "x")


def test_an_id_declared_twice_names_both_sources():
    spec: EnvSpec = registry.spec("PrimeCount-Python-v0")
    with pytest.raises(ValueError, match="'PrimeCount-Python-v0' is declared twice: by folder a and by entry point b"):
        registry.collect([("folder a", (spec,)), ("entry point b", (spec,))])
