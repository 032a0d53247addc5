"""The sandbox contract on the Docker backend, against a private daemon and a locally built image."""

from __future__ import annotations

import hashlib
import socket
import subprocess
from pathlib import Path
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from agent_envs.core.spec import Mount
from agent_envs.envs.docvqa.spec import DOCUMENT_PATH
from agent_envs.sandbox.base import SandboxConfig, SandboxUnavailable
from agent_envs.sandbox._bwrap_layout import bwrap_usable
from agent_envs.sandbox.docker import LABEL, DockerSandbox
from protocol_specs import format_observation

if TYPE_CHECKING:  # imported by pytest as a plugin; a direct import would skip assertion rewriting
    from docker_daemon import DockerDaemon

pytest_plugins = ["docker_daemon"]
pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parent.parent


def _config(base: SandboxConfig, **changes) -> SandboxConfig:
    limits = base.limits.model_copy(update=changes.pop("limits", {}))
    return base.model_copy(update={"limits": limits, **changes})


@pytest.fixture
def sandbox(docker_sandbox_config: SandboxConfig) -> Iterator[DockerSandbox]:
    with DockerSandbox(docker_sandbox_config) as sb:
        yield sb


def _containers(daemon: DockerDaemon, sb: DockerSandbox) -> list[str]:
    res = daemon.docker("ps", "-aq", "--filter", f"label={LABEL}={sb.sandbox_id}")
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def _processes(sb: DockerSandbox) -> list[str]:
    """Command lines of every process in the container except the listing itself."""
    res = sb.run("ps -e -o args=")
    return [line for line in res.stdout.decode().splitlines() if "ps -e -o args=" not in line]


def test_echo_and_separate_streams(sandbox: DockerSandbox) -> None:
    res = sandbox.run("echo hello; echo oops >&2; exit 3")
    assert (res.returncode, res.stdout, res.stderr, res.timed_out) == (3, b"hello\n", b"oops\n", False)
    assert format_observation(res, "docvqa") == "hello\n\n[stderr]\noops\n[exit_code] 3"
    assert format_observation(sandbox.run("echo e >&2"), "math") == "[stderr]\ne\n\n[exit_code] 0"
    assert sandbox.run("true").stdout == b"" and sandbox.run("true").stderr == b""


@pytest.mark.parametrize("command,code", [("exit 7", 7), ("false", 1), ("no-such-tool", 127), ("echo (", 2)])
def test_exit_codes(sandbox: DockerSandbox, command: str, code: int) -> None:
    assert sandbox.run(command).returncode == code


def test_protocol_environment(sandbox: DockerSandbox) -> None:
    res = sandbox.run(
        'pwd; ulimit -v; echo "$HOME $PIP_NO_INDEX"; '
        "echo $OPENBLAS_NUM_THREADS $OMP_NUM_THREADS $MKL_NUM_THREADS $NUMEXPR_NUM_THREADS; id -u"
    )
    lines = res.stdout.decode().splitlines()
    assert lines[:4] == ["/workspace", "8388608", "/tmp 1", "1 1 1 1"]
    assert int(lines[4]) == sandbox.uid != 0
    tools = sandbox.run(
        "python3 -c 'import numpy, sympy, PIL, pytesseract; print(numpy.ones(2).sum())'; python3 -m pip --version"
    )
    assert tools.stdout == b"2.0\n" and tools.returncode != 0 and b"pip " not in tools.stdout + tools.stderr


def test_timeout_kills_the_whole_tree(sandbox: DockerSandbox) -> None:
    res = sandbox.run("sleep 60", timeout=2)
    assert res.timed_out and res.returncode == 124
    assert format_observation(res, "docvqa") == "Bash timed out after 2.0s."
    assert 1.9 <= res.duration_s < 6, res.duration_s
    assert res.stderr == b""  # no job-control noise from the wrapper
    res = sandbox.run("(sleep 61; echo late) & sleep 62", timeout=1)
    assert res.timed_out
    assert not [p for p in _processes(sandbox) if "sleep 6" in p]


def test_background_processes_do_not_survive_a_command(sandbox: DockerSandbox) -> None:
    res = sandbox.run("nohup sleep 300 >/dev/null 2>&1 & setsid sleep 301 & echo started")
    assert res.returncode == 0 and res.stdout == b"started\n" and res.duration_s < 10
    assert not [p for p in _processes(sandbox) if "sleep 30" in p]


def test_no_network(sandbox: DockerSandbox) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        probe = (
            "import socket\n"
            f"try: socket.create_connection(('127.0.0.1', {port}), timeout=3); print('connected')\n"
            "except OSError as e: print('blocked', e.errno)\n"
            "try: socket.getaddrinfo('example.org', 80); print('resolved')\n"
            "except OSError as e: print('no-dns')\n"
        )
        res = sandbox.run(f'python3 -c "{probe}"; cat /proc/net/dev | tail -n +3 | cut -d: -f1')
        with pytest.raises(BlockingIOError):
            listener.accept()
    out = res.stdout.decode().split()
    assert out[0] == "blocked" and out[2] == "no-dns" and out[3:] == ["lo"], out


def test_read_only_root_and_writable_scratch(sandbox: DockerSandbox) -> None:
    res = sandbox.run("for p in /x /usr/x /etc/x /root/x; do touch $p 2>/dev/null || echo ro $p; done")
    assert res.stdout.decode().split("\n")[:-1] == ["ro /x", "ro /usr/x", "ro /etc/x", "ro /root/x"]
    assert sandbox.run("echo w > /workspace/a && echo t > /tmp/b && mkdir -p /tmp/d && cd /tmp/d").returncode == 0
    res = sandbox.run("pwd; cat /workspace/a /tmp/b")
    assert res.stdout == b"/tmp/d\nw\nt\n"  # files and the working directory persist


def test_workspace_size_is_capped(docker_sandbox_config: SandboxConfig) -> None:
    with DockerSandbox(_config(docker_sandbox_config, limits={"workspace_mib": 8})) as sb:
        res = sb.run("head -c 20000000 /dev/zero > /workspace/big; echo $?; stat -c %s /workspace/big")
    code, size = res.stdout.split()
    assert code != b"0" and int(size) <= 8 * 1024 * 1024 and b"No space left" in res.stderr


def test_fresh_mode_forgets_everything(docker_daemon: DockerDaemon, docker_sandbox_config: SandboxConfig) -> None:
    with DockerSandbox(docker_sandbox_config.model_copy(update={"mode": "fresh"})) as sb:
        assert sb.run("echo x > /workspace/f; cd /tmp").returncode == 0
        assert _containers(docker_daemon, sb) == []
        res = sb.run("pwd; ls /workspace")
    assert res.stdout == b"/workspace\n"


def test_document_is_bound_read_only_and_byte_equal(docker_sandbox_config: SandboxConfig, tmp_path: Path) -> None:
    doc = tmp_path / "doc.png"
    doc.write_bytes(b"\x89PNG fake document " * 100)
    doc.chmod(0o600)  # unreadable for the sandbox uid: the backend must stage a readable copy
    (tmp_path / "secret.txt").write_text("answer")
    with DockerSandbox(docker_sandbox_config.model_copy(update={"mounts": [Mount(str(doc), DOCUMENT_PATH)]})) as sb:
        res = sb.run(
            "sha256sum /workspace/document.png; echo x >> /workspace/document.png || echo no-write; "
            "rm -f /workspace/document.png || echo no-rm; ls /workspace; find / -name secret.txt 2>/dev/null; "
            "sha256sum /workspace/document.png"
        )
    digest = hashlib.sha256(doc.read_bytes()).hexdigest()
    assert res.stdout.decode().replace("  /workspace/document.png", "").split() == [
        digest,
        "no-write",
        "no-rm",
        "document.png",
        digest,
    ]


def test_tesseract_reads_the_document(docker_sandbox_config: SandboxConfig, docvqa_dir: Path) -> None:
    image = min((docvqa_dir / "documents").glob("*.png"))
    with DockerSandbox(docker_sandbox_config.model_copy(update={"mounts": [Mount(str(image), DOCUMENT_PATH)]})) as sb:
        res = sb.run("tesseract /workspace/document.png stdout 2>/dev/null | wc -w")
    assert res.returncode == 0 and int(res.stdout) > 20


def test_memory_limit_contains_a_memory_bomb(docker_sandbox_config: SandboxConfig) -> None:
    with DockerSandbox(_config(docker_sandbox_config, limits={"memory_gib": 0.25})) as sb:
        limit = sb.run("cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max 2>/dev/null")
        assert int(limit.stdout.split()[0]) == 256 * 1024 * 1024
        single = sb.run("python3 -c 'b = bytearray(2 * 1024**3)'")
        assert single.returncode == 1 and b"MemoryError" in single.stderr
        # each process stays under ulimit -v; together they exceed the cgroup
        many = sb.run(
            "for i in 1 2 3 4; do (python3 -c 'import time; b = bytearray(180 * 2**20); "
            "time.sleep(2)'; echo rc=$?) & done; wait",
            timeout=30,
        )
        assert b"rc=137" in many.stdout, many
        assert sb.run("echo alive").stdout == b"alive\n"


def test_pids_limit_contains_a_fork_bomb(docker_sandbox_config: SandboxConfig) -> None:
    with DockerSandbox(_config(docker_sandbox_config, limits={"max_processes": 64})) as sb:
        assert sb.run("cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max 2>/dev/null").stdout == b"64\n"
        res = sb.run("bomb() { bomb | bomb & }; bomb; sleep 2", timeout=4)
        assert b"Resource temporarily unavailable" in res.stderr and res.duration_s < 15
        assert len(_processes(sb)) <= 5  # the bomb is gone: only the wrapper of this listing
        assert sb.run("echo alive").stdout == b"alive\n"


def test_output_capture_is_bounded(sandbox: DockerSandbox) -> None:
    res = sandbox.run("seq 1 2000000; seq 1 300000 >&2")
    keep = len(res.stdout) // 2
    assert res.stdout.startswith(b"1\n2\n3\n") and res.stdout.endswith(b"\n1999999\n2000000\n")
    full = subprocess.run(["seq", "1", "2000000"], capture_output=True, check=True).stdout
    assert res.stdout_dropped == len(full) - 2 * keep
    assert res.stderr.endswith(b"\n300000\n") and res.stderr_dropped > 0


def test_launch_error_for_nul_byte(sandbox: DockerSandbox) -> None:
    res = sandbox.run("echo a\0b")
    assert res.returncode == 126 and "embedded null byte" in (res.launch_error or "")


def test_close_removes_the_container(docker_daemon: DockerDaemon, docker_sandbox_config: SandboxConfig) -> None:
    sb = DockerSandbox(docker_sandbox_config)
    assert _containers(docker_daemon, sb) == []  # created lazily
    sb.run("sleep 100 &")
    assert len(_containers(docker_daemon, sb)) == 1
    sb.close()
    sb.close()
    assert _containers(docker_daemon, sb) == []


def test_unreachable_daemon_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    with (
        DockerSandbox(SandboxConfig(backend="docker")) as sb,
        pytest.raises(SandboxUnavailable, match="no Docker daemon"),
    ):
        sb.run("true")


def test_missing_image_is_a_clear_error(docker_sandbox_config: SandboxConfig) -> None:
    cfg = docker_sandbox_config.model_copy(update={"docker_image": "agent-envs-absent:none"})
    with DockerSandbox(cfg) as sb, pytest.raises(SandboxUnavailable, match="build_local_image.sh"):
        sb.run("true")


def test_local_image_runs_the_package(docker_daemon: DockerDaemon, docker_image: str) -> None:
    has_cli = (REPO / "agent_envs" / "cli.py").is_file()
    args = ["--help"] if has_cli else ["--entrypoint", "python3", docker_image, "-c", "import agent_envs"]
    cmd = ["run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL"]
    res = docker_daemon.docker(*cmd, *([docker_image] + args if has_cli else args))
    assert res.returncode == 0, res.stderr
    if has_cli:
        assert "usage" in res.stdout.lower()


def _bwrap_in_container(daemon: DockerDaemon, image: str, *options: str) -> str:
    probe = "from agent_envs.sandbox._bwrap_layout import bwrap_usable; ok, why = bwrap_usable(); print(ok, why)"
    res = daemon.docker("run", "--rm", "--network", "none", *options, "--entrypoint", "python3", image, "-c", probe)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_bwrap_is_reported_unusable_in_a_default_container(docker_daemon: DockerDaemon, docker_image: str) -> None:
    out = _bwrap_in_container(docker_daemon, docker_image)
    assert out.startswith("False bwrap probe exited"), out


def test_bwrap_works_in_a_container_with_unconfined_profiles(docker_daemon: DockerDaemon, docker_image: str) -> None:
    host_ok, why = bwrap_usable()
    if not host_ok:
        pytest.skip(f"bwrap is not usable on this host either ({why}), so a container cannot use it")
    options = [f"--security-opt={o}" for o in ("seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined")]
    assert _bwrap_in_container(docker_daemon, docker_image, *options).startswith("True")


def test_image_build_leaves_the_host_install_alone(docker_image: str) -> None:
    """Building the image installs the package into a staging folder, never over the host's copy."""
    import importlib.metadata

    assert importlib.metadata.version("agent-envs")  # raises PackageNotFoundError if pip removed it
