"""bubblewrap sandbox: docs/protocol.md#sandbox-cases and #derived-cases, persistence, and shell-session recovery."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from agent_envs.core.spec import Mount
from agent_envs.envs.docvqa.spec import DOCUMENT_PATH
from agent_envs.sandbox.base import SandboxConfig, SandboxLimits, SandboxUnavailable
from agent_envs.sandbox.bwrap import BwrapSandbox
from agent_envs.sandbox.factory import make_sandbox, resolve_config
from protocol_specs import format_observation

REPO = Path(__file__).resolve().parent.parent
FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


@pytest.fixture(params=["persistent", "fresh"])
def sandbox_for(request):
    made = []

    def build(image=None, **limits):
        cfg = SandboxConfig(
            mode=request.param,
            mounts=[] if image is None else [Mount(str(image), DOCUMENT_PATH)],
            limits=SandboxLimits(**limits),
        )
        made.append(BwrapSandbox(cfg))
        return made[-1]

    yield build
    for sb in made:
        sb.close()


def obs(sb, cmd, timeout=None, limit=6000):
    return format_observation(sb.run(cmd, timeout), "docvqa", limit)


def test_image_readable_and_secret_invisible(sandbox_for, tmp_path):  # #sandbox-cases 3
    (tmp_path / "doc.png").write_bytes(b"fake-png")
    (tmp_path / "secret.txt").write_text("top secret")
    sb = sandbox_for(tmp_path / "doc.png")
    res = sb.run(f"cat /workspace/document.png; ls /workspace; cat {tmp_path}/secret.txt")
    assert res.stdout == b"fake-pngdocument.png\n"
    assert b"No such file" in res.stderr and b"top secret" not in res.stdout + res.stderr


def test_missing_image_fails_before_launch(tmp_path):
    with pytest.raises(FileNotFoundError):
        BwrapSandbox(SandboxConfig(mounts=[Mount(str(tmp_path / "nope.png"), DOCUMENT_PATH)]))


def test_tesseract_reads_rendered_invoice(sandbox_for, tmp_path):  # #sandbox-cases 4
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (900, 220), "white")
    ImageDraw.Draw(img).text((30, 50), "INVOICE 42", fill="black", font=ImageFont.truetype(str(FONT), 96))
    img.save(tmp_path / "inv.png")
    res = sandbox_for(tmp_path / "inv.png").run("tesseract /workspace/document.png stdout 2>/dev/null", 60)
    assert res.returncode == 0 and b"INVOICE" in res.stdout.upper() and b"42" in res.stdout


def test_python_libraries_inside(sandbox_for):
    out = obs(sandbox_for(), "python3 -c 'import numpy, sympy, PIL, pytesseract; print(sympy.sqrt(8))'", 60)
    assert out == "2*sqrt(2)\n[exit_code] 0"


def test_repo_invisible_and_tcp_blocked(sandbox_for):  # #sandbox-cases 5 (a local listener)
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        code = (
            f"import socket\ntry:\n socket.create_connection(('127.0.0.1', {port}), 2)\n print('connected')\n"
            "except OSError as e:\n print('network-blocked', e.errno)"
        )
        out = obs(sandbox_for(), f'cat {REPO}/README.md {REPO}/pyproject.toml; python3 -c "{code}"')
        srv.setblocking(False)
        with pytest.raises(BlockingIOError):
            srv.accept()
    # neither file's text (the clone's folder may well be named agent-envs: the path proves nothing)
    assert "network-blocked" in out and "[build-system]" not in out and "Gymnasium environments" not in out


def test_truncation_80(sandbox_for):  # #sandbox-cases 6
    out = obs(sandbox_for(), "python3 -c \"print('x' * 200)\"", limit=80)
    assert len(out) <= 100 and "...[truncated]..." in out


def test_ulimit_threads_which(sandbox_for):  # #sandbox-cases 7, 8, 10
    sb = sandbox_for()
    assert obs(sb, "ulimit -v") == "8388608\n[exit_code] 0"
    assert (
        obs(sb, "echo $OPENBLAS_NUM_THREADS $OMP_NUM_THREADS $MKL_NUM_THREADS $NUMEXPR_NUM_THREADS")
        == "1 1 1 1\n[exit_code] 0"
    )
    assert obs(sb, "which python").startswith(sys.prefix + "/bin/python")


def test_pip_disabled(sandbox_for):  # #sandbox-cases 9
    res = sandbox_for().run("python -m pip --version; pip --version; pip3 --version")
    assert res.returncode != 0 and "pip " not in format_observation(res, "docvqa")


def test_nul_byte_command(sandbox_for):  # #sandbox-cases 12
    res = sandbox_for().run("echo a\0b")
    assert res.returncode == 126 and "embedded null byte" in format_observation(res, "docvqa")


def test_reference_cases_5_14(sandbox_for):
    sb = sandbox_for()
    res = sb.run("echo err 1>&2; exit 3")
    assert (format_observation(res, "docvqa"), res.returncode) == ("[stderr]\nerr\n[exit_code] 3", 3)
    assert obs(sb, "true") == "Bash exited with code 0 and no output."
    res = sb.run("sleep 3", timeout=1)
    assert (format_observation(res, "docvqa"), res.returncode, res.timed_out) == (
        "Bash timed out after 1.0s.",
        124,
        True,
    )
    root = set(obs(sb, "ls /").split("\n")[:-1])
    assert root - {"bin", "dev", "etc", "lib", "lib64", "proc", "tmp", "usr", "workspace"} <= {
        Path(p).parts[1] for p in (sys.prefix, sys.base_prefix)
    }


def test_heredoc_and_unbalanced_quotes(sandbox_for):
    sb = sandbox_for()
    assert obs(sb, "cat <<'EOF'\nline $HOME\nEOF\necho after") == "line $HOME\nafter\n[exit_code] 0"
    bad = sb.run('echo "unbalanced')
    assert bad.returncode == 2 and b"unexpected EOF" in bad.stderr
    assert obs(sb, "echo fine") == "fine\n[exit_code] 0"


def test_error_messages_count_lines_from_one(sandbox_for):
    assert (
        obs(sandbox_for(), "echo a\nnosuchcmd")
        == "a\n\n[stderr]\n/bin/bash: line 2: nosuchcmd: command not found\n[exit_code] 127"
    )


def test_persistence_only_in_persistent_mode(sandbox_for):
    sb = sandbox_for()
    sb.run("cd /tmp && mkdir d && cd d && echo data > f && v=42")
    out = obs(sb, "pwd; echo v=$v; cat /tmp/d/f")
    if sb.config.mode == "persistent":
        assert out == "/tmp/d\nv=42\ndata\n[exit_code] 0"
    else:
        assert out.startswith("/workspace\nv=\n\n[stderr]\ncat: /tmp/d/f: No such file")


def test_hung_reader_times_out_and_session_continues(sandbox_for):
    sb = sandbox_for()
    assert obs(sb, "cat") == "Bash exited with code 0 and no output."  # stdin is /dev/null
    sb.run("cd /tmp; echo kept > k")
    res = sb.run("mkfifo p; cat p", timeout=1)
    assert res.timed_out
    res = sb.run("while :; do :; done", timeout=1)  # a loop inside the shell itself
    assert res.timed_out
    res = sb.run("while :; do sleep 5; done", timeout=1)
    assert res.timed_out
    expected = "kept\n[exit_code] 0" if sb.config.mode == "persistent" else None
    out = obs(sb, "cat /tmp/k")
    assert out == expected if expected else "No such file" in out


@pytest.mark.parametrize("killer", ["exit 5", "kill -9 $$", "exec true", "set -e; false"])
def test_session_survives_its_shell_dying(sandbox_for, killer):
    sb = sandbox_for()
    res = sb.run(f"echo before; {killer}")
    assert res.stdout == b"before\n"
    assert obs(sb, "echo again") == "again\n[exit_code] 0"


def test_a_command_cannot_forge_its_own_end():
    """docs/reliability.md#tool-channels: ``$__ae_n`` is readable by the command, so it could write
    the driver's end markers and status line itself; the command is over only when the shell is
    back at its read with nothing else running: the forged end is ignored, the later output and
    the real status are the command's, and the background job is killed before ``run`` returns."""
    import time

    with BwrapSandbox(SandboxConfig()) as sb:
        forge = (
            "printf '\\0\\36AE%s\\n' \"$__ae_n\"; printf '\\0\\36AE%s\\n' \"$__ae_n\" >&2; "
            "printf '\\36AR %s 0\\n' \"$__ae_n\" >&59; "
        )
        started = time.monotonic()
        res = sb.run(forge + "sleep 313 & sleep 1.5; echo late; exit 7")
        assert time.monotonic() - started >= 1.5 and res.returncode == 7
        assert res.stdout.endswith(b"late\n")
        assert sb._state["shell"].others() == []  # the background sleep is gone
        assert obs(sb, "echo next") == "next\n[exit_code] 0"


def test_a_shell_that_ignores_the_abort_signal_is_rebuilt():
    """A timed-out command whose shell traps SIGUSR2 and loops: the sandbox is torn down and
    ``run`` returns the timeout with the output so far (it raised OSError reading the pipes of the
    shell it had just closed: a model's command counted as an infrastructure error)."""
    with BwrapSandbox(SandboxConfig()) as sb:
        res = sb.run("trap '' USR2; echo looping; while :; do :; done", timeout=1)
        assert res.timed_out and res.returncode == 124 and res.stdout == b"looping\n", res
        assert obs(sb, "echo next") == "next\n[exit_code] 0"


def test_exit_keeps_files_and_cwd():
    with BwrapSandbox(SandboxConfig()) as sb:
        sb.run("cd /tmp && echo x > f && export E=1 && exit 4")
        assert obs(sb, "pwd; cat f; echo $E") == "/tmp\nx\n1\n[exit_code] 0"


def test_fork_bomb_contained_by_nproc():
    with BwrapSandbox(SandboxConfig(limits=SandboxLimits(max_processes=40))) as sb:
        code = "import os\nn=0\ntry:\n while n < 500:\n  if os.fork() == 0:\n   os.pause()\n  n += 1\nexcept OSError: pass\nprint(n)"
        res = sb.run(f"python3 -c '{code}'", timeout=20)
        assert res.returncode == 0 and 25 <= int(res.stdout) < 40


def test_missing_bwrap_names_package(monkeypatch):
    from agent_envs.sandbox import _bwrap_layout

    _bwrap_layout.find_bwrap.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        with pytest.raises(SandboxUnavailable, match=r"bubblewrap.*sandbox='none'"):
            BwrapSandbox(SandboxConfig())
    finally:
        monkeypatch.undo()
        _bwrap_layout.find_bwrap.cache_clear()


def test_factory_and_local_backend():
    assert resolve_config(None).backend == "bwrap" and resolve_config("none").backend == "none"
    assert resolve_config({"backend": "bwrap", "mode": "fresh"}).mode == "fresh"
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        resolve_config("vm")
    with pytest.raises(TypeError):
        resolve_config(3)  # type: ignore[arg-type]
    sb = make_sandbox("none")
    try:
        sb.run("echo data > f; cd /; v=1")
        assert (
            format_observation(sb.run("cat f; echo v=$v; ulimit -v; echo $BROWSER"), "math")
            == "data\nv=\n8388608\n/bin/false\n\n[exit_code] 0"
        )
        res = sb.run("sleep 5 & sleep 3", timeout=0.5)
        assert res.timed_out and format_observation(res, "math") == "Bash timed out after 0.5s."
        assert "embedded null byte" in format_observation(sb.run("a\0b"), "math")
        workdir = sb.workdir
    finally:
        sb.close()
    assert workdir is not None and not os.path.exists(workdir)


@pytest.mark.skipif(os.geteuid() != 0, reason="the pre-made user namespace is made only when running as root")
def test_a_read_only_proc_sys_is_an_error_not_a_hang():
    """Where the limit cannot be written (under bwrap: no_new_privs keeps the helper's re-exec from
    gaining the namespace's capabilities; some containers), capping nested user namespaces fails:
    that must be a clear error at once, not a wait for a line that never comes."""
    import subprocess

    code = "from agent_envs.sandbox._procs import UserNamespace; UserNamespace()"
    proc = subprocess.run(
        ["bwrap", "--dev-bind", "/", "/", "--proc", "/proc", "--unshare-pid", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode != 0 and "user.max_user_namespaces was refused" in proc.stderr, proc.stderr[-2000:]
