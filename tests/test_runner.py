"""The rollout runner with real environments and real sandboxes: determinism in both modes,
lockstep == async, failures become records, resume, and Ctrl-C leaves nothing behind."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import pytest

from agent_envs.policy.base import Completion, GenerationRequest, Policy
from agent_envs.rollout.metrics import summarize
from agent_envs.rollout.records import EpisodeRecord, read_jsonl
from agent_envs.rollout.runner import run_episodes, strip_timings

REPO = Path(__file__).resolve().parent.parent
TASKS = [
    {"id": f"mul-{a}x{b}", "question": f"What is {a}*{b}?", "answer": str(a * b)}
    for a, b in [(6, 7), (12, 13), (3, 99), (21, 4), (5, 5)]
]


def _bash(cmd: str) -> str:
    return "I will compute it.\nAction: " + json.dumps({"name": "bash", "arguments": {"command": cmd}})


class SeededMathPolicy(Policy):
    """Deterministic in (messages, seed): multiplies with python3 in the sandbox, sometimes takes a
    detour (a format slip or an extra command), sometimes answers off by one."""

    name = "seeded-math"

    def __init__(self, fail_keys: Sequence[str] = ()):
        self.fail_keys = set(fail_keys)
        self.calls = 0

    def complete(self, request: GenerationRequest) -> Completion:
        self.calls += 1
        if request.key in self.fail_keys:
            raise RuntimeError(f"backend refused {request.key}")
        rng = random.Random(request.seed)
        turn = sum(1 for m in request.messages if m["role"] == "assistant")
        a, b = map(int, re.search(r"What is (\d+)\*(\d+)\?", request.messages[1]["content"]).groups())
        last = request.messages[-1]["content"]
        if turn == 0:
            text = "hmm" if rng.random() < 0.3 else _bash(f"python3 -c 'print({a}*{b})'")
        elif "[exit_code]" not in last:
            text = _bash(f"python3 -c 'print({a}*{b})'") if rng.random() < 0.8 else _bash("echo checking")
        else:
            value = int(re.findall(r"-?\d+", last.split("\n", 1)[1])[0])
            text = f"Final answer: \\boxed{{{value + (1 if rng.random() < 0.25 else 0)}}}"
        return Completion(text=text, engine="seeded")

    def generate(self, requests):
        return [self.complete(r) for r in requests]


def _run(mode: str, policy: Policy | None = None, **kw) -> list[EpisodeRecord]:
    kw.setdefault("env_kwargs", {"sandbox": "bwrap", "max_turns": 6})
    return run_episodes(
        "MATH-ReAct-v0", TASKS, policy or SeededMathPolicy(), samples=3, mode=mode, concurrency=4, progress=False, **kw
    )


@pytest.fixture(scope="module")
def lockstep_records() -> list[EpisodeRecord]:
    return _run("lockstep")


def test_lockstep_runs_real_episodes_in_row_major_order(lockstep_records):
    recs = lockstep_records
    assert [r.key for r in recs] == [f"{t['id']}:sample{s:02d}" for t in TASKS for s in range(3)]
    assert [(r.row_index, r.sample_index) for r in recs] == [(i, s) for i in range(5) for s in range(3)]
    assert all(r.seed == 20260627 + r.sample_index * 1_000_003 + r.row_index for r in recs)
    assert all(r.used_bash and r.termination_reason == "final_answer" for r in recs)
    assert all("[exit_code] 0" in r.react_steps[-1]["observation"] for r in recs)
    # the seeded policy answers off by one sometimes: both outcomes occur, each scored by the env
    assert {r.score for r in recs} == {0.0, 1.0}
    assert all(
        (r.score == 1.0) == (r.prediction == t["answer"]) for r, t in zip(recs, [t for t in TASKS for _ in range(3)])
    )
    assert all(r.latency_s > 0 and r.env_id == "MATH-ReAct-v0" and r.policy == "seeded-math" for r in recs)
    assert all(r.usage["completion_tokens"] == r.generated_tokens > 0 for r in recs)


def test_same_seeds_same_records_in_both_modes_and_across_modes(lockstep_records):
    again = _run("lockstep")
    first_async = _run("async")
    second_async = _run("async")
    expected = [strip_timings(r) for r in lockstep_records]
    assert [strip_timings(r) for r in again] == expected
    assert [strip_timings(r) for r in first_async] == expected
    assert [strip_timings(r) for r in second_async] == expected


def test_other_base_seed_changes_trajectories(lockstep_records):
    other = _run("async", base_seed=7)
    assert [r.seed for r in other] != [r.seed for r in lockstep_records]
    assert [r.react_steps for r in other] != [r.react_steps for r in lockstep_records]


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_policy_failure_becomes_request_error_record(mode, tmp_path):
    bad = f"{TASKS[1]['id']}:sample01"
    out = tmp_path / "records.jsonl"
    recs = _run(mode, SeededMathPolicy(fail_keys=[bad]), out_path=out)
    assert len(recs) == 15
    failed = [r for r in recs if r.termination_reason == "request_error"]
    assert [r.key for r in failed] == [bad]
    assert failed[0].score == 0.0 and "backend refused" in failed[0].error
    assert all(r.termination_reason == "final_answer" for r in recs if r.key != bad)
    rows, bad_lines = read_jsonl(out)
    assert bad_lines == 0 and sorted(r["key"] for r in rows) == sorted(r.key for r in recs)


class WarmedMathPolicy(SeededMathPolicy):
    """Records which requests were warmed, and on which thread, before generate saw them."""

    def __init__(self, broken_warm: bool = False):
        super().__init__()
        self.broken_warm = broken_warm
        self.warmed: dict[str, str] = {}
        self.cold: list[str] = []

    def warm(self, request):
        self.warmed[request.model_dump_json()] = threading.current_thread().name
        if self.broken_warm:
            raise RuntimeError("warm failed")

    def complete(self, request):
        if request.model_dump_json() not in self.warmed:
            self.cold.append(request.key)
        return super().complete(request)


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_every_request_is_warmed_in_an_env_thread_before_generate(mode, lockstep_records):
    policy = WarmedMathPolicy()
    recs = _run(mode, policy)
    assert policy.cold == [] and policy.calls == len(policy.warmed) > len(TASKS) * 3
    assert all(name.startswith("agent-envs-env") for name in policy.warmed.values())
    assert [strip_timings(r) for r in recs] == [strip_timings(r) for r in lockstep_records]
    # a warm that raises changes nothing: generate still sees (and reports on) every request
    assert [strip_timings(r) for r in _run(mode, WarmedMathPolicy(broken_warm=True))] == [
        strip_timings(r) for r in lockstep_records
    ]


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_env_steps_run_on_the_callers_executor_which_stays_open(mode, lockstep_records):
    """``workers=``: no pool of the run's own (ES keeps one for the whole run), the same records."""
    before = {t.name for t in threading.enumerate()}
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="callers-workers") as workers:
        policy = WarmedMathPolicy()
        first = _run(mode, policy, workers=workers)
        second = _run(mode, workers=workers)  # a second run on the same, still open, executor
        started = {t.name for t in threading.enumerate()} - before
    assert not [name for name in started if name.startswith("agent-envs-env")]
    assert set(policy.warmed.values()) and all(n.startswith("callers-workers") for n in policy.warmed.values())
    expected = [strip_timings(r) for r in lockstep_records]
    assert [strip_timings(r) for r in first] == expected
    assert [strip_timings(r) for r in second] == expected


def test_a_run_on_a_shared_executor_cancels_and_waits_for_its_own_calls_only():
    from agent_envs.rollout.runner import _Workers

    started, release = threading.Event(), threading.Event()

    def hold() -> str:
        started.set()
        release.wait(30)
        return "held"

    with ThreadPoolExecutor(max_workers=1) as executor:
        mine, other = _Workers(1, "unused", executor), _Workers(1, "unused", executor)
        running = mine.submit(hold)
        assert started.wait(30)
        queued_mine, queued_other = mine.submit(str, "mine"), other.submit(str, "other")
        mine.shutdown(wait=False, cancel_futures=True)  # what an interrupted run does first
        assert queued_mine.cancelled() and not queued_other.cancelled()
        assert not mine.wait_calls(0.01)  # its running call still runs
        with pytest.raises(RuntimeError):
            mine.submit(str, "late")
        release.set()
        mine.shutdown(wait=True)
        assert running.result(0) == "held" and queued_other.result(30) == "other"
        assert executor.submit(str, "open").result(30) == "open"


class BrokenEnvFactory:
    """A real env whose step raises for one task: the runner must turn that into a record."""

    def __init__(self, bad_id: str, exc: Exception | None = None):
        self.bad_id = bad_id
        self.exc = exc if exc is not None else OSError("disk on fire")

    def __call__(self, **kwargs):
        import gymnasium as gym

        import agent_envs  # noqa: F401

        env = gym.make("MATH-ReAct-v0", **kwargs)
        bad_id, inner, exc = self.bad_id, env.unwrapped, self.exc
        original = inner.step

        def step(action):
            if inner._ep.task.id == bad_id:
                raise exc
            return original(action)

        inner.step = step
        env.step = step
        return env


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_env_exception_becomes_env_error_record(mode):
    recs = run_episodes(
        BrokenEnvFactory(TASKS[2]["id"]),
        TASKS,
        SeededMathPolicy(),
        samples=2,
        mode=mode,
        env_kwargs={"sandbox": "none", "max_turns": 6},
        concurrency=3,
        progress=False,
    )
    bad = [r for r in recs if r.task_id == TASKS[2]["id"]]
    assert len(recs) == 10 and len(bad) == 2
    assert all(r.termination_reason == "env_error" and r.error == "OSError: disk on fire" for r in bad)
    assert all(r.termination_reason == "final_answer" for r in recs if r.task_id != TASKS[2]["id"])


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_an_exception_on_the_models_text_is_the_models_outcome_not_env_error(mode, tmp_path):
    """docs/reliability.md#model-text: a step that raises something other than a machine fault
    (here the RecursionError deeply nested arguments once raised) ends the episode as the model's
    outcome: score 0, no ``error``, counted by mean_non_err, and not run again by resume."""
    out = tmp_path / "records.jsonl"
    bad_id = TASKS[1]["id"]
    factory = BrokenEnvFactory(bad_id, RecursionError("maximum recursion depth exceeded"))
    run = dict(
        samples=1,
        mode=mode,
        env_kwargs={"sandbox": "none", "max_turns": 6},
        concurrency=2,
        progress=False,
        out_path=out,
    )
    recs = run_episodes(factory, TASKS, SeededMathPolicy(), **run)
    bad = [r for r in recs if r.task_id == bad_id]
    assert [(r.termination_reason, r.score, r.error) for r in bad] == [("invalid_output", 0.0, None)]
    assert bad[0].react_error == "RecursionError: maximum recursion depth exceeded"
    assert bad[0].score_method == "invalid_output"
    assert all(r.termination_reason == "final_answer" for r in recs if r.task_id != bad_id)
    summary = summarize(recs, 1)
    assert summary["es"]["error_count"] == 0 and summary["non_error"]["count"] == len(TASKS)
    policy = SeededMathPolicy()
    again = run_episodes(factory, TASKS, policy, resume=True, **{**run, "out_path": out})
    assert policy.calls == 0 and [strip_timings(r) for r in again] == [strip_timings(r) for r in recs]


def test_resume_skips_finished_reruns_failed_and_tolerates_torn_line(tmp_path, lockstep_records):
    out = tmp_path / "records.jsonl"
    bad = f"{TASKS[0]['id']}:sample02"
    first = _run("async", SeededMathPolicy(fail_keys=[bad]), out_path=out)
    assert sum(r.failed for r in first) == 1
    with open(out, "ab") as fh:  # a run SIGKILLed mid-write leaves a torn line
        fh.write(b'{"key": "mul-6x7:sample00", "task_id": "mul-6x')
    with pytest.raises(FileExistsError, match="resume"):
        _run("async", out_path=out)
    policy = SeededMathPolicy()
    second = _run("async", policy, out_path=out, resume=True)
    assert policy.calls == 2  # only the failed episode ran again (bash turn + final answer)
    assert [strip_timings(r) for r in second] == [strip_timings(r) for r in lockstep_records]
    rows, torn = read_jsonl(out)
    assert torn == 0 and len(rows) == 15 and len({r["key"] for r in rows}) == 15
    archived, _ = read_jsonl(tmp_path / "records.request_errors.jsonl")
    assert [r["key"] for r in archived] == [bad]


def test_resume_last_successful_duplicate_wins(tmp_path):
    out = tmp_path / "records.jsonl"
    base = {"task_id": "mul-6x7", "row_index": 0, "sample_index": 0, "key": "mul-6x7:sample00"}
    lines = [
        dict(base, score=0.0, prediction="41"),
        dict(base, score=1.0, prediction="42"),
        dict(base, score=0.0, prediction="x", error="RuntimeError: late failure"),
    ]
    out.write_text("".join(json.dumps(r) + "\n" for r in lines))
    policy = SeededMathPolicy()
    recs = run_episodes(
        "MATH-ReAct-v0",
        TASKS[:1],
        policy,
        samples=1,
        out_path=out,
        resume=True,
        progress=False,
        env_kwargs={"sandbox": "none"},
    )
    assert policy.calls == 0
    assert [r.prediction for r in recs] == ["42"]


SLOW_SCRIPT = """
import signal, sys, json
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even if our runner inherited SIGINT ignored
sys.path.insert(0, {repo!r})
from agent_envs.policy.base import Completion, Policy
from agent_envs.rollout.runner import run_episodes
from agent_envs.sandbox.base import SandboxConfig, SandboxLimits

class Slow(Policy):
    name = "slow"
    def generate(self, requests):
        cmd = "bash -c 'sleep 600; :' {marker}"
        return [Completion(text="Action: " + json.dumps({{"name": "bash", "arguments": {{"command": cmd}}}}))
                for r in requests]

tasks = [{{"id": f"t{{i}}", "question": "q", "answer": "1"}} for i in range(4)]
print("starting", flush=True)
run_episodes("MATH-ReAct-v0", tasks, Slow(), samples=1, mode={mode!r}, concurrency=4, progress=False,
             out_path={out!r}, env_kwargs={{"max_turns": 3,
             "sandbox": SandboxConfig(backend="bwrap", limits=SandboxLimits(timeout_s=300))}})
"""


def _marked_processes(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("mode", ["async", "lockstep"])
def test_ctrl_c_closes_every_sandbox(tmp_path, mode):
    marker = f"agent-envs-test-marker-{os.getpid()}-{mode}"
    script = tmp_path / "slow.py"
    script.write_text(
        textwrap.dedent(SLOW_SCRIPT.format(repo=str(REPO), marker=marker, mode=mode, out=str(tmp_path / "r.jsonl")))
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"starting"
        deadline = time.monotonic() + 60
        while len(_marked_processes(marker)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)  # polling for the sandboxes to appear, not synchronising on time
        assert len(_marked_processes(marker)) >= 4, "the four sleeping tool commands never started"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)  # the tool commands would run for 300 s unless the runner kills them
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and b"KeyboardInterrupt" in proc.stderr.read()
    assert _marked_processes(marker) == [], "a sandboxed command outlived the interrupted run"


INTERRUPT_SCRIPT = """
import json, os, signal, sys, threading, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even if our runner inherited SIGINT ignored
sys.path.insert(0, {repo!r})
import gymnasium as gym
from agent_envs.policy.base import Completion, Policy
from agent_envs.rollout.runner import run_episodes
from agent_envs.sandbox.base import SandboxConfig, SandboxLimits

SLEEP = "Action: " + json.dumps({{"name": "bash", "arguments": {{"command": "bash -c 'sleep 600; :' {marker}"}}}})

class Stuck(Policy):
    # t0 answers at once; t1's generation never returns (a model generating on); t2 runs a long command
    name = "stuck"
    def generate(self, requests):
        if {mode!r} == "async" and requests[0].key.startswith("t1"):
            os.write(1, b"generating\\n")  # one write: lines of two threads never interleave
            threading.Event().wait()
        return [Completion(text="no tool" if r.key.startswith("t0") else SLEEP) for r in requests]

class SlowStart(gym.Wrapper):
    # a step slow to reach its sandbox (a loaded host): the interrupt lands before the command starts
    def step(self, action):
        os.write(1, b"stepping\\n")
        time.sleep(2)
        return self.env.step(action)

def make(**kw):
    return SlowStart(gym.make("MATH-ReAct-v0", **kw))

tasks = [{{"id": f"t{{i}}", "question": "q", "answer": "1"}} for i in range(3)]
print("starting", flush=True)
sandbox = SandboxConfig(backend="bwrap", limits=SandboxLimits(timeout_s=300))
run_episodes(make, tasks, Stuck(), mode={mode!r}, concurrency=3, progress=False, out_path={out!r},
             env_kwargs={{"max_turns": 1, "sandbox": sandbox}}, resume=True)
"""


@pytest.mark.parametrize("mode", ["async", "lockstep"])
def test_ctrl_c_stops_within_seconds_keeping_finished_episodes_and_resume_continues(tmp_path, mode):
    """One Ctrl-C with a generation in flight (async) and a step that had not reached its sandbox
    yet: the run stops at once (it once waited minutes for generations, or ran a command started
    after the interrupt to its timeout), keeps finished episodes, and ``resume`` runs the rest."""
    marker = f"agent-envs-test-interrupt-{os.getpid()}-{mode}"
    out = tmp_path / "r.jsonl"
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent(INTERRUPT_SCRIPT.format(repo=str(REPO), marker=marker, mode=mode, out=str(out))))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout.readline() == b"starting\n"
        # async: t0 ends at once, t1 generates, t2 steps; lockstep: the batch is generated, then stepped
        wanted = {b"generating\n", b"stepping\n"} if mode == "async" else {b"stepping\n"}
        seen: set[bytes] = set()
        while not wanted <= seen:
            line = proc.stdout.readline()
            assert line, "the run ended before it was interrupted"
            seen.add(line)
        deadline = time.monotonic() + 60
        while mode == "async" and not (out.exists() and out.read_bytes().count(b"\n")):
            assert time.monotonic() < deadline, "t0's record was never written"
            time.sleep(0.05)  # polling for t0's record, not synchronising on time
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)  # the command would run to its 300 s timeout, the generation forever
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert _marked_processes(marker) == [], "a sandboxed command outlived the interrupted run"
    rows = read_jsonl(out)[0] if out.exists() else []
    assert [r["task_id"] for r in rows] == (["t0"] if mode == "async" else [])

    class Answers(Policy):
        def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
            return [Completion(text="no tool") for _ in requests]

    tasks = [{"id": f"t{i}", "question": "q", "answer": "1"} for i in range(3)]
    env_kwargs = {"max_turns": 1, "sandbox": "bwrap"}
    records = run_episodes(
        "MATH-ReAct-v0", tasks, Answers(), mode=mode, progress=False, out_path=out, resume=True, env_kwargs=env_kwargs
    )
    assert [r.task_id for r in records] == ["t0", "t1", "t2"] and not any(r.error for r in records)


TWO_PRESSES_SCRIPT = """
import dataclasses, json, os, signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even if our runner inherited SIGINT ignored
sys.path.insert(0, {repo!r})
import gymnasium as gym
from gymnasium.envs.registration import load_env_creator, registry
from agent_envs import cli
from agent_envs.policy.base import Completion, Policy
from agent_envs.sandbox.base import SandboxConfig, SandboxLimits

SLEEP = "Action: " + json.dumps({{"name": "bash", "arguments": {{"command": "bash -c 'sleep 600; :' {marker}"}}}})

class Stuck(Policy):
    # t0 finishes at once; t1's generation never returns; t2 runs a long command
    name = "stuck"
    def generate(self, requests):
        if requests[0].key.startswith("t1") and not os.environ.get("ANSWER"):
            os.write(1, b"generating\\n")  # one write: lines of two threads never interleave
            threading.Event().wait()
        if requests[0].key.startswith("t2") and not os.environ.get("ANSWER"):
            os.write(1, b"running\\n")
            return [Completion(text=SLEEP)]
        return [Completion(text="Final answer: \\\\boxed{{1}}") for r in requests]

class SlowClose(gym.Wrapper):
    # closing an episode's env is where the first Ctrl-C is handled; it waits for the test's
    # second press (stdin closed after it), as a loaded host is slow to close a sandbox
    used = False
    def reset(self, **kw):
        self.used = True
        return self.env.reset(**kw)
    def close(self):
        if self.used:
            os.write(1, b"closing\\n")
            sys.stdin.readline()
        return self.env.close()

def make(**kw):
    kw["sandbox"] = SandboxConfig(backend="bwrap", limits=SandboxLimits(timeout_s=300))
    return SlowClose(load_env_creator(spec.entry_point)(**kw))

spec = registry["MATH-ReAct-v0"]
registry["MATH-ReAct-v0"] = dataclasses.replace(spec, entry_point=make, additional_wrappers=())
cli.make_policy = lambda kind, args, env_id: Stuck()
print("starting", flush=True)
sys.exit(cli.main(sys.argv[1:]))
"""


def test_two_ctrl_c_presses_stop_within_seconds_keeping_finished_episodes_and_resume_continues(tmp_path):
    """A second Ctrl-C while the first is being handled (the envs closing) once cut the closing
    short: a tool command was left running and the process waited for it (its timeout, 90 s and
    more) after printing.  Now it prints at once, exits 130 within seconds, keeps the finished
    episode, and ``eval --resume`` runs the rest."""
    marker = f"agent-envs-test-two-presses-{os.getpid()}"
    script = tmp_path / "two_presses.py"
    script.write_text(textwrap.dedent(TWO_PRESSES_SCRIPT.format(repo=str(REPO), marker=marker)))
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"id": f"t{i}", "question": "q", "answer": "1"}) + "\n" for i in range(3)))
    out = tmp_path / "run"
    records = out / "records.jsonl"
    argv = [sys.executable, str(script), "eval", "--policy", "scripted", "--env", "MATH-ReAct-v0"]
    argv += ["--data", str(data), "--out", str(out), "--sandbox", "bwrap", "--max-turns", "2"]
    argv += ["--mode", "async", "--concurrency", "3", "--no-progress"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"starting\n"
        seen: set[bytes] = set()
        while not {b"generating\n", b"running\n"} <= seen:
            line = proc.stdout.readline()
            assert line, "the run ended before it was interrupted"
            seen.add(line)
        deadline = time.monotonic() + 60
        while not (records.exists() and records.read_bytes().count(b"\n")):
            assert time.monotonic() < deadline, "t0's record was never written"
            time.sleep(0.05)  # polling for t0's record, not synchronising on time
        while not _marked_processes(marker):
            assert time.monotonic() < deadline, "t2's command never started"
            time.sleep(0.05)  # polling for t2's command, not synchronising on time
        proc.send_signal(signal.SIGINT)
        while proc.stdout.readline() != b"closing\n":
            assert proc.poll() is None, "the run ended without closing its envs"
        proc.send_signal(signal.SIGINT)  # the second press, while the first is being handled
        pressed = time.monotonic()
        proc.stdin.close()
        try:
            proc.wait(timeout=60)  # t2's command would run to its 300 s timeout
        except subprocess.TimeoutExpired:
            pytest.fail("the run was still going 60 s after the second Ctrl-C")
        took = time.monotonic() - pressed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode()
    assert proc.returncode == 130, err
    assert took < 15, f"exited {took:.1f} s after the second press"
    assert f"[agent-envs] interrupted: 1 record(s) saved in {records}; rerun with --resume" in err
    assert "Traceback" not in err
    assert _marked_processes(marker) == [], "a sandboxed command outlived the interrupted run"
    assert [row["task_id"] for row in read_jsonl(records)[0]] == ["t0"]

    resumed = subprocess.run(
        [*argv, "--resume"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=300,
        env={**os.environ, "ANSWER": "1"},
    )
    assert resumed.returncode == 0, resumed.stderr.decode()
    rows = read_jsonl(records)[0]
    assert sorted(row["task_id"] for row in rows) == ["t0", "t1", "t2"] and not any(row["error"] for row in rows)


def test_presses_while_closing_wait_for_the_closing_and_a_third_interrupts_it():
    """Under Python's own SIGINT handler: a press while the run closes its envs lets the closing
    finish, then interrupts; a further press interrupts a closing that hangs; the handler is put
    back either way.  (A program's own handler, or SIGINT ignored, is left alone.)"""
    from agent_envs.rollout.runner import _presses_deferred

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        reached = []
        with pytest.raises(KeyboardInterrupt):
            with _presses_deferred():
                signal.raise_signal(signal.SIGINT)
                reached.append("closed")
        assert reached == ["closed"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            with _presses_deferred():
                signal.raise_signal(signal.SIGINT)
                reached.append("second")
                signal.raise_signal(signal.SIGINT)
                reached.append("third")
        assert reached == ["closed", "second"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with _presses_deferred():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
