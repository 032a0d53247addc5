"""``MATH-ReAct-v0``: solve a math problem with a sandboxed bash tool (docs/protocol.md#math-tool, ES runner)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agent_envs.envs.args import EnvOptions
from agent_envs.envs.math_react.scoring import Scorer, math_score
from agent_envs.envs.math_react.spec import SPEC
from agent_envs.envs.react import EpisodeState, ReActEnv
from agent_envs.protocol.blocklist import is_blocked
from agent_envs.sandbox.local import LocalSandbox
from agent_envs.scoring.result import ScoreResult

#: the reference runner's command log, kept in the workspace of the unsandboxed parity runner
COMMAND_LOG = ".math_tool_commands.log"


class MathOptions(EnvOptions):
    scorer: Scorer = "auto"
    #: wall-clock limit of one math-verify call; not part of the config hash
    score_timeout_s: float = Field(default=10.0, gt=0, strict=True, exclude=True)
    blocklist: bool = Field(default=True, strict=True)


class MathReActEnv(ReActEnv):
    """50 turns, 4096 tokens per turn, no trajectory cap; score 0/1 on the last completion.

    ``scorer="exact"`` reproduces the published numbers (they came from the exact fallback alone);
    ``"auto"`` tries math-verify first, as the protocol's code path does.
    ``blocklist`` refuses privilege, process-control and desktop commands with the reference's
    observation; it is part of the protocol the models saw, and always on when commands run on
    the host (``sandbox="none"``).
    """

    env_spec = SPEC
    Options = MathOptions
    options: MathOptions

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        if not self.options.blocklist and self.sandbox_config.backend == "none":
            raise ValueError(
                'blocklist=False needs a sandbox: with sandbox="none" commands run on the host, '
                "where the blocklist is always on"
            )

    def _screen(self, tool: str, command: Any, runner: Any) -> str | None:
        """The reference runner logged every command, then refused blocked ones without running them.

        Only the unsandboxed parity runner keeps the log: it is a file the model can see there.
        """
        sandbox = runner.ensure_sandbox()
        on_host = isinstance(sandbox, LocalSandbox)
        if on_host:
            sandbox.log_command(COMMAND_LOG, command)
        if (self.options.blocklist or on_host) and is_blocked(command):
            return self.env_spec.tool(tool).blocked
        return None

    def _score(self, ep: EpisodeState) -> ScoreResult:
        return math_score(
            ep.last_completion,
            ep.task.answer,
            scorer=self.options.scorer,
            termination_reason=ep.termination_reason,
            used_bash=ep.used_bash,
            timeout_s=self.options.score_timeout_s,
        )


Env = MathReActEnv
