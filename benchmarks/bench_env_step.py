"""Environment-side cost of one step as the conversation grows (CPU, real tokenizer).

Each ``MATH-ReAct-v0`` episode is fed 4,096-token completions (no action, so the environment answers
with its format warning and nothing runs in a sandbox) with the context check on, as the runner
does it: ``env.step(completion)`` then ``generation_request()``.  Printed: seconds per 1,000 such
steps at turns 1, 10 and 40, for the incremental token accounting (default) and for rendering and
tokenising the whole chat every step (the previous behaviour, forced here for comparison).

    PYTHONPATH=. python benchmarks/bench_env_step.py --episodes 3
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym

import agent_envs  # noqa: F401  (registers the environments)
from agent_envs.policy.base import Completion
from agent_envs.policy.hf import smollm2_tokenizer
from agent_envs.core.tokens import TokenCounter
from agent_envs.envs.react import ReActEnv

SENTENCE = "Let me compute the value step by step: x = 12 * 7 = 84, so the total is 84 plus 16. "


class FullCounter(TokenCounter):
    """The previous accounting: every count renders and tokenises the whole chat."""

    @property
    def incremental(self) -> bool:
        return False


def completions(tokenizer, turns: int, tokens: int) -> list[Completion]:
    """One distinct ``tokens``-token completion per turn (the engine's token ids are passed along)."""
    base = tokenizer.encode(SENTENCE * (tokens // 10), add_special_tokens=False)
    out = []
    for turn in range(turns):
        ids = (tokenizer.encode(f"Turn {turn}. ", add_special_tokens=False) + base)[:tokens]
        out.append(Completion(text=tokenizer.decode(ids), token_ids=ids, finish_reason="length"))
    return out


def run(
    accounting: str, tokenizer, replies: list[Completion], episodes: int, turns: tuple[int, ...]
) -> dict[int, float]:
    """Mean seconds per step at each requested turn."""
    env = gym.make(
        "MATH-ReAct-v0", tokenizer=tokenizer, max_model_len=10**8, sandbox="none", max_turns=len(replies) + 1
    )
    react = env.unwrapped
    assert isinstance(react, ReActEnv)
    if accounting == "full":
        react.counter = FullCounter(tokenizer)
    spent = {t: 0.0 for t in turns}
    for episode in range(episodes):
        env.reset(options={"task": {"id": f"bench-{episode}", "question": "What is 84 + 16?", "answer": "100"}})
        for turn, reply in enumerate(replies, start=1):
            start = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(reply)
            react.generation_request()
            if turn in spent:
                spent[turn] += time.perf_counter() - start
            assert not (terminated or truncated), "the episode ended early"
    env.close()
    return {t: spent[t] / episodes for t in turns}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per completion")
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 10, 40])
    parser.add_argument("--skip-full", action="store_true", help="only the incremental accounting")
    args = parser.parse_args()
    tokenizer = smollm2_tokenizer()
    replies = completions(tokenizer, max(args.turns), args.tokens)
    assert TokenCounter(tokenizer).incremental  # the once-per-tokenizer check, outside the timings
    modes = ["incremental"] if args.skip_full else ["incremental", "full"]
    rows = {m: run(m, tokenizer, replies, args.episodes, tuple(args.turns)) for m in modes}
    first, last = min(args.turns), max(args.turns)
    print(
        f"# MATH-ReAct-v0, SmolLM2 tokenizer, {args.tokens}-token turns, {args.episodes} episodes; "
        "env-side seconds per 1,000 steps (step + generation_request)"
    )
    print("| accounting | " + " | ".join(f"turn {t}" for t in args.turns) + f" | turn {last} / turn {first} |")
    print("|---|" + "---|" * (len(args.turns) + 1))
    for mode, per_step in rows.items():
        cells = " | ".join(f"{1000 * per_step[t]:.2f}" for t in args.turns)
        print(f"| {mode} | {cells} | {per_step[last] / per_step[first]:.2f}x |")
    ratio = rows["incremental"][last] / rows["incremental"][first]
    print(f"\nincremental: turn {last} costs {ratio:.2f}x turn {first} (target <= 1.5x)")


if __name__ == "__main__":
    main()
