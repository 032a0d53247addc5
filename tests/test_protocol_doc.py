"""docs/protocol.md is the spec the code cites: every cited section anchor must exist there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "docs" / "protocol.md"
SOURCES = ("agent_envs", "tests", "docs", "examples", "scripts", "benchmarks", "docker", "README.md", "Dockerfile")
CITATION = re.compile(r"protocol\.md#([\w-]+)")
#: further anchors of a multi-section citation ("docs/protocol.md#metrics, #trace-logs") or a short
#: one after an earlier full citation ("# #derived-cases")
SHORT = re.compile(r"(?<![\w/#&])#([a-z0-9]+(?:-[a-z0-9]+)+)\b")


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower-cased, punctuation dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    in_fence = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        heading = None if in_fence else re.match(r"#{1,6}\s+(.+?)\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def source_files() -> list[Path]:
    files: list[Path] = []
    for name in SOURCES:
        path = REPO / name
        files += [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return [p for p in files if p.suffix in ("", ".py", ".md", ".sh", ".txt", ".toml") and "__pycache__" not in p.parts]


def test_every_cited_anchor_exists():
    known = anchors(SPEC.read_text(encoding="utf-8"))
    cited: dict[str, set[str]] = {}
    for path in source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        if "protocol.md" not in text:
            continue
        names = set(CITATION.findall(text)) | set(SHORT.findall(text))
        for name in names:
            cited.setdefault(name, set()).add(str(path.relative_to(REPO)))
    assert len(cited) > 30, "the code should cite the spec"
    missing = {name: sorted(paths) for name, paths in cited.items() if name not in known}
    assert not missing, f"anchors cited but not in docs/protocol.md: {missing}"


def test_no_citations_of_the_outside_document():
    """Sections of the reference write-up ("§N.N") are not part of this repository."""
    stale = [
        f"{p.relative_to(REPO)}:{i}"
        for p in source_files()
        for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if re.search(r"§\s?\d", line)
    ]
    assert not stale, stale


def test_anchor_rules():
    assert anchors("# A b\n## HTTP-evaluator compatibility\n```\n# not a heading\n```\n## A b\n") == {
        "a-b",
        "http-evaluator-compatibility",
        "a-b-1",
    }


def test_every_cited_reliability_anchor_exists():
    """docs/reliability.md states the package's promises; code and tests cite its sections."""
    known = anchors((REPO / "docs" / "reliability.md").read_text(encoding="utf-8"))
    cited = {
        (name, str(p.relative_to(REPO)))
        for p in source_files()
        for name in re.findall(r"reliability\.md#([\w-]+)", p.read_text(encoding="utf-8", errors="replace"))
    }
    assert len(cited) > 5 and not {c for c in cited if c[0] not in known}, sorted(c for c in cited if c[0] not in known)
