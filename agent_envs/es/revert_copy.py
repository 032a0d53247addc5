"""Where an exact revert keeps the unperturbed weights while a member is evaluated.

Subtracting the noise again leaves a rounding residue, so an exact revert restores a copy instead.
On a GPU the copy belongs on the GPU: a device-to-device copy of 8 GB takes milliseconds, while the
host round trip took 4.9 s (apply) + 1.1 s (revert) per member for a 4B model.  The device copy is
allocated once, when ES is initialised, and only when the device has room for it beside the engine
(``torch.cuda.mem_get_info``, keeping :data:`DEVICE_MARGIN_BYTES` free); otherwise the host copy of
before (a fresh ``.to("cpu")`` per member) is the fallback, and the reason is printed.  Tensors on
the CPU are copied on the CPU: there the device is the host.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import torch

LOCATIONS = ("auto", "device", "host")
#: left free on a GPU after the copy, for the engine's own transient allocations
DEVICE_MARGIN_BYTES = 2**30
_GIB = 2**30


def free_bytes(device: torch.device) -> int | None:
    """Free memory of a CUDA device (all processes counted); None for other devices (no check)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.mem_get_info(device)[0])


def choose_location(
    requested: str, need: dict[str, int], free: dict[str, int | None], margin: int = DEVICE_MARGIN_BYTES
) -> tuple[str, str]:
    """``("device" | "host", why)`` for copies of ``need[device]`` bytes with ``free[device]`` free."""
    if requested not in LOCATIONS:
        raise ValueError(f"revert copy must be one of {', '.join(LOCATIONS)}, got {requested!r}")
    if requested == "host":
        return "host", "a host copy was asked for (revert_copy='host')"
    checked = {dev: (n, room) for dev, n in need.items() if (room := free.get(dev)) is not None}
    short = [
        f"{dev} needs {n / _GIB:.2f} GiB + {margin / _GIB:.2f} GiB margin, has {room / _GIB:.2f} GiB free"
        for dev, (n, room) in checked.items()
        if room < n + margin
    ]
    if not short:
        where = ", ".join(f"{dev} {n / _GIB:.2f} GiB" for dev, n in need.items())
        return "device", f"a copy on the tensors' device ({where})"
    if requested == "device":
        raise RuntimeError(f"no room for a device copy of the weights: {'; '.join(short)}")
    return "host", f"no room for a device copy ({'; '.join(short)}); using a host copy per member"


class RevertCopy:
    """The saved weights of one exact-revert perturber: :meth:`save` before a perturbation,
    :meth:`restore` after it (or after a failed one, for the first ``count`` tensors)."""

    def __init__(self, params: Sequence[torch.Tensor], requested: str = "auto") -> None:
        self.params = list(params)
        need: dict[str, int] = {}
        for p in self.params:
            need[str(p.device)] = need.get(str(p.device), 0) + p.numel() * p.element_size()
        free = {dev: free_bytes(torch.device(dev)) for dev in need}
        self.location, self.reason = choose_location(requested, need, free)
        self._buffers: list[torch.Tensor] = []
        if self.location == "device":
            try:
                self._buffers = [torch.empty_like(p) for p in self.params]
            except torch.cuda.OutOfMemoryError as exc:  # another engine on the GPU took the room first
                self._buffers = []
                if requested == "device":
                    raise
                self.location = "host"
                self.reason = f"the device copy did not fit ({str(exc)[:200]}); using a host copy"
        if self.location == "host" and requested != "host":
            print(f"[es] exact revert: {self.reason}", file=sys.stderr, flush=True)

    def describe(self) -> dict[str, Any]:
        return {"revert_copy": self.location, "revert_copy_reason": self.reason}

    def save(self) -> None:
        if self.location == "device":
            for buffer, p in zip(self._buffers, self.params):
                buffer.copy_(p.detach())
        else:
            self._buffers = [p.detach().to("cpu", copy=True) for p in self.params]

    def restore(self, count: int | None = None) -> None:
        for buffer, p in zip(self._buffers[:count], self.params[:count]):
            p.data.copy_(buffer)
        if self.location == "host":
            self._buffers = []

    def release(self) -> None:
        """Give the memory back (the perturber is being replaced)."""
        self._buffers = []
