"""``agent-envs es export`` (and ``agent-envs export-checkpoint``, the same): replay an ES history on
a fresh engine and save the weights with their manifest and verification (agent_envs.es.checkpoint).
Light to import: the CLI builds its parser from here on every start."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from agent_envs.rollout.options import key_value


def export(argv: Sequence[str]) -> int:
    """``agent-envs es export``: the history replayed on a fresh engine and saved, with its
    manifest and verification (agent_envs.es.checkpoint)."""
    from agent_envs.es.checkpoint import CheckpointError

    try:
        return export_and_print(export_parser().parse_args(argv))
    except CheckpointError as exc:
        print(f"agent-envs es export: error: {exc}", file=sys.stderr)
        return 2


def export_and_print(args: argparse.Namespace) -> int:
    """Export as ``args`` (:func:`export_parser`'s options) say and print the summary as JSON; 0
    when the saved weights verified, 1 when not (``agent-envs export-checkpoint`` runs this too)."""
    from agent_envs.es.checkpoint import export_checkpoint

    manifest, verification = export_checkpoint(
        args.history,
        args.model,
        args.out,
        tp=args.tp,
        generations=args.generations,
        load_format=args.format,
        engine_args=dict(args.engine_arg),
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    summary = {
        "out": str(args.out),
        "generations_replayed": manifest["generations_replayed"],
        "load_format": manifest["load_format"],
        "tensor_parallel_size": manifest["tensor_parallel_size"],
        "shards": [s["file"] for s in manifest["shards"]],
        "passed": verification["passed"],
    }
    print(json.dumps(summary, indent=2))
    return 0 if verification["passed"] else 1


def export_parser(**kwargs: Any) -> argparse.ArgumentParser:
    """The options of ``agent-envs es export`` (``kwargs``: the parser's own, e.g. ``add_help``)."""
    p = argparse.ArgumentParser(
        **{"prog": "agent-envs es export", **kwargs},
        description="replay an ES history on a fresh engine and save it, with manifest.json and verification.json",
    )
    p.add_argument("--history", required=True, type=Path, help="the ES run's history.json")
    p.add_argument("--model", required=True, help="the base model the history was trained from")
    p.add_argument("--tp", type=int, default=1, help="tensor_parallel_size of the engine and the saved state")
    p.add_argument("--out", required=True, type=Path, help="folder to write the checkpoint into")
    p.add_argument("--generations", type=int, default=None, help="replay only the first N updates")
    p.add_argument(
        "--format",
        choices=("sharded_state", "safetensors"),
        default=None,
        help="default: sharded_state for --tp > 1, safetensors for --tp 1",
    )
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="passed to vllm.LLM, e.g. dtype=float32",
    )
    return p
