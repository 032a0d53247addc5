"""``bash scripts/run_main.sh``, the README's first command, end to end on an empty model cache: it
installs, converts the embedded model, evaluates every text environment with it and with the
scripted reference, and writes one report in which every environment shows real tool calls, and
the base SmolLM2 beside the ES-trained one (agent_envs.es.trained_model) with their paired comparison.
The ES part replays only the first 2 of the shipped 300 generations and answers 2 tasks (the full
replay takes minutes of CPU; tests/test_es_trained_model.py checks its bits).

The installation runs into a virtual environment made here on top of this interpreter's packages,
so ``pip install -e .`` never re-points the machine's own installation at this checkout."""

from __future__ import annotations

import os
import re
import subprocess
import venv
from html import unescape
from pathlib import Path

import pytest

from agent_envs.core.cache import is_complete

REPO = Path(__file__).resolve().parent.parent


def reference_call(env_id: str) -> str:
    """The start of the scripted reference's first tool call on the first built-in task, as the report
    prints a parsed action (``name$ command``, or ``name (argument):`` and the text's first line)."""
    import gymnasium as gym

    from agent_envs.envs.registry import spec
    from agent_envs.protocol.parsing import parse_action

    first = spec(env_id).load_tasks("builtin", limit=1)[0]  # the main job evaluates the first built-in tasks
    env = gym.make(env_id, dataset="builtin", sandbox="bwrap")
    try:
        env.reset(seed=0, options={"task": first})
        unwrapped = env.unwrapped
        action = parse_action(spec(env_id).baseline(unwrapped.generation_request()), unwrapped.rules.parser)
    finally:
        env.close()
    assert action is not None, env_id
    ((key, value),) = action["arguments"].items()
    line = value.splitlines()[0][:6]
    return f"{action['name']}$ {line}" if key == "command" else f"{action['name']} ({key}):\n{line}"


def main_job_envs() -> tuple[str, ...]:
    import runpy

    return runpy.run_path(str(REPO / "scripts" / "main_job.py"), run_name="main_job_envs")["ENVS"]


@pytest.mark.parametrize("env_id", main_job_envs())
def test_the_scripted_reference_solves_the_main_jobs_tasks(env_id):
    """The report's reference shows a solved episode for every environment: on the main job's tasks
    (the first 2 built-in ones) its real tool calls in a bwrap sandbox, as eval runs them, lead to
    scored answers (it answered 1 to every Math task and an OCR's first line on DocVQA, scoring 0)."""
    from agent_envs.envs.registry import spec
    from agent_envs.policy.scripted import ScriptedPolicy
    from agent_envs.rollout.runner import run_episodes

    tasks = spec(env_id).load_tasks("builtin", limit=2)
    policy = ScriptedPolicy(spec(env_id).baseline)
    records = [r.row() for r in run_episodes(env_id, tasks, policy, env_kwargs={"sandbox": "bwrap"}, progress=False)]
    assert [(r["used_bash"], r["termination_reason"]) for r in records] == [(True, "final_answer")] * 2
    assert all(r["score"] > 0 for r in records), [(r["task_id"], r["score"]) for r in records]


def test_the_main_job_covers_every_text_environment():
    """Each environment once, in its ReAct form: left out are only the one that needs a
    vision-language model and the native-tool-call variants (the same tasks in another action format)."""
    from agent_envs.envs.registry import ENV_IDS, spec

    envs = main_job_envs()
    assert envs[0] == ENV_IDS[0] and all(spec(e).baseline is not None for e in envs)
    assert not any("view" in spec(e).tool_names for e in envs)
    left_out = [e for e in ENV_IDS if e not in envs]
    assert left_out and all(
        "view" in spec(e).tool_names or any(r.parser.native_tool_calls for r in spec(e).rules.values())
        for e in left_out
    )


def episodes(html: str) -> dict[str, str]:
    """The report's episode articles by their heading (``run · key``), HTML entities decoded."""
    found = {}
    for article in html.split('<article class="episode"')[1:]:
        heading = re.search(r"<h3>(.*?)</h3>", article, re.S)
        found[unescape(heading.group(1))] = unescape(article.split("</article>", 1)[0])
    return found


@pytest.mark.slow
def test_run_main_on_an_empty_model_cache(tmp_path: Path, smollm2_gguf: Path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    model = tmp_path / "empty-cache" / "smollm2-hf"
    out = tmp_path / "main"
    env = {
        **os.environ,
        "PYTHON": str(env_dir / "bin" / "python"),
        "AGENT_ENVS_SMOLLM2_HF": str(model),
        "AGENT_ENVS_MAIN_OUT": str(out),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", "scripts/run_main.sh", "--es-generations", "2", "--es-tasks", "2"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert is_complete(model)  # converted into the new cache, once

    envs = main_job_envs()
    lines = proc.stdout.splitlines()
    assert any(line.startswith("[main] installed in ") for line in lines), log[-3000:]
    # the six runs' progress (the ES side-by-side prints its own afterwards)
    progress = [line for line in lines if re.match(r"\[main\] \d+:\d\d  ", line) and "reference" in line]
    assert progress and all(e in progress[-1] for e in envs) and "reference 2/2" in progress[-1]
    timing = next(line for line in lines if line.startswith("[main] time: "))
    assert all(phase in timing for phase in ("install", "caches", "evaluation", "report", "total"))
    report = (out / "report.html").resolve()
    assert lines[-1].startswith(f"[main] report: {report}") and f"xdg-open {report}" in lines[-1]

    html = report.read_text()
    about = html.split('<section id="about">', 1)[1].split("</section>", 1)[0]
    shown = episodes(html)
    for env_id in envs:
        for policy in ("smollm2-135m", "scripted-reference"):
            run = f"{env_id}.{policy}"
            assert f">{run}</span>" in about, run
            assert sum(heading.startswith(f"{run} · ") for heading in shown) == 2, run
        calls = [
            body
            for heading, body in shown.items()
            if heading.startswith(f"{env_id}.") and '<pre class="action">' in body and '<pre class="obs">' in body
        ]
        call = reference_call(env_id)
        assert any(call in body for body in calls), f"no {call} tool call for {env_id}"
    assert "SmolLM2-135M-Instruct (embedded, CPU)" in about and "scripted reference policy (no model)" in about
    assert "--policy vllm --model" in about and "--base-url" in about

    # the base and the ES-trained model side by side, on the same tasks, with the difference and its interval
    es = [f"Countdown-ReAct-v0.fewshot.{label}" for label in ("smollm2-135m-base", "smollm2-135m-es-first2")]
    assert all(f">{run}</span>" in about for run in es)
    comparison = html.split('<section id="comparison">', 1)[1].split("</section>", 1)[0]
    assert f"Comparison: {es[1]} vs {es[0]}" in comparison and "over 2 paired tasks" in comparison
    assert "95% bootstrap CI [" in comparison
    summary = next(line for line in lines if line.startswith("[main] ES-trained minus base on 2 tasks: "))
    assert "delta " in summary and "95% CI [" in summary
    assert any("the fingerprints after generations 2 (of 300) all equal the GPU's" in line for line in lines), log[
        -3000:
    ]
