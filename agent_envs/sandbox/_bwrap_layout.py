"""What a bubblewrap sandbox contains (docs/protocol.md#tool-sandbox), as a bwrap argument list.

Kept apart from process management so that the layout can be read (and tested) on its own:
read-only system directories and the running Python's prefixes, pip hidden, writable size-capped
tmpfs ``/tmp`` and ``/workspace``, the configured mounts, and a cleared environment.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from agent_envs.core.spec import Mount
from agent_envs.sandbox.base import BASE_ENV, SandboxConfig, SandboxLimits, SandboxUnavailable, tmpfs_mib

SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/usr/local", "/etc/alternatives")
#: the uid/gid a command has inside the sandbox
SANDBOX_UID = 1000
#: when the host user is root, sandbox processes run as this host uid: RLIMIT_NPROC is never
#: enforced for host root (kuid 0), even inside a user namespace, so a fork bomb would not stop
HOST_UID_WHEN_ROOT = 65534
INSTALL_HINT = (
    "bubblewrap (bwrap) is required for sandbox='bwrap': install the Debian package "
    "`bubblewrap` (apt-get install bubblewrap), or pass sandbox='none' to run commands "
    "unsandboxed on the host"
)


@functools.lru_cache(maxsize=1)
def find_bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(INSTALL_HINT)
    return path


@functools.lru_cache(maxsize=1)
def bwrap_usable() -> tuple[bool, str]:
    """Whether bubblewrap can build a sandbox here, by actually starting one.

    Inside a container started with Docker's default seccomp/AppArmor profile and masked
    /proc paths, bwrap cannot create user namespaces or mount /proc; the caller then falls
    back to the container-as-boundary mode (see docs/docker.md).
    """
    try:
        bwrap = find_bwrap()
    except SandboxUnavailable:
        return False, "bwrap is not installed"
    probe = [
        bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "true",
    ]
    try:
        res = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap probe failed: {exc}"
    if res.returncode != 0:
        return False, f"bwrap probe exited {res.returncode}: {res.stderr.strip() or 'no message'}"
    return True, "bwrap works"


@functools.lru_cache(maxsize=1)
def supports_size() -> bool:
    """``--size`` (tmpfs size caps) exists since bubblewrap 0.5."""
    res = subprocess.run([find_bwrap(), "--help"], capture_output=True, text=True, check=False)
    return "--size" in res.stdout


def runtime_prefixes(config: SandboxConfig) -> list[str]:
    """Configured prefixes, ``$AGENT_ENVS_TOOL_PREFIX``, then ``sys.prefix`` and ``sys.base_prefix``; existing, each once."""
    env_prefix = os.environ.get("AGENT_ENVS_TOOL_PREFIX")
    candidates = [*config.runtime_prefixes, *([env_prefix] if env_prefix else []), sys.prefix, sys.base_prefix]
    out: list[str] = []
    seen: set[str] = set()
    for p in candidates:
        real = os.path.realpath(p)
        if os.path.isdir(real) and real not in seen:
            seen.add(real)
            out.append(os.path.abspath(p))
    return out


def _covered(path: str, bound: Sequence[str]) -> bool:
    return any(path == b or path.startswith(b.rstrip("/") + "/") for b in bound)


def _bind_args(prefixes: list[str]) -> list[str]:
    args: list[str] = []
    bound: list[str] = []  # resolved sources
    made: set[str] = set()
    for p in (*SYSTEM_DIRS, *prefixes):
        if not os.path.exists(p):
            continue
        real = os.path.realpath(p)
        if real in bound or (p in prefixes and _covered(real, bound)):
            continue
        for parent in reversed(Path(p).parents):
            s = str(parent)
            if s != "/" and s not in made and not _covered(s, SYSTEM_DIRS):
                args += ["--perms", "0755", "--dir", s]
                made.add(s)
        args += ["--ro-bind", p, p]
        bound.append(real)
    return args


@functools.lru_cache(maxsize=8)
def _pip_hiding_args(prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """Shadow pip executables with /dev/null and hide pip (and ensurepip) packages."""
    args: list[str] = []
    seen: set[str] = set()
    for prefix in (*prefixes, "/usr", "/usr/local", "/"):
        root = Path(prefix)
        for exe in (*root.glob("bin/pip"), *root.glob("bin/pip3"), *root.glob("bin/pip3.*")):
            if str(exe) not in seen and exe.exists():
                seen.add(str(exe))
                args += ["--ro-bind", "/dev/null", str(exe)]
        for pattern in ("lib/python*/site-packages/pip", "lib/python*/dist-packages/pip", "lib/python*/ensurepip"):
            for d in root.glob(pattern):
                if str(d) not in seen and d.is_dir():
                    seen.add(str(d))
                    args += ["--tmpfs", str(d)]
    return tuple(args)


@functools.lru_cache(maxsize=8)
def _startup_hook_args(prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """Shadow the host's executable ``.pth`` start-up hooks with /dev/null.

    They serve the host (editable installs, setuptools shims, CA injection for an egress proxy),
    run code in every sandboxed ``python3`` and, here, tripled its start-up time (site imported
    certifi, importlib.resources and pathlib for a proxy the sandbox cannot reach).  Path-only
    ``.pth`` files and legacy ``*-nspkg.pth`` namespace hooks stay.
    """
    args: list[str] = []
    for prefix in prefixes:
        for pth in sorted(Path(prefix).glob("lib/python*/*-packages/*.pth")):
            if pth.name.endswith("-nspkg.pth"):
                continue
            try:
                hook = any(line.startswith(("import ", "import\t")) for line in pth.read_text().splitlines())
            except (OSError, UnicodeDecodeError):
                continue
            if hook:
                args += ["--ro-bind", "/dev/null", str(pth)]
    return tuple(args)


def environment(config: SandboxConfig, prefixes: list[str]) -> dict[str, str]:
    bins = [f"{p}/bin" for p in prefixes if os.path.isdir(f"{p}/bin")]
    return {**BASE_ENV, "PATH": ":".join([*bins, "/usr/local/bin", "/usr/bin", "/bin"]), **config.env}


def _tmpfs(path: str, perms: str, limits: SandboxLimits) -> list[str]:
    size = ["--size", str(tmpfs_mib(limits) * 1024 * 1024)] if supports_size() else []
    return ["--perms", perms, *size, "--tmpfs", path]


def layout_args(config: SandboxConfig, mounts: list[Mount]) -> list[str]:
    """Everything between ``bwrap`` and the namespace flags: mounts, cwd and environment."""
    prefixes = runtime_prefixes(config)
    args = [
        "--new-session",
        "--die-with-parent",
        "--clearenv",
        *_bind_args(prefixes),
        *_pip_hiding_args(tuple(prefixes)),
        *_startup_hook_args(tuple(prefixes)),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        *_tmpfs("/tmp", "1777", config.limits),
        *_tmpfs("/workspace", "0777", config.limits),
    ]
    for m in mounts:
        args += ["--ro-bind" if m.read_only else "--bind", m.host, m.target]
    args += ["--chdir", "/workspace"]
    for key, value in environment(config, prefixes).items():
        args += ["--setenv", key, value]
    return args


def set_rlimits(limits: SandboxLimits) -> None:
    """Runs in the forked child before exec.  NPROC is set inside (see :func:`command_prefix`)."""
    pairs = [
        (resource.RLIMIT_FSIZE, limits.max_file_size_mib * 1024 * 1024),
        (resource.RLIMIT_NOFILE, limits.max_open_files),
        (resource.RLIMIT_CPU, limits.cpu_seconds),
    ]
    if limits.memory_gib is not None:
        pairs.append((resource.RLIMIT_AS, memory_kib(limits) * 1024))
    for which, value in pairs:
        hard = resource.getrlimit(which)[1]
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (cap, cap))


def memory_kib(limits: SandboxLimits) -> int:
    if limits.memory_gib is None:
        raise ValueError("no memory limit configured")
    return max(1024, int(limits.memory_gib * 1024 * 1024))


def with_ulimit(limits: SandboxLimits, command: str) -> str:
    """``command`` behind the shell's address-space cap (``ulimit -v``), when one is configured."""
    return f"ulimit -v {memory_kib(limits)}; {command}" if limits.memory_gib is not None else command


def command_prefix(limits: SandboxLimits, as_root: bool) -> list[str]:
    """Programs exec'd inside the sandbox before bash: drop to the sandbox uid, cap processes.

    NPROC is applied inside because it is counted per user namespace there, and outside it would
    also count every host process of the invoking user.
    """
    drop = (
        [
            "setpriv",
            f"--reuid={SANDBOX_UID}",
            f"--regid={SANDBOX_UID}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ]
        if as_root
        else []
    )
    n = limits.max_processes
    return [*drop, "prlimit", f"--nproc={n}:{n}", "--"]
