"""Synthetic DocVQA pages: deterministic bytes, OCR-checked questions, cached built-in set."""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from pathlib import Path

import pytest

from agent_envs.core.cache import is_complete
from agent_envs.envs.docvqa import synth as synth_docs
from agent_envs.envs.docvqa.data import load_docvqa_tasks
from agent_envs.envs.docvqa.synth import best_ocr_anls, generate_docvqa_tasks, ocr_text

pytestmark = pytest.mark.skipif(
    shutil.which("tesseract") is None,
    reason="synthetic pages are OCR-checked with the tesseract CLI",
)


def _fields(tasks: list) -> list[dict]:
    return [{**t.model_dump(), "image": Path(t.image).name} for t in tasks]


def test_same_seed_gives_byte_identical_pages_and_questions(tmp_path: Path) -> None:
    a = generate_docvqa_tasks(12, seed=5, out_dir=tmp_path / "a")
    b = generate_docvqa_tasks(12, seed=5, out_dir=tmp_path / "b")
    assert len(a) == 12 and _fields(a) == _fields(b)
    pages_a, pages_b = (
        sorted((tmp_path / "a").glob("*.png")),
        sorted((tmp_path / "b").glob("*.png")),
    )
    assert [p.name for p in pages_a] == [p.name for p in pages_b] and pages_a
    assert all(x.read_bytes() == y.read_bytes() for x, y in zip(pages_a, pages_b))
    other = generate_docvqa_tasks(12, seed=6, out_dir=tmp_path / "c")
    assert [t.question for t in other] != [t.question for t in a]
    # every kept question's recorded difficulty is reproduced by a fresh OCR of its page
    ocr = {p: ocr_text(Path(p)) for p in {t.image for t in a}}
    for task in a:
        assert task.ocr_anls >= 0.5  # type: ignore[attr-defined]
        assert best_ocr_anls(ocr[task.image], task.answers) == pytest.approx(task.ocr_anls, abs=1e-4)  # type: ignore[attr-defined]
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["kept"] == 12 and manifest["version"] == synth_docs.VERSION
    assert {p.name for p in pages_a} == {Path(t.image).name for t in a}  # unused pages removed


def test_best_ocr_anls_uses_protocol_anls_over_line_windows() -> None:
    ocr = "Subtotal $17,993.50\nTotal Due $18,752.87\nInvoice No: INV-37526\n"
    assert best_ocr_anls(ocr, ["$18,752.87", "18,752.87"]) == 1.0
    assert best_ocr_anls(ocr, ["INV-37528"]) == pytest.approx(1 - 1 / 9)  # one OCR slip
    assert best_ocr_anls(ocr, ["Total Due $18,752.87 Invoice"]) < 1.0  # windows stay on one line
    assert best_ocr_anls(ocr, ["Vanderbilt"]) == 0.0
    assert best_ocr_anls("abcd", ["abef"]) == 0.0  # d == 0.5 scores 0, as in the protocol


def test_missing_fonts_fall_back_with_a_warning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(synth_docs, "FONT_DIRS", (tmp_path,))
    synth_docs._font.cache_clear()
    try:
        with pytest.warns(UserWarning, match="not found .*Pillow's default font"):
            page = synth_docs.LAYOUTS["letter"](random.Random(1), synth_docs.FONT_FAMILIES[0])
    finally:
        synth_docs._font.cache_clear()
    assert page.image.size == synth_docs.PAGE_SIZE and page.image.getextrema()[0] == 0


@pytest.fixture(scope="module")
def builtin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    cache = tmp_path_factory.mktemp("cache")
    return cache, load_docvqa_tasks("builtin", cache_dir=cache)


@pytest.mark.slow
def test_builtin_set_is_generated_once_and_reused(builtin: tuple[Path, list]) -> None:
    cache, tasks = builtin
    assert len(tasks) == 200 and len({t.id for t in tasks}) == 200
    folder = synth_docs.builtin_cache_dir(200, 0, cache)
    assert all(Path(t.image).parent == folder and Path(t.image).suffix == ".png" for t in tasks)
    stamp = (folder / "manifest.json").stat().st_mtime_ns
    assert _fields(load_docvqa_tasks("builtin", limit=20, cache_dir=cache)) == _fields(tasks[:20])
    assert (folder / "manifest.json").stat().st_mtime_ns == stamp  # reused, not regenerated


def test_cached_set_is_finished_only_with_its_marker_and_rebuilt_when_damaged(tmp_path: Path) -> None:
    """The cache rule (agent_envs.core.cache): a folder without the marker is never used, and a set whose
    pages were deleted by hand is generated again, in place."""
    folder = synth_docs.builtin_cache_dir(3, 0, tmp_path)
    folder.mkdir(parents=True)
    (folder / "tasks.jsonl").write_text("")  # an unfinished folder in the way: no marker
    tasks_file = synth_docs.builtin_tasks_file(3, 0, tmp_path)
    assert is_complete(folder) and len(tasks_file.read_text().splitlines()) == 3
    page = folder / json.loads(tasks_file.read_text().splitlines()[0])["image"]
    original = page.read_bytes()
    page.unlink()
    assert synth_docs.builtin_tasks_file(3, 0, tmp_path) == tasks_file
    assert page.read_bytes() == original and is_complete(folder)
    assert [p.name for p in folder.parent.iterdir() if p.name.endswith(".partial")] == []


@pytest.mark.slow
def test_builtin_set_mixes_layouts_difficulties_and_distractors(
    builtin: tuple[Path, list],
) -> None:
    _, tasks = builtin
    assert set(Counter(t.doc_type for t in tasks)) == set(synth_docs.LAYOUTS)  # type: ignore[attr-defined]
    assert {t.difficulty for t in tasks} <= {"easy", "medium", "hard"}  # type: ignore[attr-defined]
    assert all(t.id.startswith("docvqa_synth_0_") for t in tasks)
    money = [t for t in tasks if t.answers[0].startswith("$")]
    assert money and all(t.answers[1] == t.answers[0][1:] for t in money)  # $975.00 / 975.00
    by_page: dict[str, dict[str, str]] = {}
    for t in tasks:
        by_page.setdefault(t.image, {})[t.question] = t.answers[0]
    # distractors: a page asks for both the subtotal and the (different) total
    totals = ("What is the total amount due?", "What is the total?")
    assert any(
        "What is the subtotal?" in page
        and any(page.get(k, page["What is the subtotal?"]) != page["What is the subtotal?"] for k in totals)
        for page in by_page.values()
    )
    tables = [t.question for t in tasks if t.doc_type == "table" and "for 19" in t.question]  # type: ignore[attr-defined]
    assert tables  # year-column questions (adjacent years on each page)
