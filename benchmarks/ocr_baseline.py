"""Scripted OCR-only DocVQA baseline: tesseract, then a question-word line heuristic.

Usage (from the repo root, with the package installed or PYTHONPATH=.):
    python benchmarks/ocr_baseline.py [--synthetic 100] [--sample PATH/val_v1.0.json]
It shows how far plain OCR plus string matching gets, i.e. the floor an agent using the
CLI sandbox should beat.  tesseract runs directly on the host (not through the environment).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from agent_envs.envs.docvqa.data import load_docvqa_tasks
from agent_envs.envs.docvqa.synth import ocr_text
from agent_envs.envs.docvqa.task import DocTask
from agent_envs.envs.docvqa.scoring import anls, anls_accuracy, normalize

SAMPLE = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "docvqa_sample" / "val_v1.0.json"
STOPWORDS = {
    "what",
    "is",
    "the",
    "are",
    "of",
    "for",
    "in",
    "on",
    "to",
    "a",
    "an",
    "who",
    "whom",
    "which",
    "when",
    "where",
    "how",
    "much",
    "many",
    "was",
    "were",
    "does",
    "do",
    "did",
    "this",
    "that",
    "by",
    "with",
    "at",
    "be",
    "name",
}
YEAR = re.compile(r"^(19|20)\d\d$")


def _content_words(text: str) -> set[str]:
    return {w for w in normalize(text).split() if w not in STOPWORDS}


def answer_from_ocr(question: str, ocr: str) -> str:
    """Pick the OCR line sharing most question words; return what follows its label."""
    lines = [line.strip() for line in ocr.splitlines() if line.strip()]
    if not lines:
        return ""
    words = _content_words(question)
    years = {w for w in words if YEAR.match(w)}
    label_words = words - years
    best = max(lines, key=lambda line: len(label_words & set(normalize(line).split())))
    if years:  # a table cell: take the value in the column headed by the asked-for year
        year = next(iter(years))
        header = next(
            (
                line.split()
                for line in lines
                if len([t for t in line.split() if YEAR.match(normalize(t))]) >= 2 and year in normalize(line).split()
            ),
            None,
        )
        values = [t for t in best.split() if any(ch.isdigit() for ch in t)]
        if header and values:
            columns = [normalize(t) for t in header if YEAR.match(normalize(t))]
            from_right = len(columns) - columns.index(year)
            if from_right <= len(values):
                return values[-from_right]
    if ": " in best:  # "Label: value" (a bare colon may be part of a time such as 20:47)
        return best.split(": ", 1)[1].strip() or best
    rest = [t for t in best.split() if normalize(t) not in label_words]
    return " ".join(rest) or best


def evaluate(tasks: list[DocTask]) -> tuple[float, float]:
    """Mean ANLS and mean accuracy; each page is OCR'd once."""
    ocr: dict[str, str] = {}
    scores = []
    for task in tasks:
        if task.image not in ocr:
            ocr[task.image] = ocr_text(Path(task.image))
        text = ocr[task.image]
        scores.append(anls(answer_from_ocr(task.question, text), task.answers))
    return sum(scores) / len(scores), sum(map(anls_accuracy, scores)) / len(scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", type=int, default=100, help="built-in questions to score")
    parser.add_argument("--sample", type=Path, default=SAMPLE, help="official val_v1.0.json")
    args = parser.parse_args()
    sets = {f"built-in synthetic (first {args.synthetic})": load_docvqa_tasks("builtin", limit=args.synthetic)}
    if args.sample.is_file():
        sets[f"real DocVQA sample ({args.sample.parent.name})"] = load_docvqa_tasks(args.sample)
    else:
        print(f"(real sample skipped: {args.sample} not found)")
    print(f"| {'data set':<40} | questions | mean ANLS | accuracy (ANLS>0.5)")
    print(f"|{'-' * 42}|-----------|-----------|--------------------")
    for name, tasks in sets.items():
        mean_anls, accuracy = evaluate(tasks)
        print(f"| {name:<40} | {len(tasks):>9} | {mean_anls:>9.4f} | {accuracy:>9.4f}")


if __name__ == "__main__":
    main()
