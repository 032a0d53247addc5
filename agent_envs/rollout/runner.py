"""Run many episodes of an environment with a policy: lockstep (reference) or async (fast).

* ``mode="lockstep"`` reproduces the reference ES runner (docs/protocol.md#scheduling): episodes advance turn by
  turn in batches of ``concurrency``; each turn is one batched ``policy.generate`` over every live
  episode, then every episode's tool step.  Tool steps run in a thread pool; episodes are
  independent, so the result equals the sequential reference.
* ``mode="async"`` lets every episode advance on its own: a request goes to ``policy.agenerate``
  as soon as its episode is ready and tool steps run in worker threads, overlapping generation.
  A slow episode never holds up the others.

Both modes use the same per-request seeds (``seed_base + 97*turn``), so a deterministic seeded
policy gives identical records either way.  Each record is on disk (fsynced) as soon as its
episode ends.  Nothing a policy or an environment does aborts the run: failures become records
with an ``error`` (re-run by ``resume=True``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
import threading
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

import gymnasium as gym

from agent_envs.core.flight import episodes_in_flight
from agent_envs.core.tasks import episode_key, task_id
from agent_envs.core.types import CONTEXT_LENGTH_EXCEEDED, INVALID_OUTPUT, MACHINE_FAULTS
from agent_envs.policy.base import Completion, GenerationRequest, Policy, batch_or_each, error_text
from agent_envs.protocol.seeds import DEFAULT_BASE_SEED
from agent_envs.core.steps import StepContext, StepScore, StepScorer
from agent_envs.scoring.process import process_fields

from .episode_loop import EpisodeLoop
from .gather import ScoreGatherer
from .progress import Progress
from .records import EpisodeRecord, JsonlWriter, as_row
from .resume import prepare_resume
from .shelf import EnvShelf, close_quietly

MODES = ("async", "lockstep")
#: how often an interrupted run closes its environments again while worker calls still run
CLOSE_PASS_S = 0.2
T = TypeVar("T")
EnvSource = str | Callable[..., gym.Env]
#: wall-clock fields: excluded when comparing runs for determinism
TIMING_FIELDS = frozenset({"latency_s", "tool_seconds", "env_seconds", "turn_tool_s", "turn_generation_s"})


@dataclass(frozen=True)
class Job:
    row_index: int
    sample_index: int
    task: Any
    #: the trajectory seed, when a frozen key-to-seed map gives it (None: the seed formula)
    seed_base: int | None = None

    @property
    def task_id(self) -> str:
        return task_id(self.task)

    @property
    def key(self) -> str:
        return episode_key(self.task_id, self.sample_index)


@dataclass
class _Episode:
    """Runner-side state of one episode; its env methods run in worker threads."""

    job: Job
    env: gym.Env | None
    base_seed: int
    started: float = field(default_factory=time.perf_counter)
    request: GenerationRequest | None = None
    episode: dict[str, Any] | None = None
    error: str | None = None
    policy_calls: int = 0
    prompt_tokens: int | None = 0
    engine: str | None = None
    env_seconds: float = 0.0
    #: wall seconds each policy call took (lockstep: the whole batch's call)
    generation_s: list[float] = field(default_factory=list)
    finished: float = 0.0
    #: the policy's :meth:`~agent_envs.policy.base.Policy.warm`, run on each new request
    warm: Callable[[GenerationRequest], None] | None = None
    #: with a step scorer: react steps handed to it so far, those of the last step, their scores
    score_steps: bool = False
    steps_taken: int = 0
    new_contexts: list[StepContext] = field(default_factory=list)
    step_scores: list[StepScore] = field(default_factory=list)

    #: set when ``env.step`` raised on the model's text (not a machine fault): ``<ExcType>: <msg>``
    invalid_output: str | None = None

    @property
    def done(self) -> bool:
        return self.episode is not None or self.error is not None or self.invalid_output is not None

    def next_request(self) -> GenerationRequest:
        """The request of a live episode (one that has not ended always has its next request)."""
        assert self.request is not None
        return self.request

    def start(self) -> None:
        """Reset the env for this job and fetch the first request (worker thread)."""
        assert self.env is not None
        t = time.perf_counter()
        try:
            _, info = self.env.reset(
                options={
                    "task": self.job.task,
                    "row_index": self.job.row_index,
                    "sample_index": self.job.sample_index,
                    "base_seed": self.base_seed,
                    **({} if self.job.seed_base is None else {"seed_base": self.job.seed_base}),
                }
            )
            if info.get("context_overflow"):  # the first prompt cannot fit: ended before any generation
                self._after_step(*self.env.step(Completion(error=CONTEXT_LENGTH_EXCEEDED))[2:])
            else:
                self.request = self.env.get_wrapper_attr("generation_request")()
        except Exception as exc:
            self._fail(exc)
        self.env_seconds += time.perf_counter() - t
        self._warm()

    def advance(self, completion: Completion) -> None:
        """Feed one completion; then either the episode is over or ``request`` is the next one."""
        assert self.env is not None
        t = time.perf_counter()
        self.new_contexts = []
        self.policy_calls += 1
        self.engine = completion.engine or self.engine
        if self.prompt_tokens is not None:  # summed only while every completion reports it
            reported = completion.prompt_tokens
            self.prompt_tokens = None if reported is None else self.prompt_tokens + reported
        try:
            _, _, terminated, truncated, info = self.env.step(completion)
        except MACHINE_FAULTS as exc:
            self._fail(exc)
        except Exception as exc:  # raised by what the model wrote: its outcome (docs/reliability.md)
            self.invalid_output = error_text(exc)
            self.finished = time.perf_counter()
        else:
            self._after_step(terminated, truncated, info)
        self.env_seconds += time.perf_counter() - t
        self._warm()

    def _after_step(self, terminated: bool, truncated: bool, info: dict[str, Any]) -> None:
        assert self.env is not None
        try:
            if self.score_steps:
                self.new_contexts = self.env.get_wrapper_attr("step_contexts")(self.steps_taken)
                self.steps_taken += len(self.new_contexts)
            if terminated or truncated:
                self.episode = dict(info["record"])
                self.finished = time.perf_counter()
            else:
                self.request = self.env.get_wrapper_attr("generation_request")()
        except Exception as exc:
            self._fail(exc)

    def _warm(self) -> None:
        """Let the policy prepare the next request here, in the worker thread (not env time)."""
        if self.warm is not None and not self.done and self.request is not None:
            try:
                self.warm(self.request)
            except Exception:  # generate reports the same failure for this request
                pass

    def _fail(self, exc: Exception) -> None:
        self.error = error_text(exc)
        self.finished = time.perf_counter()


class _Context:
    """Everything shared by the episodes of one run: env factory (and the caller's shelf of kept
    envs), policy identity, output."""

    def __init__(
        self,
        make_env: Callable[[], gym.Env],
        policy: Policy,
        base_seed: int,
        tags: dict[str, Any],
        writer: JsonlWriter | None,
        progress: Progress,
        scorer: StepScorer | None = None,
        env_id: str | None = None,
        shelf: EnvShelf | None = None,
    ):
        self.make_env = make_env
        self.shelf = shelf
        #: the registered id, for the records of episodes whose environment raised
        self.env_id = env_id
        self.scorer = scorer
        self.policy = policy
        self.base_seed = base_seed
        self.tags = tags
        self.writer = writer
        self.progress = progress
        self.meta = dict(policy.describe())
        self.records: dict[str, EpisodeRecord] = {}
        self.envs: list[gym.Env] = []  # every env of this run (built or taken from the shelf), for closing
        self.spare: list[gym.Env] = []

    def kept_env(self) -> gym.Env | None:
        """An env built before (:meth:`prepare`'s, or one from the shelf), or None; builds nothing,
        so it is quick enough for the async run's event loop."""
        if self.spare:
            return self.spare.pop()
        env = self.shelf.take() if self.shelf is not None else None
        if env is not None:
            self.envs.append(env)
        return env

    def build_env(self) -> gym.Env:
        """A new env (kept on the shelf from now on, when the run has one)."""
        env = self.make_env() if self.shelf is None else self.shelf.build(self.make_env)
        self.envs.append(env)
        return env

    def new_env(self) -> gym.Env:
        env = self.kept_env()
        return env if env is not None else self.build_env()

    def retire(self, ep: _Episode, env: gym.Env | None) -> gym.Env | None:
        """Keep the env for the next job unless it raised (then close it, drop it from this run and
        from the shelf; the next job gets another)."""
        if ep.episode is None and env is not None:
            close_quietly(env)
            self.envs.remove(env)
            if self.shelf is not None:
                self.shelf.discard(env)
            return None
        return env

    def put_back(self) -> None:
        """The run's envs, closed, back on the shelf for the next run."""
        if self.shelf is not None:
            self.shelf.put_back(self.envs)
            self.envs = []

    def episode(self, job: Job, env: gym.Env | None) -> _Episode:
        return _Episode(job, env, self.base_seed, warm=self.policy.warm, score_steps=self.scorer is not None)

    def prepare(self) -> None:
        """Build the first env in the caller's thread so a bad configuration raises at once."""
        self.spare.append(self.new_env())

    def finish(self, ep: _Episode) -> EpisodeRecord:
        record = self._record(ep)
        if self.writer is not None:
            self.writer.write(record)
        self.records[record.key] = record
        self.progress.update(record.score, record.generated_tokens)
        return record

    def _record(self, ep: _Episode) -> EpisodeRecord:
        job = ep.job
        row: dict[str, Any] = dict(ep.episode or {})
        if ep.episode is None:  # the environment raised: on the model's text, or the machine failed
            reason = "env_error" if ep.invalid_output is None else INVALID_OUTPUT
            row.update(
                {
                    "key": job.key,
                    "task_id": job.task_id,
                    "row_index": job.row_index,
                    "sample_index": job.sample_index,
                    "base_seed": self.base_seed,
                    "score": 0.0,
                    **({} if job.seed_base is None else {"seed": job.seed_base}),
                    "termination_reason": reason,
                    "react_error": ep.error or ep.invalid_output,
                    "score_method": reason,
                    "env_id": self.env_id,
                }
            )
        error = ep.error
        if row.get("termination_reason") == "request_error":
            error = error or f"request_error: {row.get('react_error') or 'policy request failed'}"
        generated = int(row.get("generated_tokens") or 0)
        usage = {"completion_tokens": generated, "accumulated_response_tokens": int(row.get("trajectory_tokens") or 0)}
        if ep.prompt_tokens is not None and ep.policy_calls:
            usage.update(prompt_tokens=ep.prompt_tokens, total_tokens=ep.prompt_tokens + generated)
        row.update(
            {
                "latency_s": max(0.0, ep.finished - ep.started),
                "env_seconds": ep.env_seconds,
                "turn_generation_s": list(ep.generation_s),
                "policy_calls": ep.policy_calls,
                "usage": usage,
                "engine": ep.engine or self.meta.get("engine"),
                "endpoint": self.meta.get("endpoint"),
                "model": self.meta.get("model"),
                "policy": self.meta.get("policy", self.policy.name),
                "error": error,
                "tags": dict(self.tags),
            }
        )
        if self.scorer is not None:
            row.update(process_fields(ep.step_scores, self.scorer.aggregation))
        return EpisodeRecord.model_validate(row)


# --------------------------------------------------------------------------- lockstep
def _generate_batch(policy: Policy, requests: Sequence[GenerationRequest]) -> list[Completion]:
    """One batched call; a failure is retried request by request (:func:`batch_or_each`)."""
    return batch_or_each(policy.generate, requests, lambda request, exc: Completion.failed(exc))


def _run_lockstep(ctx: _Context, jobs: Sequence[Job], batch_size: int, pool: Executor) -> None:
    envs: list[gym.Env | None] = []
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start : start + batch_size]
        envs += [None] * (len(chunk) - len(envs))
        envs[: len(chunk)] = [env if env is not None else ctx.new_env() for env in envs[: len(chunk)]]
        episodes = [ctx.episode(job, env) for job, env in zip(chunk, envs)]
        list(pool.map(_Episode.start, episodes))
        live = _settle(ctx, envs, list(enumerate(episodes)))
        while live:
            t = time.perf_counter()
            completions = _generate_batch(ctx.policy, [ep.next_request() for _, ep in live])
            for _, ep in live:
                ep.generation_s.append(time.perf_counter() - t)
            list(pool.map(_Episode.advance, [ep for _, ep in live], completions))
            ctx.progress.turn(len(live))
            if ctx.scorer is not None:
                _score_turn(ctx.scorer, [ep for _, ep in live])
            live = _settle(ctx, envs, live)


def _score_turn(scorer: StepScorer, episodes: Sequence[_Episode]) -> None:
    """One scorer call for the new steps of every episode of this turn."""
    scores = iter(scorer.score_sync([c for ep in episodes for c in ep.new_contexts]))
    for ep in episodes:
        ep.step_scores += [next(scores) for _ in ep.new_contexts]


def _settle(ctx: _Context, envs: list[gym.Env | None], live: list[tuple[int, _Episode]]) -> list[tuple[int, _Episode]]:
    """Record the episodes that have ended (retiring their envs); return the ones still running."""
    running = []
    for i, ep in live:
        if ep.done:
            envs[i] = ctx.retire(ep, envs[i])
            ctx.finish(ep)
        else:
            running.append((i, ep))
    return running


# --------------------------------------------------------------------------- async
async def _run_async(ctx: _Context, jobs: Sequence[Job], concurrency: int, pool: Executor) -> None:
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(concurrency)
    idle: list[gym.Env] = []
    gatherer = ScoreGatherer(ctx.scorer) if ctx.scorer is not None else None

    async def agenerate(request: GenerationRequest) -> Completion:
        try:
            out = await ctx.policy.agenerate(request)
            return out if isinstance(out, Completion) else Completion.failed(TypeError(f"not a Completion: {out!r}"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return Completion.failed(exc)

    async def one(job: Job) -> None:
        async with gate:
            env = idle.pop() if idle else ctx.kept_env()
            if env is None:
                try:
                    env = await loop.run_in_executor(pool, ctx.build_env)
                except Exception as exc:
                    ep = _Episode(job, None, ctx.base_seed)
                    ep._fail(exc)
                    ctx.finish(ep)
                    return
            ep = ctx.episode(job, env)
            await loop.run_in_executor(pool, ep.start)
            scores: list[asyncio.Future[StepScore]] = []
            while not ep.done:
                assert ep.request is not None
                t = time.perf_counter()
                completion = await agenerate(ep.request)
                ep.generation_s.append(time.perf_counter() - t)
                await loop.run_in_executor(pool, ep.advance, completion)
                ctx.progress.turn()
                if gatherer is not None:  # scored alongside: this episode generates on meanwhile
                    scores += [gatherer.submit(c) for c in ep.new_contexts]
            ep.step_scores = list(await asyncio.gather(*scores))
            retired = ctx.retire(ep, env)
            if retired is not None:
                idle.append(retired)
            ctx.finish(ep)

    tasks = [asyncio.ensure_future(one(job)) for job in jobs]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --------------------------------------------------------------------------- entry point
def _env_kwargs(policy: Policy, env_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The environment's keywords: the caller's, with what the policy tells (its tokenizer, ...)."""
    kwargs = dict(env_kwargs or {})
    kwargs.setdefault("tokenizer", policy.tokenizer)
    if getattr(policy, "processor", None) is not None:  # a vision-language policy's image token counts
        kwargs.setdefault("processor", policy.processor)
    if policy.max_model_len is not None:
        kwargs.setdefault("max_model_len", policy.max_model_len)
    return kwargs


def _env_factory(source: EnvSource, kwargs: dict[str, Any]) -> Callable[[], gym.Env]:
    if isinstance(source, str):  # importing any agent_envs module registered the ids
        return lambda: gym.make(source, **kwargs)
    return lambda: source(**kwargs)


def finished_records(out_path: str | Path | None, resume: bool) -> dict[str, EpisodeRecord]:
    """Records already in ``out_path`` by key (``resume``); refuses to overwrite a non-empty file."""
    if out_path is None:
        return {}
    out_path = Path(out_path)
    if resume:
        return prepare_resume(out_path).finished
    if out_path.exists() and out_path.stat().st_size > 0:
        raise FileExistsError(f"{out_path} already has records: resume, or choose another output path")
    return {}


def make_jobs(tasks: Sequence[Any], samples: int, row_indices: Sequence[int] | None = None) -> list[Job]:
    """Row-major (row, sample) enumeration, as the reference evaluator.  ``row_indices`` gives the
    tasks' rows in a larger list (a slice of it running elsewhere keeps its seeds and keys)."""
    rows = range(len(tasks)) if row_indices is None else [int(r) for r in row_indices]
    if len(rows) != len(tasks):
        raise ValueError(f"{len(rows)} row indices for {len(tasks)} tasks")
    return [Job(row, sample, task) for row, task in zip(rows, tasks) for sample in range(samples)]


def with_key_seeds(jobs: Sequence[Job], key_seeds: Mapping[str, int]) -> list[Job]:
    """The jobs with their trajectory seeds from a frozen key-to-seed map, which must cover them."""
    missing = [j.key for j in jobs if j.key not in key_seeds]
    if missing:
        raise ValueError(
            f"the key-to-seed map has no seed for {len(missing)} of {len(jobs)} episodes "
            f"(e.g. {', '.join(missing[:3])})"
        )
    return [dataclasses.replace(j, seed_base=int(key_seeds[j.key])) for j in jobs]


def run_episodes(
    env_id_or_factory: EnvSource,
    tasks: Sequence[Any],
    policy: Policy,
    *,
    samples: int = 1,
    mode: str = "async",
    base_seed: int = DEFAULT_BASE_SEED,
    env_kwargs: dict[str, Any] | None = None,
    concurrency: int = 64,
    tool_workers: int | None = None,
    out_path: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    tags: dict[str, Any] | None = None,
    row_indices: Sequence[int] | None = None,
    step_scorer: StepScorer | None = None,
    key_seeds: Mapping[str, int] | None = None,
    workers: Executor | None = None,
    envs: EnvShelf | None = None,
    episode_loop: EpisodeLoop | None = None,
) -> list[EpisodeRecord]:
    """Run ``samples`` episodes of every task and return their records in (row, sample) order.

    ``concurrency`` is the lockstep batch size, or the number of episodes in flight in async mode;
    ``tool_workers`` sizes the thread pool for env steps (default: ``concurrency``).  With
    ``out_path`` every record is appended (fsynced) as it finishes; ``resume=True`` first keeps
    the finished records there and re-runs only missing or failed ones.  ``row_indices``: the
    tasks' rows in the full list (default ``0..len(tasks)-1``), for a slice run on another engine.
    ``step_scorer`` scores every step (docs/protocol.md#process-rewards), batched across episodes:
    one call per turn in lockstep mode, gathered calls beside generation in async mode.
    ``key_seeds``: each episode's trajectory seed by record key (a frozen map for formal
    evaluations), instead of ``base_seed + sample*1_000_003 + row``.
    ``workers``: run the env steps on this executor, which the caller keeps across runs (its size is
    then the cap, not ``tool_workers``), instead of starting a pool of threads for this run: an ES
    generation's 16 members x 16 episodes started 256 threads before their first request, and
    on a loaded interpreter that held the first turn back (benchmarks/bench_es_loop_host.py).  The
    run waits for, and when interrupted cancels, its own calls only; the executor stays open.
    ``envs``: take the environments from this shelf, which the caller keeps across runs of the same
    environment and keywords, and put them back (closed) at the end, instead of building them with
    ``gym.make`` and closing them: an ES run built 256 every generation (:mod:`.shelf`).
    ``episode_loop``: in async mode, run the episodes on this event loop, which the caller shares
    between the runs of its threads, instead of starting one in this thread (:mod:`.episode_loop`).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if step_scorer is not None and (env_kwargs or {}).get("step_scorer") is not None:
        raise ValueError("give step_scorer to run_episodes or in env_kwargs, not both")
    if samples < 1 or concurrency < 1:
        raise ValueError(f"samples and concurrency must be >= 1 (got {samples}, {concurrency})")
    jobs = make_jobs(tasks, samples, row_indices)
    if key_seeds is not None:
        jobs = with_key_seeds(jobs, key_seeds)
    done = finished_records(out_path, resume)
    todo = [j for j in jobs if j.key not in done]
    keys = [j.key for j in jobs]
    if len(set(keys)) != len(keys):
        raise ValueError("task ids are not unique: records are keyed by '<task_id>:sampleNN'")

    kwargs = _env_kwargs(policy, env_kwargs)
    if envs is not None:
        envs.check(env_id_or_factory, kwargs)
    make_env = _env_factory(env_id_or_factory, kwargs)
    bar = Progress(len(todo), progress, desc=mode)
    writer = JsonlWriter(out_path) if out_path is not None else None
    ctx = _Context(
        make_env,
        policy,
        base_seed,
        dict(tags or {}),
        writer,
        bar,
        step_scorer,
        env_id_or_factory if isinstance(env_id_or_factory, str) else None,
        envs,
    )
    pool = _Workers(tool_workers or concurrency, "agent-envs-env", workers)
    try:
        with episodes_in_flight(min(concurrency, len(todo))):  # they share the sandboxes' tmpfs budget
            if todo:
                ctx.prepare()
            if mode == "lockstep":
                _run_lockstep(ctx, todo, concurrency, pool)
            elif episode_loop is not None:
                episode_loop.run(_run_async(ctx, todo, concurrency, pool))
            else:
                asyncio.run(_run_async(ctx, todo, concurrency, pool))
    finally:
        with _presses_deferred():
            _shutdown(ctx, pool)
            ctx.put_back()
            bar.close()
            if writer is not None:
                writer.close()
    merged = {**done, **ctx.records}
    return [merged[k] for k in keys if k in merged]


class _Workers(Executor):
    """The run's env worker calls, knowing which of them still run (for :func:`_shutdown`): on a
    thread pool of the run's own, or on the caller's ``executor``, which outlives the run (shutting
    this down cancels and waits for the run's own calls, and leaves the executor open)."""

    def __init__(self, max_workers: int, thread_name_prefix: str, executor: Executor | None = None) -> None:
        self._owned = executor is None
        self._executor = executor or ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self._closed = False
        self._calls: set[Future[Any]] = set()
        self._calls_lock = threading.Lock()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if self._closed:
            raise RuntimeError("cannot schedule new env calls after the run's shutdown")
        future = self._executor.submit(fn, *args, **kwargs)
        with self._calls_lock:
            self._calls.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[Any]) -> None:
        with self._calls_lock:
            self._calls.discard(future)

    def _running(self) -> set[Future[Any]]:
        with self._calls_lock:
            return set(self._calls)

    def wait_calls(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: as long as it takes) for every call to end; whether they all did."""
        return not wait(self._running(), timeout).not_done

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._closed = True
        if self._owned:
            self._executor.shutdown(wait=wait, cancel_futures=cancel_futures)
            return
        if cancel_futures:
            for future in self._running():
                future.cancel()
        if wait:
            self.wait_calls(None)


@contextlib.contextmanager
def _presses_deferred() -> Iterator[None]:
    """Ctrl-C while the run closes its environments waits until they are closed, then interrupts.

    A second press (a user hurrying the first) once cut the closing short: a tool command was
    left running and interpreter exit waited for its worker thread (the command's timeout, 90 s
    and more).  A third press interrupts the closing itself, for a close that hangs.  Only on the
    main thread and under Python's own SIGINT handler: a program's own handling is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    presses = 0

    def press(_signum: int, _frame: object) -> None:
        nonlocal presses
        presses += 1
        if presses > 1:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, press)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if presses:
        raise KeyboardInterrupt


def _shutdown(ctx: _Context, pool: _Workers) -> None:
    """Close every env, again each :data:`CLOSE_PASS_S` until no worker call runs (also when
    interrupted): closing kills running tool commands and a closed env starts none, so a step
    that reached its sandbox after a pass (a slow start on a loaded host) ends at the next one,
    instead of running its command to the end (docs/reliability.md#interrupts)."""
    pool.shutdown(wait=False, cancel_futures=True)
    while True:
        for env in list(ctx.envs):
            close_quietly(env)
        if pool.wait_calls(CLOSE_PASS_S):
            break
    pool.shutdown(wait=True)


def strip_timings(record: EpisodeRecord | dict[str, Any]) -> dict[str, Any]:
    """A record without wall-clock fields (for determinism comparisons)."""
    return {k: v for k, v in as_row(record).items() if k not in TIMING_FIELDS}
