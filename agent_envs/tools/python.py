"""The ``python`` tool: one persistent, sandboxed Python interpreter per episode.

Variables, imports and function definitions persist across calls, so a step costs a pipe round
trip instead of an interpreter start-up.  The interpreter runs ``_py_driver.py`` in a sandbox of
its own (``Sandbox.popen``: bubblewrap with the shell's namespaces, mounts, uid and rlimits, or
the unsandboxed ``"none"`` backend); it does not share the bash tool's ``/workspace``, and the
shell's ``mode`` does not apply (the interpreter lives for the episode by definition).  It needs
the sandbox capability :data:`~agent_envs.sandbox.base.PROCESSES`, which the docker backend does
not have yet (an environment offering the tool refuses that backend when it is made).

Per call the guarantees match the bash tool's: output is captured in head/tail windows and
framed by :func:`agent_envs.sandbox.output.format_observation`; every process the code started
is killed before the call returns; the timeout kills the whole sandbox.  A timeout, a crash
(``sys.exit``, ``os._exit``, a segfault, the ``cpu_seconds`` rlimit, which counts the
interpreter's whole life), a ``MemoryError`` or a thread left running ends the interpreter; the
next call starts a fresh one, and :func:`format_python_observation` says so to the model.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
import weakref
from pathlib import Path
from typing import Any

from agent_envs.core.spec import Framing, ToolSpec
from agent_envs.sandbox import _procs
from agent_envs.sandbox.base import PID_NAMESPACE, PROCESSES, ExecResult, Sandbox, SandboxConfig, SandboxUnavailable
from agent_envs.sandbox.capture import PendingWrite, StreamReader, captured, drain, pump, settle
from agent_envs.sandbox.factory import make_sandbox
from agent_envs.sandbox.output import format_observation

DRIVER = (Path(__file__).with_name("_py_driver.py")).read_text(encoding="utf-8")
#: how long a new interpreter may take to start (not charged to the call's timeout)
BOOT_GRACE_S = 30.0
#: how long a dying interpreter's last output is awaited
EXIT_GRACE_S = 3.0


#: longest status line kept (``<16-hex nonce> <kind> <rc>``); anything longer is not one
STATUS_LINE_MAX = 64


class _Status:
    """Reads the driver's status pipe and picks out the line for one nonce.

    Code in the interpreter can write to this pipe too: the buffer is bounded and each byte is
    looked at once, and a line is only a claim (the host checks the driver's state, see
    :meth:`_Interpreter.idle`)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.kind: str | None = None
        self.rc = 0
        self.done = False  # EOF: the interpreter is gone
        self.nonce = b""

    def fileno(self) -> int:
        return self.fd

    def on_ready(self) -> bool:
        """Read once; False when nothing was there (the pipe is non-blocking) or at EOF."""
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return False
        if not data:
            self.done = True
            return False
        *lines, rest = (self.buf + data).split(b"\n")
        for line in lines:
            parts = line.split()
            if (
                len(parts) == 3
                and parts[0] == self.nonce
                and parts[1] in (b"B", b"R", b"X")
                and parts[2].lstrip(b"-").isdigit()
                and len(line) <= STATUS_LINE_MAX
            ):
                self.kind, self.rc = parts[1].decode(), int(parts[2])
        self.buf = rest[-STATUS_LINE_MAX:]
        return True

    def read_available(self) -> None:
        """Every line already written: once the driver is idle, its own (last) line is among them."""
        while not self.done and self.on_ready():
            pass


class _Interpreter:
    """One live interpreter process and its pipes."""

    def __init__(self, sandbox: Sandbox, sweep: bool) -> None:
        self.sandbox = sandbox
        status_r, status_w = os.pipe()
        try:
            self.proc: subprocess.Popen[bytes] = sandbox.popen(
                ["python3", "-u", "-c", DRIVER, str(status_w), "1" if sweep else "0"], pass_fds=(status_w,)
            )
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        self.status = _Status(status_r)
        self.sweep = sweep
        self.dead = False
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        for fd in (self.proc.stdin.fileno(), self.proc.stdout.fileno(), self.proc.stderr.fileno(), status_r):
            os.set_blocking(fd, False)
        self.commands = _procs.pipe_inode(self.proc.stdin.fileno())
        # wait for the driver's ready line, so that start-up is not charged to the first call
        self.status.nonce = b"boot"
        pump([self.status], lambda: self.status.kind is not None or self.status.done, time.monotonic() + BOOT_GRACE_S)
        if self.status.kind != "B":
            out = StreamReader(self.proc.stdout.fileno(), 4096)
            err = StreamReader(self.proc.stderr.fileno(), 4096)
            drain(out, err, time.monotonic() + EXIT_GRACE_S)
            self.close()
            text = (out.window.data() + err.window.data()).decode("utf-8", "replace").strip()
            raise OSError(f"the python interpreter did not start: {text or 'no output'}")
        #: host pids of the interpreter and of what else its sandbox keeps (bwrap's namespace init)
        self.driver, self.keep = self.proc.pid, {self.proc.pid}
        if sweep:
            init = _procs.sandbox_init(self.proc.pid)
            kids = _procs.children(init) if init is not None else []
            if init is None or len(kids) != 1:
                self.close()
                raise OSError("the python interpreter's sandbox started without it")
            self.driver, self.keep = kids[0], {init, kids[0]}

    def idle(self) -> bool:
        """The call is over: the interpreter is one thread blocked reading its next block, and no
        other process of its sandbox is left.  Status lines only say when to look (code in the
        interpreter can write them and run on); code blocking on the command pipe itself looks
        the same, and takes only its own next call (docs/reliability.md#tool-channels)."""
        if not self.sweep:
            self.sandbox.sweep(self.proc)
        return _procs.blocked_reading(self.driver, self.commands) and not _procs.running(
            set(_procs.descendants(self.proc.pid)) - self.keep
        )

    def run(self, code: bytes, timeout: float, keep: int) -> tuple[ExecResult, str | None]:
        """The call's result and, when the interpreter ended, why (for the notice)."""
        started = time.monotonic()
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        nonce = secrets.token_hex(8).encode()  # matches status lines to calls; not a secret
        out = StreamReader(self.proc.stdout.fileno(), keep)
        err = StreamReader(self.proc.stderr.fileno(), keep)
        self.status.nonce, self.status.kind = nonce, None
        writer = PendingWrite(self.proc.stdin.fileno(), b"%s %d\n" % (nonce, len(code)) + code)
        deadline = started + timeout

        def complete() -> bool:
            return self.status.done or (self.status.kind is not None and writer.done and self.idle())

        finished = settle(
            [out, err, self.status],
            complete,
            deadline,
            writer,
            pending=lambda: self.status.kind is not None or self.status.done,
        )
        why = None
        if not finished:
            why = f"the call timed out after {timeout:.1f}s"
            self.close()
        elif self.status.kind is None or (self.status.done and self.status.kind != "X"):  # died mid-call
            drain(out, err, time.monotonic() + EXIT_GRACE_S)
            self.close()
            why = _exit_reason(self.proc.returncode)
        else:
            for source in (out, err, self.status):
                source.read_available()
            if self.status.kind == "X":
                self.close()
                why = "the code left the interpreter unusable (see above)"
        rc = 124 if not finished else (self.status.rc if self.status.kind else self.proc.returncode)
        return ExecResult(
            returncode=rc,
            timed_out=not finished,
            **captured(out, err),
            duration_s=time.monotonic() - started,
            timeout_s=timeout,
        ), why

    def processes(self) -> list[int]:
        return [] if self.dead else self.sandbox.process_ids(self.proc)

    def close(self) -> None:
        if self.dead:
            return
        self.dead = True
        self.sandbox.stop(self.proc)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        os.close(self.status.fd)


def _close_held(held: list[_Interpreter | None], sandbox: Sandbox) -> None:
    """End a tool's interpreter, then its sandbox (``close``, or the tool's finaliser)."""
    interp = held[0]
    if interp is not None:
        interp.close()
    sandbox.close()


def _exit_reason(rc: int | None) -> str:
    if rc is not None and rc > 128:  # bwrap reports a signal as 128 + N
        rc = -(rc - 128)
    if rc is not None and rc < 0:
        return f"the interpreter was killed by signal {-rc}"
    return f"the interpreter exited with code {rc}"


class PythonTool:
    """A persistent Python interpreter for one episode (see the module docstring).

    ``run(code)`` never raises for anything the code does; ``close()`` leaves nothing behind.
    """

    name = "python"

    def __init__(self, sandbox: SandboxConfig | str | dict[str, Any] | None = None) -> None:
        self._sandbox = make_sandbox(sandbox)
        self.config = self._sandbox.config
        if PROCESSES not in self._sandbox.capabilities:
            self._sandbox.close()
            raise SandboxUnavailable(
                f"the python tool cannot run on the {self.config.backend!r} backend yet; use 'bwrap' or 'none'"
            )
        #: the interpreter kills what each call started itself, inside its own pid namespace
        self._sweep = PID_NAMESPACE in self._sandbox.capabilities
        #: the live interpreter, in a list the finaliser shares: a tool dropped without close()
        #: (an episode garbage-collected) still ends its interpreter and its sandbox
        self._held: list[_Interpreter | None] = [None]
        self._finalizer = weakref.finalize(self, _close_held, self._held, self._sandbox)
        self.restarts = 0

    @property
    def _interp(self) -> _Interpreter | None:
        return self._held[0]

    @_interp.setter
    def _interp(self, interp: _Interpreter | None) -> None:
        self._held[0] = interp

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        """Execute ``code`` in the episode's interpreter; ``meta["notice"]`` is set when the
        interpreter ended during this call (the next call gets a fresh one)."""
        limit = self.config.limits.timeout_s if timeout is None else timeout
        started = time.monotonic()
        if "\0" in code:
            return ExecResult(returncode=126, launch_error="embedded null byte")
        try:
            if self._interp is None or self._interp.dead:
                self._interp = _Interpreter(self._sandbox, self._sweep)
        except (OSError, ValueError) as exc:
            return ExecResult(returncode=126, launch_error=str(exc), duration_s=time.monotonic() - started)
        result, why = self._interp.run(code.encode("utf-8", "surrogateescape"), limit, self.config.limits.capture_keep)
        if why is not None:
            self.restarts += 1
            result.meta["notice"] = (
                f"[python] {why}; the interpreter was restarted, so variables and imports from earlier calls are gone."
            )
        return result

    def processes(self) -> list[int]:
        """Host pids of the interpreter's sandbox (empty when none runs)."""
        return self._interp.processes() if self._interp is not None else []

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> "PythonTool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def format_python_observation(result: ExecResult, framing: Framing, limit: int = 6000) -> str:
    """The shell's framing of ``result``, followed by the restart notice when there is one."""
    text = format_observation(result, framing, limit)
    notice = result.meta.get("notice")
    return f"{text}\n{notice}" if notice else text


class PythonObserver:
    """The ``python`` tool as an environment uses it: code in, observation text out."""

    name = "python"

    def __init__(self, config: SandboxConfig, framing: Framing, limit: int) -> None:
        self.tool = PythonTool(config)
        self.framing = framing
        self.limit = limit

    def run(self, code: str) -> str:
        return format_python_observation(self.tool.run(code), self.framing, self.limit)

    def close(self) -> None:
        self.tool.close()


#: the declaration: ``{"code": "<python code>"}``, one persistent interpreter per episode
PYTHON = ToolSpec(
    "python",
    PythonObserver,
    argument="code",
    framing=Framing(label="Python", translate_newlines=True),
    needs=frozenset({PROCESSES}),
    placeholder="<python code>",
    description=(
        "runs code in a Python interpreter that keeps its variables and imports between calls; "
        "print what you want to see."
    ),
)
