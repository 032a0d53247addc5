"""The CLI's ``scripted`` Math baseline, a scripted reference (not a model): one real bash call that
computes the answer, then an answer read off its output.

For each family of the built-in synthetic problems (:mod:`agent_envs.envs.math_react.synth`) it
writes the short brute-force or textbook program a capable model would run, from the numbers in
the question alone (it never reads the gold answer); a question of any other form gets the last
number in it printed back, so a run on another data set still shows the protocol's two turns.
"""

from __future__ import annotations

import re
from typing import Any

from agent_envs.protocol.messages import action_text, last_observation_body, task_turn_text

#: trial division of the number ``n`` (every built-in problem's numbers have small prime factors):
#: leaves ``f``, its prime factorisation
_FACTOR = "f=dict()\nx=n\np=2\nwhile x>1:\n while x%p==0: f[p]=f.get(p,0)+1; x//=p\n p+=1\n"
_LEGENDRE = "def v(p):\n t,q=0,p\n while q<=m: t+=m//q; q*=p\n return t\n"

#: (question pattern, program over its groups g[0], g[1], ...), one per built-in family
PROGRAMS: tuple[tuple[str, str], ...] = (
    (r"remainder when (\d+)\^(\d+) is divided by (\d+)", "print(pow({0}, {1}, {2}))"),
    (
        r"1 <= k <= (\d+) satisfy gcd\(k, (\d+)\) = 1",
        "from math import gcd\nprint(sum(gcd(k, {1}) == 1 for k in range(1, {0} + 1)))",
    ),
    (
        r"from \(0, 0\) to \((\d+), (\d+)\).*avoid the point \((\d+), (\d+)\)",
        "from math import comb\nprint(comb({0} + {1}, {0}) - comb({2} + {3}, {2}) * comb({0} - {2} + {1} - {3}, {0} - {2}))",
    ),
    (
        r"sum of all positive divisors of (\d+)",
        "n={0}\n" + _FACTOR + "s=1\nfor p, e in f.items(): s*=(p**(e+1)-1)//(p-1)\nprint(s)",
    ),
    (r"How many positive divisors does (\d+) have", "n={0}\n" + _FACTOR + "s=1\nfor e in f.values(): s*=e+1\nprint(s)"),
    (
        r"Write ((?:1/\d+ \+ )*1/\d+) as a fraction",
        "from fractions import Fraction\nt=sum(Fraction(*map(int, u.split('/'))) for u in {0!r}.split(' + '))\n"
        "print(t.numerator + t.denominator)",
    ),
    (
        r"trailing zeros does (\d+)! have when written in base (\d+)",
        "m={0}\nn={1}\n" + _FACTOR + _LEGENDRE + "print(min(v(p)//e for p, e in f.items()))",
    ),
)


def program(question: str) -> str:
    """The Python program that answers ``question``: its family's, else one printing its last number."""
    for pattern, source in PROGRAMS:
        found = re.search(pattern, question, re.DOTALL)
        if found:
            return source.format(*found.groups())
    numbers = re.findall(r"\d+", question) or ["0"]
    return f"print({numbers[-1]})"


def baseline(request: Any) -> str:
    task = task_turn_text(request.messages)
    if task is not None:
        return action_text("bash", {"command": f'python3 -c "{program(task)}"'})
    found = re.findall(r"-?\d+", last_observation_body(request.messages)) or ["0"]
    return f"Final answer: \\boxed{{{found[0]}}}"
