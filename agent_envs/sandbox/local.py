"""The ``"none"`` backend: commands run unsandboxed on the host (as the reference runner did, docs/protocol.md#math-tool).

Per episode there is one temporary working directory that persists across turns and is removed
on close, when the sandbox is garbage-collected, or at interpreter exit (whichever comes first).  Each command is ``/bin/bash -c "ulimit -v KiB; <command>"`` in a new session; its whole
process group is killed when it times out and when it finishes (so plain background jobs do not
outlive it; a process that calls setsid itself can, which is why this backend is not a sandbox).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref

from agent_envs.sandbox import _procs
from agent_envs.sandbox._bwrap_layout import set_rlimits, with_ulimit
from agent_envs.sandbox.capture import StreamReader, captured, drain
from agent_envs.sandbox.base import PROCESSES, ExecResult, Sandbox, SandboxConfig

_DROPPED_ENV = ("DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS")


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class LocalSandbox(Sandbox):
    capabilities = frozenset({PROCESSES})

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.workdir: str | None = tempfile.mkdtemp(prefix="ae-local-")
        self._remove = weakref.finalize(self, shutil.rmtree, self.workdir, ignore_errors=True)
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env["BROWSER"] = "/bin/false"
        env.update(config.env)
        self.env = env

    def run(self, command: str, timeout: float | None = None) -> ExecResult:
        limit = self.config.limits.timeout_s if timeout is None else timeout
        started = time.monotonic()
        if self.workdir is None:
            return ExecResult(returncode=126, launch_error="sandbox is closed")
        script = with_ulimit(self.config.limits, command)
        runner = os.getpid()
        try:
            proc = _procs.launch(
                lambda: subprocess.Popen(
                    ["/bin/bash", "-c", script],
                    cwd=self.workdir,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=lambda: _procs.die_with_runner(runner),
                )
            )
        except (OSError, ValueError) as exc:
            return ExecResult(returncode=126, launch_error=str(exc), duration_s=time.monotonic() - started)
        assert proc.stdout is not None and proc.stderr is not None
        keep = self.config.limits.capture_keep
        out, err = StreamReader(proc.stdout.fileno(), keep), StreamReader(proc.stderr.fileno(), keep)
        finished = drain(out, err, started + limit)
        if finished:
            finished = _wait(proc, started + limit)
        _killpg(proc.pid)
        rc = proc.wait()
        if not (out.done and err.done):  # only after a timeout: grandchildren may hold the pipes
            drain(out, err, time.monotonic() + 1.0)
        proc.stdout.close()
        proc.stderr.close()
        return ExecResult(
            returncode=rc if finished else 124,
            timed_out=not finished,
            **captured(out, err),
            duration_s=time.monotonic() - started,
            timeout_s=limit,
        )

    def popen(self, program: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        """Start a long-lived tool process in the working directory, under the sandbox's rlimits,
        in its own session; stdin/stdout/stderr are pipes.  End it with :meth:`stop`."""
        if self.workdir is None:
            raise OSError("sandbox is closed")
        limits, runner = self.config.limits, os.getpid()

        def child_setup() -> None:
            _procs.die_with_runner(runner)
            set_rlimits(limits)

        return _procs.launch(
            lambda: subprocess.Popen(
                program,
                cwd=self.workdir,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                preexec_fn=child_setup,
                start_new_session=True,
            )
        )

    @staticmethod
    def sweep(proc: subprocess.Popen[bytes]) -> None:
        """Kill every descendant of ``proc`` and wait until each has exited (``proc`` lives on;
        it should be a child subreaper, so that double-forked orphans stay its descendants)."""
        seen: set[int] = set()
        while new := set(_procs.descendants(proc.pid)) - seen:
            _procs.kill_all(sorted(new))
            for pid in new:
                _procs.wait_exit(pid, 1.0)
            seen |= new

    @classmethod
    def stop(cls, proc: subprocess.Popen[bytes]) -> None:
        """Kill ``proc``, its descendants and its process group, and reap it."""
        cls.sweep(proc)
        _killpg(proc.pid)
        proc.wait()

    def log_command(self, name: str, command: str) -> None:
        """Append ``command`` to the file ``name`` in the working directory, stamped with the UTC
        time and the timeout, as the reference runner did; a failed write is ignored there too."""
        if self.workdir is None:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            with open(os.path.join(self.workdir, name), "a", encoding="utf-8") as log:
                log.write(f"\n[{stamp}] timeout={self.config.limits.timeout_s}\n{command}\n")
        except (OSError, UnicodeError):
            pass

    @staticmethod
    def process_ids(proc: subprocess.Popen[bytes]) -> list[int]:
        """Host pids of ``proc`` and every process below it."""
        return [proc.pid, *_procs.descendants(proc.pid)]

    def close(self) -> None:
        self._remove()
        self.workdir = None


def _wait(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        return False
