"""Token counting from many env threads at once, as the lockstep runner warms prompts.

vLLM hands out a tokenizer whose every call borrows a private copy and deep-copies a new one when
all are busy; 200 env threads warming prompts at once made the first lockstep turn copy tokenizers
(about a second of CPU each) while the GPU waited.  The counter must render and tokenise without
touching that pool, and give exactly the ids the tokenizer itself gives.
"""

from __future__ import annotations

import json
import random

import pytest

from agent_envs.policy.hf import smollm2_tokenizer
from agent_envs.core.tokens import TokenCounter, _input_ids
from vllm_cpu import run_result


def _texts(n: int) -> list[str]:
    rng = random.Random(7)
    alphabet = "abc xyz 0123 \n\t{}\"'<|im_end|> é ü 你好 <think> </think> Action: Observation:"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 400))) for _ in range(n)]


def test_direct_encoding_equals_the_tokenizer_on_varied_text() -> None:
    tokenizer = smollm2_tokenizer()
    counter = TokenCounter(tokenizer)
    assert counter._encode is not None  # the fast path is on for this tokenizer
    for text in _texts(200):
        assert counter.text_ids(text) == list(tokenizer.encode(text, add_special_tokens=False))
        chat = [{"role": "system", "content": "s"}, {"role": "user", "content": text}]
        expected = _input_ids(tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True))
        assert counter.prompt_ids(chat) == expected


SCRIPT = r"""
import copy, json, sys, threading
from vllm.tokenizers.hf import maybe_make_thread_pool
from agent_envs.policy.hf import smollm2_tokenizer
from agent_envs.core.tokens import PromptTally, TokenCounter

plain = smollm2_tokenizer()
pooled = maybe_make_thread_pool(smollm2_tokenizer())
copies = []
real_deepcopy = copy.deepcopy
def counting(obj, *args, **kwargs):
    if type(obj).__name__.startswith(("TokenizerPool", "TokenizersBackend")):
        copies.append(type(obj).__name__)
    return real_deepcopy(obj, *args, **kwargs)
copy.deepcopy = counting
counter, reference = TokenCounter(pooled), TokenCounter(plain)
texts = json.loads(sys.argv[1])
results, start = {}, threading.Barrier(len(texts))
def work(i, text):
    chat = [{"role": "system", "content": "You solve."}, {"role": "user", "content": text}]
    start.wait()
    tally = PromptTally(counter, chat)
    for turn in range(3):
        chat += [{"role": "assistant", "content": text[::-1]}, {"role": "user", "content": text[turn:]}]
        results[i] = tally.prompt_ids()
threads = [threading.Thread(target=work, args=(i, t)) for i, t in enumerate(texts)]
[t.start() for t in threads]; [t.join() for t in threads]
expected = {}
for i, text in enumerate(texts):
    chat = [{"role": "system", "content": "You solve."}, {"role": "user", "content": text}]
    for turn in range(3):
        chat += [{"role": "assistant", "content": text[::-1]}, {"role": "user", "content": text[turn:]}]
    expected[i] = reference.prompt_ids(chat)
print("RESULT " + json.dumps({"copies": len(copies), "equal": all(results[i] == expected[i] for i in expected)}))
"""


@pytest.mark.vllm
def test_many_threads_never_copy_vllms_pooled_tokenizer() -> None:
    out, _ = run_result(["-c", SCRIPT, json.dumps(_texts(48))], timeout=600, check=False)
    assert out == {"copies": 0, "equal": True}
