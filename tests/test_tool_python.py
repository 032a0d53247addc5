"""The python tool: state persists, crashes and timeouts restart it (and say so), limits hold,
hostile code is contained, and nothing is left behind (processes, temp folders, mounts)."""

from __future__ import annotations

import gc
import json
import os
import random
import re
import resource
import socket
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import pytest

from agent_envs.sandbox.base import SandboxConfig, SandboxLimits, SandboxUnavailable
from agent_envs.tools.python import PythonTool
from protocol_specs import format_python_observation
from sandbox_backends import (
    close_checked,
    describe,
    host_processes_matching,  # noqa: F401
    nothing_left_behind,  # noqa: F401  (an autouse fixture)
)

#: the tool keeps one interpreter sandbox per episode whatever the shell's mode; "none" is the
#: unsandboxed backend (behaviour only, no containment claims)
BACKENDS = ["bwrap", "none"]
LIMITS = SandboxLimits(workspace_mib=64, max_file_size_mib=16, memory_gib=1.0, max_processes=64)
RESTARTED = "the interpreter was restarted, so variables and imports from earlier calls are gone."


def _tool(backend: str, **limits) -> PythonTool:
    return PythonTool(SandboxConfig(backend=backend, limits=LIMITS.model_copy(update=limits)))


@pytest.fixture(params=BACKENDS)
def tool(request):
    t = _tool(request.param)
    yield t
    close_checked(t)


@pytest.fixture
def sandboxed():
    t = _tool("bwrap")
    yield t
    close_checked(t)


def _obs(tool: PythonTool, code: str, timeout: float | None = None) -> str:
    return format_python_observation(tool.run(textwrap.dedent(code), timeout), "math")


def test_state_persists_across_calls(tool):
    assert _obs(tool, "import math\nx = 6 * 7\ndef f(n):\n    return n + x") == "Bash exited with code 0 and no output."
    assert _obs(tool, "print(f(math.floor(0.5)))") == "42\n\n[exit_code] 0"
    assert _obs(tool, "x") == "42\n\n[exit_code] 0"  # a final bare expression is echoed


def test_exception_keeps_state_and_shows_traceback(tool):
    tool.run("y = 1")
    out = _obs(tool, "print('before')\n1/0")
    assert out.startswith("before\n\n[stderr]\nTraceback") and "ZeroDivisionError" in out
    assert out.endswith("[exit_code] 1") and "_py_driver" not in out
    assert _obs(tool, "print(y)") == "1\n\n[exit_code] 0"


@pytest.mark.parametrize(
    "code,why",
    [
        ("import os; os._exit(3)", "exited with code 3"),
        ("import sys; sys.exit(2)", "exited with code 2"),
        ("import ctypes; ctypes.string_at(0)", "killed by signal 11"),
        ("x = bytearray(4 * 1024**3)", "unusable"),
        ("import threading, time; threading.Thread(target=time.sleep, args=(60,), daemon=True).start()", "unusable"),
    ],
)
def test_crash_restarts_with_fresh_state(tool, code, why):
    tool.run("kept = 1")
    out = _obs(tool, code)
    assert why in out and out.endswith(RESTARTED)
    assert "NameError" in _obs(tool, "kept")  # fresh state ...
    assert _obs(tool, "print(6*7)") == "42\n\n[exit_code] 0"  # ... and it works
    assert tool.restarts == 1


def test_timeout_restarts_and_says_so(tool):
    tool.run("kept = 1")
    res = tool.run("while True: pass", timeout=1)
    out = format_python_observation(res, "math")
    assert res.timed_out and out == f"Bash timed out after 1.0s.\n[python] the call timed out after 1.0s; {RESTARTED}"
    assert "NameError" in _obs(tool, "kept")
    assert _obs(tool, "print('ok')") == "ok\n\n[exit_code] 0"


def test_output_is_windowed_like_the_shell(tool):
    res = tool.run("import sys\nfor _ in range(200): sys.stdout.write('x' * 100_000)")
    assert res.stdout_dropped > 0 and len(res.stdout) <= 2 * tool.config.limits.capture_keep
    out = format_python_observation(res, "math", limit=100)
    assert out == "x" * 50 + "\n...[truncated]...\n" + "x" * 36 + "\n[exit_code] 0"


def test_stdin_and_stream_swaps_cannot_hijack_the_channel(tool):
    assert "EOFError" in _obs(tool, "input()")
    tool.run("import sys, io; sys.stdout = io.StringIO(); sys.stderr = io.StringIO()")
    assert _obs(tool, "print('visible')") == "visible\n\n[exit_code] 0"


def test_forged_end_markers_are_plain_output(tool):
    out = _obs(tool, r"print('\0\x1eAE0123456789abcdef\n'); import os; os.write(1, b'\0\x1eAEzz\n'); print('after')")
    assert out.endswith("after\n\n[exit_code] 0")


def test_large_code_block(tool):
    code = "data = [" + ",".join(["1"] * 300_000) + "]\nprint(len(data))"
    assert _obs(tool, code) == "300000\n\n[exit_code] 0"


def test_nul_byte_is_a_launch_error(tool):
    assert _obs(tool, "print(1)\0") == "[ERROR] Failed to execute command: embedded null byte"


def test_background_processes_do_not_survive(tool):
    tag = str(random.randint(10**8, 10**9))
    out = _obs(
        tool,
        f"""
        import os, subprocess, time
        subprocess.Popen(['sleep', '{tag}1'])
        subprocess.Popen(['sleep', '{tag}2'], start_new_session=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep({tag}3)
            os._exit(0)
        print('started')""",
    )
    assert out == "started\n\n[exit_code] 0"
    assert {p: describe(p) for p in host_processes_matching(tag.encode())} == {}
    assert _obs(tool, "print(7)") == "7\n\n[exit_code] 0"


def test_forked_children_do_not_run_the_driver(tool):
    tool.run("kept = 5")
    out = _obs(
        tool, "import os, sys\npid = os.fork()\nprint('child' if pid == 0 else 'parent')\nif pid: os.waitpid(pid, 0)"
    )
    assert sorted(re.findall("child|parent", out)) == ["child", "parent"]  # lines may interleave
    assert _obs(tool, "print(kept)") == "5\n\n[exit_code] 0" and tool.restarts == 0


def test_interpreter_that_cannot_start_is_a_launch_error():
    with PythonTool(SandboxConfig(backend="bwrap", env={"PYTHONHOME": "/nonexistent"})) as t:
        out = _obs(t, "print(1)")
        assert out.startswith("[ERROR] Failed to execute command: the python interpreter did not start: ")
        assert "Fatal Python error" in out and t.processes() == []


def _alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (a zombie has ended)."""
    alive = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(pid)
        except OSError:
            continue
    return alive


@pytest.mark.parametrize("backend", BACKENDS)
def test_countdown_episodes_dropped_without_close_leave_nothing(backend):
    """Garbage collection ends a dropped episode's python interpreter and its sandbox (it once
    left three processes per Countdown episode, and a /tmp/ae-local-* folder with "none")."""
    env = gym.make("Countdown-ReAct-v0", sandbox=backend, max_turns=3)
    env.reset(seed=0)
    env.step("Action: " + json.dumps({"name": "python", "arguments": {"code": "print(1)"}}))
    tool = env.unwrapped._tools["python"].tool
    pids, workdir = tool.processes(), getattr(tool._sandbox, "workdir", None)
    assert _alive(pids)
    del env, tool
    gc.collect()
    assert _alive(pids) == []
    assert workdir is None or not os.path.exists(workdir)


def test_docker_is_refused_clearly():
    with pytest.raises(SandboxUnavailable, match="docker"):
        PythonTool(SandboxConfig(backend="docker"))


# -- containment (the bwrap sandbox; "none" is documented as no sandbox) -------------------------


def test_fork_bomb_is_contained(sandboxed):
    out = _obs(
        sandboxed,
        """
        import os
        for _ in range(10_000):
            try:
                if os.fork() == 0:
                    while True: pass
            except OSError:
                print('capped'); break""",
        timeout=10,
    )
    assert "capped" in out
    assert _obs(sandboxed, "print('alive')").startswith("alive")


@pytest.mark.parametrize(
    "code",
    [
        "os.kill(1, 9)",
        "os.kill(-1, 9)",
        "os.kill(os.getppid(), 9)",
        # the test process; its id names no pid, which differs between pytest-xdist's workers
        pytest.param(f"os.kill({os.getpid()}, 9)", id="os.kill(test-process, 9)"),
    ],
)
def test_signals_cannot_escape(sandboxed, code):
    sandboxed.run("kept = 1")
    _obs(sandboxed, f"import os\ntry:\n    {code}\nexcept OSError:\n    pass")
    assert _obs(sandboxed, "print(kept)") == "1\n\n[exit_code] 0"


def test_file_size_limit(sandboxed):
    out = _obs(sandboxed, "open('/workspace/big', 'wb').write(b'0' * (32 * 1024**2))")
    assert "File too large" in out


@pytest.mark.parametrize("path", ["/usr/pwned", "/etc/pwned", "/pwned", "/bin/pwned"])
def test_writes_outside_workspace_fail(sandboxed, path):
    out = _obs(sandboxed, f"open('{path}', 'w').write('x')")
    assert any(s in out for s in ("Read-only file system", "Permission denied", "No such file"))
    assert "[exit_code] 1" in out
    assert _obs(sandboxed, "open('/workspace/ok', 'w').write('x'); print(open('ok').read())") == "x\n\n[exit_code] 0"


def test_no_network(sandboxed):
    with socket.create_server(("127.0.0.1", 0)) as srv:
        srv.setblocking(False)
        port = srv.getsockname()[1]
        out = _obs(sandboxed, f"import socket; socket.create_connection(('127.0.0.1', {port}), 2)")
        assert "ConnectionRefusedError" in out or "OSError" in out
        with pytest.raises(BlockingIOError):
            srv.accept()
    assert "gaierror" in _obs(sandboxed, "import socket; socket.getaddrinfo('example.com', 80)")


def test_host_is_invisible(sandboxed):
    out = _obs(sandboxed, "import os; print(sorted(p for p in os.listdir('/proc') if p.isdigit()))")
    assert out.startswith("['1', '2']")  # bwrap's init and the interpreter, nothing of the host
    assert "Errno" in _obs(sandboxed, "print(open('/etc/shadow').read())")


def test_only_the_interpreter_sandbox_runs_between_calls(sandboxed):
    sandboxed.run("import subprocess; subprocess.Popen(['sleep', '1000'])")
    assert len(sandboxed.processes()) == 3  # bwrap monitor, init, the interpreter


def test_many_episodes_leak_nothing():
    for i in range(20):
        with _tool("bwrap") as t:
            t.run(
                random.choice(
                    [
                        "print(1)",
                        "import os; os._exit(1)",
                        "while True: pass",
                        "import subprocess; subprocess.Popen(['sleep', '99'])",
                    ]
                ),
                timeout=0.5,
            )
            if i % 2:
                t.run("print(2)")


#: model code that finds the driver's nonce and status fd in its frames and writes the end of the
#: call itself (the old end markers on both streams and a status line), then works on
FORGE_END = """
    import os, sys, time
    frame = sys._getframe()
    while 'nonce' not in frame.f_locals:
        frame = frame.f_back
    nonce, fd = frame.f_locals['nonce'], frame.f_locals['status_fd']
    for stream in (1, 2):
        os.write(stream, b'\\0\\x1eAE' + nonce + b'\\n')
    os.write(fd, nonce + b' R 0\\n')
"""


def test_code_cannot_forge_the_end_of_a_call(tool):
    """docs/reliability.md#tool-channels: a call is over when the interpreter is idle, not when a
    status line says so: the forged end is ignored, the call lasts until the code is done, and
    its later output and real exit status are the call's."""
    tag = str(random.randint(10**8, 10**9))
    started = time.monotonic()
    result = tool.run(
        textwrap.dedent(
            FORGE_END
            + f"""
    import subprocess
    subprocess.Popen(['sleep', '{tag}'])
    time.sleep(1.5)
    print('late')
    raise ValueError('the real end')"""
        )
    )
    assert time.monotonic() - started >= 1.5, result
    assert b"late" in result.stdout and b"ValueError: the real end" in result.stderr and result.returncode == 1
    assert host_processes_matching(tag.encode()) == []
    assert _obs(tool, "print(6 * 7)") == "42\n\n[exit_code] 0" and tool.restarts == 0


#: issue 32's attack on the end of a call: the driver's status line with the call's nonce, then a
#: blocking read of the driver's own command pipe (which takes the next call's code), then a loop
IMITATE_THE_END = """
    import os, sys
    frame = sys._getframe()
    while 'nonce' not in frame.f_locals:
        frame = frame.f_back
    nonce, commands = frame.f_locals['nonce'], frame.f_locals['commands']
    os.write(frame.f_locals['status_fd'], b'\\n' + nonce + b' R 0\\n')
    head = commands.readline()
    print('took:', commands.read(int(head.split()[1])).decode(), flush=True)
    while True:
        pass
"""


def test_imitating_the_end_of_a_call_costs_only_the_own_interpreter(tool):
    """docs/reliability.md#tool-channels: code can imitate the driver's end (the interpreter's
    state is the model's), but that only ends its own call early and takes its own next call,
    which then times out and restarts the interpreter; the call after that runs normally and
    nothing is left running."""
    tool.run(textwrap.dedent(IMITATE_THE_END), timeout=5)
    second = tool.run("print('next')", timeout=2)
    assert second.timed_out and second.stdout == b"took: print('next')\n", second
    assert _obs(tool, "print(6 * 7)") == "42\n\n[exit_code] 0" and tool.restarts == 1


def test_a_status_fd_flood_without_newlines_costs_the_host_little(tool):
    """Model code writing 32 MiB to the status fd with no newline: the host reads it in bounded,
    linear steps (it once re-split its whole buffer on every 4 KiB read, seconds of CPU in the
    runner outside every sandbox limit)."""
    code = (
        "import os, sys\nchunk = b'x' * 65536\nfor _ in range(512):\n    os.write(int(sys.argv[1]), chunk)\nprint('ok')"
    )
    before = resource.getrusage(resource.RUSAGE_SELF)
    out = _obs(tool, code)
    after = resource.getrusage(resource.RUSAGE_SELF)
    host_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert out == "ok\n\n[exit_code] 0" and host_cpu < 1.0, host_cpu
