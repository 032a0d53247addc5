"""DocVQA task loading: built-in synthetic pages, the HF validation split, official JSON, JSONL.

Normalisation follows docs/protocol.md#docvqa-data so task ids and answers match the reference harness:
question/answers/id are read from their alternative field names, ids become
``docvqa_<questionId>``, and every task ends up with a host path to an existing page image.
"""

from __future__ import annotations

import functools
import io
import json
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError
from pydantic import ValidationError

from agent_envs.core.atomic import atomic_write
from agent_envs.core.cache import cache_root
from agent_envs.core.content import ImageTooLarge, open_image
from agent_envs.core.jsonl import jsonl_rows
from agent_envs.envs.docvqa.task import DocTask

HF_REPO = "lmms-lab/DocVQA"
HF_CONFIG = "DocVQA"
HF_SPLIT = "validation"
HF_REVISION = "539088ef8a8ada01ac8e2e6d4e372586748a265e"
BUILTIN_SIZE = 200
BUILTIN_SEED = 0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

QUESTION_KEYS = ("question", "query", "prompt")
ANSWER_KEYS = ("answers", "answer", "ground_truth")
ID_KEYS = ("questionId", "question_id", "id", "task_id")


class DocDataError(ValueError):
    """A DocVQA data spec or row could not be turned into a task."""


DocSpec = str | Path | Iterable[Mapping[str, Any] | DocTask]


def default_cache_dir() -> Path:
    return cache_root()


def load_docvqa_tasks(spec: DocSpec, *, limit: int | None = None, cache_dir: str | Path | None = None) -> list[DocTask]:
    """Load DocVQA tasks from ``"builtin"``, ``"hf"``/``"lmms-lab/DocVQA"``, a file, or rows.

    ``cache_dir`` holds generated synthetic pages and images extracted from hub rows
    (default ``$AGENT_ENVS_CACHE`` or ``~/.cache/agent-envs``).
    """
    if limit is not None and limit < 0:
        raise DocDataError(f"limit must be >= 0, got {limit}")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if isinstance(spec, str) and spec == "builtin":
        from agent_envs.envs.docvqa.synth import builtin_tasks_file

        size = max(BUILTIN_SIZE, limit or 0)
        tasks = _load_jsonl(builtin_tasks_file(size, BUILTIN_SEED, cache), cache)
    elif isinstance(spec, str) and spec in ("hf", HF_REPO):
        tasks = _load_hf(cache, limit)
    elif isinstance(spec, (str, Path)):
        path = Path(spec)
        if not path.is_file():
            problem = "path is not a file" if path.exists() else "file not found"
            raise DocDataError(f'DocVQA data {problem}: {path} (or use "builtin")')
        tasks = _load_official_json(path, cache, limit) if path.suffix == ".json" else _load_jsonl(path, cache)
    else:
        tasks = [
            row if isinstance(row, DocTask) else _require(normalize_row(row, None, cache, f"row {i}"), row, f"row {i}")
            for i, row in enumerate(spec)
        ]
    return tasks if limit is None else tasks[:limit]


def _require(task: DocTask | None, row: Mapping[str, Any], where: str) -> DocTask:
    if task is None:
        raise DocDataError(
            f"{where}: needs a question, non-empty answers and an image; "
            f"this row has no {' and no '.join(_missing(row))}"
        )
    return task


def _essentials(row: Mapping[str, Any]) -> tuple[Any, list[str], Any]:
    """The row's question, its non-empty answers (a single value becomes a list) and its image."""
    raw = _first(row, ANSWER_KEYS)
    answers = list(raw) if isinstance(raw, (list, tuple)) else [] if raw is None else [raw]
    answers = [str(a).strip() for a in answers if a is not None and str(a).strip()]
    return _first(row, QUESTION_KEYS), answers, row.get("image")


def _missing(row: Mapping[str, Any]) -> list[str]:
    """Which of question, answers and image the row lacks (such a row is not a task)."""
    question, answers, image = _essentials(row)
    present = {"question": bool(question), "answers": bool(answers), "image": image not in (None, "")}
    return [name for name, ok in present.items() if not ok]


def _usable(
    rows: Iterable[tuple[str, Any]], data_file: Path | None, cache: Path, source: str, limit: int | None = None
) -> list[DocTask]:
    """Tasks of the usable rows; rows without a question, answers or an image are dropped, as
    the reference's data preparation does, with a warning that counts them by reason."""
    tasks: list[DocTask] = []
    dropped: Counter[str] = Counter()
    seen = 0
    for where, row in rows:
        if limit is not None and len(tasks) >= limit:
            break
        seen += 1
        task = normalize_row(row, data_file, cache, where)
        if task is None:
            dropped["no " + " and no ".join(_missing(row))] += 1
        else:
            tasks.append(task)
    if not dropped:
        return tasks
    reasons = ", ".join(f"{n} with {why}" for why, n in dropped.most_common())
    if not tasks:
        hint = (
            "; a test split carries no answers (use the validation split)"
            if all("answers" in why for why in dropped)
            else ""
        )
        raise DocDataError(f"{source}: every one of its {seen} rows was dropped ({reasons}){hint}")
    warnings.warn(f"{source}: dropped {sum(dropped.values())} of {seen} rows ({reasons})", stacklevel=3)
    return tasks


def _first(row: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    return next((row[k] for k in keys if row.get(k) not in (None, "", [])), None)


def _prefixed_id(raw_id: Any) -> str:
    """``docvqa_<questionId>`` unless the id already carries the prefix."""
    text = str(raw_id)
    return text if text.startswith("docvqa_") else f"docvqa_{text}"


def normalize_row(row: Mapping[str, Any], data_file: Path | None, cache: Path, where: str = "row") -> DocTask | None:
    """One raw row -> task; None when it lacks a question, answers or an image (dropped)."""
    if not isinstance(row, Mapping):
        raise DocDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    question, answers, image = _essentials(row)
    if _missing(row):
        return None
    raw_id = _first(row, ID_KEYS)
    if raw_id is None:
        raise DocDataError(f"{where}: no id field (one of {', '.join(ID_KEYS)})")
    known = set(QUESTION_KEYS + ANSWER_KEYS + ID_KEYS) | {
        "image",
        "docId",
        "question_types",
    }
    extra = {k: v for k, v in row.items() if k not in known and _is_json_scalar_or_list(v)}
    if "docId" in row:
        extra["doc_id"] = row["docId"]
    if "question_types" in row:
        extra["question_types"] = row["question_types"]
    path = _image_path(image, str(raw_id).removeprefix("docvqa_"), data_file, cache, where)
    try:
        return DocTask(
            **{
                **extra,
                "id": _prefixed_id(raw_id),
                "question": str(question),
                "answers": answers,
                "image": str(path),
            }
        )
    except ValidationError as exc:
        raise DocDataError(f"{where}: invalid task: {exc.errors()[0]['msg']}") from exc


def _is_json_scalar_or_list(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, list, dict)) or value is None


def _image_path(image: Any, stem: str, data_file: Path | None, cache: Path, where: str) -> Path:
    """A host path for the row's image: resolve a path, or write raw bytes / PIL images as PNG."""
    if isinstance(image, Mapping):  # HF Image feature with decoding off: {"bytes", "path"}
        image = image.get("bytes") or image.get("path")
    path = (
        resolve_image_path(str(image), data_file, where)
        if isinstance(image, (str, Path))
        else write_png(image, cache / "docvqa_images" / f"{stem}.png", where)
    )
    check_pixels(path, where)
    return path


def resolve_image_path(raw: str, data_file: Path | None, where: str = "row") -> Path:
    """Resolve an image path (Windows or POSIX style) like the reference loader.

    Relative paths are tried against the data file's directory, the working directory and
    then each ancestor of the data file, in that order.
    """
    rel = Path(raw.replace("\\", "/"))
    if rel.is_absolute():
        candidates = [rel]
    else:
        bases = [data_file.parent] if data_file else []
        bases.append(Path.cwd())
        if data_file:
            bases.extend(data_file.resolve().parent.parents)
        candidates = [base / rel for base in bases]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    source = f" in {data_file}" if data_file else ""
    other = next((c for c in candidates if c.exists()), None)
    if other is not None:
        raise DocDataError(f"{where}{source}: image path is not a file: {other}")
    raise DocDataError(
        f"{where}{source}: image file not found: {raw!r} (tried "
        f"{', '.join(str(c) for c in candidates[:3])}{', ...' if len(candidates) > 3 else ''})"
    )


def check_image(path: str | Path, where: str) -> None:
    """Raise a clear error unless ``path`` is a file that decodes as an image.

    Run before an episode starts, so a missing or corrupt page is the user's error and is never
    discovered by the model; each unchanged file is decoded once per process.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{where}: document image not found: {p}")
    if not p.is_file():
        raise DocDataError(f"{where}: document image path is not a file: {p}")
    stat = p.stat()
    problem = _decode_problem(str(p.resolve()), stat.st_size, stat.st_mtime_ns)
    if problem is not None:
        raise DocDataError(f"{where}: document image is not a readable image: {p} ({problem})")


@functools.lru_cache(maxsize=4096)
def _decode_problem(path: str, size: int, mtime_ns: int) -> str | None:
    """Why the whole image does not decode, or None (size and mtime key the cache: edits are re-checked)."""
    try:
        with open_image(path, "the page") as img:
            img.load()
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for bad data; all mean "not an image"
        return f"{type(exc).__name__}: {exc}"
    return None


def check_pixels(path: Path, where: str) -> None:
    """Refuse a page over the image size limit when the data is loaded (only its header is read),
    so an eval stops before any model loads instead of failing every episode of it."""
    try:
        open_image(path, f"{where}: the page {path}").close()
    except ImageTooLarge as exc:
        raise DocDataError(str(exc)) from None
    except OSError:  # not an image at all: reset says so (check_image), with the decoder's words
        pass


def write_png(image: Any, target: Path, where: str = "row") -> Path:
    """Write page bytes or a PIL image to ``target`` once; non-PNG bytes are re-encoded."""
    if target.is_file() and target.stat().st_size > 0:
        return target
    if isinstance(image, (bytes, bytearray)) and bytes(image[:8]) == PNG_MAGIC:
        data = bytes(image)
    else:
        try:
            pil = image if isinstance(image, Image.Image) else open_image(io.BytesIO(bytes(image)), where)
            buffer = io.BytesIO()
            pil.save(buffer, format="PNG")
        except ImageTooLarge as exc:
            raise DocDataError(str(exc)) from None
        except (TypeError, OSError, UnidentifiedImageError) as exc:
            raise DocDataError(f"{where}: image is neither a path nor decodable image data") from exc
        data = buffer.getvalue()
    atomic_write(target, [data])
    return target


def _load_jsonl(path: Path, cache: Path) -> list[DocTask]:
    return [
        _require(normalize_row(row, path, cache, where), row, where) for where, row in jsonl_rows(path, DocDataError)
    ]


def _load_official_json(path: Path, cache: Path, limit: int | None) -> list[DocTask]:
    """``val_v1.0.json`` layout: ``{"data": [...]}`` or a bare list; images relative to it."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DocDataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    rows = payload.get("data") if isinstance(payload, dict) else payload
    if not isinstance(rows, list):
        raise DocDataError(f"{path}: expected a list of rows or an object with a 'data' list")
    sourced = (
        (f"{path} data[{i}]", {"source": "DocVQA", **row} if isinstance(row, Mapping) else row)
        for i, row in enumerate(rows)
    )
    return _usable(sourced, path, cache, str(path), limit)


def _load_hf(cache: Path, limit: int | None) -> list[DocTask]:
    try:
        import datasets

        rows = datasets.load_dataset(HF_REPO, HF_CONFIG, split=HF_SPLIT, revision=HF_REVISION)
        rows = rows.cast_column("image", datasets.Image(decode=False))
    except Exception as exc:  # any hub/network/cache failure means the same thing to the user
        raise DocDataError(
            f"could not load {HF_REPO!r} ({HF_CONFIG}/{HF_SPLIT}) from the Hugging Face hub "
            f'({type(exc).__name__}: {exc}); offline, use "builtin", an official val_v1.0.json '
            "or a JSONL of {id, question, answers, image} rows"
        ) from exc
    sourced: Iterator[tuple[str, Any]] = (
        (f"{HF_REPO} row {i}", {**row, "source": HF_REPO, "config": HF_CONFIG, "split_source": HF_SPLIT})
        for i, row in enumerate(rows)
    )
    return _usable(sourced, None, cache, f"{HF_REPO} ({HF_CONFIG}/{HF_SPLIT})", limit)
