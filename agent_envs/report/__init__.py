"""``agent-envs report``: one self-contained HTML page per run (or comparison of runs), built
from the run folders' records alone, for people inspecting an evaluation."""

from .build import build_report, default_output
from .load import RunError

__all__ = ["build_report", "default_output", "RunError"]
