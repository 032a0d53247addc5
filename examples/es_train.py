"""Kept for its command lines: ``python examples/es_train.py FLAGS`` is ``agent-envs es train FLAGS``
(``--eval-only``: ``agent-envs es evaluate-only``), every documented flag as before.

The run lives in the package (``agent_envs.esrun``: settings, run, command); a program drives it as::

    from agent_envs.esrun.command import run_settings
    from agent_envs.esrun.settings import parse_settings

    history = run_settings(parse_settings(["--model", M, "--train", "builtin", "--history", "h.json"]))

or opens the engines itself with ``agent_envs.esrun.run.open_run(settings)`` (the benchmarks do).

See ``agent-envs es train --help`` and docs/protocol.md#es-maths.
"""

from __future__ import annotations

import sys
from typing import Sequence

from agent_envs.esrun.command import main as es


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mode = "evaluate-only" if "--eval-only" in argv else "train"
    print(f"[es] examples/es_train.py is now: agent-envs es {mode} ...", file=sys.stderr)
    return es([mode, *argv])


if __name__ == "__main__":
    sys.exit(main())
