"""The driver's update call: where it spends its time (agent_envs/es/call_path.py: the worker stamps its
method with the clock every process of one kernel shares, and the driver splits its call into the way to
the method, the method and the way back, only where both ends read one clock), and the updated weights'
fingerprint answered in the same call, so the trainer's next question costs no second trip."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from test_es_refresh_ahead import IDS, SEEDS, SIGMA, SIGNS, engine_worker, refreshed

from agent_envs.es import call_path
from agent_envs.es.batched import describe_update
from agent_envs.es.worker import ESWorkerExtension, VLLMLowRank

TO, BACK = 0.15, 0.25  # the delays the test's engine handle puts on the way there and back


def _child_stamps(queue: Any) -> None:
    queue.put(call_path.stamps(call_path.now()))


def test_a_worker_in_another_process_stamps_within_the_drivers_interval() -> None:
    context = multiprocessing.get_context("spawn")  # a fresh interpreter, as vLLM's engine core process
    queue = context.Queue()
    start = call_path.now()
    child = context.Process(target=_child_stamps, args=(queue,))
    child.start()
    stamps = queue.get(timeout=60)
    child.join(60)
    end = call_path.now()
    assert stamps["clock"] == call_path.clock_id() != ""
    split = call_path.split(start, end, stamps)
    assert split["to_worker_s"] > 0 and split["back_s"] > 0  # the child's stamps lie inside the interval
    assert abs(sum(split.values()) - (end - start)) < 1e-9


def test_stamps_from_another_clock_or_none_give_no_split() -> None:
    stamps = call_path.stamps(call_path.now())
    assert call_path.split(0.0, 1.0, {**stamps, "clock": "another machine"}) == {}
    assert call_path.split(0.0, 1.0, {}) == {}
    assert call_path.split(0.0, 1.0, {"clock": stamps["clock"], "entered_at": 0.5}) == {}


class DelayedEngine:
    """An engine handle whose ``collective_rpc`` reaches the worker ``TO`` seconds after it is called and
    answers ``BACK`` seconds after the worker returns (the delays the split must find where they are)."""

    def __init__(self, worker: ESWorkerExtension) -> None:
        self.worker = worker
        self.calls: list[str] = []

    def collective_rpc(
        self, method: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        self.calls.append(method)
        time.sleep(TO)
        answer = getattr(self.worker, method)(*args, **(kwargs or {}))
        time.sleep(BACK)
        return [answer]

    def reset_prefix_cache(self) -> bool:
        return True


def test_the_update_call_is_split_where_its_time_went() -> None:
    worker = engine_worker()
    refreshed(worker, ahead=False)
    backend = object.__new__(VLLMLowRank)  # the driver's backend over the handle, without an engine to set up
    backend.llm = DelayedEngine(worker)
    backend.last_update, backend.last_refresh = {}, {}
    backend.update(list(SEEDS[::2]), [0.5, -1.0], 0.01, SIGMA, refresh=(IDS, SEEDS, SIGMA, SIGNS))
    parts = backend.last_update
    assert parts["to_worker_s"] >= TO and parts["back_s"] >= BACK
    assert parts["in_worker_s"] < parts["call_s"] - TO - BACK + 1e-9
    assert abs(parts["to_worker_s"] + parts["in_worker_s"] + parts["back_s"] - parts["call_s"]) < 1e-9
    assert parts["in_worker_s"] >= parts["joined_s"]  # the worker's own parts lie inside its method
    # the update's whole wall there: its own parts inside it, and with the wait and the fingerprint inside the method
    assert parts["joined_s"] + parts["device_s"] <= parts["update_wall_s"] <= parts["in_worker_s"]
    assert not set(call_path.STAMPS) & set(parts)  # the stamps make the split; only the split is kept
    text = describe_update(parts)
    assert f"to the worker {parts['to_worker_s']:.3f} s" in text and f"back {parts['back_s']:.3f} s" in text
    assert f"the update's wall there {parts['update_wall_s']:.3f} s" in text


def test_the_update_answers_the_updated_weights_fingerprint_for_the_next_question_only() -> None:
    worker = engine_worker()
    refreshed(worker, ahead=False)
    engine = DelayedEngine(worker)
    backend = object.__new__(VLLMLowRank)
    backend.llm = engine
    backend.last_update, backend.last_refresh = {}, {}
    answers = backend.update(list(SEEDS[::2]), [0.5, -1.0], 0.01, SIGMA)
    assert "weights_fingerprint" not in answers[0]  # the answer is recorded; the fingerprint has its own field
    assert backend.last_update["fingerprint_s"] >= 0
    updated = worker.es_lowrank_fingerprint()
    assert updated != "" and engine.calls == ["es_lowrank_update"]
    assert backend.fingerprint() == updated and engine.calls == ["es_lowrank_update"]  # no second trip
    assert backend.fingerprint() == updated and engine.calls[-1] == "es_lowrank_fingerprint"  # taken once
    backend.update(list(SEEDS[::2]), [1.0, 0.25], 0.01, SIGMA)
    backend.refresh(IDS, SEEDS, SIGMA, SIGNS)  # any later weight call: the fingerprint is asked for again
    assert backend.fingerprint() == worker.es_lowrank_fingerprint() != updated
    assert engine.calls[-1] == "es_lowrank_fingerprint"
