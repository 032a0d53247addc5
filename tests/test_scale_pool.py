"""Engines on Ray: an ES population and an evaluation spread over 2 engines give what 1 engine gives,
also when an engine is killed mid-run, and also when the 2 engines share one GPU.

Real parts: a local Ray session (two actors on this 2-core machine), real MATH-ReAct episodes with
bwrap sandboxes inside the actors, and a tiny torch model per actor whose weights the real
SeededPerturber perturbs and updates; the policy's answers depend on those weights, so equal
records mean equal weights, and the checksums are of real tensors.  The session declares one GPU
(``num_gpus=1``, no real GPU): Ray schedules fractional-GPU engines on it as on a GPU host.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e .[ray])")

from agent_envs.cli import main as cli_main  # noqa: E402
from agent_envs.envs.math_react.task import MathTask  # noqa: E402
from agent_envs.es.history import ESConfig, load_history, replay  # noqa: E402
from agent_envs.es.population import ESTrainer, evaluate_member  # noqa: E402
from agent_envs.rollout import load_records, run_episodes  # noqa: E402
from agent_envs.scale.engines import EngineSpec  # noqa: E402
from agent_envs.scale.es import PoolBackend, PoolESTrainer  # noqa: E402
from agent_envs.scale.pool import EnginePool, EnginesDoNotFit  # noqa: E402
from agent_envs.scale.rollout import comparable, pool_run_episodes  # noqa: E402
from agent_envs.scale.toy import TorchToyEngine, simulated_gpu_file  # noqa: E402

SPEC = EngineSpec(factory="agent_envs.scale.toy:TorchToyEngine")
TASKS = [MathTask(id=f"toy{i}", question=f"Pick the number of box {i}.", answer=str(i % 4)) for i in range(6)]
CONFIG = ESConfig(
    env_id="MATH-ReAct-v0",
    model="toy",
    generations=3,
    population=6,
    case_batch_size=3,
    train_samples=2,
    sigma_start=0.8,
    sigma_end=0.8,
    sigma_schedule="constant",
    alpha=0.8,
)
ROLLOUT = {"env_kwargs": {"max_turns": 3, "sandbox": "bwrap"}, "concurrency": 6}


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    """One local Ray for the module (starting one costs seconds), shut down at the end; its session
    files go to a private temp folder, removed afterwards (Ray's default would leave /tmp/ray)."""
    root = tempfile.mkdtemp(prefix="aeray-")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", root)
        ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=root)
        try:
            yield
        finally:
            ray.shutdown()
            shutil.rmtree(root, ignore_errors=True)


def _killer(engine: int, on_dispatch: int) -> tuple[dict[str, Any], Any]:
    """A monitor that kills ``engine`` (ray.kill) as its ``on_dispatch``-th job is handed to it, and
    waits until Ray reports the actor dead, so that job is certain to be caught by the kill."""
    state: dict[str, Any] = {
        "pool": None,
        "seen": 0,
        "killed_job": None,
        "killed_generation": None,
        "done": [],
        "requeued": [],
    }

    def monitor(event: str, fields: dict[str, Any]) -> None:
        if event == "done":
            state["done"].append(fields["engine"])
        if event == "requeue":
            state["requeued"].append(fields["job"])
        if event == "dispatch" and fields["engine"] == engine:
            state["seen"] += 1
            if state["seen"] == on_dispatch:
                state["killed_job"] = fields["job"]
                # generations run one after another: the members done so far say which one this is
                state["killed_generation"] = len(state["done"]) // CONFIG.population
                actor = state["pool"].actors[engine]
                ray.kill(actor)
                while True:  # returns as soon as the kill has landed
                    try:
                        ray.get(actor.place.remote())
                    except ray.exceptions.RayActorError:
                        break

    return state, monitor


def _es(engines: int, path, monitor=None, state=None, spec=SPEC, **pool_kwargs) -> tuple[list[dict], str, list[int]]:
    with EnginePool(spec, engines, monitor=monitor, **pool_kwargs) as pool:
        if state is not None:
            state["pool"] = pool
        backend = PoolBackend(pool, log=lambda _: None)
        history = PoolESTrainer(CONFIG, backend, TASKS, str(path), rollout_kwargs=ROLLOUT, log=lambda _: None).run()
        if state is not None:
            state.update(info=pool.info, mps=pool.mps.describe(), fingerprint=backend.fingerprint())
        return history, backend.checksum(), list(pool.lost)


def _without_placement(history: list[dict]) -> list[dict]:
    out = []
    for record in history:
        record = dict(record)
        if "samples" in record:
            record["samples"] = [
                {**s, "engine_index": None, "result": [comparable(r) for r in s["result"]]} for s in record["samples"]
            ]
        out.append(record)
    return out


@pytest.fixture(scope="module")
def one_engine(tmp_path_factory):
    return _es(1, tmp_path_factory.mktemp("es1") / "history.json")


def test_es_one_engine_run_trains_real_weights(one_engine):
    history, checksum, lost = one_engine
    generations = [r for r in history if "rewards" in r]
    assert len(generations) == CONFIG.generations and lost == []
    assert all(len(set(g["rewards"])) > 1 for g in generations), "members must differ for the update to move"
    assert len({g["weights_fingerprint"] for g in generations}) == CONFIG.generations
    engine = TorchToyEngine()
    engine.es_init()
    assert history[0]["config"]["start_fingerprint"] == engine.fingerprint()
    replay(history, engine.es, CONFIG.seed, CONFIG.population)  # checks every generation's fingerprint
    assert engine.checksum() == checksum and engine.fingerprint() == generations[-1]["weights_fingerprint"]


def test_es_pool_of_one_equals_in_process_trainer(one_engine, tmp_path):
    engine = TorchToyEngine()
    engine.es_init(exact_revert=True)

    def evaluate(batch, seed, generation, member):
        return evaluate_member(
            engine.policy,
            CONFIG.env_id,
            batch,
            seed,
            generation=generation,
            member=member,
            samples=CONFIG.train_samples,
            **ROLLOUT,
        )

    plain = ESTrainer(CONFIG, engine, TASKS, evaluate, str(tmp_path / "h.json"), log=lambda _: None).run()
    history, checksum, _ = one_engine
    assert [(r.get("seeds"), r.get("rewards"), r.get("weights")) for r in plain] == [
        (r.get("seeds"), r.get("rewards"), r.get("weights")) for r in history
    ]
    assert engine.checksum() == checksum


def test_es_two_engines_equal_one_engine(one_engine, tmp_path):
    history, checksum, lost = _es(2, tmp_path / "history.json")
    assert lost == []
    assert {s["engine_index"] for r in history for s in r.get("samples", [])} == {0, 1}
    assert _without_placement(history) == _without_placement(one_engine[0])
    assert checksum == one_engine[1]
    assert load_history(tmp_path / "history.json") == history


def test_es_two_engines_sharing_a_gpu_start_in_turn_and_equal_one_engine(one_engine, tmp_path):
    """k engines per GPU (fractional bundles, as 8 engines on 4 GPUs at 0.5 each): Ray puts both on
    the one declared GPU, they build one after another (each build takes 0.5 s here, like a real
    engine's memory profiling), and the ES history is the one-engine history."""
    gpu = {"simulated_gpu": str(tmp_path), "gpu_memory_share": 0.4, "gpu_footprint": 450}  # both fit on 1000
    simulated_gpu_file(str(tmp_path), "0").write_text(json.dumps({"total": 1000, "used": 0}))
    spec = EngineSpec(
        factory="agent_envs.scale.toy:TorchToyEngine",
        gpus=0.5,
        kwargs={"start_seconds": 0.5, **gpu},
        memory_probe="agent_envs.scale.toy:simulated_gpu_memory",
    )
    state: dict[str, Any] = {}
    history, checksum, lost = _es(2, tmp_path / "history.json", state=state, spec=spec, start_lock_dir=str(tmp_path))
    assert lost == [] and [i["gpus"] for i in state["info"]] == [["0"], ["0"]]
    # each build read the GPU's memory before and after itself: the second saw what the first took
    memory = sorted((i["memory"] for i in state["info"]), key=lambda m: -m["free_before"])
    assert [(m["free_before"], m["free_after"], m["share"]) for m in memory] == [(1000, 550, 0.4), (550, 100, 0.4)]
    (a0, a1), (b0, b1) = sorted(tuple(i["build_span"]) for i in state["info"])
    assert a1 - a0 >= 0.5 and b1 - b0 >= 0.5 and b0 >= a1  # the second build began after the first ended
    assert state["mps"].startswith("CUDA MPS off: ")  # no MPS on this host, and the pool says so
    assert {s["engine_index"] for r in history for s in r.get("samples", [])} == {0, 1}
    assert _without_placement(history) == _without_placement(one_engine[0])
    assert checksum == one_engine[1]


def test_engines_that_cannot_all_fit_on_their_gpu_are_refused_after_the_first_build(tmp_path):
    """Four engines on one GPU of 1000 units: each asks for 200 and takes 300, so the fourth would find 100
    where its build needs 300 and the margin.  The pool refuses as soon as the first is built, names the
    share that fits, and kills the engines still building (the second one's build takes 2 s here) instead
    of waiting for them."""
    simulated_gpu_file(str(tmp_path), "0").write_text(json.dumps({"total": 1000, "used": 0}))
    spec = EngineSpec(
        factory="agent_envs.scale.toy:TorchToyEngine",
        gpus=0.25,
        cpus=0.5,
        kwargs={"start_seconds": 2.0, "simulated_gpu": str(tmp_path), "gpu_memory_share": 0.2, "gpu_footprint": 300},
        memory_probe="agent_envs.scale.toy:simulated_gpu_memory",
    )
    events: list[str] = []
    with pytest.raises(EnginesDoNotFit) as refused:
        EnginePool(spec, 4, start_lock_dir=str(tmp_path), monitor=lambda event, _: events.append(event))
    why = str(refused.value)
    assert "engine 4 would find about 0.00 GiB free" in why and "a share of at most 0.145 per engine fits" in why, why
    assert json.loads(simulated_gpu_file(str(tmp_path), "0").read_text())["used"] == 300  # one engine built
    assert events == []  # no engine was handed to the caller
    groups = ray.util.placement_group_table().values()
    assert groups and {g["state"] for g in groups} == {"REMOVED"}  # every engine's placement given back


def test_es_killed_engine_loses_and_duplicates_nothing(one_engine, tmp_path):
    state, monitor = _killer(engine=1, on_dispatch=3)  # mid-run: generation 0 or 1 is under way
    history, checksum, lost = _es(2, tmp_path / "history.json", monitor, state)
    assert lost == [1] and state["requeued"] == [state["killed_job"]]
    assert len(state["done"]) == CONFIG.generations * CONFIG.population  # each member finished once
    for record in (r for r in history if "samples" in r):
        assert [s["seed"] for s in record["samples"]] == record["seeds"]
        for sample in record["samples"]:
            member_keys = [row["key"] for row in sample["result"]]
            assert len(member_keys) == len(set(member_keys)) == CONFIG.case_batch_size * CONFIG.train_samples
    # which dispatch is engine 1's third depends on the engines' speed: find the generation it fell in
    killed = [r for r in history if "samples" in r][state["killed_generation"]]
    assert killed["samples"][state["killed_job"]]["engine_index"] == 0  # re-run on the survivor
    assert _without_placement(history) == _without_placement(one_engine[0])
    assert checksum == one_engine[1]


def test_eval_over_two_engines_with_a_kill_equals_one_engine(tmp_path):
    reference = run_episodes(
        "MATH-ReAct-v0", TASKS, TorchToyEngine().policy, samples=2, progress=False, base_seed=7, **ROLLOUT
    )
    state, monitor = _killer(engine=1, on_dispatch=2)
    out = tmp_path / "records.jsonl"
    with EnginePool(SPEC, 2, monitor=monitor) as pool:
        state["pool"] = pool
        records = pool_run_episodes(
            pool, "MATH-ReAct-v0", TASKS, samples=2, out_path=out, chunk_rows=1, progress=False, base_seed=7, **ROLLOUT
        )
        assert pool.lost == [1] and state["requeued"] == [state["killed_job"]]
    assert [comparable(r) for r in records] == [comparable(r) for r in reference]
    written = load_records(out)
    assert sorted(r.key for r in written) == sorted(r.key for r in reference)  # none lost, none twice
    assert {r.score for r in reference} == {0.0, 1.0}


def test_cli_eval_engines_two_equals_one(tmp_path):
    common = [
        "eval",
        "--policy",
        "scripted",
        "--limit",
        "4",
        "--samples",
        "2",
        "--no-progress",
        "--no-trace-logs",
        "--sandbox",
        "bwrap",
    ]
    assert cli_main([*common, "--out", str(tmp_path / "one" / "run")]) == 0
    assert cli_main([*common, "--engines", "2", "--out", str(tmp_path / "two" / "run")]) == 0
    one, two = (load_records(tmp_path / d / "run" / "records.jsonl") for d in ("one", "two"))
    assert len(one) == 8
    assert sorted((comparable(r) for r in two), key=lambda r: r["key"]) == sorted(
        (comparable(r) for r in one), key=lambda r: r["key"]
    )


def test_vllm_spec_packs_k_engines_per_gpu():
    from agent_envs.policy.vllm import DEFAULT_ROLLOUT_TOKEN_BUDGET
    from agent_envs.scale.engines import vllm_spec

    whole = vllm_spec("m", {"gpu_memory_utilization": 0.8})
    half = vllm_spec("m", {"gpu_memory_utilization": 0.8}, engines_per_gpu=2)
    assert whole.gpus == 1 and whole.kwargs["gpu_memory_utilization"] == 0.8
    assert half.gpus == 0.5 and half.kwargs["gpu_memory_utilization"] == 0.4
    assert whole.kwargs["rollout_token_budget"] == DEFAULT_ROLLOUT_TOKEN_BUDGET == 0  # one default everywhere
    with pytest.raises(ValueError, match="single-GPU engines"):
        vllm_spec("m", {"tensor_parallel_size": 2}, engines_per_gpu=2)
