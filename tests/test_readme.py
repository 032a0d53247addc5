"""The README's Python snippets run as written (issue 36): each block is executed, unless its first
line says what it needs that a test machine lacks (``# needs: ...``), which is then the printed
reason it is skipped."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = [
    (README.read_text()[: m.start()].count("\n") + 1, m.group(1))
    for m in re.finditer(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)
]
NEEDS = "# needs:"


def test_the_readme_has_python_snippets_and_runs_most_of_them():
    assert len(BLOCKS) >= 3 and sum(not code.startswith(NEEDS) for _, code in BLOCKS) >= 2


@pytest.mark.parametrize("line,code", BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_snippet_runs_as_written(line, code, tmp_path, monkeypatch, capsys):
    if code.startswith(NEEDS):
        pytest.skip(f"README.md:{line} {code.splitlines()[0][2:]}")
    monkeypatch.chdir(tmp_path)  # whatever a snippet writes stays in the test's folder
    exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.strip(), "each snippet shows its result"
