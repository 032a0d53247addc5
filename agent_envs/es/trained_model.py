"""The ES-trained SmolLM2-135M-Instruct that ships with the package, as a history, not as weights.

``trained/smollm2_es.history.json.gz`` is the winning low-rank run of 2026-12-02 (300
generations on one H200; ``trained/smollm2_es.json`` holds its command, task and held-out
result, docs/benchmarks.md#es-with-real-weights), kept to what a replay needs: the config, and per
generation the member seeds, rewards, weights and the weights' fingerprint.  :func:`es_smollm2_dirs`
replays it onto the embedded model's converted folder on the CPU (:func:`replay_onto`), once, into
a cache folder named by the history's hash, and compares the replay's fingerprint after every
update with the one the GPU recorded (docs/protocol.md#history).

Both folders it returns hold the run's dtype (bfloat16): ``base`` is the embedded model as the GPU
loaded it (no update), ``trained`` after the 300 updates, so a side-by-side differs by the
training alone.  The replay adds each update's float32 product cast to bfloat16, as the engine
did; the float32 product itself is summed in another order by the CPU's BLAS than by CUDA, so a
generation can round one entry differently: ``replay.json`` says whether every fingerprint
matched, and the first generation that did not.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..core.cache import build_once
from ..policy.hf import SMOLLM2_HF_DIR, smollm2_hf_dir
from .lowrank import replay_onto

TRAINED = Path(__file__).resolve().parent / "trained"
HISTORY = TRAINED / "smollm2_es.history.json.gz"
PROVENANCE = TRAINED / "smollm2_es.json"
#: what the build writes beside the two model folders: the replay's check against the GPU's run
REPLAY_REPORT = "replay.json"
#: a progress line on stderr every this many replayed generations (a full replay takes minutes)
PROGRESS_EVERY = 25
#: the replay compares its fingerprint with the GPU's after every this many generations and the last
#: (each one is a pass over every weight; equal after generation g means equal weights after all of 1..g)
CHECK_EVERY = 5


def history_digest(path: Path = HISTORY) -> str:
    """SHA-256 of the shipped history's JSON (uncompressed): the cache folder's key."""
    return hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest()


def trained_history(path: Path = HISTORY) -> list[dict[str, Any]]:
    records = json.loads(gzip.decompress(path.read_bytes()))
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{path}: a history must be a JSON list of objects")
    return records


def provenance() -> dict[str, Any]:
    """How the shipped history was trained (command, date, GPU, held-out result)."""
    result: dict[str, Any] = json.loads(PROVENANCE.read_text(encoding="utf-8"))
    return result


def cache_dir(base: Path = SMOLLM2_HF_DIR, generations: int | None = None) -> Path:
    """Where the replay is cached: beside the embedded model's converted folder, keyed by the history
    (and by ``generations`` when only the first ones are replayed)."""
    part = "" if generations is None else f"-first{generations}"
    return base.parent / f"smollm2-es-{history_digest()[:16]}{part}"


def es_smollm2_dirs(base: Path = SMOLLM2_HF_DIR, generations: int | None = None) -> tuple[Path, Path]:
    """``(base, trained)``: the embedded SmolLM2 as the ES run loaded it and after its 300 updates
    (the first ``generations`` only: a quick check of the machinery, not the trained model),
    replayed once into :func:`cache_dir` (any number of processes may ask at once)."""
    target = cache_dir(base, generations)
    build_once(target, lambda staging: build(staging, smollm2_hf_dir(base), generations))
    return target / "base", target / "trained"


def build(out: Path, model_dir: Path, generations: int | None = None, check_every: int = CHECK_EVERY) -> dict[str, Any]:
    """Replay the shipped history (its first ``generations``) from ``model_dir`` into ``out/base``
    and ``out/trained`` and write ``out/replay.json`` (the fingerprints compared after every
    ``check_every``-th generation and the last); refuses a base whose targets differ from the run's."""
    history = trained_history()
    recorded = [r.get("weights_fingerprint") for r in history if "rewards" in r]
    replayed: dict[int, str] = {}

    def check(index: int, fp: str) -> None:
        replayed[index] = fp
        if (index + 1) % PROGRESS_EVERY == 0:
            equal = sum(fp == recorded[i] for i, fp in replayed.items())
            print(
                f"[es replay] generation {index + 1}/{len(recorded)}: {equal} of {len(replayed)} checked "
                "fingerprints equal the GPU's",
                file=sys.stderr,
                flush=True,
            )

    base = replay_onto(model_dir, history, out / "base", generations=0)
    if base["base_matches_run"] is False:
        raise ValueError(
            f"{model_dir}: the targets' checksum {base['base_checksum']} is not the ES run's base; "
            "the history replays only onto the model it was trained from"
        )
    started = time.perf_counter()
    result = replay_onto(
        model_dir, history, out / "trained", generations=generations, after_update=check, check_every=check_every
    )
    differ = [i for i, fp in sorted(replayed.items()) if fp != recorded[i]]
    last = max(replayed, default=-1) + 1
    report = {
        **result,
        "replay_s": round(time.perf_counter() - started, 1),
        "generations": last,
        "checked_generations": sorted(i + 1 for i in replayed),
        "fingerprints_equal": len(replayed) - len(differ),
        "first_differing_generation": differ[0] + 1 if differ else None,
        "final_checksum_run": provenance()["final_checksum"],
        "of_generations": len(recorded),
        "bit_exact": not differ and (last < len(recorded) or result["checksum"] == provenance()["final_checksum"]),
    }
    (out / REPLAY_REPORT).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def replay_report(base: Path = SMOLLM2_HF_DIR, generations: int | None = None) -> dict[str, Any]:
    """The cached replay's check (``replay.json``), building it first when needed."""
    es_smollm2_dirs(base, generations)
    result: dict[str, Any] = json.loads((cache_dir(base, generations) / REPLAY_REPORT).read_text(encoding="utf-8"))
    return result
