"""PrimeCount's answer parser and scorer: the final answer must be the exact count.

The parser takes the final-answer line (a ``\\boxed{}`` around it is unwrapped) and reads one
integer written with digits, optionally grouped by commas, underscores or spaces (``78,498``);
anything else (words, two numbers, a sign, a decimal point) is no answer.  The reward is 1.0 for
the exact count, else 0.0, with a reason.
"""

from __future__ import annotations

import re

from agent_envs.envs.prime_count.task import PrimeCountTask
from agent_envs.protocol.parsing import answer_status, final_answer_line, strip_think
from agent_envs.scoring.result import ScoreResult

SCORE_METHOD = "prime_count_exact"
_BOXED = re.compile(r"^\\boxed\s*\{(.*)\}\s*\.?$", re.S)
_INTEGER = re.compile(r"^\d{1,3}(?:[,_ ]\d{3})+$|^\d{1,9}$")


def parse_count(answer: str | None) -> int | None:
    """The count an answer states, or None when it states no single non-negative integer."""
    if answer is None:
        return None
    text = answer.strip()
    boxed = _BOXED.match(text)
    if boxed:
        text = boxed.group(1).strip()
    text = text.rstrip(".").strip()
    if not _INTEGER.match(text):
        return None
    return int(re.sub(r"[,_ ]", "", text))


def prime_count_score(last_completion: str, task: PrimeCountTask, *, termination_reason: str | None) -> ScoreResult:
    """1.0 only for an episode that ended with a final answer stating the exact count."""
    answer = final_answer_line(strip_think(last_completion))
    ended = termination_reason == "final_answer"
    count = parse_count(answer) if ended else None
    gold = task.answer
    if not ended:
        reason = f"episode ended with {termination_reason}"
    elif count is None:
        reason = "the final answer is not one integer"
    else:
        reason = "" if count == gold else f"counted {count}, not {gold}"
    return ScoreResult(
        score=1.0 if ended and not reason else 0.0,
        method=SCORE_METHOD,
        label=SCORE_METHOD,
        status="ok" if ended else "skipped",
        answer_status=answer_status(last_completion),
        prediction=answer or "",
        extras={"score_reason": reason, "count": count},
    )
