"""Prompt files: shipped under ``prompts/`` (installed as ``agent_envs._prompts``), overridable by path.

Templates use the literal placeholder ``{question}`` and are filled with ``str.replace`` so braces in
questions (LaTeX) are never interpreted.  Files are read without the final newline that editors add.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path


def _read(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text[:-1] if text.endswith("\n") else text


def load_prompt(name_or_path: str | Path) -> str:
    """A shipped prompt by name (``"<env folder>/system"``) or any text file by path."""
    p = Path(name_or_path)
    if p.suffix or p.exists():
        if not p.is_file():
            raise FileNotFoundError(f"prompt file not found: {p}")
        return _read(p)
    try:
        return _read(Path(str(resources.files("agent_envs._prompts").joinpath(f"{name_or_path}.txt"))))
    except (ModuleNotFoundError, FileNotFoundError):
        repo = Path(__file__).resolve().parents[2] / "prompts" / f"{name_or_path}.txt"
        if repo.is_file():
            return _read(repo)
        raise FileNotFoundError(f"no shipped prompt named {name_or_path!r}") from None


def fill(template: str, question: str) -> str:
    return template.replace("{question}", question)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_skill(path: str | Path) -> tuple[str, str]:
    """A skill file's text (docs/protocol.md#skill-injection) and the SHA-256 of its bytes."""
    try:
        data = Path(path).read_bytes()
        return data.decode("utf-8"), hashlib.sha256(data).hexdigest()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"skill file {path}: {exc}") from None
