"""DocVQA loading: the real val_v1.0 sample, JSONL path resolution, row normalisation, errors."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from PIL import Image

from agent_envs.envs.docvqa.data import DocDataError, load_docvqa_tasks, normalize_row
from agent_envs.envs.docvqa.task import DocTask

from conftest import DOCVQA_DIR as SAMPLE  # noqa: E402
from conftest import run_offline  # noqa: E402


def _need_sample() -> Path:
    if not (SAMPLE / "val_v1.0.json").is_file():
        pytest.skip(f"real DocVQA sample not present at {SAMPLE}")
    return SAMPLE / "val_v1.0.json"


def test_official_json_sample_loads_all_questions(tmp_path: Path) -> None:
    tasks = load_docvqa_tasks(_need_sample(), cache_dir=tmp_path)
    assert len(tasks) == 12
    assert len({Path(t.image).name for t in tasks}) == 3
    first = tasks[0]
    assert first.id == "docvqa_26167"
    assert first.answers == ["2", "page 2"]
    assert Path(first.image) == (SAMPLE / "documents" / "ffbg0227_2.png").resolve()
    assert first.doc_id == 7467 and first.source == "DocVQA"  # type: ignore[attr-defined]
    assert all(Path(t.image).is_file() for t in tasks)
    assert not list(tmp_path.iterdir())  # file-based images are used in place, never copied


def test_official_json_bare_list_and_limit(tmp_path: Path) -> None:
    rows = json.loads(_need_sample().read_text())["data"]
    for row in rows:
        row["image"] = str(SAMPLE / row["image"])
    rows.append(
        {
            "questionId": 1,
            "question": "no answers here",
            "answers": [],
            "image": "x.png",
        }
    )
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(rows))
    with pytest.warns(UserWarning, match=r"bare\.json: dropped 1 of 13 rows \(1 with no answers\)"):
        tasks = load_docvqa_tasks(bare, cache_dir=tmp_path)
    assert len(tasks) == 12  # the unanswerable row is dropped, as in the reference loader
    assert [t.id for t in load_docvqa_tasks(bare, limit=2, cache_dir=tmp_path)] == [t.id for t in tasks[:2]]


def test_jsonl_relative_paths_resolve_against_file_then_cwd_then_ancestors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _need_sample()
    (tmp_path / "pages").mkdir()
    (tmp_path / "data" / "deep").mkdir(parents=True)
    png = (SAMPLE / "documents" / "ffjw0228_11.png").read_bytes()
    (tmp_path / "pages" / "a.png").write_bytes(png)
    (tmp_path / "data" / "deep" / "b.png").write_bytes(png)
    cwd_dir = tmp_path / "elsewhere"
    (cwd_dir / "pages").mkdir(parents=True)
    (cwd_dir / "pages" / "c.png").write_bytes(png)
    monkeypatch.chdir(cwd_dir)
    rows = [
        {
            "id": "docvqa_1",
            "question": "q1",
            "answers": ["x"],
            "image": "b.png",
        },  # file dir
        {
            "id": "2",
            "question": "q2",
            "answers": "y",
            "image": "pages\\c.png",
        },  # cwd, Windows style
        {
            "question_id": 3,
            "query": "q3",
            "answer": ["z"],
            "image": "pages/a.png",
        },  # ancestor
    ]
    data = tmp_path / "data" / "deep" / "tasks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_docvqa_tasks(data, cache_dir=tmp_path / "cache")
    assert [t.id for t in tasks] == ["docvqa_1", "docvqa_2", "docvqa_3"]
    assert [t.question for t in tasks] == ["q1", "q2", "q3"]
    assert tasks[1].answers == ["y"]
    assert [Path(t.image) for t in tasks] == [
        (tmp_path / "data" / "deep" / "b.png").resolve(),
        (cwd_dir / "pages" / "c.png").resolve(),
        (tmp_path / "pages" / "a.png").resolve(),
    ]


def test_a_test_split_without_answers_is_named_as_such(tmp_path: Path) -> None:
    rows = [{"questionId": i, "question": "q", "image": "documents/p.png", "docId": 1} for i in range(3)]
    test_split = tmp_path / "test_v1.0.json"
    test_split.write_text(json.dumps({"dataset_split": "test", "data": rows}))
    with pytest.raises(
        DocDataError,
        match=r"every one of its 3 rows was dropped \(3 with no answers\); "
        r"a test split carries no answers \(use the validation split\)",
    ):
        load_docvqa_tasks(test_split, cache_dir=tmp_path)
    rows[0].pop("question")
    test_split.write_text(json.dumps(rows))
    with pytest.raises(DocDataError, match=r"\(2 with no answers, 1 with no question and no answers\)"):
        load_docvqa_tasks(test_split, cache_dir=tmp_path)


def test_directories_are_not_files(tmp_path: Path) -> None:
    (tmp_path / "pages.png").mkdir()
    data = tmp_path / "t.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "q", "answers": ["x"], "image": "pages.png"}) + "\n")
    with pytest.raises(DocDataError, match=r"t\.jsonl:1 in .*: image path is not a file: .*pages\.png"):
        load_docvqa_tasks(data, cache_dir=tmp_path)
    with pytest.raises(DocDataError, match="DocVQA data path is not a file"):
        load_docvqa_tasks(tmp_path, cache_dir=tmp_path)


def test_a_scalar_answer_of_any_type_is_one_answer(tmp_path: Path) -> None:
    row = {"id": 1, "question": "q", "answer": 42, "image": Image.new("RGB", (5, 5))}
    assert load_docvqa_tasks([row], cache_dir=tmp_path)[0].answers == ["42"]
    with pytest.raises(DocDataError, match="row 0: needs .*; this row has no answers and no image"):
        load_docvqa_tasks([{"id": 1, "question": "q", "answer": " "}], cache_dir=tmp_path)


def test_missing_image_names_row_and_path(tmp_path: Path) -> None:
    data = tmp_path / "t.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "q", "answers": ["x"], "image": "gone/p.png"}) + "\n")
    with pytest.raises(DocDataError, match=r"t\.jsonl:1 in .*image file not found: 'gone/p\.png'"):
        load_docvqa_tasks(data, cache_dir=tmp_path)


def test_corrupt_jsonl_and_incomplete_rows_are_specific(tmp_path: Path) -> None:
    data = tmp_path / "t.jsonl"
    data.write_text('{"id": "a", "question": "q", "answers": ["x"], "image": "p.png"\n')
    with pytest.raises(DocDataError, match=r"t\.jsonl:1: corrupt JSON"):
        load_docvqa_tasks(data, cache_dir=tmp_path)
    data.write_text(json.dumps({"id": "a", "question": "q", "answers": [" "], "image": "p.png"}) + "\n")
    with pytest.raises(DocDataError, match=r"t\.jsonl:1: needs a question, non-empty answers"):
        load_docvqa_tasks(data, cache_dir=tmp_path)
    with pytest.raises(DocDataError, match="not found"):
        load_docvqa_tasks(tmp_path / "missing.jsonl", cache_dir=tmp_path)


def test_rows_with_image_bytes_are_written_once_as_png(tmp_path: Path) -> None:
    jpeg = io.BytesIO()
    Image.new("L", (40, 20), 200).save(jpeg, format="JPEG")
    png = io.BytesIO()
    Image.new("L", (30, 10), 100).save(png, format="PNG")
    rows = [
        {
            "questionId": 7,
            "question": "q",
            "answers": ["a"],
            "docId": 3,
            "image": {"bytes": jpeg.getvalue(), "path": None},
        },
        {
            "questionId": "docvqa_8",
            "question": "q",
            "ground_truth": "b",
            "image": png.getvalue(),
        },
        {
            "questionId": 9,
            "question": "q",
            "answers": ["c"],
            "image": Image.new("RGB", (5, 5)),
        },
    ]
    tasks = load_docvqa_tasks(rows, cache_dir=tmp_path)
    assert [t.id for t in tasks] == ["docvqa_7", "docvqa_8", "docvqa_9"]
    assert tasks[0].doc_id == 3  # type: ignore[attr-defined]
    for task in tasks:
        with Image.open(task.image) as img:
            assert img.format == "PNG"
    assert Path(tasks[1].image).read_bytes() == png.getvalue()  # PNG bytes kept verbatim
    mtime = os.stat(tasks[0].image).st_mtime_ns
    assert load_docvqa_tasks(rows[:1], cache_dir=tmp_path)[0].image == tasks[0].image
    assert os.stat(tasks[0].image).st_mtime_ns == mtime  # not rewritten
    with pytest.raises(DocDataError, match="row 0: image is neither a path nor decodable"):
        load_docvqa_tasks(
            [{"id": 1, "question": "q", "answers": ["a"], "image": b"junk"}],
            cache_dir=tmp_path,
        )


def test_normalize_row_drops_incomplete_rows_and_keeps_tasks_as_is(
    tmp_path: Path,
) -> None:
    assert normalize_row({"questionId": 1, "question": "q", "answers": ["a"]}, None, tmp_path) is None
    task = DocTask(id="t", question="q", answers=["a"], image="/x.png")
    assert load_docvqa_tasks([task], cache_dir=tmp_path) == [task]
    with pytest.raises(DocDataError, match="no id field"):
        normalize_row({"question": "q", "answers": ["a"], "image": b"x"}, None, tmp_path)


def test_hub_spec_fails_offline_with_a_pointer_to_local_files(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom agent_envs.envs.docvqa.data import load_docvqa_tasks, DocDataError\n"
        "try:\n    load_docvqa_tasks('hf', cache_dir=sys.argv[1])\n"
        "except DocDataError as e:\n    print('ERR', e)\n"
    )
    out = run_offline(code, tmp_path / "hf", str(tmp_path))
    assert out.startswith("ERR ") and "lmms-lab/DocVQA" in out and '"builtin"' in out
