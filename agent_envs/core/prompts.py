"""Prompt files: shipped under ``prompts/`` (installed as ``agent_envs._prompts``), overridable by path.

Templates use the literal placeholder ``{question}`` and are filled with ``str.replace`` so braces in
questions (LaTeX) are never interpreted.  Files are read without the final newline that editors add.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path
from typing import Any

from agent_envs.core.jsonl import jsonl_rows


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


#: the roles a few-shot file alternates, in order (docs/protocol.md#few-shot-turns)
FEW_SHOT_ROLES = ("user", "assistant")


def few_shot_turns(source: str | Path | list[Any]) -> tuple[dict[str, str], ...]:
    """Worked examples as earlier chat turns (docs/protocol.md#few-shot-turns): a JSONL file (or a
    list) of ``{"role": ..., "content": ...}`` messages, user and assistant in turn, starting with
    a user message and ending with an assistant one.  Anything else is a ValueError naming the
    file and line."""
    if isinstance(source, list):
        rows: list[tuple[str, Any]] = [(f"few-shot turns: item {i}", row) for i, row in enumerate(source, 1)]
        whole = "few-shot turns"
    else:
        path, whole = Path(source), f"few-shot file {source}"
        try:
            rows = list(jsonl_rows(path, ValueError))
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{whole}: {exc}") from None
    turns: list[dict[str, str]] = []
    for where, row in rows:
        role = FEW_SHOT_ROLES[len(turns) % 2]
        if not isinstance(row, dict) or set(row) != {"role", "content"}:
            raise ValueError(f'{where}: expected an object with exactly "role" and "content"')
        if row["role"] != role:
            raise ValueError(f"{where}: expected role {role!r} (user and assistant in turn), got {row['role']!r}")
        if not isinstance(row["content"], str) or not row["content"].strip():
            raise ValueError(f"{where}: content must be a non-empty string")
        turns.append({"role": role, "content": row["content"]})
    if not turns or len(turns) % 2:
        raise ValueError(f"{whole}: expected user/assistant pairs ending with an assistant message, got {len(turns)}")
    return tuple(turns)
