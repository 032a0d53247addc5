#!/usr/bin/env python3
"""ES on a real vLLM engine with a toy objective, then replay of its history on a fresh engine.

The objective is computed from what the perturbed engine generates (share of even token ids in a
greedy continuation), so member rewards differ and every generation really moves the weights.
``train`` writes the history and prints the trained weights' checksum; ``replay`` (run in a new
process, i.e. a fresh engine) rebuilds the weights from the history and prints its checksum.

    python scripts/gpu_es_replay_check.py train  --model M --load-format dummy --history h.json
    python scripts/gpu_es_replay_check.py replay --model M --load-format dummy --history h.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_envs.es.history import ESConfig, resume  # noqa: E402
from agent_envs.es.population import ESTrainer, MemberResult  # noqa: E402
from agent_envs.es.worker import VLLMPerturbation  # noqa: E402
from gpu_engine import add_engine_args, make_llm  # noqa: E402

PROMPTS = [
    {"id": f"p{i}", "prompt": p}
    for i, p in enumerate(["Once upon a time", "The answer is", "def main():", "In 1987 the company"])
]


def toy_config(model: str, generations: int, population: int, tp_size: int, history: str) -> ESConfig:
    return ESConfig(
        env_id="toy",
        model=model,
        generations=generations,
        population=population,
        case_batch_size=len(PROMPTS),
        sigma_start=1e-2,
        sigma_end=5e-3,
        alpha=5e-3,
        tp_size=tp_size,
        history_file=history,
    )


def toy_train(llm, backend: VLLMPerturbation, config: ESConfig) -> list[dict]:
    """Run the ES generations; reward = share of even token ids in greedy continuations."""
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=32)

    def evaluate(batch, seed: int, generation: int, member: int) -> MemberResult:
        outs = llm.generate([t["prompt"] for t in batch], greedy, use_tqdm=False)
        ids = [t for o in outs for t in o.outputs[0].token_ids]
        reward = sum(1 for t in ids if t % 2 == 0) / max(1, len(ids))
        return MemberResult(generation=generation, member=member, seed=seed, reward=reward, rows=[])

    history = ESTrainer(config, backend, PROMPTS, evaluate, config.history_file, log=lambda _: None).run()
    for rec in history:
        if "rewards" in rec:
            norm = sum(w * w for w in rec["weights"]) ** 0.5
            print(
                f"[check] generation {rec['generation']} rewards {[round(r, 3) for r in rec['rewards']]} "
                f"weight_norm {norm:.4f}"
            )
    return history


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("action", choices=["train", "replay"])
    add_engine_args(ap)
    ap.add_argument("--history", required=True)
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--population", type=int, default=8)
    args = ap.parse_args()

    llm = make_llm(args, max_model_len=1024)
    backend = VLLMPerturbation(llm, scope="full", exact_revert=True)
    config = toy_config(args.model, args.generations, args.population, backend.tp_size, args.history)
    print(f"[check] start checksum {backend.checksum()}")
    if args.action == "replay":
        _, done = resume(args.history, config, backend)
        print(f"[check] replayed {done} generations; checksum {backend.checksum()}")
        return
    toy_train(llm, backend, config)
    print(f"[check] trained checksum {backend.checksum()}")


if __name__ == "__main__":
    main()
