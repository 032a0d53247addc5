"""The walls are checked by tools, not painted on: import-linter's contracts (pyproject.toml) hold
for the package, imports inside functions included, and fail on a planted violation; and no shared
module names an environment (docs/architecture.md)."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_envs.envs import registry

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "agent_envs"
needs_import_linter = pytest.mark.skipif(
    importlib.util.find_spec("importlinter") is None,
    reason="import-linter not installed (bash scripts/install.sh --test installs it)",
)
#: the registry's environment folders (agent_envs.envs.<folder>), and the registry itself
FOLDERS = tuple(name.rsplit(".", 1)[1] for name, _ in registry.folder_specs())
#: the environments' folders and the registry that finds them: the only modules that may name one
ENV_FOLDERS = (*(f"envs/{folder}" for folder in FOLDERS), "envs/registry.py")
#: a folder's name, with or without its underscores or as dashes (``math-react``, ``PrimeCount``)
ENV_NAMES = re.compile("|".join(folder.replace("_", "[_-]?") for folder in FOLDERS), re.IGNORECASE)


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """check_code.sh's import-linter run: pyproject's contracts with the registry's folders filled in."""
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "lint_imports.py"), "--root", str(root)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _planted(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package and its contracts with ``line`` added at the end of ``module``."""
    root = tmp_path / "repo"
    shutil.copytree(PACKAGE, root / "agent_envs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    if (REPO / "prompts").is_dir():  # the registry imports the package, which reads its shared prompt data
        shutil.copytree(REPO / "prompts", root / "prompts")
    target = root / "agent_envs" / module
    target.write_text(target.read_text() + "\n" + line + "\n")
    return root


@needs_import_linter
def test_the_contracts_hold():
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"Contracts: (\d+) kept, 0 broken", done.stdout)


@needs_import_linter
@pytest.mark.parametrize(
    "module,line,broken",
    [
        # an upward import hidden inside a function
        (
            "core/types.py",
            "def _upward():\n    from agent_envs.cli import main\n    return main",
            "layers point one way",
        ),
        ("core/spec.py", "import agent_envs.protocol.seeds", "core imports nothing of the package"),
        ("policy/sampling.py", "from agent_envs.envs import react", "policies know no environment"),
        (
            "rollout/metrics.py",
            "from agent_envs.envs.docvqa.metrics import ANLS_KEY",
            "shared layers reach an environment only through the registry",
        ),
        (
            "envs/countdown/env.py",
            "from agent_envs.envs.math_react.scoring import math_score",
            "an environment's folder imports no other environment",
        ),
        # a folder no list names: the registry's folders are the contracts' lists
        (
            "rollout/metrics.py",
            "from agent_envs.envs.prime_count.scoring import parse_count",
            "shared layers reach an environment only through the registry",
        ),
        (
            "envs/prime_count/env.py",
            "from agent_envs.envs.countdown.scoring import countdown_score",
            "an environment's folder imports no other environment",
        ),
        # the model libraries, each only where its layer owns it
        ("tools/bash.py", "import torch", "the layers below policy import no model library"),
        ("rollout/metrics.py", "import torch", "torch only in es/"),
        ("policy/openai.py", "def _hidden():\n    import vllm\n    return vllm", "vLLM only in policy.vllm and es/"),
        ("es/worker.py", "import ray.util", "Ray only in scale.pool"),
        ("envs/react.py", "from transformers import AutoTokenizer", "the layers below policy import no model library"),
        # es/: upward, and between two modules of one layer
        ("es/history.py", "import agent_envs.es.worker", "es/ modules point one way"),
        ("es/seeds.py", "from agent_envs.es import schedule", "es/ modules point one way"),
    ],
)
def test_a_planted_violation_breaks_its_contract(tmp_path, module, line, broken):
    done = _lint(_planted(tmp_path, module, line))
    assert done.returncode != 0
    assert f"{broken}" in done.stdout and "BROKEN" in done.stdout.split(broken, 1)[1].splitlines()[0], done.stdout


def _shared_modules() -> list[Path]:
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not any(str(p.relative_to(PACKAGE)).startswith(f) for f in ENV_FOLDERS)
    ]


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants and names of a module, docstrings left out (they may explain by example)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.alias):
            out.append((node.lineno, node.name))
    return out


def test_no_shared_module_names_an_environment():
    named = [
        f"{p.relative_to(REPO)}:{line}: {text!r}"
        for p in _shared_modules()
        for line, text in _strings(ast.parse(p.read_text()))
        if ENV_NAMES.search(text)
    ]
    assert named == []
    assert len(_shared_modules()) > 60  # the walk saw the package


def test_the_grep_catches_a_name(tmp_path):
    tree = ast.parse('"""DocVQA is fine in a docstring."""\nKEY = "docvqa"\n')
    assert [t for _, t in _strings(tree) if ENV_NAMES.search(t)] == ["docvqa"]


def test_the_contracts_cover_every_layer():
    """Each top-level package and module of agent_envs sits in the layers contract."""
    layers = re.search(r'id = "layers".*?layers = \[(.*?)\]', (REPO / "pyproject.toml").read_text(), re.S)
    assert layers is not None
    listed = set(re.findall(r'"agent_envs\.(\w+)"', layers.group(1)))
    present = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")
    }
    assert present == listed, f"not in a layer: {sorted(present - listed)}"


def test_the_es_order_covers_every_es_module():
    """Each module of agent_envs/es sits in the es-order contract (one left out would be unchecked)."""
    contract = re.search(r'id = "es-order".*?layers = \[(.*?)\]', (REPO / "pyproject.toml").read_text(), re.S)
    assert contract is not None
    listed = set(re.findall(r"\w+", " ".join(re.findall(r'"([^"]*)"', contract.group(1)))))
    present = {p.stem for p in (PACKAGE / "es").glob("*.py") if p.stem != "__init__"}
    assert present == listed, f"not in the es order: {sorted(present - listed)}; unknown: {sorted(listed - present)}"
