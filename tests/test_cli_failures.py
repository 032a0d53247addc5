"""``agent-envs eval`` when the outside world fails: an unusable output location (checked before
the policy is built), a full disk mid-run, and a policy server that is down or hangs.  Real
mounts (a private mount namespace), real sockets on 127.0.0.1, no mocks of the failing part."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent_envs import cli
from agent_envs.rollout.records import read_jsonl

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _in_private_tmpfs(mount_opts: str, mountpoint: Path, *eval_args: str) -> subprocess.CompletedProcess:
    """``agent-envs eval`` in a private mount namespace with a tmpfs at ``mountpoint`` (gone with it)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a private tmpfs")
    script = 'mount -t tmpfs -o "$1" none "$2" && shift 2 && exec "$@"'
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        script,
        "sh",
        mount_opts,
        str(mountpoint),
        sys.executable,
        "-m",
        "agent_envs.cli",
        "eval",
        "--no-progress",
        *eval_args,
    ]
    return subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=300)


@pytest.fixture
def no_policy(monkeypatch):
    """The output check must come first: building the policy (loading a model) fails the test."""

    def refuse(*_a, **_k):
        raise AssertionError("the policy was built before the output location was checked")

    monkeypatch.setattr(cli, "make_policy", refuse)


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_out_on_or_under_a_file_is_refused_before_the_policy(tmp_path, capsys, no_policy, where):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    out = blocker if where == "file" else blocker / "run"
    assert cli.main(["eval", "--policy", "scripted", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"agent-envs eval: error: --out {out}: {blocker} is a file, not a directory\n"


@pytest.mark.parametrize("sub", ["", "run"])
def test_out_on_a_read_only_file_system_is_refused_before_the_policy(tmp_path, sub):
    out = tmp_path / sub if sub else tmp_path
    # a model that does not exist: had the policy been built first, its error would show instead
    done = _in_private_tmpfs(
        "ro,size=64k",
        tmp_path,
        "--policy",
        "transformers",
        "--model",
        str(tmp_path / "no-such-model"),
        "--out",
        str(out),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"agent-envs eval: error: --out {out} is not a writable directory: Read-only file system\n"


def test_full_disk_reports_the_first_failed_write_once(tmp_path):
    out = tmp_path / "run"
    done = _in_private_tmpfs(
        "size=8k", tmp_path, "--policy", "scripted", "--sandbox", "none", "--limit", "8", "--out", str(out)
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("No space left on device") == 1, done.stderr
    assert done.stderr.startswith(f"agent-envs eval: error: cannot write {out}/"), done.stderr
    assert len(done.stderr.splitlines()) == 1


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def _openai_eval(url: str, out: Path) -> list[str]:
    return ["eval", "--base-url", url, "--model", "m", "--request-retries", "0", "--limit", "2", "--no-progress"] + [
        "--out",
        str(out),
    ]


def test_no_server_at_the_base_url_is_one_line_before_any_episode(tmp_path, capsys):
    """It ran every episode (200 by default, about 52 s) before saying each one failed."""
    url = f"http://127.0.0.1:{_dead_port()}/v1"
    assert cli.main(_openai_eval(url, tmp_path / "run")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agent-envs eval: error: no server answers at {url} (ConnectError: ")
    assert err.endswith("; start the server or fix --base-url\n") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def _server_that_dies_after_one_answer() -> tuple[str, threading.Thread]:
    """A server on 127.0.0.1 that answers the first request (eval's up-front check), then stops
    listening: every episode's request after it finds nothing there."""
    srv = socket.create_server(("127.0.0.1", 0))

    def answer_once() -> None:
        with srv:
            conn, _ = srv.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")

    thread = threading.Thread(target=answer_once, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}/v1", thread


def test_every_episode_failing_on_a_server_that_died_exits_3_with_a_warning(tmp_path, capsys):
    url, server = _server_that_dies_after_one_answer()
    rc = cli.main(_openai_eval(url, tmp_path / "run"))
    server.join(timeout=30)
    out, err = capsys.readouterr()
    assert rc == cli.EXIT_ALL_ERRORED == 3
    assert "2 of 2 episode(s) ended in an error (request_error: 2; first: ConnectError" in err
    assert "every episode ended in an error" in err
    header, row = out.splitlines()[:2]
    assert header.split()[3:5] == ["mean", "mean_non_err"] and row.split()[3:5] == ["0.0000", "-"]
    rows, _ = read_jsonl(tmp_path / "run" / "records.jsonl")
    assert [r["termination_reason"] for r in rows] == ["request_error"] * 2


def test_request_timeout_and_retries_reach_the_openai_policy(tmp_path, capsys):
    """A server that accepts and never answers: each attempt ends at --request-timeout."""
    accepted: list[socket.socket] = []
    with socket.create_server(("127.0.0.1", 0)) as srv:

        def hold() -> None:
            while True:
                try:
                    accepted.append(srv.accept()[0])
                except OSError:
                    return

        threading.Thread(target=hold, daemon=True).start()
        url = f"http://127.0.0.1:{srv.getsockname()[1]}/v1"
        rc = cli.main(
            [
                "eval",
                "--base-url",
                url,
                "--model",
                "m",
                "--request-timeout",
                "0.5",
                "--request-retries",
                "1",
                "--limit",
                "1",
                "--no-progress",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        srv.shutdown(socket.SHUT_RDWR)
    for conn in accepted:
        conn.close()
    assert rc == 3
    rows, _ = read_jsonl(tmp_path / "run" / "records.jsonl")
    assert (
        rows[0]["react_error"].startswith("AttemptDeadline: no complete answer") and len(accepted) == 3
    )  # eval's up-front check that a server is there, then 1 attempt + 1 retry


JUDGE = ["--step-scorer", "judge", "--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "j"]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--request-timeout", "0"], "--request-timeout must be > 0"),
        (["--request-retries", "-1"], "--request-retries must be >= 0"),
        # unbounded before: inf waits forever, 10**9 retries kept an eval on a closed port for 11 minutes
        (["--request-timeout", "inf"], "--request-timeout must be > 0 and at most 86400 seconds, got inf"),
        (["--request-timeout", "nan"], "--request-timeout must be > 0 and at most 86400 seconds, got nan"),
        (["--request-retries", "1000000000"], "--request-retries must be >= 0 and at most 100, got 1000000000"),
        ([*JUDGE, "--judge-timeout", "inf"], "--judge-timeout must be > 0 and at most 86400 seconds, got inf"),
        ([*JUDGE, "--judge-retries", "1000000000"], "--judge-retries must be >= 0 and at most 100, got 1000000000"),
        (["--policy", "scripted", "--request-timeout", "5"], "apply to --policy openai only"),
    ],
)
def test_bad_request_flags(tmp_path, capsys, flags, message):
    argv = ["eval", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", *flags, "--out", str(tmp_path / "r")]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def _no_docker_daemon(tmp_path: Path, monkeypatch) -> None:
    """DOCKER_HOST at a socket that does not exist: the docker CLI finds no daemon (none is needed)."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")


def test_an_unreachable_docker_daemon_stops_eval_before_any_episode(tmp_path, capsys, monkeypatch, no_policy):
    """docs/docker.md: SandboxUnavailable with the fix, one line, before the policy and any episode
    (it once ran 200 episodes whose every observation was the error, exit 0)."""
    _no_docker_daemon(tmp_path, monkeypatch)
    out = tmp_path / "run"
    argv = ["eval", "--policy", "scripted", "--env", "MATH-ReAct-v0", "--sandbox", "docker", "--out", str(out)]
    assert cli.main([*argv, "--limit", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agent-envs eval: error: docker backend: ") and err.count("\n") == 1, err
    assert "no Docker daemon reachable" in err or "CLI is not on PATH" in err
    assert not (out / "records.jsonl").exists()


def test_a_sandbox_failing_mid_run_is_an_infrastructure_error_not_the_models_observation(tmp_path, monkeypatch):
    """The daemon goes away after the check: each episode is an error row (re-run by --resume),
    never an observation the model is scored on."""
    from agent_envs.policy.scripted import ScriptedPolicy
    from agent_envs.envs import registry
    from agent_envs.rollout.runner import run_episodes

    _no_docker_daemon(tmp_path, monkeypatch)
    spec = registry.spec("MATH-ReAct-v0")
    tasks = spec.load_tasks("builtin")[:2]
    records = run_episodes(
        "MATH-ReAct-v0", tasks, ScriptedPolicy(spec.baseline), env_kwargs={"sandbox": "docker"}, progress=False
    )
    assert [r.termination_reason for r in records] == ["env_error"] * 2
    assert all("docker backend" in str(r.error) and not r.react_steps for r in records)


@pytest.mark.parametrize("policy", ["transformers", "vllm"])
def test_a_model_path_that_does_not_exist_is_one_line(tmp_path, capsys, policy):
    """It ended in a traceback (the loader took the path for a hub id)."""
    missing = tmp_path / "nonexistent" / "model"
    rc = cli.main(["eval", "--policy", policy, "--model", str(missing), "--out", str(tmp_path / "run")])
    assert rc == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"agent-envs eval: error: --model {missing}: no such file or folder (a hub model id is written owner/name)\n"
    )
    assert not (tmp_path / "run").exists()
