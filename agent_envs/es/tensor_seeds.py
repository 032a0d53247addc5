"""The generator seed of one named tensor under one member seed (docs/protocol.md#per-tensor-noise).

Torch-free, so the process that draws low-rank factors (:mod:`agent_envs.es.lowrank_factors`) starts
without importing torch; the full-rank noise (:mod:`agent_envs.es.perturb`) and the low-rank factors
(:mod:`agent_envs.es.lowrank`) both seed from here.
"""

from __future__ import annotations

import hashlib

_U64 = 2**64


def name_id(name: str) -> int:
    """The first 8 bytes of BLAKE2b-8 of the name, read little-endian."""
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")


def tensor_seed(seed: int, name: str, rank: int = 0, tp_size: int = 1) -> int:
    """Generator seed of one tensor; with tensor parallelism each rank gets its own salted stream."""
    mixed = (int(seed) ^ name_id(name)) % _U64
    if tp_size > 1:
        mixed ^= name_id(f"tensor-parallel {tp_size} rank {rank}")
    return mixed
