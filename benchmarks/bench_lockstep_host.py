"""Host-side seconds of a lockstep run around an instant offline engine: prompts tokenised inside
``generate``, by ``Policy.warm`` in the env worker threads, and with the env's and the policy's
counts sharing one memo (the default).

The stub has ``vllm.LLM``'s ``generate``/``get_tokenizer`` interface and answers every request at
once with ``--tokens`` random token ids (drawn before the clock starts), so the wall time is the
time a GPU would sit idle: environment steps, prompt rendering and tokenising, request building.

    /opt/agent-envs-vllm-cpu/bin/python benchmarks/bench_lockstep_host.py --tokenizer ~/.cache/agent-envs/smollm2-hf
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_envs.policy.base import GenerationRequest  # noqa: E402
from agent_envs.policy.sampling import SamplingConfig  # noqa: E402
from agent_envs.policy.vllm import VLLMPolicy  # noqa: E402
from agent_envs.rollout import run_episodes  # noqa: E402


class InstantLLM:
    """``vllm.LLM`` stand-in: RequestOutput-shaped answers of ``max_tokens`` pre-drawn tokens."""

    def __init__(self, tokenizer: Any, tokens: int, pool: int = 64, seed: int = 0):
        rng = random.Random(seed)
        ids = [[rng.randrange(1000, len(tokenizer) - 1000) for _ in range(tokens)] for _ in range(pool)]
        self.answers = [
            SimpleNamespace(outputs=[SimpleNamespace(text=tokenizer.decode(i), token_ids=i, finish_reason="length")])
            for i in ids
        ]
        self.tokenizer, self.calls = tokenizer, 0

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def generate(self, prompts: list, params: list, use_tqdm: bool = False) -> list:
        self.calls += 1
        return [self.answers[i % len(self.answers)] for i in range(len(prompts))]


class Unwarmed(VLLMPolicy):
    """The runner before ``warm``: every prompt is tokenised inside ``generate``, one by one."""

    def warm(self, request: GenerationRequest) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    try:
        import vllm  # noqa: F401  (the policy builds vLLM's SamplingParams; only the engine is stubbed)
    except ImportError:
        raise SystemExit(
            "needs an interpreter with vllm, e.g. /opt/agent-envs-vllm-cpu/bin/python (scripts/install_vllm_cpu.sh)"
        ) from None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer.expanduser()))
    apart = copy.deepcopy(tokenizer)  # another tokenizer object: the env's counts share no memo with the policy's
    variants = {
        "tokenise in generate, one prompt after another": (Unwarmed, None),
        "Policy.warm in env threads, env and policy count apart": (VLLMPolicy, apart),
        "Policy.warm + one count memo for env and policy (default)": (VLLMPolicy, None),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for rep in range(args.repeat):
        for index, (name, (cls, env_tokenizer)) in enumerate(variants.items()):
            # fresh questions every run: nothing counted in an earlier run can be reused
            tasks = [
                {"id": f"bench-{i}", "question": f"[{rep}.{index}] What is {i} * {i + 3}?", "answer": str(i * (i + 3))}
                for i in range(args.episodes)
            ]
            policy = cls(
                llm=InstantLLM(tokenizer, args.tokens), sampling=SamplingConfig(ignore_eos=True), max_model_len=8192
            )
            env_kwargs: dict[str, Any] = {
                "sandbox": "none",
                "max_turns": args.turns,
                "max_tokens_per_turn": args.tokens,
            }
            if env_tokenizer is not None:
                env_kwargs["tokenizer"] = env_tokenizer
            start, cpu = time.perf_counter(), time.process_time()
            records = run_episodes(
                "MATH-ReAct-v0",
                tasks,
                policy,
                mode="lockstep",
                concurrency=args.episodes,
                progress=False,
                env_kwargs=env_kwargs,
            )
            results[name].append((time.perf_counter() - start, time.process_time() - cpu))
            assert all(r.termination_reason == "max_turns" for r in records), {r.termination_reason for r in records}
    print(
        f"\n# {args.episodes} MATH-ReAct-v0 episodes x {args.turns} turns x {args.tokens} tokens, lockstep, "
        f"instant engine, {os.cpu_count()} cores; best of {args.repeat}"
    )
    print("| variant | host wall s | host ms per env step | process CPU s |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        wall, cpu = min(runs)
        print(f"| {name} | {wall:.2f} | {1000 * wall / (args.episodes * args.turns):.2f} | {cpu:.2f} |")
    first, *_, last = (min(runs)[0] for runs in results.values())
    print(f"\nhost wall default / first = {last / first:.2f} (engine idle time per lockstep run)")


if __name__ == "__main__":
    main()
