"""TRL's ``GRPOTrainer`` on an agent-envs environment, through its ``rollout_func`` (docs/rl.md#trl).

TRL 1.16 offers two public ways to bring an environment: ``environment_factory`` (TRL runs the
turn loop, parses tool calls with the tokenizer's response schema and re-tokenises each tool
result) and ``rollout_func`` (the caller runs the episodes and returns token ids, log-probabilities
and an ``env_mask``).  Only the second keeps this package's protocol (the ReAct or native parser,
the sandbox, the budgets, the scorer) and gives the trainer the exact ids the engine sampled, so
that is the one used:

* the dataset's ``prompt`` column holds each task's opening chat (system prompt and task), which
  is how a prompt is mapped back to its task;
* each call runs one episode per prompt (TRL repeats each prompt ``num_generations`` times; the
  copies become sample 0, 1, ... of the task) with :func:`agent_envs.rollout.run_episodes` and
  token trajectories on, the policy being the trainer's own model (or the trainer's colocated vLLM
  engine); the seeds move on with the trainer's step and differ between its processes;
* it returns the opening prompt's ids as ``prompt_ids`` and the rest of each episode's token
  sequence (completions and observations) as ``completion_ids``, with ``logprobs`` aligned to them
  and ``env_mask`` 1 exactly on the tokens the engine sampled; the episode's score goes along as
  ``agent_envs_score``, which :meth:`GRPOEnvironment.reward` hands back as the reward.

An episode that failed outside the model's control (a request or environment error) gets the
reward ``None``: TRL leaves it out of its group's baseline and gives it no advantage.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from typing import Any, Callable, Iterator, Sequence

import gymnasium as gym

from agent_envs.core.content import Message
from agent_envs.policy.base import Policy
from agent_envs.policy.sampling import SamplingConfig
from agent_envs.protocol.seeds import DEFAULT_BASE_SEED, SAMPLE_STRIDE
from agent_envs.rollout.records import EpisodeRecord
from agent_envs.rollout.runner import run_episodes
from agent_envs.rollout.trajectories import episode_tokens, skip_reason

#: how far the base seed moves per trainer step: room for 1024 samples of every task in between
STEP_SEED_STRIDE = 1024 * SAMPLE_STRIDE
#: and per training process (copies of one prompt may land on several): 64 samples each, 16 processes
PROCESS_SEED_STRIDE = 64 * SAMPLE_STRIDE
#: the extra rollout field that carries each episode's score to :meth:`GRPOEnvironment.reward`
SCORE_FIELD = "agent_envs_score"

PolicyFactory = Callable[[Any], Policy]


def opening_key(messages: Sequence[Message]) -> str:
    """The key of a task's opening chat (a prompt TRL hands back is matched to its task by it)."""
    return json.dumps([{"role": m["role"], "content": m["content"]} for m in messages], sort_keys=True)


def sampling_from(args: Any) -> SamplingConfig:
    """The trainer's sampling settings (``GRPOConfig``), without the protocol's presence penalty:
    GRPO's loss assumes the samples come from the policy as it stands."""
    return SamplingConfig(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k or 0,
        min_p=args.min_p or 0.0,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=0.0,
    )


def trainer_policy(
    trainer: Any, sampling: SamplingConfig, *, batch_decode: bool = False, rollout_token_budget: int = 0
) -> Policy:
    """The trainer's model as a policy: the colocated vLLM engine TRL keeps in step with the
    weights when it has one, else the model itself through :class:`TransformersPolicy`
    (``batch_decode``: one padded batch per lockstep turn, several times faster on a CPU; a
    sample then depends on its batch neighbours' padding, which GRPO does not mind;
    ``rollout_token_budget``: prompt tokens per batch, 0 for all at once: the first pass holds
    every prompt position's logits, 32 prompts of 509 tokens 3.2 GB in float32)."""
    generation = getattr(trainer, "vllm_generation", None)
    if getattr(trainer, "use_vllm", False):
        llm = getattr(generation, "llm", None)
        if llm is None:
            raise ValueError(
                "GRPOEnvironment runs episodes on a colocated engine (vllm_mode='colocate'); "
                "server mode keeps the engine out of reach"
            )
        from agent_envs.policy.vllm import VLLMPolicy

        return VLLMPolicy(llm=llm, tokenizer=trainer.processing_class, sampling=sampling)
    from agent_envs.policy.hf import TransformersPolicy

    model = trainer.accelerator.unwrap_model(trainer.model)
    return TransformersPolicy(
        getattr(model, "name_or_path", "trainer-model"),
        model=model,
        tokenizer=trainer.processing_class,
        sampling=sampling,
        device=str(trainer.accelerator.device),
        batch_decode=batch_decode,
        rollout_token_budget=rollout_token_budget,
    )


@contextlib.contextmanager
def generating(trainer: Any) -> Iterator[None]:
    """The trainer's model in eval mode while episodes run, back in its own mode after."""
    model = getattr(trainer, "model", None)
    training = getattr(model, "training", False)
    if model is not None:
        model.eval()
    try:
        yield
    finally:
        if model is not None:
            model.train(training)


class GRPOEnvironment:
    """An environment and its tasks as TRL's ``train_dataset``, ``rollout_func`` and reward function.

    ``env_kwargs`` go to every environment (``token_trajectories`` is always on); ``policy`` builds
    the policy from the trainer (default :func:`trainer_policy`); ``sampling`` overrides
    :func:`sampling_from`.  :attr:`records` keeps the records of the last call.
    """

    def __init__(
        self,
        env_id: str,
        tasks: Sequence[Any] | None = None,
        *,
        dataset: Any = "builtin",
        limit: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        mode: str = "lockstep",
        concurrency: int = 64,
        base_seed: int = DEFAULT_BASE_SEED,
        sampling: SamplingConfig | None = None,
        policy: PolicyFactory | None = None,
    ):
        self.env_id = env_id
        self.env_kwargs = {k: v for k, v in (env_kwargs or {}).items() if k != "token_trajectories"}
        self.mode, self.concurrency, self.base_seed = mode, concurrency, base_seed
        self.sampling, self.policy_factory = sampling, policy
        env = gym.make(
            env_id, **({"tasks": list(tasks)} if tasks is not None else {"dataset": dataset}), **self.env_kwargs
        )
        try:
            self.tasks = list(env.get_wrapper_attr("tasks"))[:limit]
            self.openings = [env.reset(options={"task": t, "row_index": i})[0] for i, t in enumerate(self.tasks)]
        finally:
            env.close()
        self._rows: dict[str, int] = {}
        for row, opening in enumerate(self.openings):
            key = opening_key(opening)
            if key in self._rows:
                raise ValueError(
                    f"tasks {self.tasks[self._rows[key]].id!r} and {self.tasks[row].id!r} open with the "
                    "same chat: a prompt could not be told apart from the other"
                )
            self._rows[key] = row
        self.records: list[EpisodeRecord] = []
        self._policy: tuple[Any, Policy] | None = None

    def dataset(self) -> Any:
        """The ``train_dataset``: one row per task, its opening chat as ``prompt``."""
        from datasets import Dataset

        return Dataset.from_dict({"prompt": self.openings})

    def reward(self, prompts: Any = None, completions: Any = None, **kwargs: Any) -> list[float | None]:
        """The reward function: each episode's score from the environment's own scorer."""
        return list(kwargs[SCORE_FIELD])

    reward.__name__ = "agent_envs_score"

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """The ``rollout_func``: one episode per prompt, returned as TRL expects."""
        rows = [self._row_of(p) for p in prompts]
        samples = _sample_numbers(rows)
        base_seed = (
            self.base_seed
            + STEP_SEED_STRIDE * int(getattr(trainer.state, "global_step", 0))
            + PROCESS_SEED_STRIDE * int(getattr(getattr(trainer, "accelerator", None), "process_index", 0))
        )
        with generating(trainer):  # before the policy is built: building one puts the model in eval mode
            self.records = self._run(self._policy_for(trainer), rows, samples, base_seed)
        by_job = {(r.row_index, r.sample_index): r for r in self.records}
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            SCORE_FIELD: [],
        }
        for row, sample in zip(rows, samples):
            self._append(out, by_job[(row, sample)], trainer)
        return out

    def _row_of(self, prompt: Any) -> int:
        row = self._rows.get(opening_key(prompt))
        if row is None:
            raise ValueError(
                "rollout_func got a prompt that is none of this environment's task openings "
                "(use GRPOEnvironment.dataset() as the train_dataset)"
            )
        return row

    def _policy_for(self, trainer: Any) -> Policy:
        if self._policy is None or self._policy[0] is not trainer:
            sampling = self.sampling or sampling_from(trainer.args)
            factory = self.policy_factory or (lambda t: trainer_policy(t, sampling))
            self._policy = (trainer, factory(trainer))
        return self._policy[1]

    def _run(self, policy: Policy, rows: list[int], samples: list[int], base_seed: int) -> list[EpisodeRecord]:
        """One ``run_episodes`` per number of samples a task needs (TRL's batches make it one)."""
        need: dict[int, int] = {}
        for row, sample in zip(rows, samples):
            need[row] = max(need.get(row, 0), sample + 1)
        records: list[EpisodeRecord] = []
        for count in sorted(set(need.values())):
            group = sorted(r for r, n in need.items() if n == count)
            records += run_episodes(
                self.env_id,
                [self.tasks[r] for r in group],
                policy,
                samples=count,
                row_indices=group,
                mode=self.mode,
                base_seed=base_seed,
                env_kwargs={**self.env_kwargs, "token_trajectories": True},
                concurrency=self.concurrency,
                progress=False,
            )
        return records

    def _append(self, out: dict[str, list[Any]], record: EpisodeRecord, trainer: Any) -> None:
        """One episode's fields; an episode without a training sequence (it failed) trains nothing
        (one end-of-sequence token, mask 0) and has no reward."""
        row = record.row()
        if skip_reason(row) is not None:
            tokenizer = trainer.processing_class
            out["prompt_ids"].append(
                list(
                    tokenizer.apply_chat_template(
                        self.openings[record.row_index], add_generation_prompt=True, tokenize=True, return_dict=False
                    )
                )
            )
            out["completion_ids"].append([tokenizer.eos_token_id])
            out["logprobs"].append([0.0])
            out["env_mask"].append([0])
            out[SCORE_FIELD].append(None)
            return
        tokens = episode_tokens(row)
        cut = tokens.prompt_length
        out["prompt_ids"].append(tokens.tokens[:cut])
        out["completion_ids"].append(tokens.tokens[cut:])
        out["logprobs"].append(
            tokens.logprobs[cut:] if tokens.logprobs is not None else [None] * (len(tokens.tokens) - cut)
        )
        out["env_mask"].append(tokens.loss_mask[cut:])
        out[SCORE_FIELD].append(tokens.reward)


def _sample_numbers(rows: list[int]) -> list[int]:
    """Each prompt's sample number: how many copies of its task came before it in the batch."""
    seen: Counter[int] = Counter()
    numbers = []
    for row in rows:
        numbers.append(seen[row])
        seen[row] += 1
    return numbers
