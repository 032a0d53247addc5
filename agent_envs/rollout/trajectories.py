"""Token trajectories out of records: one training sequence per episode (docs/rl.md#token-trajectories).

A record of a run with ``token_trajectories=True`` holds its episode as the engine saw it (see
:mod:`agent_envs.core.trajectory`).  :func:`episode_tokens` turns it into what an RL trainer consumes:
the whole sequence, a loss mask that is 1 exactly on the tokens the engine sampled (0 on the
prompt, on observations and on scripted turns), the log-probabilities aligned with it, where each
turn starts and ends, and the episode's reward (its score).  :func:`export_tokens` writes them as
JSONL (``agent-envs export RUN --format tokens``) and :func:`load_token_export` reads them back.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterable

from pydantic import BaseModel, Field, StrictBool, ValidationError

from agent_envs.core.atomic import atomic_write
from agent_envs.core.trajectory import segments, sequence

from .records import EpisodeRecord, as_row, dumps_line

FORMAT = "agent-envs.tokens/1"

#: a vocabulary index: a JSON integer (not a bool, float or string), within what a tokenizer can have
TokenId = Annotated[int, Field(strict=True, ge=0, lt=2**31)]
TokenIds = list[TokenId]


class _Turn(BaseModel):
    completion_ids: TokenIds
    observation_ids: TokenIds
    sampled: StrictBool
    logprobs: list[float | None] | None = None
    finish_reason: str | None = None


class _Trajectory(BaseModel):
    """The shape of a record's ``token_trajectory`` (written by core.trajectory); checked before
    a record is exported, so a damaged one is an error naming its field, not a traceback."""

    prompt_ids: TokenIds
    turns: list[_Turn]
    exact: StrictBool = False
    broken: str | None = None
    drift: dict[str, Any] | None = None


class BadTrajectory(ValueError):
    """A record whose ``token_trajectory`` is damaged; ``index`` is its position in the records given."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


def _problem(model: type[BaseModel], data: Any) -> str | None:
    """The first thing wrong with ``data`` as ``model`` (``field.path: message``), or None."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        return f"{'.'.join(map(str, first['loc'])) or 'value'}: {first['msg']}"
    return None


@dataclass
class EpisodeTokens:
    """One episode as a training sequence; ``loss_mask`` and ``logprobs`` align with ``tokens``."""

    key: str
    task_id: str
    row_index: int
    sample_index: int
    reward: float
    termination_reason: str | None
    tokens: list[int]
    #: 1 on the tokens the engine sampled, 0 on the prompt, observations and scripted turns
    loss_mask: list[int]
    #: the sampled tokens' log-probabilities (None where the engine could not give one), 0.0 where
    #: the mask is 0; None when some sampled turn came without them
    logprobs: list[float | None] | None
    #: tokens before the first completion
    prompt_length: int
    #: per turn: ``completion`` and ``observation`` as ``[start, end)`` positions, ``sampled``, ``finish_reason``
    turns: list[dict[str, Any]] = field(default_factory=list)
    #: where the re-rendered chat first differs from ``tokens`` (None: it does not)
    drift: dict[str, Any] | None = None
    format: str = FORMAT

    @property
    def model_tokens(self) -> list[int]:
        return [t for t, m in zip(self.tokens, self.loss_mask) if m]


def skip_reason(row: dict[str, Any]) -> str | None:
    """Why a record yields no training sequence, or None when it does; ValueError for a damaged
    ``token_trajectory``."""
    trajectory = row.get("token_trajectory")
    if trajectory is None:
        return "no token trajectory (run with --token-trajectories)"
    problem = _problem(_Trajectory, trajectory)
    if problem is not None:
        raise ValueError(f"record {row.get('key')!r}: token_trajectory.{problem}")
    if row.get("error"):
        return "episode failed"
    if trajectory.get("broken"):
        return "trajectory broken"
    if not trajectory.get("exact", False):
        return "engine prompt differs from the trajectory"
    for turn, (start, end, _) in zip(trajectory["turns"], segments(trajectory)):
        # a shorter list would shift every later log-probability onto the wrong token
        if turn["sampled"] and turn["logprobs"] is not None and len(turn["logprobs"]) != end - start:
            return "log-probabilities do not match the sampled tokens"
    return None


def episode_tokens(record: EpisodeRecord | dict[str, Any]) -> EpisodeTokens:
    """The training sequence of one record; ValueError (naming the record) when it has none."""
    row = as_row(record)
    reason = skip_reason(row)
    if reason is not None:
        raise ValueError(f"record {row.get('key')!r}: {reason}")
    trajectory = row["token_trajectory"]
    tokens = sequence(trajectory)
    mask = [0] * len(tokens)
    logprobs: list[float | None] | None = [0.0] * len(tokens)
    turns = []
    for turn, (start, end, stop) in zip(trajectory["turns"], segments(trajectory)):
        if turn["sampled"]:
            mask[start:end] = [1] * (end - start)
            if turn["logprobs"] is None or logprobs is None:
                logprobs = None
            else:
                logprobs[start:end] = turn["logprobs"]
        turns.append(
            {
                "completion": [start, end],
                "observation": [end, stop],
                "sampled": turn["sampled"],
                "finish_reason": turn["finish_reason"],
            }
        )
    return EpisodeTokens(
        key=row["key"],
        task_id=row["task_id"],
        row_index=row["row_index"],
        sample_index=row["sample_index"],
        reward=float(row.get("score") or 0.0),
        termination_reason=row.get("termination_reason"),
        tokens=tokens,
        loss_mask=mask,
        logprobs=logprobs,
        prompt_length=len(trajectory["prompt_ids"]),
        turns=turns,
        drift=trajectory.get("drift"),
    )


def _counts(skipped: dict[str, int]) -> str:
    return ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())) or "none"


@dataclass
class ExportSummary:
    path: Path
    exported: int
    skipped: dict[str, int]
    #: exported episodes whose re-rendered chat differs from their tokens
    drifting: int

    def line(self) -> str:
        skipped = _counts(self.skipped)
        return (
            f"{self.exported} episode(s) -> {self.path}; skipped: {skipped}; "
            f"re-rendered chat differs in {self.drifting} of {self.exported}"
        )


def export_tokens(records: Iterable[EpisodeRecord | dict[str, Any]], path: str | os.PathLike[str]) -> ExportSummary:
    """Write one JSON line per exportable episode to ``path`` (atomically, so a failure leaves no
    partial file); the others are counted by reason.  :class:`BadTrajectory` for a damaged
    trajectory, and ValueError when no episode is exportable, both before anything is written."""
    out: list[EpisodeTokens] = []
    skipped: Counter[str] = Counter()
    for index, record in enumerate(records):
        row = as_row(record)
        try:
            reason = skip_reason(row)
        except ValueError as exc:
            raise BadTrajectory(index, str(exc)) from None
        if reason is None:
            out.append(episode_tokens(row))
        else:
            skipped[reason] += 1
    if not out:
        raise ValueError(f"no episode has a token trajectory to export (skipped: {_counts(skipped)})")
    atomic_write(path, (dumps_line(asdict(e)) for e in out))
    return ExportSummary(Path(path), len(out), dict(skipped), sum(e.drift is not None for e in out))


def load_token_export(path: str | os.PathLike[str]) -> list[EpisodeTokens]:
    """The episodes of an export; an unknown format or a bad line is an error naming the line."""
    episodes = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if not isinstance(data, dict) or data.get("format") != FORMAT:
                    raise ValueError(
                        f"format {data.get('format') if isinstance(data, dict) else None!r}, expected {FORMAT!r}"
                    )
                episode = EpisodeTokens(**data)
                _check_aligned(episode)
                episodes.append(episode)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a token-trajectory line ({exc})") from None
    return episodes


class _Aligned(BaseModel):
    tokens: TokenIds
    loss_mask: list[Annotated[int, Field(strict=True, ge=0, le=1)]]
    logprobs: list[float | None] | None
    prompt_length: Annotated[int, Field(strict=True, ge=0)]


def _check_aligned(episode: EpisodeTokens) -> None:
    """What a trainer indexes by position: token ids, a 0/1 mask and log-probabilities of one length
    each, and a prompt that ends inside the sequence; ValueError naming what is not."""
    problem = _problem(_Aligned, asdict(episode))
    if problem is not None:
        raise ValueError(problem)
    n = len(episode.tokens)
    if len(episode.loss_mask) != n or (episode.logprobs is not None and len(episode.logprobs) != n):
        raise ValueError(f"loss_mask and logprobs must have one entry per token ({n})")
    if episode.prompt_length > n:
        raise ValueError(f"prompt_length {episode.prompt_length} is past the end of the {n} tokens")
