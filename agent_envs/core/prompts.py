"""Prompt files: each environment's in its own folder (``agent_envs/envs/<env>/prompts/``, its spec's
``prompt_dir``), the shared ones (judges) and the published table in ``agent_envs/prompts/``; any can
be overridden by path.

Templates use the literal placeholder ``{question}`` and are filled with ``str.replace`` so braces in
questions (LaTeX) are never interpreted.  Files are read without the final newline that editors add.

The shipped system prompts are this package's own wording; the reference's texts are not in the
repository.  :data:`PUBLISHED_TEXTS` (the one home of docs/protocol.md#prompt-hashes) lists the
SHA-256 of the reference's texts, and a *prompt profile* (:func:`profile_prompt`) is a folder holding
``<name>.txt`` per prompt name whose system prompts must hash to those values: how a user who holds the
original texts runs with them exactly (docs/protocol.md#prompt-profiles).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_envs.core.jsonl import jsonl_rows

#: the package's shared prompt files (``judges/step.txt``) and the published table, packaged as data
SHARED = Path(__file__).resolve().parents[1] / "prompts"


def _read(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text[:-1] if text.endswith("\n") else text


def load_prompt(name_or_path: str | Path, directory: str | Path | None = None) -> str:
    """A prompt by name or any text file by path.  With ``directory`` (an environment's own prompt
    folder, its spec's ``prompt_dir``) a name is the file ``<its last part>.txt`` there; without, a
    shared prompt (``"judges/step"``: ``agent_envs/prompts/judges/step.txt``)."""
    p = Path(name_or_path)
    if directory is not None and not (p.suffix or p.exists()):
        p = Path(directory) / f"{p.name}.txt"
    if p.suffix or p.exists():
        if not p.is_file():
            raise FileNotFoundError(f"prompt file not found: {p}")
        return _read(p)
    shared = SHARED / f"{name_or_path}.txt"
    if not shared.is_file():
        raise FileNotFoundError(f"no shared prompt named {name_or_path!r} (an environment's: pass its prompt_dir)")
    return _read(shared)


def fill(template: str, question: str) -> str:
    return template.replace("{question}", question)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class PublishedText:
    """A text of the reference whose SHA-256 (of its UTF-8 bytes) docs/protocol.md#prompt-hashes lists."""

    #: the table row's description
    label: str
    chars: int
    sha256: str
    #: the shipped prompt a profile's file of the same name replaces (``"<env folder>/system"``); None
    #: for the texts a profile does not hold
    prompt: str | None = None


#: the file of docs/protocol.md#prompt-hashes' rows (data beside the prompts, so this shared module names
#: no environment); tests check the page against it
PUBLISHED_FILE = "published_sha256.json"


def _published_texts() -> tuple[PublishedText, ...]:
    raw = (SHARED / PUBLISHED_FILE).read_text(encoding="utf-8")
    return tuple(PublishedText(**row) for row in json.loads(raw))


#: docs/protocol.md#prompt-hashes, row by row
PUBLISHED_TEXTS: tuple[PublishedText, ...] = _published_texts()
#: the texts a prompt profile holds, by shipped prompt name
PUBLISHED_PROMPTS: dict[str, PublishedText] = {t.prompt: t for t in PUBLISHED_TEXTS if t.prompt is not None}
#: what a run records of a prompt profile (the environment's config hash and settings)
PROFILE = "published"


def profile_prompt(directory: str | Path, name: str) -> str:
    """The system prompt ``name`` (``"<env folder>/system"``) of the prompt profile in ``directory``
    (``<directory>/<name>.txt``, e.g. ``<directory>/docvqa/system.txt``), checked against its published SHA-256
    (docs/protocol.md#prompt-profiles).  A missing file, a prompt without a published hash and a
    text that hashes differently are ValueErrors; the last names both hashes."""
    published = PUBLISHED_PROMPTS.get(name)
    if published is None:
        known = ", ".join(sorted(PUBLISHED_PROMPTS))
        raise ValueError(f"prompt profile {directory}: no published SHA-256 for {name!r} (a profile holds {known})")
    path = Path(directory) / f"{name}.txt"
    if not path.is_file():
        raise ValueError(f"prompt profile {directory}: {path} not found (a profile holds <DIR>/<name>.txt)")
    try:
        text = _read(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"prompt profile {directory}: {path}: {exc}") from None
    got = sha256(text)
    if got != published.sha256:
        raise ValueError(
            f"prompt profile {directory}: {path} has SHA-256 {got} ({len(text)} characters, a final newline "
            f"dropped), not the published {published.sha256} ({published.chars} characters) of the "
            f"{published.label}"
        )
    return text


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
