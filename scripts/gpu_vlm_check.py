#!/usr/bin/env python3
"""Run DocVQA-VL-v0 episodes with image observations through vLLM on the tiny VLM and print a table.

Builds the tiny vision-language model (agent_envs/policy/tiny_vlm.py: random seeded weights around
a tokenizer folder), draws synthetic DocVQA pages (envs/docvqa/synth.py's layouts; no tesseract
needed) and runs full episodes on each path: ``offline`` (VLLMPolicy, lockstep), ``async``
(AsyncVLLMPolicy, continuous) and ``server`` (vLLM's OpenAI server on 127.0.0.1, OpenAIPolicy
sending the images as data URLs).  Every episode opens with a scripted ``view`` of the page's top
(a random model never calls a tool), so every later turn carries that image.  A path passes when no
episode errs, every model turn carried its images, and every prompt length the engine reports is
the processor's own count of the chat (the engine expanded exactly those images).  The offline path
also checks that seeds repeat, that two pages with one seed give different samples (the pixels
reach the model) and, on the CPU (GPU kernels are not batch-invariant), that a text request's
completion ignores image neighbours in its batch.

On the GPU (vLLM 0.26), with the staged SmolLM2 tokenizer:
    python scripts/gpu_vlm_check.py --tokenizer /tmp/stage-ray/tokenizer
On this CPU machine (vllm-cpu venv):
    /opt/agent-envs-vllm-cpu/bin/python scripts/gpu_vlm_check.py --cpu --paths offline
Exit status 1 when a path fails.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from gpu_engine import vllm_cpu_env  # noqa: E402
from gpu_openai_check import SERVED_NAME, server_flags, vllm_server  # noqa: E402  (sets up sys.path, in-process vLLM)

from agent_envs.core.content import image_part, images_of  # noqa: E402
from agent_envs.policy.base import GenerationRequest  # noqa: E402
from agent_envs.policy.sampling import SamplingConfig  # noqa: E402
from agent_envs.policy.scripted import RecordingPolicy, ScriptedOpening  # noqa: E402
from agent_envs.policy.tiny_vlm import build_tiny_vlm  # noqa: E402
from agent_envs.core.tokens import TokenCounter  # noqa: E402

VIEW_TOP = 'Action: {"name": "view", "arguments": {"box": [0, 0, 850, 550]}}'
PATHS = ("offline", "async", "server")


def synthetic_tasks(n: int, out: Path) -> list:
    """``n`` pages drawn with the synthetic layouts, one question each (its answer is on the page)."""
    from agent_envs.envs.docvqa import synth
    from agent_envs.envs.docvqa.task import DocTask

    tasks = []
    for i in range(n):
        rng = random.Random(f"gpu-vlm-check:{i}")
        kind = list(synth.LAYOUTS)[i % len(synth.LAYOUTS)]
        page = synth.LAYOUTS[kind](rng, rng.choice(synth.FONT_FAMILIES))
        path = out / f"page_{i}.png"
        page.image.save(path)
        question = page.questions[0]
        tasks.append(
            DocTask(id=f"gpu_vlm_{kind}_{i}", question=question.text, answers=question.answers, image=str(path))
        )
    return tasks


def episodes(name: str, policy, tasks: list, args, counter: TokenCounter) -> dict:
    """Run the episodes through ``policy`` and summarise what its engine was sent and reported."""
    from agent_envs.rollout import run_episodes

    recording = RecordingPolicy(policy)
    t = time.perf_counter()
    records = run_episodes(
        "DocVQA-VL-v0",
        tasks,
        ScriptedOpening([VIEW_TOP], recording),
        samples=args.samples,
        mode="lockstep" if name == "offline" else "async",
        progress=False,
        env_kwargs={"max_turns": args.turns, "max_tokens_per_turn": args.max_tokens, "sandbox": args.sandbox},
    )
    wall = time.perf_counter() - t
    calls = recording.calls
    images = [len(images_of(r.messages)) for r, _ in calls]
    reported = [c.prompt_tokens for _, c in calls]
    counted = [counter.prompt_tokens(r.messages) for r, _ in calls]
    return {
        "path": name,
        "records": len(records),
        "errors": sum(r.error is not None for r in records) + sum(not c.ok for _, c in calls),
        "model_turns": len(calls),
        "turns_with_images": sum(n > 0 for n in images),
        "image_parts_sent": sum(images),
        "prompt_tokens": sum(p or 0 for p in reported),
        "prompt_tokens_exact": sum(p == q for p, q in zip(reported, counted)),
        "terminations": sorted({str(r.termination_reason) for r in records}),
        "wall_s": round(wall, 1),
        "first_error": next((r.error for r in records if r.error), None)
        or next((c.error_message for _, c in calls if not c.ok), None),
    }


def passed(row: dict, args) -> bool:
    """Every episode ran its turns without error, every model turn carried the view's image, and
    every prompt length the engine reported is the processor's count."""
    turns = args.tasks * args.samples * (args.turns - 1)
    return (
        row.get("records") == args.tasks * args.samples
        and row["errors"] == 0
        and row.get("model_turns") == turns
        and row.get("turns_with_images") == turns
        and row.get("prompt_tokens_exact") == turns
    )


def direct_checks(policy, tasks: list, args) -> dict:
    """Seeds, batch neighbours and pixels on the offline engine, outside any episode."""
    from PIL import Image

    def chat(path: str | None) -> list[dict]:
        user = (
            [{"type": "text", "text": "Read the page: "}, image_part(Image.open(path).convert("RGB"))]
            if path
            else "What is 2+2?"
        )
        return [{"role": "user", "content": user}]

    def req(path: str | None, seed: int) -> GenerationRequest:
        return GenerationRequest(messages=chat(path), seed=seed, max_tokens=args.max_tokens, stop=["<<none>>"])

    a, b = tasks[0].image, tasks[1].image
    batch = [req(a, 1), req(None, 2), req(b, 1)]
    first, again = policy.generate(batch), policy.generate(batch)
    text_alone = policy.generate([req(None, 2)])[0]
    return {
        "seeded_repeat": [c.token_ids for c in first] == [c.token_ids for c in again],
        "text_ignores_image_neighbours": text_alone.token_ids == first[1].token_ids,
        "pages_differ_same_seed": first[0].token_ids != first[2].token_ids,
        "image_prompt_tokens": [first[0].prompt_tokens, first[2].prompt_tokens],
        "image_prompt_exact": [c.prompt_tokens for c in (first[0], first[2])]
        == [len(policy.renderer.render(r.messages).ids) for r in (batch[0], batch[2])],
    }


def run_path(
    name: str, model: str, processor, tasks: list, args, engine_kwargs: dict, work: Path, results: dict
) -> dict:
    """One path's episodes (and, offline, the direct checks); its engine or server is shut down after."""
    from agent_envs.policy.base import Policy
    from agent_envs.policy.openai import OpenAIPolicy
    from agent_envs.policy.vllm import AsyncVLLMPolicy, VLLMPolicy

    started = time.perf_counter()
    counter, sampling, images = TokenCounter(processor=processor), SamplingConfig(), {"image": args.turns}
    if name == "server":
        flags = [*server_flags(engine_kwargs), "--limit-mm-per-prompt", json.dumps(images)]
        with vllm_server(model, flags, work / "server.log", args.ready_timeout, results) as url:
            start = time.perf_counter() - started
            policy: Policy = OpenAIPolicy(url, SERVED_NAME, processor=processor, sampling=sampling)
            try:
                row = episodes(name, policy, tasks, args, counter)
            finally:
                policy.close()
    else:
        cls = VLLMPolicy if name == "offline" else AsyncVLLMPolicy
        policy = cls(model, sampling=sampling, limit_mm_per_prompt=images, **engine_kwargs)
        start = time.perf_counter() - started
        try:
            row = episodes(name, policy, tasks, args, counter)
            if name == "offline":
                results["direct"] = direct_checks(policy, tasks, args)
        finally:
            policy.close()
    return {**row, "start_s": round(start, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: the bundled SmolLM2's)")
    parser.add_argument("--cpu", action="store_true", help="vllm-cpu settings (1 GiB KV cache, float32)")
    parser.add_argument("--dtype", help="engine dtype (default: float32 with --cpu, else bfloat16)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    parser.add_argument("--tasks", type=int, default=4, help="synthetic pages (one question each)")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3, help="max turns per episode (the first is a scripted view)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per turn")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--sandbox", default="bwrap" if shutil.which("bwrap") else "none")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for the server")
    parser.add_argument("--json", action="store_true", help="also print one RESULT line of JSON")
    args = parser.parse_args()
    paths = [p for p in args.paths.split(",") if p]
    if not paths or set(paths) - set(PATHS):
        parser.error(f"--paths takes a comma-separated subset of {','.join(PATHS)}")
    if args.tasks < 2 or args.turns < 2:
        parser.error("need --tasks >= 2 and --turns >= 2")

    import vllm
    from transformers import AutoProcessor

    engine_kwargs: dict = {"max_model_len": args.max_model_len, "seed": 0, "enforce_eager": True}
    if args.cpu:
        vllm_cpu_env(plain_linear=False)
    else:
        engine_kwargs["gpu_memory_utilization"] = 0.3
    engine_kwargs["dtype"] = args.dtype or ("float32" if args.cpu else "bfloat16")
    results: dict = {"vllm": vllm.__version__, "engine_kwargs": engine_kwargs, "sandbox": args.sandbox, "rows": []}
    with tempfile.TemporaryDirectory(prefix="gpu-vlm-check-") as tmp:
        work = Path(tmp)
        model = str(build_tiny_vlm(work / "tiny-vlm", seed=0, tokenizer=args.tokenizer))
        tasks = synthetic_tasks(args.tasks, work)
        processor = AutoProcessor.from_pretrained(model)
        for name in paths:
            t = time.perf_counter()
            try:
                row = run_path(name, model, processor, tasks, args, engine_kwargs, work, results)
            except Exception as exc:  # a path that cannot start is a failed row; the others still run
                row = {
                    "path": name,
                    "errors": 1,
                    "first_error": f"{type(exc).__name__}: {exc}"[:2000],
                    "start_s": round(time.perf_counter() - t, 1),
                }
            row["ok"] = passed(row, args)
            results["rows"].append(row)
            gc.collect()
    direct = results.get("direct")
    # GPU kernels are not batch-invariant: there a text request's sample may change with its batch,
    # so that check is reported but required on the CPU only
    required = (
        "seeded_repeat",
        "pages_differ_same_seed",
        "image_prompt_exact",
        *(("text_ignores_image_neighbours",) if args.cpu else ()),
    )
    ok = all(r["ok"] for r in results["rows"]) and (direct is None or all(direct[k] for k in required))
    results["ok"] = ok
    print_table(results)
    if args.json:
        print("RESULT " + json.dumps(results))
    return 0 if ok else 1


def print_table(results: dict) -> None:
    print(f"vLLM {results['vllm']}; tiny Idefics3 VLM; sandbox {results['sandbox']}")
    columns = (
        "path",
        "ok",
        "records",
        "errors",
        "model_turns",
        "turns_with_images",
        "image_parts_sent",
        "prompt_tokens",
        "prompt_tokens_exact",
        "start_s",
        "wall_s",
    )
    print(" | ".join(columns))
    for row in results["rows"]:
        print(" | ".join(str(row.get(c, "-")) for c in columns))
        if row.get("first_error"):
            print(f"  first error ({row['path']}): {row['first_error'][:500]}")
    if "direct" in results:
        print("offline direct checks: " + ", ".join(f"{k}={v}" for k, v in results["direct"].items()))
    print("ALL OK" if results["ok"] else "FAILED")


if __name__ == "__main__":
    raise SystemExit(main())
