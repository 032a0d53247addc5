"""The main job's evaluation (``scripts/run_main.sh`` installs, then runs this): every text
environment with a model (the embedded SmolLM2-135M unless told otherwise) and, beside it, the
environment's scripted reference policy, then one HTML report over all of them.  With the embedded
model it also rebuilds the ES-trained SmolLM2 shipped with the package (agent_envs.es.trained_model:
its history replayed on the CPU, checked against the GPU's per-generation fingerprints) and shows
it beside the base model on the same few-shot Countdown tasks, greedy, with the difference and its
paired-bootstrap interval (the report's comparison).

    python3 scripts/main_job.py [--out DIR] [--limit N] [--es-tasks N | --no-es] [--install-s S] [EVAL ARGS ...]

Arguments it does not know go to the model's ``agent-envs eval`` calls (``--policy vllm --model M``
or ``--base-url URL --model NAME`` evaluates a real model in the embedded one's place); the
reference runs always use ``--policy scripted`` on the same tasks.  It prints which evaluation is
where while they run, the time of each phase, and last the report's path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent_envs.envs.registry import ENV_IDS, spec  # noqa: E402  (after the path insert)

#: the tool whose observations are page images: an environment offering it needs a vision-language model
IMAGE_TOOL = "view"


def native_variant(env_id: str) -> bool:
    """Whether the environment is a native-tool-call variant of another (the same tasks and tools,
    the model's own tool-call format: docs/protocol.md#native-tool-calls); the main job shows each
    environment once, in its ReAct form."""
    return any(rules.parser.native_tool_calls for rules in spec(env_id).rules.values())


#: every registered environment whose tools answer in text and that has a scripted reference policy
ENVS = tuple(
    e
    for e in ENV_IDS
    if IMAGE_TOOL not in spec(e).tool_names and spec(e).baseline is not None and not native_variant(e)
)
REFERENCE = "scripted-reference"
#: a progress line at least this often, and whenever an evaluation finishes an episode
PROGRESS_EVERY_S = 15.0
#: the embedded model's budget here (arguments given to the job override it): a second turn shows it
#: answering the protocol's warning; 2 x 128 tokens need about 125 CPU-seconds for all three
#: environments (3 x 128: 187), about a minute on an idle 2-core machine
EMBEDDED = ["--max-turns", "2", "--max-tokens-per-turn", "128"]
ES_ENV = "Countdown-ReAct-v0"
#: the two runs of the side-by-side, in the order es_smollm2_dirs returns their models
ES_LABELS = ("smollm2-135m-base", "smollm2-135m-es")
#: held-out Countdown tasks the base and the ES-trained model answer (the first of the ES run's held-out
#: set): each is a ~510-token few-shot prompt, the cost on the CPU
ES_TASKS = 16
#: ES generations the main job replays by default: the first 50 of 300 (103 s beside the evaluations on
#: an idle 2-core machine, 2026-12-02, where all 300 take about 10 minutes; most of the held-out gain came by then: 0.264 -> 0.416
#: on the GPU's 512 tasks after 50, 0.459 after 300)
ES_GENERATIONS = 50
#: the ES run's task and decoding (scripts/gpu_es_real.py): single turn, four few-shot turns, greedy
ES_EVAL = [
    "--env-arg",
    "single_turn=true",
    "--max-turns",
    "1",
    "--max-tokens-per-turn",
    "128",
    "--temperature",
    "0",
    "--sandbox",
    "none",
]


@dataclass
class Job:
    env: str
    label: str
    out: Path
    argv: list[str]
    expected: int
    process: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def started(self) -> tuple[subprocess.Popen, Path]:
        """The process and its log, once ``run_all`` has started the job."""
        if self.process is None or self.log is None:
            raise RuntimeError(f"{self.out.name} was not started")
        return self.process, self.log

    @property
    def done(self) -> int:
        try:
            with (self.out / "records.jsonl").open("rb") as fh:
                return sum(1 for line in fh if line.endswith(b"\n"))
        except FileNotFoundError:
            return 0


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", type=Path, default=None, help="folder of the runs and the report (default runs/main-<time>)"
    )
    p.add_argument("--limit", type=int, default=2, help="tasks per environment (default 2)")
    p.add_argument(
        "--install-s", type=float, default=None, help="seconds the installation took (printed with the rest)"
    )
    p.add_argument(
        "--es-tasks",
        type=int,
        default=ES_TASKS,
        help=f"Countdown tasks for the base vs ES-trained model (default {ES_TASKS})",
    )
    p.add_argument(
        "--es-generations",
        type=int,
        default=ES_GENERATIONS,
        help=f"replay the first N of the ES run's 300 generations (default {ES_GENERATIONS}, labelled so; the "
        "GPU's held-out score was 0.416 after 50, 0.459 after 300; all 300 replay in about 10 minutes on an idle "
        "2-core machine the first time, then they are cached)",
    )
    p.add_argument("--no-es", action="store_true", help="leave out the ES-trained model")
    p.add_argument("--check", action="store_true", help="only check the arguments (run_main.sh, before installing)")
    args, extra = p.parse_known_args(argv)
    check_eval_args(extra)
    return args, extra


def check_eval_args(extra: list[str]) -> None:
    """The arguments passed on to ``agent-envs eval``, checked by eval's own parser before anything
    is installed or run: a bad one exits 2 with eval's usage."""
    from agent_envs.cli import parse_args as parse_cli

    parse_cli(["eval", *extra])


def embedded(extra: list[str]) -> bool:
    """Whether the model runs use the embedded CPU model (no other policy or model was asked for)."""
    return not any(flag in extra for flag in ("--policy", "--model", "--base-url"))


def model_label(extra: list[str]) -> str:
    """The model runs' folder suffix: the embedded model's name, or the given model's last path part."""
    if "--model" in extra[:-1]:
        return Path(extra[extra.index("--model") + 1].rstrip("/")).name or "model"
    return "smollm2-135m"


def jobs(out: Path, limit: int, extra: list[str]) -> list[Job]:
    cli = [sys.executable, "-m", "agent_envs.cli", "eval", "--limit", str(limit), "--no-progress", "--no-report"]
    label = model_label(extra)
    extra = (EMBEDDED if embedded(extra) else []) + extra
    found = []
    for env in ENVS:
        # lockstep + one padded batch per turn: a run's episodes decode together, the same way every run
        found.append(
            Job(
                env,
                label,
                out / f"{env}.{label}",
                [*cli, "--env", env, "--mode", "lockstep", "--out", str(out / f"{env}.{label}"), *extra],
                limit,
            )
        )
        found.append(
            Job(
                env,
                REFERENCE,
                out / f"{env}.{REFERENCE}",
                [*cli, "--env", env, "--policy", "scripted", "--out", str(out / f"{env}.{REFERENCE}")],
                limit,
            )
        )
    return found


def prepare_caches(extra: list[str]) -> float:
    """What the first run builds (the converted embedded model, the synthetic DocVQA pages), once, before
    the clock of the evaluation starts; returns the seconds it took."""
    from agent_envs.core.cache import is_complete
    from agent_envs.envs.docvqa.data import default_cache_dir, load_docvqa_tasks
    from agent_envs.policy.hf import SMOLLM2_HF_DIR, smollm2_hf_dir

    started = time.perf_counter()
    if embedded(extra) and not is_complete(SMOLLM2_HF_DIR):
        say(f"converting the embedded model once into {SMOLLM2_HF_DIR} (about a minute on 2 cores) ...")
        smollm2_hf_dir()
    before = {p.name for p in (default_cache_dir() / "synthetic_docs").glob("*")}
    load_docvqa_tasks("builtin")
    if {p.name for p in (default_cache_dir() / "synthetic_docs").glob("*")} - before:
        say(f"generated the built-in DocVQA pages once into {default_cache_dir() / 'synthetic_docs'}")
    return time.perf_counter() - started


def subprocess_env() -> dict[str, str]:
    """What every child process gets: this checkout importable, one torch thread, batched decoding."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "AGENT_ENVS_BATCH_DECODE": "1",
        "AGENT_ENVS_TORCH_THREADS": os.environ.get("AGENT_ENVS_TORCH_THREADS", "1"),
    }


def start_replay(out: Path, generations: int | None) -> subprocess.Popen:
    """Rebuild the ES-trained model (agent_envs.es.trained_model; cached after the first time) in its
    own process, beside the evaluations: it prints its check against the GPU's run as JSON."""
    code = (
        "import json; from agent_envs.es.trained_model import SMOLLM2_HF_DIR, replay_report; "
        f"print(json.dumps(replay_report(SMOLLM2_HF_DIR, {generations!r})))"
    )
    out.mkdir(parents=True, exist_ok=True)
    env = {**subprocess_env(), "AGENT_ENVS_TORCH_THREADS": ""}  # the replay's products use every core
    with (out / "es-replay.log").open("wb") as log:
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=log, env=env, cwd=REPO)


def es_jobs(out: Path, tasks: int, generations: int | None) -> list[Job]:
    """The base and the ES-trained SmolLM2 on the first ``tasks`` held-out tasks of the ES run, as it
    evaluated them (scripts/gpu_es_real.py: the tasks, the few-shot turns, greedy single turn)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from gpu_es_real import write_tasks

    from agent_envs.es.trained_model import es_smollm2_dirs, provenance

    train = provenance()["train"]
    _, held_out, few_shot = write_tasks(out / "es-tasks", tasks, train["tasks"], train["max_number"])
    cli = [sys.executable, "-m", "agent_envs.cli", "eval", "--env", ES_ENV, "--data", str(held_out)]
    cli += ["--env-arg", f"few_shot={few_shot}", *ES_EVAL, "--mode", "lockstep", "--no-progress", "--no-report"]
    found = []
    labels = (ES_LABELS[0], ES_LABELS[1] + ("" if generations is None else f"-first{generations}"))
    for label, model in zip(labels, es_smollm2_dirs(generations=generations)):
        run = out / f"{ES_ENV}.fewshot.{label}"
        found.append(
            Job(ES_ENV, label, run, [*cli, "--policy", "transformers", "--model", str(model), "--out", str(run)], tasks)
        )
    return found


def es_comparison(base: Job, trained: Job) -> dict:
    """``agent-envs compare``'s paired bootstrap of the two runs (trained minus base)."""
    from agent_envs.envs.registry import spec_of
    from agent_envs.rollout.metrics import paired_bootstrap

    def records(job: Job) -> list[dict]:
        return [json.loads(line) for line in (job.out / "records.jsonl").read_text().splitlines() if line]

    before = records(base)
    return paired_bootstrap(before, records(trained), spec=spec_of(before))


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def say(text: str) -> None:
    print(f"[main] {text}", flush=True)


def clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def progress_line(all_jobs: list[Job], elapsed: float) -> str:
    parts = []
    for env in dict.fromkeys(j.env for j in all_jobs):
        mine = [j for j in all_jobs if j.env == env]
        parts.append(
            f"{env} "
            + ", ".join(
                f"{'reference' if j.label == REFERENCE else j.label} {j.done}/{j.expected}"
                + ("" if j.process is None or j.process.poll() is None else " done")
                for j in mine
            )
        )
    return f"{clock(elapsed)}  " + " | ".join(parts)


def run_all(all_jobs: list[Job]) -> list[Job]:
    """Start every evaluation at once (one torch thread each) and report progress until all ended;
    returns the jobs that failed."""
    started = time.perf_counter()
    env = subprocess_env()
    for job in all_jobs:
        job.out.parent.mkdir(parents=True, exist_ok=True)
        job.log = job.out.parent / f"{job.out.name}.log"
        with job.log.open("wb") as log:
            job.process = subprocess.Popen(job.argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    last, shown = 0.0, None
    while any(j.started[0].poll() is None for j in all_jobs):
        time.sleep(0.5)
        now = time.perf_counter() - started
        state = [(j.done, j.started[0].poll() is None) for j in all_jobs]
        if state != shown or now - last >= PROGRESS_EVERY_S:
            say(progress_line(all_jobs, now))
            last, shown = now, state
    return [j for j in all_jobs if j.started[0].returncode != 0]


def summary_table(all_jobs: list[Job]) -> str:
    from agent_envs.cli import format_table

    rows = [(job.out.name, json.loads((job.out / "summary.json").read_text())) for job in all_jobs]
    return format_table(rows, 1)


def checked_span(generations: list[int]) -> str:
    """``5, 10, ..., 50`` for the generations whose fingerprints the replay compared."""
    if len(generations) <= 3:
        return ", ".join(map(str, generations))
    return f"{generations[0]}, {generations[1]}, ..., {generations[-1]}"


def run_es(
    replay: subprocess.Popen, out: Path, tasks: int, generations: int | None
) -> tuple[list[Job], list[Job], dict | None]:
    """Wait for the replay, then evaluate the base and the ES-trained model side by side; returns the
    two jobs, the failed ones and what the main job wrote about them into es.json (None when the
    replay or an evaluation failed)."""
    say("waiting for the ES-trained model's replay (minutes on the first run, then cached) ...")
    stdout, _ = replay.communicate()
    if replay.returncode != 0:
        say(f"the replay failed (exit {replay.returncode}); the end of {out}/es-replay.log:")
        print("\n".join((out / "es-replay.log").read_text(errors="replace").splitlines()[-25:]), flush=True)
        return [], [], None
    check = json.loads(stdout.decode().strip().splitlines()[-1])
    verdict = (
        f"bit for bit: the fingerprints after generations {checked_span(check['checked_generations'])} "
        f"(of {check['of_generations']}) all equal the GPU's"
        if check["bit_exact"]
        else f"{check['fingerprints_equal']} of {len(check['checked_generations'])} checked fingerprints equal the "
        "GPU's, the first "
        f"that differs is generation {check['first_differing_generation']} (the CPU sums each float32 "
        "product in another order than CUDA, and one bfloat16 rounding came out differently)"
    )
    say(f"ES-trained SmolLM2 rebuilt ({check['updates']} updates replayed) {verdict}")
    both = es_jobs(out, tasks, generations)
    say(f"evaluating the base and the ES-trained SmolLM2 on {tasks} held-out few-shot Countdown task(s), greedy")
    failed = run_all(both)
    if failed:
        return both, failed, None
    from agent_envs.es.trained_model import provenance
    from agent_envs.rollout.metrics import compare_means

    result = es_comparison(*both)
    lo, hi = result["bootstrap_95_ci"]
    before, after, delta = compare_means(result)
    gpu_delta = compare_means(provenance()["held_out_compare"])[2]
    say(
        f"ES-trained minus base on {result['paired_tasks']} tasks: {before:.3f} -> {after:.3f}, delta "
        f"{delta:+.3f}, 95% CI [{lo:+.3f}, {hi:+.3f}] (the GPU's run on 512 tasks: {gpu_delta:+.3f})"
    )
    summary = {"replay": check, "compare": result, "verdict": verdict, "trained": provenance()}
    (out / "es.json").write_text(json.dumps(summary, indent=2) + "\n")
    return both, [], summary


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    if args.check:
        return 0
    out = args.out or REPO / "runs" / f"main-{time.strftime('%Y%m%d-%H%M%S')}"
    caches_s = prepare_caches(extra)
    all_jobs = jobs(out, args.limit, extra)
    say(
        f"evaluating {', '.join(ENVS)} on {args.limit} built-in task(s) each: "
        f"{all_jobs[0].label} and the scripted reference policy (logs: {out}/*.log)"
    )
    started, cpu_before, load_before = time.perf_counter(), children_cpu_s(), os.getloadavg()[0]
    replay = start_replay(out, args.es_generations) if embedded(extra) and not args.no_es else None
    if replay is not None:
        say(f"rebuilding the ES-trained SmolLM2 from its shipped history beside them (log: {out}/es-replay.log)")
    failed = run_all(all_jobs)
    eval_s, es_s, compared = time.perf_counter() - started, 0.0, None
    if replay is not None and not failed:
        es_started = time.perf_counter()
        both, failed, summary = run_es(replay, out, args.es_tasks, args.es_generations)
        es_s = time.perf_counter() - es_started
        if summary is None and not failed:
            return 1  # the replay failed; run_es showed its log
        if not failed:
            compared = (len(all_jobs), len(all_jobs) + 1)
            all_jobs += both
    elif replay is not None:
        replay.kill()
    eval_cpu_s = children_cpu_s() - cpu_before
    for job in failed:
        process, log = job.started
        say(f"{job.out.name} failed (exit {process.returncode}); the end of {log}:")
        print("\n".join(log.read_text(errors="replace").splitlines()[-25:]), flush=True)
    if failed:
        return 1
    print(summary_table(all_jobs), flush=True)
    report_started = time.perf_counter()
    from agent_envs.report import build_report

    report = build_report([job.out for job in all_jobs], out / "report.html", compared).resolve()
    report_s = time.perf_counter() - report_started
    phases = ([("install", args.install_s)] if args.install_s is not None else []) + [
        ("caches (first run only)", caches_s),
        ("evaluation", eval_s),
        *([("ES replay wait and side-by-side", es_s)] if replay is not None else []),
        ("report", report_s),
    ]
    say(
        "time: "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases)
        + f"; total {sum(s for _, s in phases):.0f} s"
    )
    # wall time on a shared machine grows with the load; the CPU seconds are what the job itself needs
    say(
        f"the evaluation used {eval_cpu_s:.0f} CPU-seconds on {os.cpu_count()} cores; load average "
        f"{load_before:.1f} when it started, {os.getloadavg()[0]:.1f} at the end"
    )
    say(f"report: {report}  (open it: xdg-open {report}, or copy the one file anywhere)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
