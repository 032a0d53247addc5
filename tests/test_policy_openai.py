"""OpenAIPolicy against real HTTP servers on 127.0.0.1 (agent_envs.policy.server)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from agent_envs.policy.base import Completion, GenerationRequest
from agent_envs.policy.openai import OpenAIPolicy, is_context_length_error
from agent_envs.policy.scripted import ScriptedPolicy
from agent_envs.policy.server import PolicyServer


def echo(request: GenerationRequest) -> Completion:
    return Completion(text=f"seed={request.seed} max={request.max_tokens}", token_ids=[7, 8, 9])


@pytest.fixture
def servers():
    pair = [PolicyServer(ScriptedPolicy(echo), model="m", max_model_len=256, record=64).start() for _ in range(2)]
    yield pair
    for s in pair:
        s.close()


def req(seed: int = 1, content: str = "hello", **kw) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": content}], seed=seed, max_tokens=32, stop=["Observation:"], **kw
    )


def client(urls, **kw) -> OpenAIPolicy:
    return OpenAIPolicy(urls, "m", backoff_base_s=0.01, **kw)


def test_round_trip_sends_protocol_sampling_and_reads_token_ids(servers) -> None:
    policy = client(servers[0].url)
    out = policy.generate([req(seed=42)])[0]
    assert out.ok and out.text == "seed=42 max=32" and out.token_ids == [7, 8, 9] and out.completion_tokens == 3
    body = servers[0].received[0]
    assert {
        k: body[k]
        for k in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "presence_penalty",
            "repetition_penalty",
            "seed",
            "stop",
            "max_tokens",
        )
    } == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 40,
        "min_p": 0.0,
        "presence_penalty": 2.0,
        "repetition_penalty": 1.0,
        "seed": 42,
        "stop": ["Observation:"],
        "max_tokens": 32,
    }
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["return_token_ids"] is True
    models = httpx.get(servers[0].url + "/models").json()
    assert models["data"][0]["id"] == "m" and models["data"][0]["max_model_len"] == 256
    policy.close()


def test_jobs_are_spread_row_major_over_endpoints(servers) -> None:
    policy = client([s.url for s in servers], samples_per_row=2)
    jobs = [req(seed=10 * r + s, row_index=r, sample_index=s) for r in range(2) for s in range(2)]
    assert all(c.ok for c in policy.generate(jobs))
    assert sorted(b["seed"] for b in servers[0].received) == [0, 10]  # job j -> endpoint j mod 2
    assert sorted(b["seed"] for b in servers[1].received) == [1, 11]
    plain = policy.generate([req(seed=100 + i) for i in range(4)])  # no position: plain round robin
    assert [c.engine for c in plain].count(servers[0].url) == 2
    policy.close()


def test_503s_are_retried_then_succeed(servers) -> None:
    servers[0].fail_next(503, times=2)
    policy = client(servers[0].url, max_retries=3)
    out = policy.generate([req()])[0]
    assert out.ok and len(servers[0].received) == 3
    policy.close()


def test_persistent_500_becomes_request_error_after_bounded_retries(servers) -> None:
    servers[0].fail_next(500, times=10)
    policy = client(servers[0].url, max_retries=3)
    out = policy.generate([req()])[0]
    assert out.error == "request_error" and out.error_message.startswith("HTTPStatusError: Server error '500")
    assert len(servers[0].received) == 4  # one try + 3 retries
    policy.close()


def test_other_4xx_is_not_retried(servers) -> None:
    servers[0].fail_next(422, times=5)
    out = client(servers[0].url).generate([req()])[0]
    assert out.error == "request_error" and len(servers[0].received) == 1


def test_context_length_400_is_a_termination_not_an_error(servers) -> None:
    policy = client(servers[0].url)
    out = policy.generate([req(content="word " * 2000)])[0]
    assert out.error == "context_length_exceeded" and "maximum context length is 256" in out.error_message
    assert len(servers[0].received) == 1


def test_timeouts_retry_then_fail(servers) -> None:
    servers[0].delay_next(1.0, times=2)
    policy = client(servers[0].url, timeout_s=0.2, max_retries=1)
    out = policy.generate([req()])[0]
    assert out.error == "request_error" and out.error_message.startswith("AttemptDeadline: no complete answer")
    servers[0].delay_next(1.0, times=1)
    assert client(servers[0].url, timeout_s=0.2, max_retries=2).generate([req()])[0].ok


def test_server_reports_real_errors_but_not_clients_that_hung_up(servers, capsys) -> None:
    for exc, reported in (
        (BrokenPipeError(32, "Broken pipe"), False),
        (ConnectionResetError(104, "reset"), False),
        (ValueError("a bug in the handler"), True),
    ):
        try:
            raise exc
        except Exception:
            servers[0].handle_error(None, ("127.0.0.1", 1))
        err = capsys.readouterr().err
        assert ("a bug in the handler" in err) is reported and "Broken pipe" not in err


def test_async_path_and_concurrency(servers) -> None:
    policy = client([s.url for s in servers])
    servers[1].fail_next(503, times=1)

    async def run() -> list[Completion]:
        return list(await asyncio.gather(*(policy.agenerate(req(seed=i)) for i in range(8))))

    out = asyncio.run(run())
    assert [c.text for c in out] == [f"seed={i} max=32" for i in range(8)]
    assert len(servers[0].received) == 4 and len(servers[1].received) == 5


def test_context_error_detection_rules() -> None:
    vllm_style = '{"error": {"message": "This model\'s maximum context length is 10 tokens.", "param": "input_tokens"}}'
    assert is_context_length_error(400, vllm_style)
    assert is_context_length_error(400, "context length 10 exceeded; maximum input length is 8")
    assert not is_context_length_error(400, '{"error": {"message": "context length", "param": "messages"}}')
    assert not is_context_length_error(500, vllm_style)
    # vLLM 0.32 refuses a prompt with more characters than the window's token count allows before tokenising
    by_chars = (
        '{"error": {"message": "This model\'s maximum context length is 1024 tokens. However, your prompt '
        "contains 200148 characters (more than 82944 characters, which is the upper bound for 1024 input "
        'tokens). Please reduce the length of the input prompt.", "param": "input_text", "code": 400}}'
    )
    assert is_context_length_error(400, by_chars)


def test_window_is_read_from_the_models_list(servers) -> None:
    listed, given, other = client(servers[0].url), client(servers[0].url, max_model_len=100), client(servers[0].url)
    other.model = "other"  # a model the server does not list
    assert [p.window(servers[0].url) for p in (listed, given, other)] == [256, 100, None]
    for p in (listed, given, other):
        p.close()


def test_real_model_behind_the_server() -> None:
    from agent_envs.policy.hf import default_cpu_policy

    try:
        local = default_cpu_policy(num_threads=1)
    except FileNotFoundError as exc:
        pytest.skip(f"default CPU model unavailable: {exc}")
    with PolicyServer(local, model="smollm2") as server:
        remote = OpenAIPolicy(server.url, "smollm2", backoff_base_s=0.01)
        request = req(seed=3, content="Name a fruit.").model_copy(update={"max_tokens": 8})
        over_http = remote.generate([request])[0]
        assert over_http.token_ids == local.generate([request])[0].token_ids
        assert over_http.prompt_tokens == local.counter.prompt_tokens(request.messages)
        remote.close()
        # the official SDK's sampling settings reach the model: greedy is one text whatever the seed
        with openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0) as sdk:
            texts = {
                sdk.chat.completions.create(
                    model="smollm2", messages=request.messages, temperature=0, max_tokens=6, seed=seed
                )
                .choices[0]
                .message.content
                for seed in (1, 2)
            }
            sampled = sdk.chat.completions.create(
                model="smollm2", messages=request.messages, temperature=1.5, max_tokens=6, seed=5, n=2, logprobs=True
            )
        assert len(texts) == 1
        assert len(sampled.choices) == 2 and all(len(c.logprobs.content) > 0 for c in sampled.choices)


@pytest.mark.parametrize("phase", ["head", "body"])
@pytest.mark.parametrize("path", ["sync", "async"])
def test_a_server_trickling_a_byte_at_a_time_hits_the_per_attempt_deadline(phase, path) -> None:
    """docs/reliability.md#deadlines: ``timeout_s`` bounds each attempt from connection to last byte.
    The server sends a byte every 0.5 s (its head, or a 20 kB body), so httpx's per-read timeout
    never fires: two attempts of 2 s must end in about 4 s, not in hours."""
    from slow_servers import TrickleServer, run_bounded

    with TrickleServer(phase=phase) as server:
        policy = client(server.url, timeout_s=2.0, max_retries=1, max_model_len=4096)
        call = (
            (lambda: policy.generate([req()])[0]) if path == "sync" else (lambda: asyncio.run(policy.agenerate(req())))
        )
        finished, out, seconds = run_bounded(call, 30)
        assert finished, f"still waiting after {seconds:.0f}s"
        assert out.error == "request_error" and out.error_message.startswith("AttemptDeadline: no complete answer")
        assert 4.0 <= seconds < 10.0 and server.accepted == 2
    policy.close()
