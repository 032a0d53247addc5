#!/usr/bin/env python3
"""GRPO with TRL on an agent-envs environment: episodes through the runner, rewards from the
environment's scorer, the trainer fed the engine's exact ids, log-probabilities and masks (docs/rl.md).

On the CPU with the embedded SmolLM2 (converted from its GGUF on first use into smollm2-hf under
the cache root, $AGENT_ENVS_CACHE or ~/.cache/agent-envs) on the two-number Countdown of
scripts/gpu_es_real.py, four worked examples as chat turns, one reply, no tools: the base model
solves some tasks some of the time, so a step of 4 tasks in groups of 4 holds both rewards in a
group (docs/rl.md#trl; tests/test_trl_grpo.py runs this command):
    python examples/grpo_trl.py --small-countdown --cpu --steps 1 --tasks 16 --batch 4 --generations 4 \
        --micro-batch 4 --temperature 0.7 --max-tokens-per-turn 48
On one GPU with TRL's colocated vLLM engine (bf16; vllm installed; docs/rl.md#trl):
    python examples/grpo_trl.py --small-countdown --vllm-colocate --steps 3 --tasks 16 --batch 8 --generations 8 \
        --temperature 0.7 --max-tokens-per-turn 48 --out runs/grpo-trl-vllm
A larger GPU run (the trainer's model generates through transformers without --vllm-colocate):
    python examples/grpo_trl.py --env MATH-ReAct-v0 --model Qwen/Qwen3-0.6B --data dapo --tasks 64 \
        --steps 20 --generations 8 --batch 4 --max-turns 4 --max-tokens-per-turn 512
A GPU smoke run of the colocated-vLLM path without a model hub (a tiny random Qwen3 built around a
tokenizer folder, saved with its weights; the scripted opening gives every episode a real tool call):
    python examples/grpo_trl.py --tiny-from-tokenizer /tmp/stage-ray/tokenizer --vllm-colocate --steps 2 \
        --tasks 4 --generations 4 --max-turns 3 --max-tokens-per-turn 32 --scripted-opening
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: what the summary keeps of TRL's log per step (``frac_reward_zero_std`` 1: no group's rewards differ, no gradient)
#: prompt tokens per decoding batch on the CPU: 8 small-Countdown prompts; their first pass's logits
#: (every position's, float32) take 0.8 GB, where all 32 of a step at once took 3.2 GB and more
CPU_BATCH_TOKENS = 4096
LOGGED = ("step", "reward", "reward_std", "frac_reward_zero_std", "loss", "grad_norm", "completions/mean_length")


def build_parser() -> argparse.ArgumentParser:
    """The example's options; the sampling flags and the per-turn token limit are agent-envs eval's
    and es's (agent_envs.rollout.options), their defaults GRPOConfig's."""
    from agent_envs.rollout.options import add_max_tokens_per_turn, add_sampling_flags

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="MATH-ReAct-v0")
    source = ap.add_mutually_exclusive_group()
    source.add_argument(
        "--model",
        help="model folder or id (trained in place); default: the embedded SmolLM2-135M-Instruct, built on first use",
    )
    source.add_argument(
        "--tiny-from-tokenizer",
        type=Path,
        help="train a tiny random Qwen3 built around this tokenizer folder (smoke runs)",
    )
    ap.add_argument(
        "--data", default="builtin", help="the environment's dataset spec (builtin, a JSONL path, dapo, ...)"
    )
    ap.add_argument(
        "--small-countdown",
        action="store_true",
        help="Countdown-ReAct-v0 on scripts/gpu_es_real.py's two-number tasks (written to OUT/data), with its "
        "four worked examples as chat turns, single turn, no sandbox; overrides --env, --data, --max-turns",
    )
    ap.add_argument("--tasks", type=int, default=8, help="first N tasks")
    ap.add_argument("--steps", type=int, default=2, help="optimiser steps")
    ap.add_argument("--generations", type=int, default=4, help="episodes per task per step (GRPO's group size)")
    ap.add_argument("--batch", type=int, default=1, help="tasks per step")
    ap.add_argument(
        "--micro-batch",
        type=int,
        help="episodes per forward and backward pass (default: the step's batch x generations in one); the "
        "step's gradient accumulates over the passes, its episodes still generated in one call",
    )
    ap.add_argument("--max-turns", type=int, default=3)
    add_max_tokens_per_turn(ap, "tokens per generation (default: 64)", default=64)
    add_sampling_flags(ap, "TRL GRPOConfig's", protocol_values=False)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--sandbox", default="bwrap", choices=("bwrap", "none", "docker"))
    ap.add_argument(
        "--scripted-opening",
        action="store_true",
        help="the first turn is the environment's scripted baseline call (context, not trained on)",
    )
    ap.add_argument("--cpu", action="store_true", help="train on the CPU in float32, one torch thread")
    ap.add_argument(
        "--vllm-colocate",
        "--use-vllm",
        dest="vllm_colocate",
        action="store_true",
        help="generate on TRL's colocated vLLM engine (use_vllm=True, vllm_mode='colocate'; GPU, needs vllm)",
    )
    ap.add_argument(
        "--vllm-gpu-memory-utilization",
        type=float,
        default=0.3,
        help="the colocated engine's share of the GPU's memory (TRL's default 0.3); the rest trains",
    )
    ap.add_argument(
        "--vllm-max-model-length",
        type=int,
        help="the colocated engine's context window (default: the model's); prompt plus every turn must fit",
    )
    ap.add_argument("--out", type=Path, default=Path("runs/grpo-trl"))
    ap.add_argument("--save", action="store_true", help="save the trained model to OUT/model")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.presence_penalty:  # sampling_from: GRPO's loss assumes samples from the policy as it stands
        ap.error("--presence-penalty: GRPO samples without one (its loss assumes the policy's own samples)")
    return args


def tiny_model(tokenizer_dir: Path, out: Path, seed: int) -> str:
    """The tiny Qwen3 shape of the GPU scripts with seeded random weights, saved where both
    transformers and TRL's colocated vLLM engine load it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from gpu_engine import TINY_QWEN3, dense_qwen3

    folder = dense_qwen3(tokenizer_dir.expanduser(), TINY_QWEN3, out)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16).save_pretrained(folder)
    return str(folder)


def resolve_model(model: str | None) -> str:
    """The model to train: a folder, a hub id, or (``None``) the embedded SmolLM2 converted on demand
    into ``smollm2-hf`` under the cache root (agent_envs.policy.hf.SMOLLM2_HF_DIR)."""
    if model is None:
        from agent_envs.policy.hf import smollm2_hf_dir

        return str(smollm2_hf_dir())
    path = Path(model).expanduser()
    if path.exists():
        return str(path)
    if model.startswith(("~", "/", ".")):
        raise SystemExit(
            f"--model {model}: no such folder (without --model the embedded SmolLM2 is built on first use)"
        )
    return model


def small_countdown(out: Path) -> tuple[Path, dict[str, object]]:
    """scripts/gpu_es_real.py's task: its training rows, each task once (ES may draw one twice; GRPO's
    prompts must tell their tasks apart), and the environment arguments it ran with."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from gpu_es_real import task_key, write_tasks

    train, _, shots = write_tasks(out, eval_tasks=1)
    first: dict[Any, dict[str, Any]] = {}
    for row in map(json.loads, train.read_text().splitlines()):
        first.setdefault(task_key(row), row)
    train.write_text("".join(json.dumps(row) + "\n" for row in first.values()))
    return train, {"single_turn": True, "few_shot": str(shots), "max_turns": 1, "sandbox": "none"}


def config_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """TRL's ``GRPOConfig`` arguments for these options.  ``--vllm-colocate`` asks for TRL 1.16's
    colocated engine: ``GRPOTrainer`` builds ``vllm.LLM`` from the model's folder in this process
    (``processed_logprobs``, ``max_num_seqs`` = the batch) and loads the trainer's weights into it
    before each step's rollouts; :func:`agent_envs.rl.trl_rollout.trainer_policy` then runs the
    episodes on that engine (``trainer.vllm_generation.llm``)."""
    vllm: dict[str, Any] = {}
    if args.vllm_colocate:
        vllm = {
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": args.vllm_gpu_memory_utilization,
            "vllm_max_model_length": args.vllm_max_model_length,
        }
    from agent_envs.rollout.options import sampling_flags

    episodes = args.batch * args.generations
    micro = args.micro_batch or episodes
    if episodes % micro:
        raise SystemExit(f"--micro-batch {micro} must divide the step's {episodes} episodes (--batch x --generations)")
    return {
        "output_dir": str(args.out),
        "report_to": "none",
        "use_cpu": args.cpu,
        "bf16": not args.cpu,
        "max_steps": args.steps,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": episodes // micro,
        "num_generations": args.generations,
        "learning_rate": args.lr,
        **{flag: value for flag, value in sampling_flags(args).items() if flag != "presence_penalty"},
        "logging_steps": 1,
        "save_strategy": "no",
        "gradient_checkpointing": False,
        "seed": args.seed,
        "use_vllm": args.vllm_colocate,
        **vllm,
    }


def group_scores(records: list[Any], step: int) -> list[dict[str, Any]]:
    """Each task's scores in one rollout call (one GRPO group per task): GRPO learns only from a
    group whose scores differ."""
    groups: dict[str, list[float | None]] = {}
    for r in sorted(records, key=lambda r: (r.row_index, r.sample_index)):
        groups.setdefault(r.task_id, []).append(r.score)
    return [{"step": step, "task": task, "scores": scores} for task, scores in groups.items()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from agent_envs.envs import registry
    from agent_envs.policy.scripted import ScriptedOpening
    from agent_envs.rl.trl_rollout import GRPOEnvironment, sampling_from, trainer_policy
    from agent_envs.rollout.options import env_kwargs as build_env_kwargs

    if args.cpu:
        torch.set_num_threads(1)  # a small model decodes faster on one thread than on several busy ones
    if args.tiny_from_tokenizer:
        model_path = tiny_model(args.tiny_from_tokenizer, args.out / "tiny-model", args.seed)
    else:
        model_path = resolve_model(args.model)
    env_id, data = args.env, args.data
    env_kwargs = build_env_kwargs(
        sandbox=args.sandbox, max_turns=args.max_turns, max_tokens_per_turn=args.max_tokens_per_turn
    )
    if args.small_countdown:
        env_id = "Countdown-ReAct-v0"
        data, task_kwargs = small_countdown(args.out)
        env_kwargs.update(task_kwargs)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32 if args.cpu else torch.bfloat16)

    def policy(trainer):
        # on the CPU: each turn in padded batches of at most CPU_BATCH_TOKENS prompt tokens
        inner = trainer_policy(
            trainer,
            sampling_from(trainer.args),
            batch_decode=args.cpu,
            rollout_token_budget=CPU_BATCH_TOKENS if args.cpu else 0,
        )
        if not args.scripted_opening:
            return inner
        baseline = registry.spec(env_id).baseline
        if baseline is None:
            raise SystemExit(f"--scripted-opening: {env_id} has no scripted baseline to open with")
        return ScriptedOpening([baseline], inner)

    env = GRPOEnvironment(env_id, dataset=data, limit=args.tasks, policy=policy, env_kwargs=env_kwargs)
    groups: list[dict[str, Any]] = []

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        out = env(prompts, trainer)
        groups.extend(group_scores(env.records, trainer.state.global_step + 1))
        return out

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env.reward,
        args=GRPOConfig(**config_kwargs(args)),
        train_dataset=env.dataset(),
        processing_class=tokenizer,
        rollout_func=rollout,
    )
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    steps = [{k: h[k] for k in LOGGED if k in h} for h in trainer.state.log_history if "reward" in h]
    summary = {
        "env": env_id,
        "model": model_path,
        "vllm_colocate": args.vllm_colocate,
        "steps": trainer.state.global_step,
        "wall_s": round(wall, 1),
        "per_step": steps,
        "groups": groups,
        "last_episodes": [
            {
                "key": r.key,
                "score": r.score,
                "turns": r.turns,
                "termination_reason": r.termination_reason,
                "exact_trajectory": (r.row().get("token_trajectory") or {}).get("exact"),
            }
            for r in env.records
        ],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.save:
        trainer.save_model(str(args.out / "model"))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
