"""Math task loading: the built-in synthetic set, protocol JSONL files, and (online only) HF sets.

The published MATH-ReAct files must be used byte-for-byte (docs/protocol.md#math-data), hence the SHA-256
helpers; a corrupt row is reported with its file and line so a bad download is easy to locate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent_envs.core.jsonl import jsonl_rows
from agent_envs.envs.math_react.task import MathTask

BUILTIN_SIZE = 200
HF_SPECS = {
    "dapo": "BytedTsinghua-SIA/DAPO-Math-17k",
    "aime": "MathArena/aime_2026",
}


class MathDataError(ValueError):
    """A math data spec could not be turned into tasks (bad file, bad row, unreachable hub)."""


MathSpec = str | Path | Iterable[Mapping[str, Any] | MathTask]


def load_math_tasks(spec: MathSpec, *, limit: int | None = None, seed: int = 0) -> list[MathTask]:
    """Load math tasks from ``"builtin"``, ``"dapo"``/``"aime"``, a JSONL path, or rows.

    ``seed`` only affects the built-in synthetic set; files and hub sets keep their order.
    """
    if limit is not None and limit < 0:
        raise MathDataError(f"limit must be >= 0, got {limit}")
    if isinstance(spec, str) and spec == "builtin":
        from agent_envs.envs.math_react.synth import generate_math_tasks

        return generate_math_tasks(BUILTIN_SIZE if limit is None else limit, seed)
    if isinstance(spec, str) and spec in HF_SPECS:
        tasks = _load_hf(spec)
    elif isinstance(spec, (str, Path)):
        tasks = _load_jsonl(Path(spec))
    else:
        tasks = [_to_task(row, where=f"row {i}") for i, row in enumerate(spec)]
    return tasks if limit is None else tasks[:limit]


def _to_task(row: Mapping[str, Any] | MathTask, where: str) -> MathTask:
    if isinstance(row, MathTask):
        return row
    if not isinstance(row, Mapping):
        raise MathDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in ("id", "question", "answer") if row.get(k) is None]
    if missing:
        raise MathDataError(f"{where}: missing field(s) {', '.join(missing)}")
    try:
        return MathTask.model_validate(dict(row))
    except ValidationError as exc:
        raise MathDataError(f"{where}: invalid task: {exc.errors()[0]['msg']}") from exc


def _load_jsonl(path: Path) -> list[MathTask]:
    if not path.is_file():
        raise MathDataError(f'math data file not found: {path} (or use "builtin")')
    return [_to_task(row, where) for where, row in jsonl_rows(path, MathDataError)]


def _load_hf(name: str) -> list[MathTask]:
    repo = HF_SPECS[name]
    try:
        import datasets

        rows = datasets.load_dataset(repo, split="train")
    except Exception as exc:  # any hub/network/cache failure means the same thing to the user
        raise MathDataError(
            f"could not load {repo!r} from the Hugging Face hub ({type(exc).__name__}: {exc}); "
            'offline, pass a JSONL file of {id, question, answer, source} rows or "builtin"'
        ) from exc
    convert = _dapo_row if name == "dapo" else _aime_row
    seen: dict[str, MathTask] = {}
    for row in rows:
        task = convert(row)
        seen.setdefault(task.id, task)  # DAPO-Math-17k repeats each problem many times
    return list(seen.values())


def _dapo_row(row: Mapping[str, Any]) -> MathTask:
    prompt = row["prompt"]
    question = prompt[0]["content"] if isinstance(prompt, list) else str(prompt)
    return MathTask(
        id=f"dapo_{row['extra_info']['index']}",
        question=question,
        answer=row["reward_model"]["ground_truth"],
        source=HF_SPECS["dapo"],
        ability=row.get("ability"),
    )


def _aime_row(row: Mapping[str, Any]) -> MathTask:
    return MathTask(
        id=f"aime_2026_{int(row['problem_idx']):03d}",
        question=row["problem"],
        answer=row["answer"],
        source=HF_SPECS["aime"],
    )


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, streamed so large files need little memory."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256sums(directory: str | Path) -> dict[str, str]:
    """Check every entry of ``<directory>/SHA256SUMS``; return {name: digest} or raise."""
    directory = Path(directory)
    sums = directory / "SHA256SUMS"
    if not sums.is_file():
        raise MathDataError(f"no SHA256SUMS file in {directory}")
    checked: dict[str, str] = {}
    for lineno, line in enumerate(sums.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2:
            raise MathDataError(f"{sums}:{lineno}: expected '<sha256>  <file>'")
        expected, name = parts[0].lower(), parts[1].lstrip("*").strip()
        target = directory / name
        if not target.is_file():
            raise MathDataError(f"{sums}:{lineno}: listed file is missing: {target}")
        actual = sha256_file(target)
        if actual != expected:
            raise MathDataError(f"SHA-256 mismatch for {target}: expected {expected}, got {actual}")
        checked[name] = actual
    return checked
