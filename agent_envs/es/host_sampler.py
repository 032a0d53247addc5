"""Where a process's threads spend their wall time: a sampling profiler for a host with nothing to install
(``bench_es_generation.py --sample-host``: the benchmark's own process, and through the worker extension's
``es_host_sample_start``/``es_host_sample_stop`` the engine's, where vLLM schedules and prepares each step).

A low-rank ES generation on the H200 sent its second turn's 256 requests over 1.03 s where the same
loop on a fake engine takes 0.04 s (docs/scaling.md#folded-into-the-matmul): the time goes to vLLM's
frontend, the episode loop or the threads between them, and only the real engine shows which.  cProfile
sees one thread and slows it; this reads every thread's current frame (``sys._current_frames``) every
few milliseconds instead and counts, per thread:

- whether it was waiting (its innermost frame in a wait: a selector, a lock, a queue) or running;
- where it ran: the innermost frame of this repository's or vLLM's code on its stack (``owner``), and the
  innermost frame of all (``frame``), so time in a library call is charged to the caller that made it.

Samples are taken only when the sampler's thread holds the interpreter's lock, so a thread that keeps
the lock for long stretches is seen less often than its wall time; a wait inside C code other than
those in :data:`WAITS` counts as running in its caller.  The shares are rough, the ranking is what to read.

A round holds that lock too, for longer the more threads there are: in a low-rank ES driver at P = 256
(about 1,280 threads) each round took 29 ms where 2 ms was asked, so the sampler held the lock most of the
generation and slowed the threads it watched (docs/scaling.md#folded-into-the-matmul).  A waiting thread
now costs one frame's look, names are kept per code object, and the wait after a round grows with the
round's own time so that the sampler runs at most ``duty`` of the wall (a fifth); the table's first line
says how often rounds came and what share of the wall the sampler's own thread ran.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Iterator
from types import CodeType, FrameType, TracebackType

#: (file name ending, function) pairs whose frame means the thread is waiting, not running
WAITS = (
    ("selectors.py", "select"),
    ("threading.py", "wait"),
    ("threading.py", "_wait_for_tstate_lock"),
    ("queue.py", "get"),
    ("concurrent/futures/thread.py", "_worker"),  # its own frame innermost: blocked in SimpleQueue.get (C)
    ("multiprocessing/connection.py", "_recv"),  # a pipe's blocking read (vLLM's death-pipe monitor)
    ("sugar/poll.py", "poll"),  # ZeroMQ's poll: vLLM's engine sockets waiting for the other process
)
#: path parts that make a frame an owner: this repository's packages and vLLM's
OWNERS = ("agent_envs/", "benchmarks/", "vllm/")


def _where(code: CodeType) -> str:
    return f"{'/'.join(code.co_filename.split('/')[-2:])}:{code.co_name}"


class HostSampler:
    """Samples every thread but its own every ``interval`` seconds between ``start()`` and ``stop()``
    (or as a context manager), less often where a round takes more than ``duty`` of that: the wait after
    a round is at least ``(1 - duty) / duty`` times the round.  ``owners``: the path parts that make a
    frame an owner."""

    def __init__(self, interval: float = 0.002, owners: tuple[str, ...] = OWNERS, duty: float = 0.2) -> None:
        if not 0 < duty <= 1:
            raise ValueError(f"duty must be in (0, 1], got {duty}")
        self.interval, self.owners, self.duty = interval, owners, duty
        self.samples: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.totals: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-sampler", daemon=True)
        self.seconds = 0.0
        #: rounds taken, and the CPU seconds the sampler's own thread spent on them
        self.rounds, self.cpu_seconds = 0, 0.0
        # per code object: its place (file:function), whether it is a wait, whether an owner's
        self._codes: dict[CodeType, tuple[str, bool, bool]] = {}

    def __enter__(self) -> HostSampler:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        self._started = time.perf_counter()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.seconds = time.perf_counter() - self._started

    def _run(self) -> None:
        own, cpu, wait = threading.get_ident(), time.thread_time(), self.interval
        while not self._stop.wait(wait):
            began = time.perf_counter()
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident != own:
                    self.sample(names.get(ident, str(ident)), frame)
            self.rounds += 1
            wait = max(self.interval, (time.perf_counter() - began) * (1 - self.duty) / self.duty)
        self.cpu_seconds = time.thread_time() - cpu

    def _code(self, code: CodeType) -> tuple[str, bool, bool]:
        known = self._codes.get(code)
        if known is None:
            name = code.co_filename
            waits = any(name.endswith(f) and code.co_name == fn for f, fn in WAITS)
            known = self._codes[code] = (_where(code), waits, any(part in name for part in self.owners))
        return known

    def sample(self, thread: str, frame: FrameType) -> None:
        """Count one sample of ``thread`` at ``frame`` (its innermost)."""
        innermost, waiting, _ = self._code(frame.f_code)
        self.totals[thread] += 1
        if waiting:  # the stack below a wait is not looked at
            self.samples[(thread, "waiting", "")] += 1
            return
        owner = next((where for where, _, owns in map(self._code, _codes(frame)) if owns), "(no owner)")
        self.samples[(thread, owner, innermost)] += 1

    def table(self, top: int = 8) -> str:
        """Per thread (most running samples first): its samples, the share of them running, and its
        ``top`` running places (owner, innermost frame) with their shares of the thread's samples."""
        running = collections.Counter({t: n - self.samples[(t, "waiting", "")] for t, n in self.totals.items()})
        every = self.seconds / self.rounds if self.rounds else float("nan")
        lines = [
            f"{sum(self.totals.values())} samples over {self.seconds:.2f} s: {self.rounds} rounds, one every "
            f"{every * 1e3:.1f} ms ({self.interval * 1e3:.0f} ms asked); the sampler's own thread ran "
            f"{self.cpu_seconds / self.seconds if self.seconds else 0:.0%} of the wall"
        ]
        for thread, busy in running.most_common():
            total = self.totals[thread]
            lines.append(f"- {thread}: {total} samples, running {busy / total:.0%}")
            places = [(k, n) for k, n in self.samples.items() if k[0] == thread and k[1] != "waiting"]
            for (_, owner, innermost), n in sorted(places, key=lambda item: -item[1])[:top]:
                lines.append(f"    {n / total:5.1%}  {owner}" + (f"  <- {innermost}" if innermost != owner else ""))
        return "\n".join(lines)


def _codes(frame: FrameType | None) -> Iterator[CodeType]:  # innermost first
    while frame is not None:
        yield frame.f_code
        frame = frame.f_back
