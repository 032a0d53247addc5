"""DocVQA answer extraction and ANLS scoring (docs/protocol.md#docvqa-scoring)."""

from __future__ import annotations

import re
from typing import Literal, Sequence, get_args

from agent_envs.protocol.parsing import answer_status, final_answer_line, strip_think
from agent_envs.scoring.result import ZEROING_TERMINATIONS, ScoreResult


AnlsVariant = Literal["protocol", "official"]
ANLS_VARIANTS: tuple[str, ...] = get_args(AnlsVariant)
LABEL_PREFIX = "docvqa_paper_react_cli_"
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def normalize(text: str) -> str:
    """Protocol normalisation: lower-case, every run outside ``[a-z0-9]`` becomes one space, strip.

    ASCII-only on purpose (``café`` -> ``caf``, ``1,000`` -> ``1 000``): the published numbers use it.
    """
    return _NON_ALNUM.sub(" ", text.lower()).strip()


def normalize_official(text: str) -> str:
    """DocVQA-challenge normalisation: lower-case, trim, collapse whitespace; punctuation kept."""
    return " ".join(text.lower().split())


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute; unit costs), two-row dynamic programme."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _similarity(pred: str, gold: str) -> float:
    """1 - normalised distance when that distance is below 0.5, else 0 (0.5 itself gives 0)."""
    longest = max(len(pred), len(gold), 1)
    if abs(len(pred) - len(gold)) / longest >= 0.5:  # the length gap bounds the distance from below
        return 0.0
    distance = levenshtein(pred, gold) / longest
    return 1.0 - distance if distance < 0.5 else 0.0


def anls(prediction: str, answers: Sequence[str], variant: AnlsVariant = "protocol") -> float:
    """Best similarity of the prediction to any gold answer; 0 for an empty prediction.

    ``official`` normalises as the DocVQA challenge does but divides by the *normalised* lengths.
    The challenge script divides by raw lengths, so padding a prediction with spaces raises its
    score there ("x" + 40 spaces vs "abc" gives 0.927); here it gives 0.
    """
    norm = {"protocol": normalize, "official": normalize_official}.get(variant)
    if norm is None:
        raise ValueError(f"unknown ANLS variant {variant!r}; expected 'protocol' or 'official'")
    pred = norm(prediction)
    golds = [g for g in (norm(a) for a in answers) if g]
    if not pred or not golds:
        return 0.0
    return max(_similarity(pred, g) for g in golds)


def anls_accuracy(x: float) -> float:
    """Accuracy of one ANLS value: strictly above 0.5."""
    return 1.0 if x > 0.5 else 0.0


def docvqa_prediction(last_completion: str) -> str:
    """Final-answer value, else the last non-empty line, else the stripped text (think removed)."""
    cleaned = strip_think(last_completion)
    final = final_answer_line(cleaned)
    if final is not None:
        return final
    lines = [line.strip() for line in cleaned.splitlines() if line.strip()]
    return lines[-1] if lines else cleaned.strip()


def docvqa_score(
    last_completion: str,
    answers: Sequence[str],
    *,
    termination_reason: str | None,
    used_bash: bool,
    variant: AnlsVariant = "protocol",
) -> ScoreResult:
    """ES-runner DocVQA score of an episode from its last completion.

    A trajectory without bash use is scored on the empty string. Trajectories cut by the turn or
    token budget are still scored on their last completion, as the published runs were.  The
    extras keep the raw ANLS (also when ``score`` is zeroed) as ``anls`` and, as the reference's
    records do, again as ``vlns``, and its accuracy [ANLS > 0.5] as ``acc``.
    """
    text = last_completion if used_bash else ""
    prediction = docvqa_prediction(text)
    raw = anls(prediction, answers, variant)
    if termination_reason in ZEROING_TERMINATIONS:
        score, method = 0.0, str(termination_reason)
    elif not used_bash:
        score, method = 0.0, "no_tool_use"
    else:
        score, method = raw, "anls"
    return ScoreResult(
        score=score,
        method=method,
        label=LABEL_PREFIX + method,
        status="ok",
        answer_status=answer_status(text),
        prediction=prediction,
        extras={"anls": raw, "vlns": raw, "acc": anls_accuracy(raw)},
    )
