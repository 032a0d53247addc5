"""Run folders (docs/reliability.md#run-folders): one writer at a time, resume refuses what it
cannot resume with one line naming file and line (before any model loads), files of one run
share one mode that respects the umask, and ``report`` renders damaged or foreign records as far
as it can.  Real processes, real files, a private mount namespace for the read-only case."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent_envs import cli
from agent_envs.rollout.resume import DamagedRecords, prepare_resume

REPO = Path(__file__).resolve().parent.parent
EVAL = ["eval", "--policy", "scripted", "--sandbox", "none", "--limit", "2", "--no-progress"]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture
def no_policy(monkeypatch):
    """Checks that must come first: building the policy (loading a model) fails the test."""

    def refuse(*_a, **_k):
        raise AssertionError("the policy was built before the run folder was checked")

    monkeypatch.setattr(cli, "make_policy", refuse)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "done"
    assert cli.main([*EVAL, "--out", str(out)]) == 0
    return out


def test_a_second_writer_is_refused_naming_the_first_and_a_killed_holder_leaves_no_lock(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(  # takes the folder's lock the way eval does, then waits
        [
            sys.executable,
            "-c",
            "import sys; from agent_envs.rollout.runlock import RunLock; "
            "RunLock(sys.argv[1]).acquire(); print('locked', flush=True); sys.stdin.read()",
            str(out),
        ],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        assert cli.main([*EVAL, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"agent-envs eval: error: {out} is in use by another eval (pid {holder.pid} on host ")
        assert ", started 20" in err and err.count("\n") == 1
        assert not (out / "records.jsonl").exists() and not (out / "config.json").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert cli.main([*EVAL, "--out", str(out)]) == 0  # the kernel dropped the dead holder's lock


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "directory", "fifo"])
def test_a_lock_that_is_not_a_plain_file_is_refused_in_one_line_and_left_alone(tmp_path, capsys, no_policy, kind):
    """``<out>/.lock`` a symlink is never followed (eval once truncated and rewrote its target); a
    directory or FIFO is one line, not a traceback (or a hang)."""
    out, target = tmp_path / "run", tmp_path / "precious.txt"
    out.mkdir()
    target.write_text("keep me\n")
    lock = out / ".lock"
    if kind == "symlink":
        lock.symlink_to(target)
    elif kind == "dangling symlink":
        lock.symlink_to(tmp_path / "created-through-the-link")
    elif kind == "directory":
        lock.mkdir()
    else:
        os.mkfifo(lock)
    assert cli.main([*EVAL, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agent-envs eval: error: {lock} cannot be the run lock: it is a ") and err.count("\n") == 1
    assert target.read_text() == "keep me\n" and not (tmp_path / "created-through-the-link").exists()
    assert not (out / "config.json").exists()


def test_a_refusal_shows_the_holder_sanitised_and_short(tmp_path):
    """The lock file is anyone's text: terminal escapes and a 3 KB "pid" never reach stderr whole."""
    import fcntl

    from agent_envs.rollout.runlock import RunFolderBusy, RunLock

    (tmp_path / ".lock").write_text(json.dumps({"pid": "\x1b[2J" + "9" * 3000, "host": "h\x07\r", "started": "t"}))
    fd = os.open(tmp_path / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by this open file: RunLock's own open is refused
        with pytest.raises(RunFolderBusy) as refused:
            RunLock(tmp_path).acquire()
    finally:
        os.close(fd)
    message = str(refused.value)
    assert message.isprintable() and len(message) < 400 + len(str(tmp_path)), message
    assert "pid ?[2J9999" in message and "on host h??" in message


@pytest.mark.parametrize("existed", [False, True])
def test_a_failed_eval_leaves_no_folder_holding_only_the_lock(tmp_path, capsys, existed):
    """Refused after the lock was taken (here a missing skill file): nothing of the run stays."""
    out = tmp_path / "run"
    if existed:
        out.mkdir()
    assert cli.main([*EVAL, "--out", str(out), "--skill-file", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt" in capsys.readouterr().err
    assert (list(out.iterdir()) == []) if existed else not out.exists()


def _damaged(run: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "damaged"
    shutil.copytree(run, copy)
    lines = (copy / "records.jsonl").read_text().splitlines()
    (copy / "records.jsonl").write_text("\n".join(edit(lines)) + "\n")
    return copy


def _with_score(line: str, score: float) -> str:
    return json.dumps({**json.loads(line), "score": score})  # written NaN / Infinity, as Python's json does


def _without(line: str, field: str) -> str:
    row = json.loads(line)
    row.pop(field)
    return json.dumps(row)


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda ls: [_without(ls[0], "task_id"), *ls[1:]], "line 1 is not a record (task_id: Field required)"),
        (
            lambda ls: [ls[0], json.dumps({**json.loads(ls[1]), "key": 7})],
            "line 2 is not a record (key: Input should be a valid string)",
        ),
        (lambda ls: [ls[0], "{not json", ls[1]], "line 2 is not JSON"),
        (lambda ls: [ls[0], "[1, 2]", ls[1]], "line 2 is a JSON list, not a record"),
        (lambda ls: [ls[0], _with_score(ls[1], float("nan"))], "line 2 has score NaN, not a finite number"),
        (lambda ls: [_with_score(ls[0], float("inf")), ls[1]], "line 1 has score Infinity, not a finite number"),
    ],
)
def test_resume_on_damaged_records_is_one_line_naming_file_and_line(
    finished_run, tmp_path, capsys, no_policy, edit, problem
):
    run = _damaged(finished_run, tmp_path, edit)
    before = (run / "records.jsonl").read_bytes()
    assert cli.main([*EVAL, "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"agent-envs eval: error: cannot resume: {run / 'records.jsonl'}: {problem}"
        + err[err.index(problem) + len(problem) :]
    )
    assert err.count("\n") == 1 and (run / "records.jsonl").read_bytes() == before  # nothing rewritten


def test_resume_tolerates_only_a_torn_last_line(finished_run, tmp_path):
    run = _damaged(finished_run, tmp_path, lambda ls: [ls[0], ls[1][:40]])
    assert cli.main([*EVAL, "--out", str(run), "--resume"]) == 0
    assert len((run / "records.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    "config, problem", [("{not json", "is not readable JSON"), ("[1, 2]", "holds a JSON list, not a run configuration")]
)
def test_resume_with_a_corrupt_config_is_one_line(finished_run, tmp_path, capsys, no_policy, config, problem):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "config.json").write_text(config)
    assert cli.main([*EVAL, "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agent-envs eval: error: cannot resume: {run / 'config.json'} {problem}")
    assert err.count("\n") == 1


def test_a_dataset_with_duplicate_ids_is_refused_before_the_policy(tmp_path, capsys, no_policy):
    data = tmp_path / "tasks.jsonl"
    rows = [
        {"id": "a", "question": "1+1?", "answer": "2"},
        {"id": "b", "question": "2+2?", "answer": "4"},
        {"id": "a", "question": "3+3?", "answer": "6"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = cli.main(
        [
            "eval",
            "--env",
            "MATH-ReAct-v0",
            "--data",
            str(data),
            "--policy",
            "transformers",
            "--model",
            str(tmp_path / "no-model"),
            "--out",
            str(tmp_path / "run"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err == (
        f"agent-envs eval: error: --data {data}: task id 'a' is used by rows 1, 3; ids must "
        "be unique (records are keyed by '<task_id>:sampleNN')\n"
    )


@pytest.mark.parametrize("mask", [0o027, 0o002])
def test_the_files_of_a_run_share_one_mode_that_respects_the_umask(tmp_path, mask):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "agent_envs.cli", *EVAL, "--out", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.umask(mask),
    )
    assert done.returncode == 0, done.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    modes = {p.relative_to(out).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in files}
    assert {"config.json", "records.jsonl", "summary.json", "report.html", ".lock"} <= set(modes)
    assert any(name.startswith("trace_logs/") for name in modes)
    assert set(modes.values()) == {0o666 & ~mask}, {k: oct(v) for k, v in modes.items()}


# ----------------------------------------------------------------------------------------- report
def _report_of(run: Path, tmp_path: Path, edit, env: str | None = None) -> str:
    copy = tmp_path / "rep"
    shutil.copytree(run, copy)
    rows = [json.loads(line) for line in (copy / "records.jsonl").read_text().splitlines()]
    (copy / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in edit(rows)))
    if env is not None:  # the run's own config names an environment this version does not know
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, "env": env}))
    (copy / "report.html").unlink()
    assert cli.main(["report", str(copy)]) == 0
    return (copy / "report.html").read_text()


def test_report_of_older_records_without_env_id_uses_the_runs_config(finished_run, tmp_path):
    html = _report_of(finished_run, tmp_path, lambda rs: [{k: v for k, v in r.items() if k != "env_id"} for r in rs])
    assert html.count('<article class="episode"') == 2 and "could not be shown</summary>" not in html


@pytest.mark.parametrize(
    "edit, shown, note",
    [
        (
            lambda rs: [{**r, "env_id": "Nope-v0"} for r in rs],
            2,
            "2 record(s) with env_id Nope-v0: not an environment registered here, so success is read as score &gt;= 1",
        ),
        (lambda rs: [{k: v for k, v in r.items() if k != "env_id"} for r in rs], 2, "2 record(s) with env_id (none)"),
        (lambda rs: [{**rs[0], "step_scores": "high"}, rs[1]], 2, "line 1: step_scores not shown (unexpected str)"),
        (lambda rs: [{**rs[0], "turn_log": "x", "tool_calls": "many"}, rs[1]], 2, "line 1: tool_calls not shown"),
        (lambda rs: [{**rs[0], "score": "high"}, rs[1]], 1, "line 1: left out (score: Input should be a valid number"),
        (lambda rs: [rs[0], {**rs[1], "react_steps": [{"turn": "x"}]}], 2, ":sample00: turns not shown (ValueError"),
    ],
)
def test_report_renders_what_it_can_of_damaged_or_foreign_records_and_says_what_not(
    finished_run, tmp_path, edit, shown, note
):
    html = _report_of(finished_run, tmp_path, edit, env="Nope-v0")
    assert html.count('<article class="episode"') == shown
    assert note.replace("'", "&#39;") in html and "could not be shown</summary>" in html


def test_report_out_onto_a_directory_or_under_a_file_is_one_line(finished_run, tmp_path, capsys):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    for out, problem in (
        (tmp_path, f"--out {tmp_path} is a directory; name a file, e.g. {tmp_path / 'report.html'}"),
        (blocker / "r.html", f"--out {blocker / 'r.html'}: {blocker} is a file, not a directory"),
    ):
        assert cli.main(["report", str(finished_run), "--out", str(out)]) == 2
        assert capsys.readouterr().err == f"agent-envs report: error: {problem}\n"


def test_report_onto_a_read_only_mount_is_one_line(finished_run, tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private read-only bind mount")
    target = tmp_path / "ro"
    target.mkdir()
    script = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            str(target),
            sys.executable,
            "-m",
            "agent_envs.cli",
            "report",
            str(finished_run),
            "--out",
            str(target / "r.html"),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"agent-envs report: error: cannot write the report to {target / 'r.html'}: Read-only file system\n"
    )


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("score", "abc", "line 1 is not a record (score: "),
        ("turn_log", "abc", "line 1 is not a record (turn_log: "),
        ("react_steps", ["x", 1], "line 1 is not a record (react_steps.0: "),
        ("turn_tool_s", "abc", "line 1 is not a record (turn_tool_s: "),
        ("step_scores", "abc", None),  # not a list: no step scored, the rest summarised
    ],
)
def test_summarize_on_type_confused_fields_is_one_line_or_a_summary(tmp_path, capsys, field, value, problem):
    """``summarize`` (and compare, export, which share the loader) ended in tracebacks here."""
    row = {"key": "t:sample00", "task_id": "t", "row_index": 0, "sample_index": 0, "score": 1.0}
    (tmp_path / "records.jsonl").write_text(json.dumps({**row, field: value}) + "\n")
    code = cli.main(["summarize", str(tmp_path)])
    out, err = capsys.readouterr()
    if problem is None:
        assert code == 0 and "1.0000" in out
    else:
        assert code == 2 and err.startswith(f"agent-envs summarize: error: {tmp_path / 'records.jsonl'}: {problem}")
        assert err.count("\n") == 1


@pytest.mark.parametrize("kind", ["directory", "FIFO"])
def test_records_that_are_not_a_regular_file_are_one_line_not_a_traceback_or_a_hang(tmp_path, capsys, no_policy, kind):
    """A directory ended --resume in a traceback; a FIFO made ``eval --resume`` (and summarize)
    wait forever for a writer: the file is checked on a descriptor opened without blocking."""
    out = tmp_path / "run"
    out.mkdir()
    records = out / "records.jsonl"
    records.mkdir() if kind == "directory" else os.mkfifo(records)
    for argv, problem in (
        ([*EVAL, "--out", str(out), "--resume"], f"{records} is a {kind}, not a records file"),
        ([*EVAL, "--out", str(out)], f"{records} is a {kind}, not a records file"),
        (["summarize", str(out)], f"{records} is a {kind}, not a records file"),
        (["export", str(out), "--format", "tokens"], f"{records} is a {kind}, not a records file"),
    ):
        assert cli.main(argv) == 2
        assert capsys.readouterr().err == f"agent-envs {argv[0]}: error: {problem}\n"
    with pytest.raises(DamagedRecords, match=f"is a {kind}, not a records file"):
        prepare_resume(records)  # the runner's own resume, for library callers


def test_summarize_says_when_a_score_is_not_a_finite_number(finished_run, tmp_path, capsys):
    """It printed mean 0.0000 for a NaN score without a word."""
    run = _damaged(finished_run, tmp_path, lambda ls: [ls[0], _with_score(ls[1], float("nan"))])
    key = json.loads((run / "records.jsonl").read_text().splitlines()[1])["key"]
    assert cli.main(["summarize", str(run)]) == 0
    assert capsys.readouterr().err == (
        f"[agent-envs] warning: {run}: 1 record(s) have a score that is not a finite number (NaN or Infinity), "
        f"counted as 0 in the means: {key}\n"
    )


def test_resume_keeps_the_bytes_of_a_finished_row_with_invalid_utf8(finished_run, tmp_path):
    """The rewrite re-encoded rows, turning invalid UTF-8 into U+FFFD without a word."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    first, second = (run / "records.jsonl").read_bytes().splitlines()
    kept = first.replace(b'"prediction": "', b'"prediction": "\xff\xfe', 1)
    assert kept != first
    (run / "records.jsonl").write_bytes(kept + b"\n" + second + b"\n")
    assert cli.main([*EVAL, "--out", str(run), "--resume"]) == 0
    assert (run / "records.jsonl").read_bytes().splitlines() == [kept, second]
