"""docs/rl.md's ``python examples/grpo_trl.py`` commands, as a test runs them: the slow test runs the
CPU one, the fast ones parse every one with the example's parser."""

from __future__ import annotations

import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "grpo_trl.py"
PREFIX = "    python examples/grpo_trl.py"


def documented_commands() -> list[list[str]]:
    """The arguments of each indented ``python examples/grpo_trl.py`` command of docs/rl.md
    (continuation lines joined), without its ``--out``."""
    lines = (REPO / "docs" / "rl.md").read_text(encoding="utf-8").splitlines()
    commands = []
    for start in (i for i, line in enumerate(lines) if line.startswith(PREFIX)):
        text = ""
        for line in lines[start:]:
            text += line.strip().removesuffix("\\") + " "
            if not line.rstrip().endswith("\\"):
                break
        words = shlex.split(text)[2:]
        if "--out" in words:
            del words[words.index("--out") : words.index("--out") + 2]
        commands.append(words)
    return commands


def documented_command(marker: str) -> list[str]:
    """The first documented command that holds ``marker``."""
    return next(words for words in documented_commands() if marker in words)
