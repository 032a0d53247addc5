"""The CLI's ``scripted`` Countdown baseline: search with the python tool, answer what it printed."""

from __future__ import annotations

import re
from typing import Any

from agent_envs.protocol.messages import action_text, last_observation_body, task_turn_text

#: an exhaustive search over the numbers, run inside the python tool (the baseline's one call)
SEARCH = """from fractions import Fraction as F
from itertools import permutations
def s(v):
    if len(v) == 1:
        return v[0]
    for i, j in permutations(range(len(v)), 2):
        (a, x), (b, y) = v[i], v[j]
        rest = [v[k] for k in range(len(v)) if k not in (i, j)]
        for val, e in ((a + b, f"({x} + {y})"), (a - b, f"({x} - {y})"), (a * b, f"({x} * {y})"),
                       (a / b if b else None, f"({x} / {y})")):
            if val is not None:
                r = s(rest + [(val, e)])
                if r and r[0] == T:
                    return r
    return None
r = s([(F(n), str(n)) for n in N])
print(r[1] if r else "none")"""


def baseline(request: Any) -> str:
    user = task_turn_text(request.messages)
    if user is not None:
        nums = re.search(r"Numbers: ([\d, ]+)", user)
        target = re.search(r"Target: (\d+)", user)
        setup = f"N = [{nums.group(1) if nums else ''}]\nT = {target.group(1) if target else 0}\n"
        return action_text("python", {"code": setup + SEARCH})
    found = last_observation_body(request.messages).strip().splitlines() or ["none"]
    return f"Final answer: \\boxed{{{found[0]}}}"
