"""``MATH-ReAct-v0``: solve a math problem with a sandboxed bash tool (docs/protocol.md#math-tool, ES runner)."""
from __future__ import annotations

from typing import Any

from agent_envs.envs.math_react.scoring import SCORERS, math_score
from agent_envs.envs.math_react.spec import SPEC
from agent_envs.envs.react import EpisodeState, ReActEnv
from agent_envs.protocol.blocklist import is_blocked
from agent_envs.sandbox.local import LocalSandbox

#: the reference runner's command log, kept in the workspace of the unsandboxed parity runner
COMMAND_LOG = ".math_tool_commands.log"


class MathReActEnv(ReActEnv):
    """50 turns, 4096 tokens per turn, no trajectory cap; score 0/1 on the last completion.

    ``scorer="exact"`` reproduces the published numbers (they came from the exact fallback alone);
    ``"auto"`` tries math-verify first, as the protocol's code path does.
    ``blocklist`` refuses privilege, process-control and desktop commands with the reference's
    observation; it is part of the protocol the models saw, and always on when commands run on
    the host (``sandbox="none"``).
    """

    env_spec = SPEC

    def __init__(self, *, scorer: str = "auto", score_timeout_s: float = 10.0, blocklist: bool = True,
                 **kwargs: Any):
        if scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {SCORERS}, got {scorer!r}")
        if not isinstance(blocklist, bool):
            raise TypeError(f"blocklist must be True or False, got {blocklist!r}")
        self.scorer = scorer
        self.score_timeout_s = score_timeout_s
        self.blocklist = blocklist
        super().__init__(**kwargs)
        if not blocklist and self.sandbox_config.backend == "none":
            raise ValueError('blocklist=False needs a sandbox: with sandbox="none" commands run on the host, '
                             "where the blocklist is always on")

    def _extra_config(self) -> dict[str, Any]:
        return {"scorer": self.scorer, "blocklist": self.blocklist}

    def _screen(self, tool: str, command: str, runner: Any) -> str | None:
        """The reference runner logged every command, then refused blocked ones without running them.

        Only the unsandboxed parity runner keeps the log: it is a file the model can see there.
        """
        sandbox = runner.ensure_sandbox()
        on_host = isinstance(sandbox, LocalSandbox)
        if on_host:
            sandbox.log_command(COMMAND_LOG, command)
        if (self.blocklist or on_host) and is_blocked(command):
            return self.env_spec.tools[tool].blocked
        return None

    def _score(self, ep: EpisodeState) -> dict[str, Any]:
        result = math_score(
            ep.last_completion,
            ep.task.answer,
            scorer=self.scorer,
            termination_reason=ep.termination_reason,
            used_bash=ep.used_bash,
            timeout_s=self.score_timeout_s,
        )
        return {
            "answer": ep.task.answer,
            "score": result.score,
            "score_method": result.label,
            "score_status": result.status,
            "answer_status": result.answer_status,
            "prediction": result.prediction,
        }


Env = MathReActEnv
