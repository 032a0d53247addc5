"""How ES members' episodes are sampled, as one named setting recorded in the history's config
(docs/protocol.md#member-sampling; the named setting is ours).

- ``protocol``: the policy's own sampling (the protocol's settings, or ``--sampling``): the default;
- ``greedy``: temperature 0, top-p 1, top-k off (the published ES-at-scale runs score members with
  greedy decoding); the protocol's penalties and stop strings stay;
- ``temperature=T``: the policy's sampling at temperature ``T``.

Only the members' episodes get these settings (through a
:class:`~agent_envs.policy.adapter.SamplingPolicy` view of the same policy); held-out evaluation
keeps the policy's own sampling.
"""

from __future__ import annotations

import math
from typing import Any

PROTOCOL = "protocol"
GREEDY = "greedy"
#: greedy decoding in ``SamplingConfig`` fields (top_k -1: off on every engine)
GREEDY_SETTINGS = {"temperature": 0.0, "top_p": 1.0, "top_k": -1}


def normalize_member_sampling(spec: str) -> str:
    """``protocol``, ``greedy`` or ``temperature=T`` (T a finite number >= 0, written back as a float)."""
    text = str(spec).strip().lower().replace(" ", "")
    if text in (PROTOCOL, GREEDY):
        return text
    name, sep, value = text.partition("=")
    if name == "temperature" and sep:
        try:
            temperature = float(value)
        except ValueError:
            temperature = math.nan
        if math.isfinite(temperature) and temperature >= 0:
            return f"temperature={temperature!r}"
    raise ValueError(f"unknown member sampling {spec!r}; expected protocol, greedy or temperature=T (T >= 0)")


def member_sampling_settings(spec: str) -> dict[str, Any] | None:
    """The sampling settings members' requests carry over the policy's own; None for ``protocol``."""
    name = normalize_member_sampling(spec)
    if name == PROTOCOL:
        return None
    if name == GREEDY:
        return dict(GREEDY_SETTINGS)
    return {"temperature": float(name.partition("=")[2])}
