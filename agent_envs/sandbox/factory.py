"""Build a sandbox from whatever ``gym.make(..., sandbox=...)`` received."""
from __future__ import annotations

from typing import Any

from agent_envs.sandbox.base import Sandbox, SandboxConfig

BACKENDS = ("bwrap", "none", "docker")


def resolve_config(spec: SandboxConfig | str | dict[str, Any] | None) -> SandboxConfig:
    """``None`` -> bwrap defaults; ``"none"`` etc. -> that backend; a dict -> validated config."""
    if spec is None:
        config = SandboxConfig()
    elif isinstance(spec, SandboxConfig):
        config = spec
    elif isinstance(spec, str):
        config = SandboxConfig(backend=spec)
    elif isinstance(spec, dict):
        config = SandboxConfig.model_validate(spec)
    else:
        raise TypeError(f"sandbox must be a SandboxConfig, a backend name, a dict or None, "
                        f"not {type(spec).__name__}")
    if config.backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {config.backend!r}; expected one of {BACKENDS}")
    return config


def make_sandbox(spec: SandboxConfig | str | dict[str, Any] | None) -> Sandbox:
    config = resolve_config(spec)
    if config.backend == "bwrap":
        from agent_envs.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox(config)
    if config.backend == "none":
        from agent_envs.sandbox.local import LocalSandbox

        return LocalSandbox(config)
    from agent_envs.sandbox.docker import DockerSandbox

    return DockerSandbox(config)
