"""Build a sandbox from whatever ``gym.make(..., sandbox=...)`` received."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent_envs.sandbox._bwrap_layout import bwrap_usable
from agent_envs.sandbox.base import Sandbox, SandboxConfig, tmpfs_budget_mib
from agent_envs.core.validation import invalid

BACKENDS = ("bwrap", "none", "docker")
MODES = ("persistent", "fresh")
log = logging.getLogger("agent_envs.sandbox")


def resolve_config(spec: SandboxConfig | str | dict[str, Any] | None) -> SandboxConfig:
    """``None`` -> bwrap defaults; ``"none"`` etc. -> that backend; a dict -> validated config."""
    if spec is None:
        config = SandboxConfig()
    elif isinstance(spec, SandboxConfig):
        config = spec
    elif isinstance(spec, str):
        config = SandboxConfig(backend=spec)
    elif isinstance(spec, dict):
        try:
            config = SandboxConfig.model_validate(spec)
        except ValidationError as exc:
            raise invalid("sandbox config", exc) from None
    else:
        raise TypeError(f"sandbox must be a SandboxConfig, a backend name, a dict or None, not {type(spec).__name__}")
    if config.backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {config.backend!r}; expected one of {BACKENDS}")
    if config.mode not in MODES:
        raise ValueError(f"unknown sandbox mode {config.mode!r}; expected one of {MODES}")
    tmpfs_budget_mib()  # a bad $AGENT_ENVS_TMPFS_BUDGET_MIB is refused here, not in every episode
    return config


def in_container() -> bool:
    """True inside a Docker (or similar OCI) container."""
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    try:
        return any(k in Path("/proc/1/cgroup").read_text() for k in ("docker", "containerd", "kubepods"))
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def _container_is_boundary() -> bool:
    """Inside a container where bwrap cannot build namespaces, the container is the sandbox.

    Logged once; outside a container an unusable bwrap stays an error (BwrapSandbox says why).
    """
    if not in_container():
        return False
    usable, reason = bwrap_usable()
    if not usable:
        log.warning(
            "bubblewrap cannot run in this container (%s): running tools unsandboxed inside the "
            "container, which is then the only boundary (see docs/docker.md)",
            reason,
        )
    return not usable


def effective(config: SandboxConfig) -> SandboxConfig:
    """``config`` as it will run: bwrap becomes "none" where the container is the boundary."""
    if config.backend == "bwrap" and _container_is_boundary():
        return config.model_copy(update={"backend": "none"})
    return config


def backend_class(backend: str) -> type[Sandbox]:
    """The class of a backend, imported on first use (each pulls in what only it needs)."""
    if backend == "bwrap":
        from agent_envs.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox
    if backend == "none":
        from agent_envs.sandbox.local import LocalSandbox

        return LocalSandbox
    if backend == "docker":
        from agent_envs.sandbox.docker import DockerSandbox

        return DockerSandbox
    raise ValueError(f"unknown sandbox backend {backend!r}; expected one of {BACKENDS}")


def missing_capabilities(config: SandboxConfig, needs: frozenset[str]) -> list[str]:
    """Which of ``needs`` the backend ``config`` runs on lacks (sorted; empty when it has them all)."""
    return sorted(needs - backend_class(effective(config).backend).capabilities)


def backends_with(needs: frozenset[str]) -> list[str]:
    """The backends that have every capability in ``needs``, in :data:`BACKENDS` order."""
    return [b for b in BACKENDS if needs <= backend_class(b).capabilities]


def check_backend(spec: SandboxConfig | str | dict[str, Any] | None) -> None:
    """Raise :class:`~agent_envs.sandbox.base.SandboxUnavailable` when ``spec``'s backend cannot run
    here (a run asks before its first episode, so a missing daemon is not every episode's error)."""
    config = effective(resolve_config(spec))
    backend_class(config.backend).check(config)


def make_sandbox(spec: SandboxConfig | str | dict[str, Any] | None) -> Sandbox:
    config = effective(resolve_config(spec))
    return backend_class(config.backend)(config)
