"""The protocol's seed formulas (docs/protocol.md#sampling-and-seeds), free of imports so every layer can share them."""

from __future__ import annotations

#: base seed of the released runs' trajectory seeds
DEFAULT_BASE_SEED = 20260627
SAMPLE_STRIDE = 1_000_003
TURN_STRIDE = 97


def trajectory_seed(base_seed: int, row_index: int, sample_index: int) -> int:
    """``base_seed + sample_index * 1_000_003 + row_index``; turn ``t`` then samples with ``+ 97 * t``."""
    return base_seed + sample_index * SAMPLE_STRIDE + row_index
