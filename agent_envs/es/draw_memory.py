"""Memory files the low-rank drawing process writes into, kept from one generation's draws to the next's
(docs/scaling.md#folded-into-the-matmul).

:func:`agent_envs.es.lowrank.draw_ahead` hands the drawing process (:mod:`agent_envs.es.lowrank_factors`)
a memory file and maps it once the draws are in.  A new file every generation means new pages every
generation (17 GB at P = 256 on the 4B shape), which the kernel finds and zeroes one by one as the child
first writes them, and frees again when the last mapping goes: for 256 members of the 135M shape on a
2-core host, drawing and letting go took 8.15 s into a kept file against 8.79 s into a new one
(benchmarks/bench_lowrank_draw.py, docs/scaling.md).  The draws overwrite every value of the file, so a
file whose last mapping is gone takes the next generation's draws as it is.  The two most recent files
are kept, since the next generation draws while this one's factors may still be read; a file that live
arrays still map is never drawn into (a new one is made instead), so what those arrays hold never
changes under them.
"""

from __future__ import annotations

import mmap
import os
import weakref
from dataclasses import dataclass


@dataclass
class _File:
    fd: int
    #: the file's last mapping, while anything uses it
    mapping: weakref.ref[mmap.mmap] | None = None

    def free(self) -> bool:
        return self.mapping is None or self.mapping() is None


def new_file(nbytes: int) -> int:
    """A new anonymous memory file of ``nbytes`` (close-on-exec: ``pass_fds`` hands it to the drawing
    process alone; its pages are gone with its descriptor and last mapping)."""
    fd = os.memfd_create("es-lowrank-factors", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
    except OSError:
        os.close(fd)
        raise
    return fd


def _close_all(files: list[_File]) -> None:
    for kept in files:
        os.close(kept.fd)
    files.clear()


class DrawMemory:
    """Up to ``keep`` memory files for the draws, each used again once nothing maps it; closed with this
    object.  One draw at a time (the perturber's one background thread): a file handed out is free again
    until :meth:`mapped` is told of its mapping."""

    def __init__(self, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.keep = keep
        self._files: list[_File] = []
        #: how many files were made, and how many draws took a kept one (what the tests check)
        self.made = self.reused = 0
        weakref.finalize(self, _close_all, self._files)

    def file(self, nbytes: int) -> tuple[int, bool]:
        """A memory file of ``nbytes`` that nothing maps, and whether this object keeps it (the caller
        closes one it does not keep, after mapping it)."""
        for kept in self._files:
            if kept.free():
                if os.fstat(kept.fd).st_size != nbytes:
                    os.ftruncate(kept.fd, nbytes)
                kept.mapping = None
                self.reused += 1
                return kept.fd, True
        fd = new_file(nbytes)
        self.made += 1
        if len(self._files) < self.keep:
            self._files.append(_File(fd))
            return fd, True
        return fd, False

    def mapped(self, fd: int, mapping: mmap.mmap) -> None:
        """Note that ``mapping`` maps kept file ``fd``: the file takes no draws while it is alive."""
        for kept in self._files:
            if kept.fd == fd:
                kept.mapping = weakref.ref(mapping)
                return
        raise ValueError(f"file descriptor {fd} is not one of this memory's files")
