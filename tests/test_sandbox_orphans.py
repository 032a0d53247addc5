"""Sandboxes die with their runner, however it dies (docs/reliability.md#containment): a runner
SIGKILLed while it starts and uses bwrap sandboxes (persistent shells, fresh sandboxes, python
interpreters) leaves no process behind.  The runner is a real child process; a supervisor that
is a child subreaper adopts whatever it leaves, so a survivor cannot hide by reparenting to init."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: starts sandboxes on 6 threads without pause (each starts one, runs a long command or a short
#: one, closes it), and says so once a long command's ``sleep`` is a live process below it
RUNNER = textwrap.dedent("""
    import sys, threading, time
    from agent_envs.sandbox.base import SandboxConfig
    from agent_envs.sandbox.bwrap import BwrapSandbox
    from agent_envs.testing import live_descendants
    from agent_envs.tools.python import PythonTool

    def sleeping():
        for pid in live_descendants():
            try:
                command = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            if b"sleep" in command and b"600" in command:
                return True
        return False

    def shells(mode, command):
        while True:
            sandbox = BwrapSandbox(SandboxConfig(mode=mode))
            if command == "long":
                sandbox.run("sleep 600", timeout=600)
            sandbox.run("true")
            sandbox.close()

    def interpreters():
        while True:
            with PythonTool("bwrap") as tool:
                tool.run("import time; time.sleep(600)", timeout=600)

    jobs = [("persistent", "long"), ("fresh", "long"), ("persistent", "short"), ("persistent", "short"),
            ("fresh", "short")]
    for args in jobs:
        threading.Thread(target=shells, args=args, daemon=True).start()
    threading.Thread(target=interpreters, daemon=True).start()
    while not sleeping():  # the state the kill is meant to meet, not a guess at how long it takes
        time.sleep(0.01)
    print("running", flush=True)
    threading.Event().wait()
""")

#: the supervisor: a child subreaper that starts the runner, SIGKILLs it ``delay`` seconds after
#: its long commands run (sandboxes are starting on the other threads then), and reports what
#: is left of its descendants after a grace period
SUPERVISOR = textwrap.dedent("""
    import ctypes, json, os, signal, subprocess, sys, time
    sys.path.insert(0, sys.argv[3])
    from sandbox_backends import live_descendants
    ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER

    def reap():
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    return
            except ChildProcessError:
                return

    runner = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
    assert runner.stdout.readline() == "running\\n"
    time.sleep(float(sys.argv[2]))  # the moment of the kill, not a synchronisation
    before = len(live_descendants())
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait()  # reaped: its children are ours now (a scan can miss a process whose parent is exiting)
    # the next run clears what the parent-death signals could not (an init that had not set its own)
    subprocess.run([sys.executable, "-c", "from agent_envs.sandbox.base import SandboxConfig; "
                    "from agent_envs.sandbox.bwrap import BwrapSandbox; BwrapSandbox(SandboxConfig()).close()"],
                   check=True)
    deadline, empty = time.monotonic() + 10, 0
    while time.monotonic() < deadline and empty < 3:  # three empty scans in a row: nothing left
        reap()
        empty = 0 if live_descendants() else empty + 1
        time.sleep(0.05)
    left = {}
    for pid in sorted(live_descendants()):
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            command = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ")[:100].decode()
            left[pid] = f"{state} {command}"
        except OSError:
            pass
        os.kill(pid, signal.SIGKILL)  # leave nothing, whatever the verdict
    reap()
    print(json.dumps({"before": before, "left": left}))
""")


@pytest.mark.parametrize("delay", [0.0, 0.3, 0.7])
def test_sandboxes_die_with_a_runner_sigkilled_while_they_start(delay):
    from agent_envs.sandbox._bwrap_layout import bwrap_usable

    usable, why = bwrap_usable()
    if not usable:
        pytest.skip(f"bwrap cannot run here: {why}")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-c", SUPERVISOR, RUNNER, str(delay), str(REPO / "tests")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["before"] >= 2  # the runner and what it had started
    assert report["left"] == {}, report["left"]
