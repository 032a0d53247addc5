"""JSONL reading shared by the loaders: every error names the file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def jsonl_rows(path: Path, error: type[Exception]) -> Iterator[tuple[str, Any]]:
    """Yield ``("<file>:<line>", row)`` for each non-blank line; a corrupt line raises ``error``."""
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{where}: corrupt JSON line ({exc.msg})") from exc
