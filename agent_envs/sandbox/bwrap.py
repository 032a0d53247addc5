"""Bubblewrap sandbox (docs/protocol.md#tool-sandbox) in two modes.

* ``fresh``: one throw-away bwrap per command, like the reference harness (nothing persists).
  ``run`` returns only once the command's pid namespace is empty (it waits on the sandbox's
  init, whose pid bwrap reports on ``--info-fd``), not merely when bwrap's monitor exits.
* ``persistent`` (default): one bwrap with one bash per episode, reused across turns.  The
  shell runs a one-line driver loop (``bash -c``) that reads each command from a pipe (NUL-
  terminated, prefixed by a random 16-hex nonce), ``eval``s it with stdout/stderr on two more
  pipes, then SIGKILLs every other process of the sandbox (``kill -9 -1`` spares only itself and
  the namespace's init) and writes a status line carrying the nonce on the pty that pexpect
  spawned.  The host reads all three with ``poll`` and keeps head/tail windows, so unbounded or
  binary output never accumulates anywhere.  The command can read the nonce and write a status
  line itself, so a line only says when to look: the command is over once the shell is blocked
  reading the command pipe and no other process is left (docs/reliability.md#tool-channels); the
  output pipes are then read to their end.  A command blocking on that pipe itself looks the
  same: it ends its own call early and takes its own next one, which times out.
  Files, cwd and shell variables persist across commands; processes do not.  ``exit`` (or a
  timeout the host aborts with SIGUSR2) re-execs a fresh bash in place: files, cwd and exported
  variables survive, plain shell variables do not.  If the shell dies anyway (``kill -9 $$``,
  ``exec``), the next command transparently starts a new sandbox (with an empty /workspace).
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import secrets
import signal
import stat
import subprocess
import time
import weakref
from typing import Any, Callable

import pexpect
import ptyprocess

from agent_envs.sandbox import _procs
from agent_envs.sandbox._bwrap_layout import command_prefix, find_bwrap, layout_args, set_rlimits, with_ulimit
from agent_envs.sandbox.capture import PendingWrite, Source, StreamReader, captured, drain, pump, settle
from agent_envs.sandbox.base import (
    PID_NAMESPACE,
    PROCESSES,
    ExecResult,
    Sandbox,
    SandboxConfig,
    remove_folders,
    staged_mounts,
)

#: fixed fd numbers of the driver's pipes inside the sandbox
FD_PTY, FD_CMD, FD_OUT, FD_ERR, FD_USERNS = 59, 60, 61, 62, 63
BOOT_TIMEOUT_S = 30.0
#: after a timeout: how long the shell gets to come back before the sandbox is rebuilt
ABORT_GRACE_S = 3.0

# One line, so that LINENO inside eval'd commands counts from 1 as under `bash -c`.
# __ae_m repeats `kill -9 -1` until nothing but the shell and init is left (kill succeeds while
# any other process, even a zombie, exists), then lets `jobs` swallow the "Killed" notices.
DRIVER = (
    "exec 59>&1 0</dev/null; "
    "__ae_m() { __ae_i=0; while builtin kill -9 -1 2>/dev/null && ((__ae_i++ < 100000)); do "
    "builtin wait 2>/dev/null; done; { builtin wait; builtin jobs; } >/dev/null 2>&1; "
    'builtin printf \'\\36A%s %s %s\\n\' "$1" "$__ae_n" "$2" >&59; }; '
    '__ae_x() { trap - EXIT USR2; __ae_m X "$1"; '
    'exec /bin/bash --noprofile --norc -c "$BASH_EXECUTION_STRING" 0</dev/null 1>&59 2>&59; }; '
    "trap '__ae_x \"$?\"' EXIT; trap '__ae_x 124' USR2; builtin printf '\\36AB\\n' >&59; "
    "while IFS= builtin read -r -d '' -u 60 __ae_c; do __ae_n=${__ae_c:0:16}; "
    'eval "unset __ae_c; ${__ae_c:16}" </dev/null >&61 2>&62; __ae_m R "$?"; done; '
    "trap - EXIT; exit 0"
)
_STATUS = re.compile(rb"\x1eA([RX]) ([0-9a-f]{16}) (-?\d+)")


def _launch_error(text: str, started: float) -> ExecResult:
    return ExecResult(returncode=126, launch_error=text, duration_s=time.monotonic() - started)


def _encode(command: str) -> bytes:
    """Like subprocess: NUL bytes and unencodable text are launch errors (ValueError)."""
    if "\0" in command:
        raise ValueError("embedded null byte")
    return command.encode("utf-8", errors="surrogateescape")


@functools.lru_cache(maxsize=None)
def _reap_once(pid: int) -> None:
    """A process's first sandbox clears what killed runners left (once per process ``pid``)."""
    _procs.reap_orphans()


class _Layout:
    """The per-sandbox parts that outlive single commands: user namespace, staged mounts."""

    def __init__(self, config: SandboxConfig) -> None:
        self.bwrap = find_bwrap()
        _reap_once(os.getpid())
        self.as_root = os.geteuid() == 0
        # as root, the sandbox's host uid could read only world-readable files
        mounts, self.staged = staged_mounts(config, lambda p: self.as_root and not os.stat(p).st_mode & stat.S_IROTH)
        self.userns = _procs.UserNamespace() if self.as_root else None
        self.limits = config.limits
        self.layout = layout_args(config, mounts)

    def argv(self, userns_fd: int, program: list[str], options: tuple[str, ...] = ()) -> list[str]:
        if self.userns is not None:
            ns = [
                "--userns",
                str(userns_fd),
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-net",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--cap-add",
                "CAP_SETUID,CAP_SETGID",
            ]
        else:
            ns = ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", "1000", "--gid", "1000"]
        return [
            self.bwrap,
            *ns,
            *_procs.runner_mark(),
            *options,
            *self.layout,
            *command_prefix(self.limits, self.as_root),
            *program,
        ]

    def popen(
        self,
        program: list[str],
        options: tuple[str, ...] = (),
        pass_fds: tuple[int, ...] = (),
        stdin: int = subprocess.PIPE,
    ) -> subprocess.Popen[bytes]:
        """``program`` in a new sandbox of this layout, stdout/stderr piped, in its own session."""
        fd = self.userns.fd if self.userns is not None else -1
        limits, runner = self.limits, os.getpid()

        def child_setup() -> None:
            _procs.die_with_runner(runner)
            set_rlimits(limits)

        return _procs.launch(
            lambda: subprocess.Popen(
                self.argv(fd, program, options),
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(*pass_fds, fd) if fd >= 0 else pass_fds,
                preexec_fn=child_setup,
                start_new_session=True,
            )
        )

    def close(self) -> None:
        if self.userns is not None:
            self.userns.close()
        remove_folders(self.staged)
        self.staged = []


class _FreshRunner:
    """One bwrap per command: ``/bin/bash --noprofile --norc -c "ulimit -v KiB; <command>"``."""

    def __init__(self, layout: _Layout) -> None:
        self.layout = layout

    def run(self, command: str, timeout: float, keep: int) -> ExecResult:
        started = time.monotonic()
        script = with_ulimit(self.layout.limits, command)
        info_r, info_w = os.pipe()
        try:
            proc = self.layout.popen(
                ["/bin/bash", "--noprofile", "--norc", "-c", script],
                ("--info-fd", str(info_w)),
                (info_w,),
                stdin=subprocess.DEVNULL,
            )
        except (OSError, ValueError) as exc:
            os.close(info_r)
            return _launch_error(str(exc), started)
        finally:
            os.close(info_w)
        init = _procs.NamespaceInit(info_r)
        assert proc.stdout is not None and proc.stderr is not None
        out = StreamReader(proc.stdout.fileno(), keep)
        err = StreamReader(proc.stderr.fileno(), keep)
        finished = drain(out, err, started + timeout)
        if not finished:
            _procs.teardown(proc.pid)
        rc = proc.wait()
        init.wait_gone()
        proc.stdout.close()
        proc.stderr.close()
        return ExecResult(
            returncode=124 if not finished else rc,
            timed_out=not finished,
            **captured(out, err),
            duration_s=time.monotonic() - started,
            timeout_s=timeout,
        )


class _PtyStatus:
    """Reads the control pty and picks out the driver's status line for one nonce."""

    def __init__(self, fd: int, nonce: str) -> None:
        self.fd = fd
        self.nonce = nonce.encode()
        self.buf = b""
        self.kind: bytes | None = None
        self.rc: int | None = None
        self.done = False  # EOF: the sandbox is gone

    def fileno(self) -> int:
        return self.fd

    def on_ready(self) -> bool:
        """Read once; False when nothing was there or at EOF."""
        try:
            data = os.read(self.fd, 4096)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self.done = True
            return False
        self.buf += data
        for m in _STATUS.finditer(self.buf):
            if m.group(2) == self.nonce:
                self.kind, self.rc = m.group(1), int(m.group(3))
        self.buf = self.buf[-64:]
        return True

    def read_available(self) -> None:
        """Every line already written: once the shell is idle, its own (last) line is among them."""
        while not self.done and self.on_ready():
            pass


class _Spawn(pexpect.spawn):  # type: ignore[misc]  # pexpect has no type information
    """pexpect.spawn that can hand extra file descriptors to the child."""

    def __init__(self, *args: Any, pass_fds: tuple[int, ...] = (), **kwargs: Any) -> None:
        self._pass_fds = pass_fds
        super().__init__(*args, **kwargs)

    def _spawnpty(self, args: list[str], **kwargs: Any) -> Any:
        return ptyprocess.PtyProcess.spawn(args, pass_fds=self._pass_fds, **kwargs)


def _place_fds(mapping: dict[int, int]) -> None:
    """In the child: move each source fd to its target number (targets may collide with sources)."""
    moved = {fcntl.fcntl(src, fcntl.F_DUPFD, 200): dst for src, dst in mapping.items()}
    for src in mapping:
        os.close(src)
    for tmp, dst in moved.items():
        os.dup2(tmp, dst, inheritable=True)
        os.close(tmp)


class _Shell:
    """One live sandbox with the driver loop (see the module docstring)."""

    def __init__(self, layout: _Layout) -> None:
        self.layout = layout
        self.dead = False
        cmd_r, self.cmd_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        mapping = {cmd_r: FD_CMD, out_w: FD_OUT, err_w: FD_ERR}
        if layout.userns is not None:
            mapping[layout.userns.fd] = FD_USERNS
        limits, runner = layout.limits, os.getpid()

        def child_setup() -> None:
            _procs.die_with_runner(runner)
            _place_fds(mapping)
            set_rlimits(limits)

        argv = layout.argv(FD_USERNS, ["/bin/bash", "--noprofile", "--norc", "-c", DRIVER])
        try:
            self.child = _procs.launch(
                lambda: _Spawn(
                    argv[0],
                    argv[1:],
                    pass_fds=tuple(mapping),
                    echo=False,
                    timeout=None,
                    maxread=4096,
                    searchwindowsize=4096,
                    preexec_fn=child_setup,
                    env={"PATH": "/usr/bin:/bin"},
                )
            )
        except BaseException:
            for fd in (cmd_r, self.cmd_w, self.out_r, self.err_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        self.child.delaybeforesend = None
        self.child.delayafterclose = 0
        self.child.delayafterterminate = 0
        self.child.ptyproc.delayafterclose = 0
        self.child.ptyproc.delayafterterminate = 0
        # the host keeps its own (non-blocking) open of the command pipe's read end to drain
        # what an aborted read left; a separate open so the shell's end stays blocking
        self.cmd_drain = os.open(f"/proc/self/fd/{cmd_r}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        os.close(cmd_r)
        for fd in (self.cmd_w, self.out_r, self.err_r, self.cmd_drain, self.child.child_fd):
            os.set_blocking(fd, False)
        self._wait_boot()
        self.shell_pid = self._find_shell()
        self.commands = _procs.pipe_inode(self.cmd_w)

    def _wait_boot(self) -> None:
        booted = _PtyStatus(self.child.child_fd, "")
        ok = pump([booted], lambda: b"\x1eAB" in booted.buf or booted.done, time.monotonic() + BOOT_TIMEOUT_S)
        if not ok or b"\x1eAB" not in booted.buf:
            self.close()
            raise OSError(f"bwrap sandbox did not start: {booted.buf[-300:].decode(errors='replace')}")

    def _find_shell(self) -> int:
        init = _procs.sandbox_init(self.child.pid)
        kids = _procs.children(init) if init is not None else []
        if init is None or not kids:
            raise OSError("bwrap sandbox started but its shell is missing")
        self.init: int = init
        return kids[0]

    def others(self) -> list[int]:
        """Host pids of every sandbox process except the shell and init."""
        return [p for p in _procs.descendants(self.init) if p != self.shell_pid]

    def idle(self) -> bool:
        """The shell waits for its next command with nothing else running: the command is over."""
        return _procs.blocked_reading(self.shell_pid, self.commands) and not _procs.running(self.others())

    def processes(self) -> list[int]:
        return [self.child.pid, *_procs.descendants(self.child.pid)]

    def _drain_cmd(self) -> None:
        try:
            while os.read(self.cmd_drain, 65536):
                pass
        except BlockingIOError:
            pass

    def run(self, payload: bytes, timeout: float, keep: int) -> ExecResult:
        started = time.monotonic()
        nonce = secrets.token_hex(8)  # matches status lines to commands; not a secret
        out = StreamReader(self.out_r, keep)
        err = StreamReader(self.err_r, keep)
        status = _PtyStatus(self.child.child_fd, nonce)
        self._drain_cmd()
        writer = PendingWrite(self.cmd_w, nonce.encode() + payload + b"\0")
        writer.on_ready()
        sources: list[Source] = [out, err, status]

        def complete() -> bool:
            return status.done or (status.rc is not None and writer.done and self.idle())

        timed_out = not settle(
            sources, complete, started + timeout, writer, pending=lambda: status.rc is not None or status.done
        )
        if timed_out and not self._abort(out, err, sources, complete):
            rc = 124  # torn down and its output drained: none of its pipes may be read again
        elif status.done:  # the sandbox died (kill -9 $$, exec, ...)
            drain(out, err, time.monotonic() + ABORT_GRACE_S)
            rc = self._reap()
        else:
            for source in (out, err, status):
                source.read_available()
            rc = status.rc if status.rc is not None else 124
            if out.eof or err.eof:  # the command closed the driver's pipes: rebuild next time
                self.close()
        return ExecResult(
            returncode=124 if timed_out else rc,
            timed_out=timed_out,
            **captured(out, err),
            duration_s=time.monotonic() - started,
            timeout_s=timeout,
        )

    def _abort(self, out: StreamReader, err: StreamReader, sources: list[Source], complete: Callable[[], bool]) -> bool:
        """Timeout: kill the command's processes; if the shell itself is busy, SIGUSR2 re-execs it.

        False when the shell did not come back (it ignores SIGUSR2, or code imitating the driver
        never answers, docs/reliability.md#tool-channels): the sandbox is then torn down, its
        output read to the end, and closed, so the caller must not read its pipes again (their
        fd numbers may already belong to another thread's files)."""
        deadline = time.monotonic() + ABORT_GRACE_S
        _procs.kill_all(self.others())
        if settle(sources, complete, min(deadline, time.monotonic() + 0.25)):
            return True
        _procs.kill_all([self.shell_pid], signal.SIGUSR2)
        while time.monotonic() < deadline:
            _procs.kill_all(self.others())  # a loop may keep starting children
            if settle(sources, complete, min(deadline, time.monotonic() + 0.1)):
                return True
        self._stop()  # rebuilt on the next command; the pipes' writers are gone, so they end
        drain(out, err, time.monotonic() + ABORT_GRACE_S)
        self.close()
        return False

    def _reap(self) -> int:
        self.close()
        status = self.child.exitstatus
        return status if status is not None else 128 + (self.child.signalstatus or 9)

    def _stop(self) -> None:
        """Kill every process of the sandbox and reap bwrap; the host's pipe ends stay open."""
        if self.child.isalive():
            _procs.teardown(self.child.pid)
        try:
            self.child.wait()
        except pexpect.ExceptionPexpect:
            pass

    def close(self) -> None:
        if self.dead:
            return
        self.dead = True
        self._stop()
        self.child.close(force=True)
        for fd in (self.cmd_w, self.cmd_drain, self.out_r, self.err_r):
            try:
                os.close(fd)
            except OSError:
                pass


def _finalize(state: dict[str, Any]) -> None:
    shell = state.pop("shell", None)
    if shell is not None:
        shell.close()
    layout = state.pop("layout", None)
    if layout is not None:
        layout.close()


class BwrapSandbox(Sandbox):
    """Commands in bubblewrap; see the module docstring for the two modes."""

    capabilities = frozenset({PROCESSES, PID_NAMESPACE})

    def __init__(self, config: SandboxConfig) -> None:
        if config.mode not in ("persistent", "fresh"):
            raise ValueError(f"unknown bwrap mode {config.mode!r}; expected 'persistent' or 'fresh'")
        self.config = config
        self._state: dict[str, Any] = {"layout": _Layout(config)}
        self._finalizer = weakref.finalize(self, _finalize, self._state)

    def run(self, command: str, timeout: float | None = None) -> ExecResult:
        limit = self.config.limits.timeout_s if timeout is None else timeout
        started = time.monotonic()
        layout = self._state.get("layout")
        if layout is None:
            return _launch_error("sandbox is closed", started)
        if self.config.mode == "fresh":
            return _FreshRunner(layout).run(command, limit, self.config.limits.capture_keep)
        try:
            payload = _encode(command)
            shell = self._state.get("shell")
            if shell is None or shell.dead:
                shell = self._state["shell"] = _Shell(layout)
                if not self._finalizer.alive:  # closed by another thread while it started: it goes too
                    shell.close()
                    return _launch_error("sandbox is closed", started)
        except (OSError, ValueError) as exc:
            return _launch_error(str(exc), started)
        return shell.run(payload, limit, self.config.limits.capture_keep)

    def popen(self, program: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        """Start a long-lived tool process (e.g. the python tool's interpreter) in a new sandbox
        with this episode's layout and limits; stdin/stdout/stderr are pipes.  End it with
        :meth:`stop`."""
        layout: _Layout | None = self._state.get("layout")
        if layout is None:
            raise OSError("sandbox is closed")
        return layout.popen(program, pass_fds=pass_fds)

    @staticmethod
    def stop(proc: subprocess.Popen[bytes]) -> None:
        """Kill everything ``proc``'s sandbox runs and reap it."""
        _procs.teardown(proc.pid)
        proc.wait()

    @staticmethod
    def process_ids(proc: subprocess.Popen[bytes]) -> list[int]:
        """Host pids of ``proc`` and every process below it."""
        return [proc.pid, *_procs.descendants(proc.pid)]

    def processes(self) -> list[int]:
        """Host pids of this sandbox's processes (bwrap monitor included); empty when none runs."""
        shell = self._state.get("shell")
        return shell.processes() if shell is not None and not shell.dead else []

    def close(self) -> None:
        self._finalizer()
