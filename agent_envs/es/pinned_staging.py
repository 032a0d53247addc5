"""Page-locked host buffers for the low-rank update's stacked factors, filled while the rollouts run
(docs/scaling.md#folded-into-the-matmul).

The update multiplies each target's stacked factors on the GPU.  Copied from pageable memory (the
draws' memory file) they crossed at about 5 GB/s: 757 copies, 1.56 s of a P = 256 x B = 4 generation
on the 4B shape, all on the critical path.  From page-locked memory the same copies are direct DMA,
several times faster, and queue without waiting for the host.  The draws come in a new memory file every
generation, and page-locking gigabytes takes seconds, so the factors are copied into one of two buffers
locked once for the run: the next generation's draws fill one while this generation's update may still
read the other.  Where locking fails (no GPU, a locked-memory limit) the buffer stays pageable: the
copies are then as slow as before, never different.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable

import numpy as np
import torch

#: page-locks a host tensor for the device (True on success)
Locker = Callable[[torch.Tensor], bool]


#: cudaHostRegisterPortable: locked for every CUDA context of the process, not only the calling thread's
PORTABLE = 1


def _runtime() -> tuple[Callable[..., int], Callable[..., int]]:
    """``cudaHostRegister``/``cudaHostUnregister`` of the CUDA runtime torch loaded, through ctypes (which
    lets go of the interpreter lock while the call runs: locking gigabytes takes seconds the engine's loop
    must not wait); torch's own bindings, which hold the lock, where the library is not found."""
    with open("/proc/self/maps", encoding="utf-8") as maps:
        paths = [line.split()[-1] for line in maps if "libcudart.so" in line and line.split()[-1].startswith("/")]
    if paths:
        library = ctypes.CDLL(paths[0])
        library.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        library.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        return library.cudaHostRegister, library.cudaHostUnregister
    cudart = torch.cuda.cudart()
    return (lambda *a: int(cudart.cudaHostRegister(*a))), (lambda p: int(cudart.cudaHostUnregister(p)))


def cuda_lock(buffer: torch.Tensor) -> bool:
    """Register ``buffer``'s memory with CUDA (``cudaHostRegister``), unregistered when it is collected."""
    register, unregister = _runtime()
    pointer = buffer.data_ptr()
    if register(pointer, buffer.numel() * buffer.element_size(), PORTABLE) != 0:
        return False
    weakref.finalize(buffer, unregister, pointer)
    return True


class PinnedStaging:
    """Two host buffers used in turn; each grows (and is locked again) only when a generation needs more."""

    def __init__(self, lock: Locker = cuda_lock, settle: Callable[[], None] = torch.cuda.synchronize) -> None:
        self._lock, self._settle = lock, settle
        self._buffers: list[torch.Tensor | None] = [None, None]
        #: whether each buffer is page-locked
        self.locked = [False, False]

    def stage(self, values: np.ndarray, busy: torch.Tensor | None = None) -> torch.Tensor:
        """``values`` (1-D float32) copied into the buffer whose memory ``busy`` (what an update still
        reads, or None) does not use; the copy's view, bit for bit ``values``."""
        if values.dtype != np.float32 or values.ndim != 1:
            raise ValueError(f"staging takes 1-D float32 values, got {values.dtype} of {values.ndim} dimensions")
        index = 1 if busy is not None and self._holds(0, busy) else 0
        buffer = self._buffers[index]
        if buffer is not None and self.locked[index]:
            self._settle()  # a device copy out of it that a failed update left queued is over
        if buffer is None or buffer.numel() < values.size:
            self._buffers[index] = None  # the old one is unlocked and freed before the new one is taken
            buffer = torch.empty(values.size, dtype=torch.float32)
            self.locked[index] = self._lock(buffer)
            self._buffers[index] = buffer
        view = buffer[: values.size]
        view.copy_(torch.from_numpy(values))
        return view

    def _holds(self, index: int, tensor: torch.Tensor) -> bool:
        buffer = self._buffers[index]
        return buffer is not None and tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
