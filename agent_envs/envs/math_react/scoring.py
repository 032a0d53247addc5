"""Math answer extraction and scoring (docs/protocol.md#math-scoring).

math-verify guards its sympy work with ``signal.alarm``, which only works on the main thread; off
it, the published runs silently fell back to exact matching. Here math-verify runs in a
long-lived child process with its own timeouts disabled, and the parent enforces a wall-clock
limit by killing that child, which works from any thread and reports a timeout as such.
Run as ``python -m agent_envs.envs.math_react.scoring`` this module *is* that child.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import subprocess
import sys
import threading
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, Literal, get_args

from agent_envs.protocol.parsing import answer_status, final_answer_line, last_boxed, strip_think
from agent_envs.scoring.result import ZEROING_TERMINATIONS, ScoreResult

Scorer = Literal["auto", "exact", "math_verify"]
SCORERS: tuple[str, ...] = get_args(Scorer)
LABEL_PREFIX = "math_paper_react_cli_"
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?")
_FLAT_BOXED = re.compile(r"\\boxed\{([^{}]+)\}")
_STARTUP_TIMEOUT_S = 120.0  # importing sympy on a loaded machine; not charged to a call


def explicit_answer(text: str) -> str | None:
    r"""The answer the model committed to: final-answer value, else last ``\boxed{}``, else None."""
    cleaned = strip_think(text)
    final = final_answer_line(cleaned)
    return final if final is not None else last_boxed(cleaned)


def math_prediction(text: str) -> str:
    """Stored ``prediction`` (never credited): explicit answer, last number, last line, or ''."""
    explicit = explicit_answer(text)
    if explicit is not None:
        return explicit
    cleaned = strip_think(text)
    numbers = _NUMBER.findall(cleaned.replace(",", ""))
    if numbers:
        return str(numbers[-1])
    return cleaned.splitlines()[-1].strip() if cleaned else ""


def _normalize(value: str) -> str:
    value = _FLAT_BOXED.sub(lambda m: m.group(1), value.strip())
    while len(value) >= 2 and value[0] == "{" and value[-1] == "}":
        value = value[1:-1].strip()
    return re.sub(r"\s+", "", value.replace(",", "")).strip(".").lower()


def _decimal(value: str) -> Decimal | None:
    """``value`` as a finite decimal; ``a/b`` is a quotient; anything else None.

    ``value`` is normalised here even though callers pass normalised strings: the reference does
    the same, so forms that need two passes (``\\boxed {42}``, ``\\Boxed{5}``, ``{5}.``) still
    compare numerically.
    """
    value = _normalize(value)
    try:
        if "/" in value:
            left, right = value.split("/", 1)
            result = Decimal(left) / Decimal(right)
        else:
            result = Decimal(value)
        return result if result.is_finite() else None
    except (ArithmeticError, ValueError):  # decimal signals derive from ArithmeticError
        return None


def exact_fallback_match(gold: str, pred: str) -> bool:
    """Exact fallback: equal after one normalisation, or numerically within 1e-8 after two."""
    gold_n, pred_n = _normalize(gold), _normalize(pred)
    if gold_n == pred_n:
        return True
    gold_d, pred_d = _decimal(gold_n), _decimal(pred_n)
    if gold_d is None or pred_d is None:
        return False
    try:
        return abs(gold_d - pred_d) <= Decimal("1e-8")
    except ArithmeticError:  # e.g. overflow of the difference of two huge exponents
        return False


class _VerifyWorker:
    """One child process answering ``[gold, pred]`` JSON lines; replaced after a timeout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._replies: queue.Queue[str | None] = queue.Queue()
        self._unavailable = False

    def _spawn(self) -> bool:
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONIOENCODING="utf-8")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "agent_envs.envs.math_react.scoring"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                encoding="utf-8",
                env=env,
            )
        except OSError:  # e.g. out of file descriptors: try again on the next call
            return False
        self._replies = queue.Queue()
        threading.Thread(target=_pump, args=(self._proc.stdout, self._replies), daemon=True).start()
        ready = self._read(_STARTUP_TIMEOUT_S)
        if not isinstance(ready, dict) or not ready.get("ready"):
            self._unavailable = isinstance(ready, dict)  # the import failed: it never will work
            self._stop()
            return False
        return True

    def _read(self, timeout_s: float) -> dict[str, Any] | Literal["timeout", "error"]:
        """The child's next reply, or why there is none (still busy, or dead / garbled)."""
        try:
            line = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            return "timeout"
        try:
            return json.loads(line) if line is not None else "error"
        except ValueError:
            return "error"

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            if self._proc.stdin is not None:
                self._proc.stdin.close()  # stdout is closed by its reader thread at EOF
            self._proc = None

    def check(self, gold: str, pred: str, timeout_s: float) -> tuple[bool | None, str]:
        with self._lock:
            if self._unavailable or (self._proc is None and not self._spawn()):
                return None, "unavailable"
            assert self._proc is not None and self._proc.stdin is not None
            try:
                self._proc.stdin.write(json.dumps([gold, pred]) + "\n")
                self._proc.stdin.flush()
            except OSError:
                self._stop()
                return None, "error"
            reply = self._read(timeout_s)
            if isinstance(reply, str):
                self._stop()  # a busy child is killed; the next call starts a fresh one
                return None, reply
            return reply["match"], reply["status"]


def _pump(stream: IO[str], replies: queue.Queue[str | None]) -> None:
    """Move the child's reply lines into a queue, so the parent can wait with a timeout."""
    with stream:
        for line in stream:
            replies.put(line)
    replies.put(None)


_WORKER = _VerifyWorker()
atexit.register(_WORKER._stop)  # reap the child at exit instead of leaving it to the pipe closing


def math_verify_match(gold: str, pred: str, timeout_s: float = 5.0) -> tuple[bool | None, str]:
    """math-verify's verdict on ``pred`` vs ``gold`` within ``timeout_s`` wall-clock seconds.

    Returns ``(True|False, "ok")``, or ``(None, status)`` with status ``unparsed`` (either side
    parsed to nothing), ``error``, ``timeout`` or ``unavailable`` (package missing). Safe to
    call from any thread; calls are serialised through one worker process.
    """
    return _WORKER.check(gold, pred, timeout_s)


def math_score(
    last_completion: str,
    gold: str,
    *,
    scorer: Scorer = "auto",
    termination_reason: str | None,
    used_bash: bool,
    timeout_s: float = 5.0,
) -> ScoreResult:
    """ES-runner Math score of an episode from its last completion.

    ``exact`` reproduces the published numbers (math-verify never ran there); ``auto`` is the
    protocol order (math-verify, then the exact fallback); ``math_verify`` uses math-verify alone
    (0 when it cannot decide, with the reason in ``status``). The no-bash override is checked
    before scoring; it wins over every method except the two zeroing terminations either way.
    """
    if scorer not in SCORERS:
        raise ValueError(f"unknown math scorer {scorer!r}; expected 'auto', 'exact' or 'math_verify'")
    explicit = explicit_answer(last_completion)

    def result(score: float, method: str, status: str) -> ScoreResult:
        return ScoreResult(
            score=score,
            method=method,
            label=LABEL_PREFIX + method,
            status=status,
            answer_status=answer_status(last_completion),
            prediction=math_prediction(last_completion),
        )

    if termination_reason in ZEROING_TERMINATIONS:
        return result(0.0, str(termination_reason), "skipped")
    if not used_bash:
        return result(0.0, "no_bash_tool_use", "skipped")
    if explicit is None:
        return result(0.0, "missing_final_answer", "skipped")
    status = "exact"
    if scorer != "exact":
        match, status = math_verify_match(str(gold), explicit, timeout_s)
        if match is not None or scorer == "math_verify":
            return result(float(bool(match)), "math_verify", status)
    return result(float(exact_fallback_match(str(gold), explicit)), "exact_fallback", status)


def _serve() -> None:
    """Child side: answer one JSON line per request, with math-verify's signal timeouts off."""
    out, sys.stdout = sys.stdout, sys.stderr  # nothing but replies may reach the pipe
    try:
        from math_verify import parse, verify
        from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
    except ImportError:
        print(json.dumps({"ready": False}), file=out, flush=True)
        return
    config = (LatexExtractionConfig(), ExprExtractionConfig())
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        reply: dict[str, Any]
        try:
            gold, pred = json.loads(line)
            gold_p = parse(gold, extraction_config=config, parsing_timeout=None)
            pred_p = parse(pred, extraction_config=config, parsing_timeout=None)
            if gold_p and pred_p:
                reply = {"match": bool(verify(gold_p, pred_p, timeout_seconds=None)), "status": "ok"}
            else:
                reply = {"match": None, "status": "unparsed"}
        except Exception:  # noqa: BLE001 - any failure is a verdict of "could not decide"
            reply = {"match": None, "status": "error"}
        print(json.dumps(reply), file=out, flush=True)


if __name__ == "__main__":
    _serve()
