"""The ``bash`` tool: one shell command per call in the episode's sandbox, framed as an observation."""

from __future__ import annotations

from agent_envs.core.spec import Framing, ToolSpec
from agent_envs.core.types import InfrastructureError, error_text
from agent_envs.sandbox.base import Sandbox, SandboxConfig
from agent_envs.sandbox.factory import make_sandbox
from agent_envs.sandbox.output import LAUNCH_ERROR_PREFIX, format_observation


class BashTool:
    """Runs commands in one sandbox; ``run`` returns the observation text and never raises."""

    name = "bash"

    def __init__(self, config: SandboxConfig, framing: Framing, limit: int) -> None:
        self.config = config
        self.sandbox: Sandbox | None = make_sandbox(config)
        self.closed = False
        self.framing = framing
        self.limit = limit

    def ensure_sandbox(self) -> Sandbox:
        """The sandbox; after a failure dropped it, the next command gets a fresh one.  After
        :meth:`close` none: a close from another thread (a runner's Ctrl-C) must not be undone
        by a command that was on its way."""
        if self.closed:
            raise InfrastructureError("the bash tool was closed; its command was not run")
        if self.sandbox is None:
            self.sandbox = make_sandbox(self.config)
        return self.sandbox

    def run(self, command: str) -> str:
        sandbox = self.ensure_sandbox()
        try:
            result = sandbox.run(command)
        except InfrastructureError:  # the machine's fault, never the model's observation (docs/reliability.md)
            self._drop()
            raise
        except Exception as exc:  # a dead sandbox must not end a user's training loop
            self._drop()
            return LAUNCH_ERROR_PREFIX + error_text(exc)
        return format_observation(result, self.framing, self.limit)

    def _drop(self) -> None:
        if self.sandbox is not None:
            sandbox, self.sandbox = self.sandbox, None
            sandbox.close()

    def close(self) -> None:
        self.closed = True
        self._drop()


#: the declaration: ``{"command": "<shell command>"}``; an environment sets its own framing and
#: blocklist text with ``BASH.with_(framing=..., blocked=...)``
BASH = ToolSpec(
    "bash", BashTool, argument="command", placeholder="<shell command>", description="runs a shell command."
)
