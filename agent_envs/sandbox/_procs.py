"""Host-side process bookkeeping for sandboxes: user namespaces, descendants, teardown."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
from pathlib import Path

from agent_envs.sandbox._bwrap_layout import HOST_UID_WHEN_ROOT, SANDBOX_UID


#: the namespace helper: report, wait for the uid map, re-exec (to gain the namespace's
#: capabilities), cap nested user namespaces at 0, report again, then hold the namespace open
#: (a refused write must still answer: the caller waits for a line, and ``cat`` would never send one)
_NO_NESTED_USERNS = ("echo; read _; exec /bin/sh -c "
                     "'echo 0 >/proc/sys/user/max_user_namespaces && echo limited || echo refused; exec cat'")


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
        helper = subprocess.Popen(["unshare", "--user", "--", "/bin/sh", "-c", _NO_NESTED_USERNS],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert helper.stdout is not None and helper.stdin is not None
            if helper.stdout.readline() != b"\n":
                raise RuntimeError("could not create a user namespace (unshare --user failed)")
            mapping = f"0 0 1\n{SANDBOX_UID} {HOST_UID_WHEN_ROOT} 1\n"
            for name in ("uid_map", "gid_map"):
                Path(f"/proc/{helper.pid}/{name}").write_text(mapping)
            helper.stdin.write(b"\n")
            helper.stdin.flush()
            if helper.stdout.readline() != b"limited\n":
                raise RuntimeError("could not forbid nested user namespaces in the sandbox: writing "
                                   "user.max_user_namespaces was refused (a read-only /proc/sys, or this "
                                   "process runs with no_new_privs, as inside bwrap or a container started "
                                   "with no-new-privileges)")
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
