"""Host-side process bookkeeping for sandboxes: launching, user namespaces, descendants, teardown."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import queue
import select
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar, cast

from agent_envs.sandbox._bwrap_layout import HOST_UID_WHEN_ROOT, SANDBOX_UID
from agent_envs.sandbox.base import SandboxUnavailable


T = TypeVar("T")
#: a fork to run on the launcher thread and where its outcome goes: (True, result) or (False, exception)
_Job = tuple[Callable[[], Any], "queue.SimpleQueue[tuple[bool, Any]]"]
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # resolved here: a forked child only calls it


def die_with_runner(runner: int) -> None:
    """In a forked child before exec: be SIGKILLed when the runner dies, however it dies
    (docs/reliability.md#containment).  Exits at once if the runner is already gone (it died
    between the fork and this call, so the signal would never come)."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != runner:
        os._exit(70)


class _Launcher:
    """One thread, alive as long as the process, that forks every sandbox.

    The kernel sends a child's parent-death signal when the *thread* that forked it ends, not the
    process; forking from pool threads (which come and go) would kill sandboxes while they are in
    use.  Forks are fast, so one thread for all of them costs nothing noticeable."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def run(self, fork: Callable[[], T]) -> T:
        """``fork()`` (which starts a process, with :func:`die_with_runner` before its exec) on
        the launcher thread; its result, or its exception raised here."""
        with self._lock:  # a forked child of this process starts without the thread: make a new one
            if self._thread is None or self._pid != os.getpid():
                self._jobs, self._pid = queue.SimpleQueue(), os.getpid()
                self._thread = threading.Thread(
                    target=self._serve, args=(self._jobs,), daemon=True, name="agent-envs-launcher"
                )
                self._thread.start()
            jobs = self._jobs
        done: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        jobs.put((fork, done))
        ok, value = done.get()
        if not ok:
            raise value
        return cast(T, value)

    @staticmethod
    def _serve(jobs: "queue.SimpleQueue[_Job]") -> None:
        while True:
            fork, done = jobs.get()
            try:
                done.put((True, fork()))
            except BaseException as exc:  # handed to the caller's thread
                done.put((False, exc))


_launcher = _Launcher()


def launch(fork: Callable[[], T]) -> T:
    """Start a sandbox process from the launcher thread (see :class:`_Launcher`)."""
    return _launcher.run(fork)


#: a no-op bwrap option naming the runner (pid and start time) in each sandbox's command line, so
#: that a later run can tell a sandbox whose runner died (see :func:`reap_orphans`)
_MARK = "AGENT_ENVS_RUNNER_"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with the pid, it names one process)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def runner_mark() -> list[str]:
    """bwrap arguments that mark a sandbox as this process's (``--unsetenv`` of a variable the
    cleared environment never has: nothing changes inside)."""
    return ["--unsetenv", _mark(os.getpid())]


@functools.lru_cache(maxsize=None)
def _mark(pid: int) -> str:
    return f"{_MARK}{pid}_{start_time(pid)}"


def reap_orphans() -> list[int]:
    """SIGKILL every sandbox process whose runner is gone; their pids.

    A runner SIGKILLed while a sandbox starts can leave the sandbox's pid-namespace init behind
    (its parent-death signal is set only once it runs; it ignores SIGTERM), so each run clears
    what killed runs left (docs/reliability.md#containment).  Killing an init ends its namespace.
    """
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        marks = [a for a in argv if a.startswith(_MARK.encode())]
        if not marks:
            continue
        pid, _, started = marks[0].decode()[len(_MARK) :].partition("_")
        if pid.isdigit() and str(start_time(int(pid))) != started:  # that runner is gone
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
            except (ProcessLookupError, PermissionError):
                continue
    return killed


#: the namespace helper: report, wait for the uid map, re-exec (to gain the namespace's
#: capabilities), cap nested user namespaces at 0, report again, then hold the namespace open
#: (a refused write must still answer: the caller waits for a line, and ``cat`` would never send one)
_NO_NESTED_USERNS = (
    "echo; read _; exec /bin/sh -c "
    "'echo 0 >/proc/sys/user/max_user_namespaces && echo limited || echo refused; exec cat'"
)


class UserNamespace:
    """A user namespace mapping sandbox uid 1000 to an unprivileged host uid (host root only).

    bwrap joins it with ``--userns``.  Host uid 0 stays mapped to 0 so that bwrap can still
    reach the bind sources (e.g. a Python under /root) while setting up; the command itself then
    drops to uid 1000 with ``setpriv`` and, being host uid 65534, is subject to RLIMIT_NPROC.

    The namespace's ``user.max_user_namespaces`` is set to 0, so nothing inside can create a
    nested user namespace (and with it mount or network privileges): what bwrap's
    ``--disable-userns`` does, which needs ``--unshare-user`` and so cannot be used with
    ``--userns``.  The helper re-execs once its uid is mapped, because only then does it hold
    CAP_SYS_RESOURCE in the namespace, which writing that limit requires.
    """

    def __init__(self) -> None:
        helper = subprocess.Popen(
            ["unshare", "--user", "--", "/bin/sh", "-c", _NO_NESTED_USERNS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert helper.stdout is not None and helper.stdin is not None
            if helper.stdout.readline() != b"\n":
                raise SandboxUnavailable("could not create a user namespace (unshare --user failed)")
            mapping = f"0 0 1\n{SANDBOX_UID} {HOST_UID_WHEN_ROOT} 1\n"
            for name in ("uid_map", "gid_map"):
                Path(f"/proc/{helper.pid}/{name}").write_text(mapping)
            helper.stdin.write(b"\n")
            helper.stdin.flush()
            if helper.stdout.readline() != b"limited\n":
                raise SandboxUnavailable(
                    "could not forbid nested user namespaces in the sandbox: writing "
                    "user.max_user_namespaces was refused (a read-only /proc/sys, or this "
                    "process runs with no_new_privs, as inside bwrap or a container started "
                    "with no-new-privileges)"
                )
            self.fd = os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            if helper.stdin is not None:
                helper.stdin.close()
            if helper.stdout is not None:
                helper.stdout.close()
            helper.wait()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return out


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


#: number of the ``read`` system call in ``/proc/PID/syscall``, by machine
_READ_SYSCALL = {"x86_64": 0, "aarch64": 63, "riscv64": 63, "ppc64le": 3, "s390x": 3}


def pipe_inode(fd: int) -> int:
    """The inode that names the pipe behind ``fd`` (``pipe:[N]`` in ``/proc/PID/fd``)."""
    return os.fstat(fd).st_ino


def blocked_reading(pid: int, inode: int) -> bool:
    """Whether ``pid`` is one thread blocked in ``read`` on the pipe ``inode``: how the host tells
    that a tool's driver has finished a call and waits for the next.  Unlike a status line, which
    code running in the driver's process can write too, this holds only while that code is
    stopped: code that blocks on the same pipe itself is, to the host, the driver, and takes its
    own next call (docs/reliability.md#tool-channels)."""
    try:
        call = Path(f"/proc/{pid}/syscall").read_text().split()
        if len(call) < 2 or not call[0].isdigit():
            return False  # running ("running" instead of a call number)
        expected = _READ_SYSCALL.get(os.uname().machine)
        if expected is not None and int(call[0]) != expected:
            return False
        if os.readlink(f"/proc/{pid}/fd/{int(call[1], 16)}") != f"pipe:[{inode}]":
            return False
        threads = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[17]
    except (OSError, ValueError, IndexError):
        return False
    return threads == "1"


def running(pids: set[int] | list[int]) -> set[int]:
    """The ``pids`` that are alive (not zombies: those have exited and run nothing)."""
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def kill_all(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def sandbox_init(monitor_pid: int) -> int | None:
    """Host pid of the sandbox's pid-namespace init (the monitor's only child)."""
    kids = children(monitor_pid)
    return kids[0] if kids else None


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait (without reaping) until ``pid`` has exited; False on timeout."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return _exited(fd, timeout)
    finally:
        os.close(fd)


def _exited(pidfd: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the process behind ``pidfd`` to exit."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def teardown(monitor_pid: int, grace: float = 5.0) -> None:
    """Kill the sandbox's init; the kernel then kills its whole pid namespace.

    bwrap's monitor reaps init, and init's exit waits until every process of the namespace is
    gone, so once the monitor has exited nothing of the sandbox is left.  The caller reaps the
    monitor afterwards.
    """
    init = sandbox_init(monitor_pid)
    kill_all([init if init is not None else monitor_pid])
    if not wait_exit(monitor_pid, grace):
        kill_all([monitor_pid])
        wait_exit(monitor_pid, grace)


class NamespaceInit:
    """A pidfd on a bwrap sandbox's init, learnt from bwrap's ``--info-fd`` report.

    bwrap's monitor exits as soon as the command's status is known, while the kernel is still
    killing the rest of the pid namespace; init's exit, however, waits for that to finish.  The
    pid namespace inode in the report guards against the pid having been reused meanwhile.
    """

    def __init__(self, info_fd: int, timeout: float = 30.0) -> None:
        self.fd = -1
        chunks = []
        poller = select.poll()
        poller.register(info_fd, select.POLLIN)
        while poller.poll(timeout * 1000) and (chunk := os.read(info_fd, 4096)):
            chunks.append(chunk)
        os.close(info_fd)
        try:
            info = json.loads(b"".join(chunks))
            pid, ns = int(info["child-pid"]), int(info["pid-namespace"])
        except (ValueError, KeyError, TypeError):
            return  # bwrap failed before starting the sandbox: nothing to wait for
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return  # init has already been reaped, so its namespace is gone
        try:
            same = os.stat(f"/proc/{pid}/ns/pid").st_ino == ns
        except OSError:
            same = False
        if same:
            self.fd = fd
        else:
            os.close(fd)

    def wait_gone(self, grace: float = 5.0) -> None:
        """Block until init, and with it every process of the namespace, has exited."""
        if self.fd < 0:
            return
        try:
            if not _exited(self.fd, grace):
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)
                _exited(self.fd, grace)
        except ProcessLookupError:
            pass
        finally:
            os.close(self.fd)
            self.fd = -1
