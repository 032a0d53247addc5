"""Docker tool sandbox: one locked-down container per episode, one ``docker exec`` per command.

Why a container: it offers the bwrap sandbox's contract (docs/protocol.md#tool-sandbox: no network, read-only
system, writable ephemeral /workspace and /tmp, the configured mounts, single-threaded
numeric libraries, no pip) on hosts where unprivileged user namespaces are unavailable, and
adds cgroup memory/pids limits.  The ``docker`` CLI is driven through subprocess (it honours
``DOCKER_HOST``), so no client library is needed.

Isolation between commands: every command runs under a per-sandbox uid distinct from the
container's keep-alive process, so ``kill -9 -1`` at the end of a command reaps every stray
background process without stopping the container, and ``RLIMIT_NPROC`` is not shared with
other episodes.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import subprocess
import time

from agent_envs.sandbox._bwrap_layout import with_ulimit
from agent_envs.sandbox.capture import StreamReader, captured, drain
from agent_envs.sandbox.base import (
    BASE_ENV,
    ExecResult,
    Sandbox,
    SandboxConfig,
    SandboxUnavailable,
    tmpfs_mib,
    remove_folders,
    staged_mounts,
)

LABEL = "agent-envs.sandbox"
WORKSPACE = "/workspace"
#: where the wrapper remembers the shell's working directory between commands
CWD_FILE = "/tmp/.agent_envs_cwd"
KEEPALIVE_UID = 65534
#: commands run as BASE + random, so RLIMIT_NPROC is per episode and kill -1 spares PID 1
COMMAND_UID_BASE = 200_000
#: extra host seconds granted to the docker CLI beyond the in-container timeout
HOST_GRACE_S = 15.0
#: how long the check before a run waits for the daemon (a TCP host that drops packets)
CHECK_TIMEOUT_S = 30

# $1 = timeout seconds, $2 = the bash program (ulimit + cwd trap + the model's command).
# The outer shell restores the cwd, runs the program under `timeout -s KILL` (which kills its
# whole process group), then kills every remaining process of this uid and waits (up to 5 s)
# until none is left: SIGKILL is delivered asynchronously, so a process could otherwise still
# be running, on a loaded host, when the call returns.  Its own stderr goes to /dev/null so that
# bash's "Killed" job report never reaches the model.
_WRAPPER = (
    f'cwd="$(cat {CWD_FILE} 2>/dev/null)"\ncd -- "${{cwd:-{WORKSPACE}}}" 2>/dev/null || cd {WORKSPACE}\n'
    "exec 3>&2 2>/dev/null\n"
    'timeout -s KILL "$1" /bin/bash --noprofile --norc -c "$2" 2>&3 3>&-\n'
    "rc=$?\nkill -9 -1\n"
    # is a process of this uid other than this shell still alive (a zombie is not)?
    'live() { for s in /proc/[0-9]*/status; do [ "$s" = "/proc/$$/status" ] && continue; z=\n'
    "while read -r k v _; do case $k in State:) z=$v;; Uid:) "
    '[ "$v" = "$UID" ] && [ "$z" != Z ] && return 0; break;; esac; done < "$s"; done; return 1; }\n'
    "n=0\nwhile live && [ $n -lt 500 ]; do kill -9 -1; sleep 0.01; n=$((n+1)); done\nexit $rc\n"
)

_LIVE: set[str] = set()


def _remove_containers(names: list[str]) -> None:
    if names and shutil.which("docker"):
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, timeout=60, check=False)


@atexit.register
def _remove_leftovers() -> None:
    """Remove containers of sandboxes that were never closed (crash, missing env.close())."""
    _remove_containers(sorted(_LIVE))
    _LIVE.clear()


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)


def _require_cli() -> None:
    if shutil.which("docker") is None:
        raise SandboxUnavailable("docker backend: the `docker` CLI is not on PATH (install docker.io)")


def _explain(image: str, stderr: str) -> str:
    """What a failed docker command means, with the fix, on one line."""
    host = os.environ.get("DOCKER_HOST", "the default socket")
    said = " ".join(stderr.split())
    if "Cannot connect" in stderr or "connect: " in stderr:
        return f"docker backend: no Docker daemon reachable at {host}: {said}"
    if "No such image" in stderr or "not found" in stderr:
        return (
            f"docker backend: image {image!r} is missing on {host}; build it "
            f"(docker build -t {image} . or docker/build_local_image.sh {image}): {said}"
        )
    return f"docker backend: cannot start a container: {said}"


class DockerSandbox(Sandbox):
    """One container per episode (``mode="persistent"``) or per command (``mode="fresh"``)."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        _require_cli()
        # the command uid is neither a file's owner nor in its group: only world-readable files work
        self._mounts, self._staged = staged_mounts(config, lambda p: not p.stat().st_mode & 0o004)
        self.sandbox_id = secrets.token_hex(6)
        self.uid = COMMAND_UID_BASE + secrets.randbelow(1 << 16)
        self._container: str | None = None
        self._closed = False

    @classmethod
    def check(cls, config: SandboxConfig) -> None:
        """The CLI, the daemon and the image, asked once (``docker image inspect`` needs all three)."""
        _require_cli()
        try:
            res = _docker("image", "inspect", "--format", "{{.Id}}", config.docker_image, timeout=CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            host = os.environ.get("DOCKER_HOST", "the default socket")
            raise SandboxUnavailable(
                f"docker backend: the Docker daemon at {host} did not answer within {CHECK_TIMEOUT_S} s"
            ) from None
        if res.returncode != 0:
            raise SandboxUnavailable(_explain(config.docker_image, res.stderr))

    # -- container lifecycle -------------------------------------------------------------
    def _run_args(self, name: str) -> list[str]:
        lim = self.config.limits
        args = [
            "run",
            "-d",
            "--pull",
            "never",
            "--name",
            name,
            "--label",
            f"{LABEL}={self.sandbox_id}",
            "--label",
            f"agent-envs.pid={os.getpid()}",
            "--init",
            "--network",
            "none",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            # workdir "/": docker would create /workspace with mode 755 under the tmpfs
            "--user",
            f"{KEEPALIVE_UID}:{KEEPALIVE_UID}",
            "--workdir",
            "/",
            "--pids-limit",
            str(lim.max_processes),
            "--tmpfs",
            f"{WORKSPACE}:rw,exec,size={tmpfs_mib(lim)}m,mode=1777",
            "--tmpfs",
            f"/tmp:rw,exec,size={tmpfs_mib(lim)}m,mode=1777",
            "--ulimit",
            f"nofile={lim.max_open_files}:{lim.max_open_files}",
            "--ulimit",
            f"fsize={lim.max_file_size_mib * 1024 * 1024}:{lim.max_file_size_mib * 1024 * 1024}",
            "--ulimit",
            f"cpu={lim.cpu_seconds}:{lim.cpu_seconds}",
            "--ulimit",
            f"nproc={lim.max_processes}:{lim.max_processes}",
        ]
        if lim.memory_gib is not None:
            mem = f"{max(64, int(lim.memory_gib * 1024))}m"
            args += ["--memory", mem, "--memory-swap", mem]
        for key, value in {**BASE_ENV, **self.config.env}.items():
            args += ["--env", f"{key}={value}"]
        for m in self._mounts:
            args += ["--mount", f"type=bind,source={m.host},target={m.target}" + (",readonly" if m.read_only else "")]
        return args + ["--entrypoint", "sleep", self.config.docker_image, "infinity"]

    def _ensure_container(self) -> str:
        if self._closed:
            raise RuntimeError("DockerSandbox.run after close()")
        if self._container is None:
            name = f"agent-envs-{self.sandbox_id}-{secrets.token_hex(3)}"
            _LIVE.add(name)
            res = _docker(*self._run_args(name))
            if res.returncode != 0:
                _LIVE.discard(name)
                _remove_containers([name])
                raise SandboxUnavailable(_explain(self.config.docker_image, res.stderr))
            self._container = name
        return self._container

    def _drop_container(self) -> None:
        if self._container is not None:
            _remove_containers([self._container])
            _LIVE.discard(self._container)
            self._container = None

    def _kill_strays(self) -> None:
        """Host-side fallback when the in-container cleanup did not finish in time."""
        if self._container is not None:
            res = _docker(
                "exec", "--user", f"{self.uid}:{self.uid}", self._container, "/bin/bash", "-c", "kill -9 -1", timeout=30
            )
            if res.returncode not in (0, 1):
                self._drop_container()

    # -- Sandbox API ---------------------------------------------------------------------
    def run(self, command: str, timeout: float | None = None) -> ExecResult:
        limit = self.config.limits.timeout_s if timeout is None else timeout
        container = self._ensure_container()
        try:
            return self._exec(container, command, limit)
        finally:
            if self.config.mode == "fresh":
                self._drop_container()

    def _program(self, command: str) -> str:
        return with_ulimit(self.config.limits, f"trap 'pwd >| {CWD_FILE} 2>/dev/null' EXIT; {command}")

    def _exec(self, container: str, command: str, limit: float) -> ExecResult:
        argv = [
            "docker",
            "exec",
            "--user",
            f"{self.uid}:{self.uid}",
            container,
            "/bin/bash",
            "--noprofile",
            "--norc",
            "-c",
            _WRAPPER,
            "agent-envs",
            f"{limit:g}",
            self._program(command),
        ]
        keep = self.config.limits.capture_keep
        start = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except (OSError, ValueError) as exc:
            return ExecResult(returncode=126, launch_error=str(exc), timeout_s=limit)
        with proc:
            assert proc.stdout is not None and proc.stderr is not None
            out = StreamReader(proc.stdout.fileno(), keep)
            err = StreamReader(proc.stderr.fileno(), keep)
            expired = not drain(out, err, start + limit + HOST_GRACE_S)
            if expired:
                proc.kill()
            rc = proc.wait()
        elapsed = time.monotonic() - start
        if expired:
            self._kill_strays()
        # `timeout -s KILL` takes itself down with its process group, so a timeout reads as 137
        timed_out = expired or (rc == 137 and elapsed >= limit)
        streams = captured(out, err)
        if not timed_out and self._container_gone(rc, streams["stderr"]):
            return ExecResult(
                returncode=126,
                launch_error=streams["stderr"].decode(errors="replace").strip(),
                duration_s=elapsed,
                timeout_s=limit,
            )
        return ExecResult(
            returncode=124 if timed_out else rc,
            timed_out=timed_out,
            **streams,
            duration_s=elapsed,
            timeout_s=limit,
            meta={"container": container},
        )

    def _container_gone(self, rc: int, stderr: bytes) -> bool:
        """A docker-level failure (container died) rather than the command's own exit status."""
        if rc not in (1, 125, 126) or not stderr.startswith(b"Error response from daemon"):
            return False
        state = _docker("inspect", "-f", "{{.State.Running}}", self._container or "")
        if state.stdout.strip() == "true":
            return False
        self._drop_container()
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._drop_container()
        remove_folders(self._staged)
        self._staged = []
