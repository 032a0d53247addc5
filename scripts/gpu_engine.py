"""Engine options shared by the GPU check scripts: one bf16 eager vLLM engine with the ES extension."""
from __future__ import annotations

import argparse
from typing import Any


def add_engine_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", required=True)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (one worker per GPU)")
    ap.add_argument("--no-custom-all-reduce", action="store_true",
                    help="NCCL all-reduce only (a TP=2 engine stalled at start-up on one VM without this tried)")


def make_llm(args: argparse.Namespace, max_model_len: int) -> Any:
    from vllm import LLM

    from agent_envs.es.worker import EXTENSION

    return LLM(model=args.model, load_format=args.load_format, dtype="bfloat16", enforce_eager=True,
               worker_extension_cls=EXTENSION, max_model_len=max_model_len, gpu_memory_utilization=0.3,
               seed=0, tensor_parallel_size=args.tp, disable_custom_all_reduce=args.no_custom_all_reduce)
