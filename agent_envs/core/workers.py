"""Worker processes that never import the caller's ``__main__``, for work a library call parallelises.

Why not :mod:`multiprocessing`: its ``spawn`` and ``forkserver`` children import the caller's
``__main__`` again.  A script without an ``if __name__ == "__main__":`` guard (the quick-start
shape) then runs again in every child: the first DocVQA page build deadlocked that way, its
children reaching ``env.reset()`` and waiting on the cache lock their parent held.  A script read
from standard input makes every child fail instead (``<stdin>`` is not a file), and the build never
ends.  ``fork`` copies a process whose other threads (the async runner, an inference engine) may
hold locks, and the child can hang on them.

So :class:`FreshPool` starts each worker as a fresh interpreter (``python -c`` with :data:`BOOT`)
that takes the caller's ``sys.path``, as a spawned child would, then imports the function's module
and nothing else of the caller's: it behaves the same whether the caller is a script, ``python -c``,
standard input, a notebook or a thread.  Jobs and results travel as JSON lines over the worker's
stdin and stdout.  A worker ends when its stdin closes, and Linux kills it when the thread that
started it dies (``PR_SET_PDEATHSIG``), so a killed caller leaves no worker writing into a staging
folder the next builder is about to remove.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import signal
import subprocess
import sys
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import IO, Any

#: ``prctl`` option: the signal a process gets when its parent dies (linux/prctl.h)
PR_SET_PDEATHSIG = 1
#: jobs sent ahead to each worker, so it never waits for the caller to read the previous result
QUEUED_PER_WORKER = 2
#: the caller's ``sys.path`` (JSON), handed to its workers
PATH_VARIABLE = "AGENT_ENVS_WORKER_SYS_PATH"
#: a worker's program: argv is ``MODULE:FUNCTION PARENT_PID``
BOOT = (
    "import json, os, sys; "
    f"sys.path[:] = json.loads(os.environ.pop({PATH_VARIABLE!r})); "
    "from agent_envs.core.workers import _serve; "
    "_serve(sys.argv[1], int(sys.argv[2]))"
)


class WorkerError(RuntimeError):
    """A job raised in its worker, or a worker ended before answering."""


class FreshPool:
    """``workers`` fresh interpreters that run ``function`` (a module-level function whose arguments
    and result are JSON values) on jobs in order; use it as a context manager.  Leaving the
    ``with`` block normally ends the workers at their next read; leaving it by an exception kills
    them."""

    def __init__(self, function: Callable[..., Any], workers: int) -> None:
        module = sys.modules.get(function.__module__)
        if function.__module__ == "__main__" or getattr(module, function.__qualname__, None) is not function:
            raise ValueError(f"{function.__qualname__} must be a module-level function of an importable module")
        self.target = f"{function.__module__}:{function.__qualname__}"
        command = [sys.executable, "-c", BOOT, self.target, str(os.getpid())]
        env = {**os.environ, PATH_VARIABLE: json.dumps(sys.path)}
        self._procs: list[subprocess.Popen[str]] = []
        try:
            for _ in range(workers):
                self._procs.append(
                    subprocess.Popen(
                        command,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        env=env,
                        text=True,
                        encoding="utf-8",
                    )
                )
        except BaseException:
            self.close(kill=True)
            raise

    def map(self, jobs: Iterable[Sequence[Any]]) -> list[Any]:
        """``[function(*job) for job in jobs]``, computed by the workers (job ``i`` by worker ``i mod n``).
        A failed job ends the pool (the other workers' answers are left unread) and raises WorkerError."""
        if not self._procs:
            raise WorkerError(f"the pool running {self.target} is closed")
        results: list[Any] = []
        pending: deque[subprocess.Popen[str]] = deque()
        try:
            for index, job in enumerate(jobs):
                proc = self._procs[index % len(self._procs)]
                self._send(proc, job)
                pending.append(proc)
                if len(pending) == QUEUED_PER_WORKER * len(self._procs):
                    results.append(self._receive(pending.popleft()))
            results.extend(self._receive(proc) for proc in list(pending))
        except BaseException:
            self.close(kill=True)
            raise
        return results

    def _send(self, proc: subprocess.Popen[str], job: Sequence[Any]) -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(list(job)) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            raise self._ended(proc) from None

    def _receive(self, proc: subprocess.Popen[str]) -> Any:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise self._ended(proc)
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerError(f"{self.target}: {reply['error']}")
        return reply["result"]

    def _ended(self, proc: subprocess.Popen[str]) -> WorkerError:
        return WorkerError(f"a worker running {self.target} ended with exit code {proc.wait()} (see its stderr)")

    def close(self, *, kill: bool = False) -> None:
        procs, self._procs = self._procs, []
        for proc in procs:
            if kill:
                proc.kill()
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()  # an idle worker ends at end of input
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()

    def __enter__(self) -> FreshPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close(kill=kind is not None)


def _die_with(parent: int) -> None:
    """Have Linux kill this worker when its caller dies; elsewhere it ends at its next read."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the caller died before the request took effect
        os._exit(1)


def _serve(target: str, parent: int) -> None:
    """The worker's loop: one JSON list of arguments in per line, one ``{"result"}`` or ``{"error"}`` out."""
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle; it ends its workers
    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    replies: IO[str] = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything else the job prints, or its child processes write, goes to stderr
    sys.stdout = sys.stderr
    for line in sys.stdin:
        try:
            reply = {"result": function(*json.loads(line))}
        except Exception as exc:  # noqa: BLE001 - any failure of the job is the caller's to report
            traceback.print_exc()
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
