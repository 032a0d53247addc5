"""Every relative link in README.md and docs/ points at a file that exists, and every ``#anchor``
into a markdown file at one of its headings: the README is a front page whose details live in
docs/, so a moved or renamed section must not leave a dead link behind."""

from __future__ import annotations

import re
from pathlib import Path

from test_protocol_doc import anchors

REPO = Path(__file__).resolve().parent.parent
#: ``[text](target)`` and ``![alt](target)``; an optional "title" after the target is dropped
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def markdown_files(repo: Path = REPO) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


def links(markdown: str) -> list[tuple[int, str]]:
    """(line number, target) of every link outside code fences and inline code."""
    found, in_fence = [], False
    for number, line in enumerate(markdown.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if not in_fence:
            found += [(number, m.group(1)) for m in LINK.finditer(INLINE_CODE.sub("", line))]
    return found


def broken_links(path: Path, repo: Path = REPO) -> list[str]:
    """``file:line: target (why)`` for each relative link of ``path`` that does not resolve."""
    problems = []
    for number, target in links(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ... are not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(repo)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            problems.append(f"{where} (no heading #{anchor} in {dest.relative_to(repo)})")
    return problems


def test_every_relative_link_and_anchor_resolves():
    files = markdown_files()
    assert len(files) >= 8, files  # README + the docs pages it links
    checked = sum(len(links(p.read_text(encoding="utf-8"))) for p in files)
    assert checked > 30, "the README and docs should link to each other"
    problems = [problem for path in files for problem in broken_links(path)]
    assert not problems, "\n".join(problems)


def test_every_docs_page_is_linked_from_the_readme():
    readme = {target.partition("#")[0] for _, target in links((REPO / "README.md").read_text(encoding="utf-8"))}
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert not pages - readme, f"docs pages the README does not link: {sorted(pages - readme)}"


def test_the_readme_is_a_front_page():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 200


def test_a_dead_file_a_dead_anchor_and_a_code_sample_are_told_apart(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n## Sub part\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](docs/a.md#sub-part) [self](#top) [web](https://example.invalid/x)\n"
        "[gone](docs/missing.md) [bad anchor](docs/a.md#nope)\n"
        "`[in code](docs/missing.md)`\n```\n[in a fence](docs/missing.md)\n```\n# Top\n",
        encoding="utf-8",
    )
    assert broken_links(readme, tmp_path) == [
        "README.md:2: docs/missing.md (no such file)",
        "README.md:2: docs/a.md#nope (no heading #nope in docs/a.md)",
    ]
