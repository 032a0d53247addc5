"""The wheel that ``pip install .`` (and so the Dockerfile) builds ships every module, the prompts and the
package's data files (the tuned LoRA kernel settings)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_has_every_module_and_the_prompts(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a copy: an in-tree build would leave build/ and *.egg-info behind
    src.mkdir()
    for part in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / part, src / part)
    shutil.copytree(REPO / "agent_envs", src / "agent_envs", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("agent_envs-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "agent_envs").rglob("*.py")}
    # every environment's prompts/ folder, the shared prompts and the published table
    prompts = {p.relative_to(REPO).as_posix() for p in (REPO / "agent_envs").rglob("prompts/**/*.txt")}
    prompts.add("agent_envs/prompts/published_sha256.json")
    assert {"agent_envs/envs/prime_count/prompts/system.txt", "agent_envs/prompts/judges/step.txt"} <= prompts
    assert modules - names == set() and prompts - names == set()
    # LoRA kernel settings, the ES-trained model's history
    data = {p.relative_to(REPO).as_posix() for p in (REPO / "agent_envs").rglob("*.json*")}
    assert data and data - names == set()
