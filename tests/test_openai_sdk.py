"""``agent-envs serve`` driven by the official ``openai`` SDK on 127.0.0.1, as users drive it: chat
with sampling settings, ``n``, log-probabilities, tools and ``tool_choice``, the assistant turn sent
back with ``content: null``, streaming, text completions from token ids, and refusals (400 naming
the field, 404 for another model); then our own ``eval --token-trajectories --base-url`` against it.  A scripted policy stands behind the server (milliseconds a
call); its replies echo what the request asked for, so each assertion sees the server honour it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import openai
import pytest

from agent_envs.cli import main
from agent_envs.policy.base import Completion, GenerationRequest
from agent_envs.policy.hf import smollm2_hf_dir, smollm2_tokenizer
from agent_envs.policy.scripted import ScriptedPolicy
from agent_envs.policy.server import PolicyServer
from agent_envs.protocol.native import call_text
from agent_envs.rollout.trajectories import load_token_export


def _reply(request: GenerationRequest) -> Completion:
    """Echo the request: its settings, or a tool call when the last message asks for one."""
    last = str(request.messages[-1]["content"]) if request.messages else ""
    if last.startswith("call "):
        text = call_text("python", {"code": last.removeprefix("call ")})
    elif request.prompt_token_ids is not None:
        text = f"ids={request.prompt_token_ids}"
    else:
        text = f"seed={request.seed} sampling={json.dumps(request.sampling, sort_keys=True)} last={last}"
    ids = list(range(len(text.split())))
    logprobs = [-0.5] * len(ids) if request.logprobs else None
    return Completion(text=text, token_ids=ids, logprobs=logprobs, finish_reason="stop")


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    with PolicyServer(ScriptedPolicy(_reply), model="m") as server:
        sdk = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)
        yield sdk
        sdk.close()


def _chat(client: openai.OpenAI, content: str = "hi", **kwargs):
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], **kwargs)


def test_sampling_settings_seed_and_n_reach_the_policy(client) -> None:
    reply = _chat(client, temperature=0, top_p=0.5, seed=7, max_tokens=9, n=2)
    texts = [c.message.content for c in reply.choices]
    assert texts == [
        'seed=7 sampling={"temperature": 0, "top_p": 0.5} last=hi',
        'seed=8 sampling={"temperature": 0, "top_p": 0.5} last=hi',
    ]
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage is not None and reply.usage.completion_tokens == 12


def test_logprobs_come_back_per_sampled_token(client) -> None:
    reply = _chat(client, logprobs=True)
    entries = reply.choices[0].logprobs.content
    assert [e.logprob for e in entries] == [-0.5] * 3
    assert _chat(client).choices[0].logprobs is None


def test_required_tool_choice_gives_tool_calls_and_the_call_goes_back_with_null_content(client) -> None:
    tools = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]
    reply = _chat(client, "call print(1)", tools=tools, tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "python" and json.loads(call.function.arguments) == {"code": "print(1)"}
    named = _chat(client, "call 2", tools=tools, tool_choice={"type": "function", "function": {"name": "python"}})
    assert named.choices[0].message.tool_calls[0].function.name == "python"
    assert _chat(client, "call 3", tools=tools, tool_choice="none").choices[0].message.tool_calls is None
    follow_up = client.chat.completions.create(
        model="m",
        tools=tools,
        messages=[
            {"role": "user", "content": "run it"},
            choice.message.model_dump(exclude_none=True) | {"content": None},
            {"role": "tool", "tool_call_id": call.id, "content": "1"},
        ],
    )
    assert follow_up.choices[0].message.content.endswith("last=1")
    with pytest.raises(openai.InternalServerError, match="no well-formed matching"):
        _chat(client, "no call here", tools=tools, tool_choice="required")


def test_streaming_yields_the_text_and_a_usage_chunk(client) -> None:
    stream = _chat(client, seed=3, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "seed=3 sampling=null last=hi"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_completions_take_token_ids_and_return_ids_and_logprobs(client) -> None:
    reply = client.completions.create(
        model="m", prompt=[5, 6, 7], max_tokens=4, logprobs=0, extra_body={"return_token_ids": True}
    )
    choice = reply.choices[0]
    assert choice.text == "ids=[5, 6, 7]"
    assert choice.logprobs.token_logprobs == [-0.5] * 3
    assert choice.model_extra["token_ids"] == [0, 1, 2] and choice.model_extra["prompt_token_ids"] == [5, 6, 7]


def test_unsupported_fields_are_400s_naming_them_and_another_model_is_a_404(client) -> None:
    with pytest.raises(openai.BadRequestError, match="response_format") as refused:
        _chat(client, response_format={"type": "json_object"})
    assert refused.value.param == "response_format"
    with pytest.raises(openai.BadRequestError, match="frequency_penalty"):
        _chat(client, frequency_penalty=0.5)
    with pytest.raises(openai.NotFoundError, match="`gpt-x` does not exist"):
        client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}])


def test_our_eval_with_token_trajectories_runs_against_our_serve(tmp_path, capsys) -> None:
    """``eval --token-trajectories --base-url`` sends each prompt as token ids to /v1/completions and
    reads back the sampled ids and their log-probabilities."""
    tokenizer = smollm2_tokenizer()

    def answer(request: GenerationRequest) -> Completion:
        assert request.prompt_token_ids and not request.messages and request.logprobs
        ids = tokenizer.encode("Final answer: \\boxed{1}", add_special_tokens=False)
        return Completion(text=tokenizer.decode(ids), token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop")

    model = str(smollm2_hf_dir())  # the served name is the tokenizer's folder, as --model needs
    out = tmp_path / "run"
    with PolicyServer(ScriptedPolicy(answer), model=model, record=8) as server:
        args = ["eval", "--env", "MATH-ReAct-v0", "--base-url", server.url, "--model", model, "--limit", "1"]
        assert (
            main([*args, "--max-turns", "2", "--out", str(out), "--no-progress", "--no-report", "--token-trajectories"])
            == 0
        )
        assert all("prompt" in body for body in server.received)
    assert main(["export", str(out), "--format", "tokens"]) == 0
    (episode,) = load_token_export(out / "tokens.jsonl")
    assert sum(episode.loss_mask) > 0


def test_agent_envs_serve_scripted_on_a_host_answers_the_sdk_with_tool_calls() -> None:
    """The command as users start it: ``serve --policy scripted --env`` (an environment's model-free
    baseline) on ``--host 127.0.0.1``, port chosen by the system, read off its first line."""
    command = [sys.executable, "-m", "agent_envs.cli", "serve", "--policy", "scripted", "--env", "Countdown-Tools-v0"]
    serve = subprocess.Popen([*command, "--host", "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert serve.stdout is not None
        url = serve.stdout.readline().split(" at ")[-1].strip()
        assert url.startswith("http://127.0.0.1:"), url
        with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30) as sdk:
            tools = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]
            reply = sdk.chat.completions.create(
                model="agent-envs",
                messages=[{"role": "user", "content": "Numbers: 3, 4\nTarget: 7"}],
                tools=tools,
                tool_choice="required",
            )
        (call,) = reply.choices[0].message.tool_calls
        assert call.function.name == "python" and "T = 7" in json.loads(call.function.arguments)["code"]
    finally:
        serve.terminate()
        serve.wait(timeout=30)
