"""agent_envs/es/host_sampler.py: the sampling profiler that ``bench_es_generation.py --sample-host`` runs
around a generation tells a thread that computes from one that waits, and charges the computing
thread's time to the function doing it."""

from __future__ import annotations

import json
import threading

import pytest

from agent_envs.es.host_sampler import HostSampler


def spin(until: threading.Event) -> int:
    n = 0
    while not until.is_set():
        n += len(json.dumps({str(i): [i, i * 0.5] for i in range(300)}, indent=1))  # mostly in json's code
    return n


def test_a_computing_thread_and_a_waiting_one_are_told_apart() -> None:
    done, stop = threading.Event(), threading.Event()
    busy = threading.Thread(target=spin, args=(stop,), name="busy")
    idle = threading.Thread(target=done.wait, name="idle")
    sampler = HostSampler(interval=0.002, owners=("tests/",))
    busy.start()
    idle.start()
    with sampler:
        stop.wait(0.6)  # the test's own thread waits too: an Event's wait, a lock in threading.py
    stop.set()
    done.set()
    busy.join()
    idle.join()
    running = {t: n - sampler.samples[(t, "waiting", "")] for t, n in sampler.totals.items()}
    assert sampler.totals["busy"] >= 20 and sampler.totals["idle"] >= 20, sampler.totals
    assert running["busy"] / sampler.totals["busy"] > 0.8, sampler.samples
    assert running["idle"] == 0, sampler.samples
    top = max((n, key) for key, n in sampler.samples.items() if key[0] == "busy" and key[1] != "waiting")[1]
    assert top[1] == "tests/test_host_sampler.py:spin" and top[2].startswith("json/"), top  # json's time: spin's
    table = sampler.table()
    assert "- busy:" in table and "running 0%" in table and "tests/test_host_sampler.py:spin" in table, table


def test_with_many_threads_the_sampler_keeps_to_its_share_of_the_wall() -> None:
    """A round over 1,200 waiting threads takes longer than the 2 ms asked between rounds: the sampler then
    waits longer, so it runs about ``duty`` of the wall (before: 29 ms rounds back to back in an ES driver
    of about 1,280 threads, most of the wall, slowing every thread it watched), and its table says so."""
    gate = threading.Event()
    waiting = [threading.Thread(target=gate.wait, name=f"idle-{i}") for i in range(1200)]
    for t in waiting:
        t.start()
    try:
        sampler = HostSampler(interval=0.002, owners=("tests/",), duty=0.2)
        with sampler:
            gate.wait(1.0)
    finally:
        gate.set()
        for t in waiting:
            t.join()
    assert sampler.rounds >= 5, sampler.rounds
    assert sampler.cpu_seconds / sampler.seconds < 0.3, (sampler.cpu_seconds, sampler.seconds, sampler.rounds)
    assert sampler.totals["idle-7"] == sampler.rounds and sampler.samples[("idle-7", "waiting", "")] == sampler.rounds
    head = sampler.table().splitlines()[0]
    assert f"{sampler.rounds} rounds" in head and "2 ms asked" in head and "of the wall" in head, head


def test_a_duty_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="duty"):
        HostSampler(duty=0)


def test_the_worker_extension_samples_the_engine_process_between_its_start_and_stop() -> None:
    """``ESWorkerExtension.es_host_sample_start``/``stop``: the sampler run where the engine's worker runs
    (the engine's own process, for an async engine), its table returned over the engine's RPC."""
    import os

    from agent_envs.es.worker import ESWorkerExtension

    worker, stop = ESWorkerExtension(), threading.Event()
    with pytest.raises(RuntimeError, match="not being sampled"):
        worker.es_host_sample_stop()
    busy = threading.Thread(target=spin, args=(stop,), name="engine-busy")
    busy.start()
    try:
        assert worker.es_host_sample_start(0.002) == {"ok": True, "pid": os.getpid()}
        with pytest.raises(RuntimeError, match="already being sampled"):
            worker.es_host_sample_start()
        stop.wait(0.3)
        answer = worker.es_host_sample_stop(5)
    finally:
        stop.set()
        busy.join()
    assert answer["pid"] == os.getpid()
    # the busy thread's samples, charged to json (its innermost frame; no owner's code on its stack)
    assert "- engine-busy:" in answer["table"] and "<- json/" in answer["table"], answer["table"]
    with pytest.raises(RuntimeError, match="not being sampled"):  # stopped once; a new start is needed
        worker.es_host_sample_stop()
