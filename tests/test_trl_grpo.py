"""TRL's GRPOTrainer on MATH-ReAct-v0 episodes through ``rollout_func`` (agent_envs.rl.trl_rollout), on the CPU.

Two real optimiser steps with SmolLM2-135M: every episode runs through the runner with a real
bubblewrap sandbox, the rewards are the Math scorer's, and the tensors the loss is computed on are
checked against what the engine saw and sampled, token for token.

A 135M model almost never solves a task by itself, and GRPO learns nothing from a group whose
rewards are all equal; so the test's policy opens every episode with a scripted (real, sandboxed)
bash call, and sample 0 of every group answers from the tool's output by script.  Scripted turns
are context, not samples (``sampled: false``, loss mask 0): the gradient flows only through the
tokens the model sampled, whose advantage the scripted success makes non-zero.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl", reason="TRL is not installed (pip install 'agent-envs[trl]')")

from agent_envs.envs.math_react.scoring import math_score  # noqa: E402
from agent_envs.policy.base import Completion, GenerationRequest  # noqa: E402
from agent_envs.policy.hf import smollm2_hf_dir  # noqa: E402
from agent_envs.policy.scripted import RecordingPolicy, WrappedPolicy  # noqa: E402
from agent_envs.protocol.messages import action_text, last_observation_body  # noqa: E402
from agent_envs.rl.trl_rollout import GRPOEnvironment, sampling_from, trainer_policy  # noqa: E402
from agent_envs.core.trajectory import segments, sequence  # noqa: E402
from rl_docs import EXAMPLE, REPO, documented_command  # noqa: E402

pytestmark = pytest.mark.slow

TASKS = [{"id": f"add-{a}-{b}", "question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in ((2, 3), (4, 5))]


class Coached(WrappedPolicy):
    """Turn 1: a scripted bash call that computes the sum; turn 2 of sample 0: a scripted answer read
    off the tool's output; every other turn: the model."""

    def _scripted(self, request: GenerationRequest) -> Completion | None:
        turn = sum(m["role"] == "assistant" for m in request.messages)
        if turn == 0:
            a, b = re.findall(r"(\d+) \+ (\d+)", request.messages[1]["content"])[0]
            return Completion(
                text=action_text("bash", {"command": f"python3 -c 'print({a}+{b})'"}), finish_reason="stop"
            )
        if turn == 1 and request.sample_index == 0:
            found = re.findall(r"\d+", last_observation_body(request.messages))
            return Completion(text=f"Final answer: \\boxed{{{found[0]}}}", finish_reason="stop")
        return None

    def generate(self, requests):
        scripted = [self._scripted(r) for r in requests]
        later = iter(self.policy.generate([r for r, s in zip(requests, scripted) if s is None]))
        return [s if s is not None else next(later) for s in scripted]


class Capturing(trl.GRPOTrainer):
    """Keeps the tensors every loss is computed on and, before the first update, the model's own
    log-probabilities of the sampled tokens."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[dict] = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        batch = {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        if not self.batches:
            with torch.no_grad():
                ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
                mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
                logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
                width = inputs["completion_ids"].size(1)
                batch["model_logps"] = (
                    logits.log_softmax(-1)[:, -width:].gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
                )
        self.batches.append(batch)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 135M model decodes faster on one thread than on two busy ones
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = smollm2_hf_dir()
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        tokenizer.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        engines: list[RecordingPolicy] = []

        def policy(trainer):
            engines.append(RecordingPolicy(trainer_policy(trainer, sampling_from(trainer.args))))
            return Coached(engines[-1])

        env = GRPOEnvironment(
            "MATH-ReAct-v0",
            TASKS,
            policy=policy,
            env_kwargs={"max_turns": 2, "max_tokens_per_turn": 24, "sandbox": "bwrap"},
        )
        episodes: list = []
        rollout = env.__call__

        def keep(prompts, trainer):  # the records of every call, not only the last
            out = rollout(prompts, trainer)
            episodes.extend(env.records)
            return out

        args = trl.GRPOConfig(
            output_dir=str(tmp_path_factory.mktemp("grpo")),
            report_to="none",
            use_cpu=True,
            bf16=False,
            max_steps=2,
            per_device_train_batch_size=2,
            num_generations=2,
            learning_rate=1e-4,
            logging_steps=1,
            save_strategy="no",
            gradient_checkpointing=False,
            seed=0,
            shuffle_dataset=False,
        )
        trainer = Capturing(
            model=model,
            reward_funcs=env.reward,
            args=args,
            train_dataset=env.dataset(),
            processing_class=tokenizer,
            rollout_func=keep,
        )
        before = {k: v.detach().clone() for k, v in model.named_parameters()}
        trainer.train()
        after = dict(model.named_parameters())
        yield {
            "trainer": trainer,
            "episodes": episodes,
            "engine": engines[0],
            "before": before,
            "after": after,
            "tokenizer": tokenizer,
        }
    finally:
        torch.set_num_threads(threads)


def _rows(batch: dict) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, completion ids, env mask) of each row, without padding."""
    out = []
    for i in range(batch["prompt_ids"].size(0)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        keep = batch["completion_mask"][i].bool()
        out.append((prompt, batch["completion_ids"][i][keep].tolist(), batch["tool_mask"][i][keep].tolist()))
    return out


def test_two_optimiser_steps_change_the_weights(run):
    assert run["trainer"].state.global_step == 2 and len(run["trainer"].batches) == 2
    changed = [k for k, v in run["after"].items() if not torch.equal(run["before"][k], v.detach())]
    assert len(changed) > len(run["after"]) // 2, f"only {len(changed)} of {len(run['after'])} tensors changed"


def test_episodes_are_real_sandboxed_math_episodes_scored_by_the_math_scorer(run):
    episodes = run["episodes"]
    assert len(episodes) == 4 and {e.sample_index for e in episodes} == {0, 1}
    for e in episodes:
        task = next(t for t in TASKS if t["id"] == e.task_id)
        assert e.used_bash and e.tool_calls >= 1 and e.react_steps[0]["observation"].startswith(task["answer"] + "\n")
        result = math_score(
            e.completion, task["answer"], scorer="auto", termination_reason=e.termination_reason, used_bash=e.used_bash
        )
        assert e.score == result.score and e.score_method == result.label
    assert {e.score for e in episodes if e.sample_index == 0} == {1.0}
    logged = [h["reward"] for h in run["trainer"].state.log_history if "reward" in h]
    assert logged == [sum(e.score for e in episodes[i : i + 2]) / 2 for i in (0, 2)]


def test_the_trainer_scores_exactly_the_ids_the_engine_saw_and_sampled(run):
    sampled = {}  # episode key -> what the engine was sent and sampled, turn by turn
    for request, completion in run["engine"].calls:
        sampled.setdefault(request.key, []).append((request.prompt_token_ids, completion))
    rows = [row for batch in run["trainer"].batches for row in _rows(batch)]
    assert len(rows) == 4
    matched = set()
    for episode in run["episodes"]:
        trajectory = episode.row()["token_trajectory"]
        row = next(r for r in rows if r[0] == trajectory["prompt_ids"] and r[0] + r[1] == sequence(trajectory))
        matched.add(id(row))
        prompt, completion, mask = row
        model_ids = [t for t, m in zip(completion, mask) if m]
        engine_ids = []
        model_turns = [
            (t, start) for t, (start, _, _) in zip(trajectory["turns"], segments(trajectory)) if t["sampled"]
        ]
        assert len(model_turns) == len(sampled.get(episode.key, []))
        for (sent, out), (turn, start) in zip(sampled.get(episode.key, []), model_turns):
            assert sent == out.prompt_token_ids == (prompt + completion)[:start]  # what the engine saw
            assert turn["completion_ids"] == out.token_ids[: len(out.token_ids) - turn["dropped"]]
            engine_ids += turn["completion_ids"]
        assert model_ids == engine_ids
        assert bool(engine_ids) == (episode.sample_index == 1)  # sample 0 is scripted throughout
    assert len(matched) == 4


def test_the_logprobs_given_to_the_trainer_are_the_models(run):
    batch = run["trainer"].batches[0]
    mask = (batch["tool_mask"] * batch["completion_mask"]).bool()
    assert mask.sum() > 0
    engine, model = batch["sampling_per_token_logps"][mask], batch["model_logps"][mask]
    assert torch.isfinite(engine).all() and (engine <= 0).all()
    assert torch.allclose(engine, model, atol=2e-3), (engine - model).abs().max()


def test_prompts_map_back_to_their_tasks_and_copies_become_samples():
    from agent_envs.rl.trl_rollout import _sample_numbers

    env = GRPOEnvironment("MATH-ReAct-v0", TASKS)
    assert [env._row_of(p) for p in env.dataset()["prompt"]] == [0, 1]
    assert _sample_numbers([0, 0, 1, 1, 0]) == [0, 1, 0, 1, 2]
    with pytest.raises(ValueError, match="none of this environment's task openings"):
        env._row_of([{"role": "user", "content": "something else"}])
    twins = [dict(TASKS[0]), {**TASKS[0], "id": "twin", "answer": "6"}]
    with pytest.raises(ValueError, match="open with the same chat"):
        GRPOEnvironment("MATH-ReAct-v0", twins)


# -- docs/rl.md's commands ------------------------------------------------------------------------
def test_the_documented_cpu_command_gives_a_group_whose_rewards_differ(tmp_path):
    """docs/rl.md's CPU GRPO command, run as written (only ``--out`` moved): GRPO learns only from a
    group whose rewards differ, so at least one group must hold both rewards, and TRL must see it
    (``frac_reward_zero_std`` below 1, a non-zero gradient on that step)."""
    argv = documented_command("--cpu")
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *argv, "--out", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    steps = int(argv[argv.index("--steps") + 1])
    assert summary["steps"] == steps and len(summary["per_step"]) == steps
    groups = summary["groups"]
    assert len(groups) == steps * int(argv[argv.index("--batch") + 1])
    assert all(len(g["scores"]) == int(argv[argv.index("--generations") + 1]) for g in groups)
    mixed = [g for g in groups if len(set(g["scores"])) > 1]
    assert mixed, f"every group's rewards are equal: {groups}"
    for step in {g["step"] for g in mixed}:
        logged = summary["per_step"][step - 1]
        assert logged["frac_reward_zero_std"] < 1 and logged["reward_std"] > 0 and logged["grad_norm"] > 0, logged


def test_the_colocated_vllm_command_asks_trl_for_its_colocated_engine(tmp_path):
    """docs/rl.md's GPU command gives TRL 1.16's colocated-vLLM settings, and on this machine (no
    vllm) the trainer gets as far as building that engine.  A partial check: the engine itself, the
    weight sync and the episodes on it run only on a GPU."""
    import runpy

    example = runpy.run_path(str(EXAMPLE), run_name="example")
    argv = documented_command("--vllm-colocate")
    kwargs = example["config_kwargs"](example["parse_args"]([*argv, "--out", str(tmp_path)]))
    assert kwargs["use_vllm"] is True and kwargs["vllm_mode"] == "colocate" and kwargs["bf16"] is True
    assert 0 < kwargs["vllm_gpu_memory_utilization"] < 1
    step = int(argv[argv.index("--batch") + 1]) * int(argv[argv.index("--generations") + 1])
    assert kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"] == step

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here: building the engine is the GPU run's part, not this test's")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = example["parse_args"]([*argv, "--out", str(tmp_path), "--cpu", "--model", str(smollm2_hf_dir())])
    config = trl.GRPOConfig(**example["config_kwargs"](args))
    assert config.use_vllm and config.vllm_mode == "colocate"
    env = GRPOEnvironment("MATH-ReAct-v0", TASKS)
    with pytest.raises(ImportError, match="vLLM is not available"):
        trl.GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32),
            reward_funcs=env.reward,
            args=config,
            train_dataset=env.dataset(),
            processing_class=AutoTokenizer.from_pretrained(args.model),
            rollout_func=env,
        )
