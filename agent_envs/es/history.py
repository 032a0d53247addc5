"""``history.json``: the ES run's durable record, its replay and its resume (docs/protocol.md#history).

The history is a JSON list of records, one to a line.  A run appends each generation's record in place
(:class:`HistoryWriter`: the file is not rewritten, so a generation costs the same at generation 500 as
at 5); anything else replaces the file atomically (:func:`write_history`).  An append cut short (the
process killed mid-write) leaves the records before it whole, and :func:`load_history` reads them and
says so.  Replay never
trusts stored weights: it regenerates the seed stream, recomputes each update's weights from the
stored rewards with that record's normalisation settings, and re-applies the updates in order.
It checks itself as it goes: the weights it starts from must have the run's ``start_fingerprint``,
and, for a run whose members were reverted exactly, the weights after each replayed update must
have that generation's ``weights_fingerprint``; the first difference stops it (:class:`ReplayMismatch`).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Protocol, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core.atomic import atomic_write, write_all
from ..protocol.seeds import DEFAULT_BASE_SEED
from .member_sampling import normalize_member_sampling
from .normalize import normalize_method, normalize_rewards
from .schedule import normalize_schedule
from .seeds import check_mirrored, check_run_shape, check_seed_sequence
from .update_rule import RULE_KEYS, optimizer_settings, update_terms

Record = dict[str, Any]


class ESConfig(BaseModel):
    """The run's settings, stored as the history's first record ``{"config": {...}}``."""

    model_config = ConfigDict(extra="allow")

    #: the environment the run trains on (no default: a run names its environment)
    env_id: str
    model: str = ""
    generations: int = 25
    population: int = 16
    case_batch_size: int = 16
    train_samples: int = 1
    sigma_start: float = 1e-3
    sigma_end: float = 5e-4
    sigma_schedule: str = "cosine"
    sigma_warmup_steps: int = 0
    sigma_total_steps: int | None = None  # None: the number of generations
    alpha: float = 5e-4
    reward_normalization: str = "zscore"
    reward_normalization_ddof: int = 0
    reward_normalization_eps: float = 1e-8
    parameter_scope: str = "full"
    seed: int = DEFAULT_BASE_SEED
    eval_seed: int = DEFAULT_BASE_SEED
    eval_interval: int = 10
    tp_size: int = 1
    #: members restored from a saved copy instead of by subtraction (see :func:`replay_is_exact`)
    exact_revert: bool = False
    #: weights fingerprint before the first update (:mod:`agent_envs.es.fingerprint`)
    start_fingerprint: str | None = None
    history_file: str = ""
    backend: str = "vllm"
    #: members in (+eps, -eps) pairs sharing a seed (ours; agent_envs.es.update_rule)
    mirrored: bool = False
    #: "sgd": the reference's plain update; "adam": Adam on the update direction (ours)
    optimizer: str = "sgd"
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    #: sampling of the members' episodes (agent_envs.es.member_sampling): "protocol", "greedy" or
    #: "temperature=T"; held-out evaluation keeps the policy's own sampling
    member_sampling: str = "protocol"

    @field_validator("sigma_schedule")
    @classmethod
    def _schedule(cls, v: str) -> str:
        return normalize_schedule(v)

    @field_validator("reward_normalization")
    @classmethod
    def _normalization(cls, v: str) -> str:
        return normalize_method(v)

    @field_validator("member_sampling")
    @classmethod
    def _member_sampling(cls, v: str) -> str:
        return normalize_member_sampling(v)

    def model_post_init(self, __context: Any) -> None:
        check_run_shape(self.generations, self.population, self.case_batch_size, eval_only=True)
        check_mirrored(self.population, self.mirrored)
        optimizer_settings(self.model_dump(include=set(RULE_KEYS)))
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")


class GenerationRecord(BaseModel):
    """One generation: its seeds, raw rewards, the weights used, and compact rollout summaries."""

    model_config = ConfigDict(extra="allow")

    generation: int
    case_batch: list[str]
    sigma: float
    sigma_start: float
    sigma_end: float
    sigma_schedule: str
    sigma_warmup_steps: int
    seeds: list[int]
    rewards: list[float]
    weights: list[float]
    alpha: float
    reward_normalization: str
    reward_normalization_ddof: int
    reward_normalization_eps: float
    reward_mean: float
    reward_std: float
    tp_size: int = 1
    samples: list[dict[str, Any]] = Field(default_factory=list)
    updates: list[Any] = Field(default_factory=list)
    update_applied: bool = True
    #: weights fingerprint after this generation's update
    weights_fingerprint: str | None = None


class UpdateBackend(Protocol):
    #: low-rank backends also take the generation's sigma; Adam runs pass ``optimizer=`` settings
    def update(
        self, seeds: Sequence[int], weights: Sequence[float], alpha: float, *args: Any, **kwargs: Any
    ) -> Any: ...
    def fingerprint(self) -> str: ...


class ReplayMismatch(ValueError):
    """Replayed weights differ from the ones the history recorded."""


#: the history's layout: ``[``, then the records one to a line (JSON escapes every newline inside a string),
#: separated by ``,``, then ``]``; what a writer appends after goes where ``CLOSE`` began
OPEN, SEPARATOR, CLOSE = b"[\n", b",\n", b"\n]\n"


def encode_record(record: Record) -> bytes:
    return json.dumps(record, ensure_ascii=False).encode("utf-8")


def write_history(path: str | os.PathLike[str], records: Sequence[Record]) -> None:
    """Replace ``path`` with the whole list, atomically."""
    atomic_write(path, [OPEN, SEPARATOR.join(encode_record(r) for r in records), CLOSE])


class HistoryWriter:
    """A run's growing history at ``path``.  The first write, and any after the file changed under the writer
    (another process's, an evaluation's :func:`write_history`), replaces it atomically; every later one
    appends only the records added since, in place of the closing bracket, and syncs them.  Rewriting the
    whole list every generation costs what the run has recorded so far (0.68 s at 100 generations of
    256 x 4 episodes on a 2-core host, growing with every generation), between two generations.  Records
    once written must not change (for one that does: :func:`write_history`)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._written = 0
        #: the file as the last write left it: (inode, size, modification time), None before the first
        self._left: tuple[int, int, int] | None = None

    def write(self, records: Sequence[Record]) -> None:
        new = records[self._written :]
        if self._written and self._written <= len(records) and self._left == self._stat():
            if new:
                self._append(new)
        else:
            write_history(self.path, records)
        self._written, self._left = len(records), self._stat()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _append(self, new: Sequence[Record]) -> None:
        data = SEPARATOR + SEPARATOR.join(encode_record(r) for r in new) + CLOSE
        fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.lseek(fd, -len(CLOSE), os.SEEK_END)
            write_all(fd, data, self.path)
            os.fsync(fd)
        finally:
            os.close(fd)


def load_history(path: str | os.PathLike[str]) -> list[Record]:
    """The history's records; of one whose last append was cut short, the records before it (with a
    warning that says so)."""
    raw = Path(path).read_bytes()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        data = _before_a_cut(raw)
        if data is None:
            raise ValueError(f"{path}: not a JSON list of records ({exc})") from None
        warnings.warn(
            f"{path}: its last write was cut short; read the {len(data)} complete records before it", stacklevel=2
        )
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError(f"{path}: a history must be a JSON list of objects")
    return data


def _before_a_cut(raw: bytes) -> list[Record] | None:
    """The whole records of a history in :class:`HistoryWriter`'s layout whose last line is cut short (even
    inside a character); None where the damage is anywhere else (a record on a line of its own fails before
    the last line)."""
    head, newline, last = raw.rpartition(b"\n")
    try:
        text = (head + newline).decode("utf-8")
    except UnicodeDecodeError:
        return None
    try:
        text += last.decode("utf-8")
    except UnicodeDecodeError:
        pass  # cut inside a character: that line is not whole
    if not text.startswith(OPEN.decode()):
        return None
    decoder, at = json.JSONDecoder(), len(OPEN)
    records: list[Record] = []
    while True:
        while at < len(text) and text[at] in " \n,":
            at += 1
        rest = text[at:]
        if rest.strip() in ("", "]"):
            return records
        try:
            record, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return records if "\n" not in rest.rstrip("\n") else None
        if not isinstance(record, dict):
            return None
        records.append(record)


def history_config(history: Sequence[Record]) -> Record:
    """The first ``config`` record's settings ({} when the history has none)."""
    return next((r["config"] for r in history if isinstance(r.get("config"), dict)), {})


def replay_is_exact(history: Sequence[Record]) -> bool:
    """Whether a replay rebuilds the trained weights bit for bit: only if training reverted each
    member exactly, or never perturbed the weights (low-rank members are adapters).  In-place
    revert leaves a rounding residue per member, which a replay (updates alone) does not repeat, so
    its weights and checksum differ slightly from the trained ones."""
    config = history_config(history)
    return bool(config.get("exact_revert", False)) or config.get("perturbation") == "lowrank"


def is_update_record(record: Record) -> bool:
    seeds, rewards = record.get("seeds"), record.get("rewards")
    return (
        isinstance(seeds, list)
        and isinstance(rewards, list)
        and len(seeds) == len(rewards) > 0
        and record.get("update_applied") is not False
    )


def update_records(history: Sequence[Record], limit: int | None = None) -> list[Record]:
    """The applied updates (optionally the first ``limit``), required contiguous from generation 0."""
    records = [r for r in history if is_update_record(r)]
    if limit is not None:
        if limit < 0 or limit > len(records):
            raise ValueError(f"cannot keep {limit} updates: the history has {len(records)}")
        records = records[:limit]
    generations = [r.get("generation") for r in records]
    if generations != list(range(len(records))):
        raise ValueError(f"update generations must be contiguous from 0, got {generations}")
    return records


def history_prefix(history: Sequence[Record], updates: int) -> list[Record]:
    """The records before the ``updates + 1``-th applied update: what a resume keeps."""
    ends = [i for i, r in enumerate(history) if is_update_record(r)]
    if not 0 <= updates <= len(ends):
        raise ValueError(f"the history has {len(ends)} applied updates, not {updates}")
    stop = ends[updates - 1] + 1 if updates else (ends[0] if ends else len(history))
    return list(history[:stop])


def record_update(record: Record, mirrored: bool = False) -> tuple[list[int], list[float]]:
    """The ``(seeds, weights)`` an update record gives the backend (one term per pair when mirrored)."""
    return update_terms(record["seeds"], record_weights(record), mirrored)


def record_weights(record: Record) -> list[float]:
    """An update record's weights, recomputed from its raw rewards with its normalisation settings."""
    return normalize_rewards(
        record["rewards"],
        record.get("reward_normalization", "zscore"),
        int(record.get("reward_normalization_ddof", 0)),
        float(record.get("reward_normalization_eps", 1e-8)),
    )


def check_perturbation_kind(history: Sequence[Record], backend: Any) -> bool:
    """The history's noise must be the backend's (full-rank or low-rank); True for low-rank."""
    kind, wanted = (
        str(history_config(history).get("perturbation", "full")),
        getattr(backend, "perturbation_kind", "full"),
    )
    if kind != wanted:
        raise ValueError(f"the history was trained with {kind} noise; refusing to replay it onto a {wanted} backend")
    return kind == "lowrank"


def check_tp_size(history: Sequence[Record], tp_size: int) -> None:
    """Rank-salted noise depends on the TP size, so a history only replays on the same one."""
    stored = int(history_config(history).get("tp_size", 1))
    if stored != int(tp_size):
        raise ValueError(f"history was trained with tp_size={stored}; refusing to replay on tp_size={tp_size}")


def replay(
    history: Sequence[Record],
    backend: UpdateBackend,
    seed: int,
    population: int,
    generations: int | None = None,
    tp_size: int = 1,
    start: int = 0,
) -> int:
    """Re-apply the first ``generations`` updates onto ``backend``, skipping the first ``start``
    (already applied: an evaluation-only run replays step by step); return how many are applied.
    A low-rank history (docs/protocol.md#low-rank-es) replays only onto a low-rank backend, each
    update with its record's sigma, and a full-rank one only onto a full-rank backend.

    Raises :class:`ReplayMismatch` at the first weights that differ from the history's record (see
    the module docstring); :func:`checked_generations` says how many generations a history lets it check."""
    check_tp_size(history, tp_size)
    lowrank = check_perturbation_kind(history, backend)
    records = update_records(history, generations)
    config = history_config(history)
    mirrored = bool(config.get("mirrored", False))
    check_seed_sequence([r["seeds"] for r in records], seed, population, mirrored)
    optimizer = optimizer_settings(config)  # Adam's moments are rebuilt by repeating its steps in order
    expected = config.get("start_fingerprint")
    if expected and start == 0:
        _check_fingerprint(
            backend,
            expected,
            "the weights the replay starts from",
            "a different model, dtype, load format or parameter scope",
        )
    exact = replay_is_exact(history)
    for record in records[start:]:
        sigma = (float(record["sigma"]),) if lowrank else ()
        # the reference's call unless the run used Adam
        extra: dict[str, Any] = {"optimizer": optimizer} if optimizer is not None else {}
        backend.update(*record_update(record, mirrored), float(record["alpha"]), *sigma, **extra)
        if exact and record.get("weights_fingerprint"):
            _check_fingerprint(
                backend,
                record["weights_fingerprint"],
                f"generation {record['generation']}'s replayed weights",
                "a different engine build or tensor-parallel layout, or an edited history",
            )
    return len(records)


def _check_fingerprint(backend: UpdateBackend, expected: str, what: str, causes: str) -> None:
    got = backend.fingerprint()
    if got != expected:
        raise ReplayMismatch(
            f"{what} have fingerprint {got}, the history recorded {expected} ({causes}?); stopping the replay here"
        )


def check_same_rule(stored: Record, config: ESConfig) -> None:
    """A resumed run continues the source's update rule (pairs, optimiser): its replay repeats it.
    (Adam's settings count only for an Adam run.)"""
    rules = [(bool(c.get("mirrored", False)), optimizer_settings(c)) for c in (stored, config.model_dump())]
    if rules[0] != rules[1]:
        raise ValueError(
            f"the resumed history was trained with another update rule (mirrored, optimizer): {rules[0]} there, "
            f"{rules[1]} asked for; resume with its --mirrored/--optimizer/--adam-* settings"
        )


def checked_generations(history: Sequence[Record], generations: int | None = None) -> int:
    """How many replayed generations :func:`replay` compares with the history's fingerprints."""
    if not replay_is_exact(history):
        return 0
    return sum(1 for r in update_records(history, generations) if r.get("weights_fingerprint"))


def resume(
    source: str | os.PathLike[str],
    config: ESConfig,
    backend: UpdateBackend,
    generations: int | None = None,
) -> tuple[list[Record], int]:
    """Replay ``source`` onto ``backend``; return the new history's head and the next generation."""
    history = load_history(source)
    check_same_rule(history_config(history), config)
    start = backend.fingerprint()
    done = replay(history, backend, config.seed, config.population, generations, config.tp_size)
    kept = [r for r in history_prefix(history, done) if "config" not in r]
    head = [
        {"config": config.model_copy(update={"start_fingerprint": start}).model_dump()},
        *kept,
        {
            "resume": {
                "source": str(source),
                "replayed_generations": done,
                "fingerprints_checked": checked_generations(history, done),
            }
        },
    ]
    return head, done
