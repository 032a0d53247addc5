"""``PrimeCount-Python-v0`` as data: the python tool, the ``Action:`` grammar with this folder's
texts and prompts, the seeded generator as default data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_envs.core.spec import EnvSpec, ParserSpec, ReportFields, ReportSpec, Row, Rules
from agent_envs.envs.prime_count.baseline import baseline
from agent_envs.envs.prime_count.task import PrimeCountTask, generate
from agent_envs.protocol.tracelog import task_of
from agent_envs.tools.python import PYTHON

#: this environment's prompt files, beside its code
PROMPTS = Path(__file__).resolve().parent / "prompts"
#: size of the built-in dataset (``dataset="builtin"``); ``dataset_kwargs`` may change n and seed
BUILTIN_SIZE = 100

ACTION = 'Action:\n{"name": "python", "arguments": {"code": "<python code>"}}'
RULES = Rules(
    ParserSpec(),
    "You must run a python Action before answering. Count with a program, then provide Final answer.",
    f"No valid action was parsed. Use exactly:\n{ACTION}\nor finish after tool use with: Final answer: \\boxed{{<count>}}",
    no_input="No code was provided.",
)


def load_tasks(
    spec: Any = "builtin", *, n: int = BUILTIN_SIZE, seed: int = 0, limit: int | None = None
) -> list[PrimeCountTask]:
    """``"builtin"``: ``n`` generated tasks (offline, seeded); a list: task rows (``id``, ``low``, ``high``)."""
    if isinstance(spec, str) and spec == "builtin":
        return generate(n, seed)[:limit]
    if isinstance(spec, (list, tuple)):
        return [PrimeCountTask.model_validate(row) for row in list(spec)[:limit]]
    raise ValueError(f"PrimeCount-Python-v0 takes dataset='builtin' or a list of task rows, got {spec!r}")


def user_message(template: str, task: PrimeCountTask) -> str:
    return task.fill(template)


def task_fields(task: PrimeCountTask) -> dict[str, Any]:
    """The range, as records list it (the trace log and the report read it back)."""
    return {"low": task.low, "high": task.high}


def report_fields(row: Row) -> ReportFields:
    task = task_of(row)
    low, high = task.get("low"), task.get("high")
    if not (isinstance(low, int) and isinstance(high, int)):
        return ReportFields()
    gold = PrimeCountTask(id="report", low=low, high=high).answer
    return ReportFields(question=f"primes from {low} to {high}", gold=str(gold))


SPEC = EnvSpec(
    id="PrimeCount-Python-v0",
    entry_point="agent_envs.envs.prime_count.env:Env",
    rules={"es": RULES, "http_eval": RULES},
    tools=(PYTHON,),
    report=ReportSpec(trace_prefix="primecount", success_at=1.0, fields=report_fields),
    system_prompt="prime_count/system",
    user_prompt="prime_count/user",
    prompt_dir=PROMPTS,
    skill_separator="\n\nAdditional skill instructions:\n",
    max_turns=6,
    max_tokens_per_turn=1024,
    load_tasks=load_tasks,
    task_model=PrimeCountTask,
    user_message=user_message,
    task_fields=task_fields,
    baseline=baseline,
    score_metric="correct_answer",
    description="Count the primes in a range of integers with a persistent python tool.",
)
