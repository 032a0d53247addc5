"""The ``bash`` tool: one shell command per call in the episode's sandbox, framed as an observation."""
from __future__ import annotations

from agent_envs.core.spec import Framing
from agent_envs.core.types import error_text
from agent_envs.sandbox.base import Sandbox, SandboxConfig
from agent_envs.sandbox.factory import make_sandbox
from agent_envs.sandbox.output import LAUNCH_ERROR_PREFIX, format_observation


class BashTool:
    """Runs commands in one sandbox; ``run`` returns the observation text and never raises."""

    name = "bash"

    def __init__(self, config: SandboxConfig, framing: Framing, limit: int) -> None:
        self.config = config
        self.sandbox: Sandbox | None = make_sandbox(config)
        self.framing = framing
        self.limit = limit

    def run(self, command: str) -> str:
        if self.sandbox is None:  # closed after a failure: the next command gets a fresh one
            self.sandbox = make_sandbox(self.config)
        try:
            result = self.sandbox.run(command)
        except Exception as exc:  # a dead sandbox must not end a user's training loop
            self.close()
            return LAUNCH_ERROR_PREFIX + error_text(exc)
        return format_observation(result, self.framing, self.limit)

    def close(self) -> None:
        if self.sandbox is not None:
            sandbox, self.sandbox = self.sandbox, None
            sandbox.close()
