"""``agent-envs eval`` is four library parts a user can call from Python (issue 31): the run folder
held (``rollout.runfolder.run_folder``), a resume checked (``rollout.resume.check_resume``), the
episodes run on a policy or a pool (``scale.execute.execute``) and the outputs written
(``rollout.outputs.write_outputs``).  Each is called here directly, without the command line."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401  (registers the environments)
from agent_envs.envs.registry import spec
from agent_envs.policy.scripted import ScriptedPolicy
from agent_envs.rollout.outputs import write_outputs
from agent_envs.rollout.records import NotARecordsFile
from agent_envs.rollout.resume import CannotResume, check_resume
from agent_envs.rollout.runfolder import FolderNotWritable, RecordsExist, run_folder
from agent_envs.rollout.runlock import LOCK_NAME, RunFolderBusy
from agent_envs.scale.execute import execute

ENV = "MATH-ReAct-v0"


def test_run_folder_holds_the_folder_and_tidies_an_empty_one(tmp_path):
    out = tmp_path / "run"
    with run_folder(out) as records:
        assert records == out / "records.jsonl" and (out / LOCK_NAME).is_file()
        with pytest.raises(RunFolderBusy), run_folder(out):
            pass  # a second writer is refused while the first holds it
    assert not out.exists()  # nothing was written: no folder holding only the lock is left


def test_run_folder_keeps_records_only_for_a_resumed_run(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "records.jsonl").write_text('{"task_id": "t"}\n')
    with pytest.raises(RecordsExist, match="records.jsonl"), run_folder(out):
        pass
    with run_folder(out, resume=True) as records:
        assert records.read_text() == '{"task_id": "t"}\n'
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME, "records.jsonl"]  # the lock file stays, unlocked
    with run_folder(out, resume=True):
        pass


def test_run_folder_refuses_what_cannot_hold_a_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(FolderNotWritable, match="is a file, not a directory"), run_folder(blocker / "run"):
        pass
    (tmp_path / "run" / "records.jsonl").mkdir(parents=True)
    with pytest.raises(NotARecordsFile, match="is a directory, not a records file"), run_folder(tmp_path / "run"):
        pass


def test_check_resume_compares_the_run_identity(tmp_path):
    config = {"env": ENV, "seed": 1, "samples": 2}
    check_resume(tmp_path / "config.json", config)  # nothing to compare yet
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_resume(tmp_path / "config.json", {**config, "samples": 4})  # not part of the identity
    with pytest.raises(CannotResume, match=r"the configuration changed \(seed: 1 -> 2\)"):
        check_resume(tmp_path / "config.json", {**config, "seed": 2})
    (tmp_path / "records.jsonl").write_text('not json\n{"task_id": "t"}\n')
    with pytest.raises(CannotResume, match="cannot resume: .*records.jsonl.*line 1"):
        check_resume(tmp_path / "config.json", config)


class _Closing(ScriptedPolicy):
    closed = 0

    def close(self) -> None:
        type(self).closed += 1


def test_execute_then_write_outputs(tmp_path):
    env = gym.make(ENV, dataset="builtin")
    tasks = list(env.get_wrapper_attr("tasks"))[:2]
    env.close()
    _Closing.closed = 0
    policy = _Closing(spec(ENV).baseline, sampled=False)
    config = {"env": ENV, "policy": "scripted"}
    with run_folder(tmp_path / "run") as records_path:
        records, wall = execute(
            policy,
            ENV,
            tasks,
            out=records_path.parent,
            config=config,
            samples=2,
            env_kwargs={"sandbox": "bwrap"},
            out_path=records_path,
            progress=False,
        )
        summary = write_outputs(records_path.parent, records, env_id=ENV, samples=2, items=len(tasks), wall_s=wall)
    out = tmp_path / "run"
    assert _Closing.closed == 1 and wall > 0 and len(records) == 4
    assert len(records_path.read_text().splitlines()) == 4
    saved = json.loads((out / "config.json").read_text())
    assert saved["env"] == ENV and saved["policy_info"] == policy.describe()
    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["es"]["count"] == 4 and summary["es"]["items"] == 2 and summary["run"]["episodes"] == 4
    assert len(list((out / "trace_logs").iterdir())) == 4


def test_execute_closes_the_policy_when_the_run_fails(tmp_path):
    policy = _Closing(["x"])
    _Closing.closed = 0
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):  # config.json cannot be written under a file
        execute(policy, ENV, [], out=tmp_path / "file", config={})
    assert _Closing.closed == 1
