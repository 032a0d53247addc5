"""import-linter on the contracts of pyproject.toml, with the environments' folders taken from the
registry (docs/architecture.md): the contracts that list them ("shared-layers-name-no-environment",
"environments-are-independent") check every folder ``agent_envs.envs.registry`` finds, so a new
environment's folder is inside the walls without an edit here or in pyproject.toml.

Run from a checkout (``bash scripts/check_code.sh`` does): ``PYTHONPATH=. python scripts/lint_imports.py``;
``--root DIR`` checks another copy (tests/test_layers.py plants violations in one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

#: contract id -> the key whose list is the environments' folders
FOLDER_LISTS = {"shared-layers-name-no-environment": "forbidden_modules", "environments-are-independent": "modules"}


def env_folders(root: Path) -> list[str]:
    """The registry's folders of the package under ``root`` (imported in a child, so that the copy's
    own registry answers)."""
    code = "from agent_envs.envs.registry import folder_specs; print(*[n for n, _ in folder_specs()])"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"lint_imports: the registry did not load:\n{done.stderr}")
    return done.stdout.split()


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)  # strings and lists of strings are TOML as JSON writes them


def contracts(root: Path) -> str:
    """pyproject.toml's import-linter section as TOML, the folder lists replaced."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
    folders = env_folders(root)
    lines = ["[tool.importlinter]"]
    lines += [f"{k} = {_toml(v)}" for k, v in config.items() if k != "contracts"]
    for contract in config["contracts"]:
        key = FOLDER_LISTS.get(contract["id"])
        if key is not None:
            contract = {**contract, key: folders}
        lines += ["", "[[tool.importlinter.contracts]]", *[f"{k} = {_toml(v)}" for k, v in contract.items()]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout to check (default: here)")
    args = parser.parse_args()
    root = args.root.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "importlinter.toml"
        config.write_text(contracts(root))
        command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
        return subprocess.run(
            [sys.executable, "-c", command, "--no-cache", "--config", str(config)],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        ).returncode


if __name__ == "__main__":
    raise SystemExit(main())
