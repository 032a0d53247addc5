"""The OpenAI-compatible client policy and ``eval --base-url``'s client flags against a tiny stdlib
server on 127.0.0.1 that answers from a script of (status, headers, body) and keeps what it got:
429s are retried after the wait ``Retry-After`` asks for, other waits grow exponentially, the API
key and ``--tool-choice`` reach the server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from agent_envs.cli import main
from agent_envs.policy.base import GenerationRequest
from agent_envs.policy.openai import OpenAIPolicy, retry_after

OK = {"choices": [{"message": {"content": "Final answer: \\boxed{1}"}, "finish_reason": "stop"}], "usage": {}}


class Scripted(ThreadingHTTPServer):
    """Answers POSTs with ``script`` in turn (then 200 ``OK``); ``seen`` keeps (time, headers, body)."""

    def __init__(self, script: list[tuple[int, dict[str, str]]]):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script, self.seen = list(script), []  # type: ignore[var-annotated]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    server: Scripted

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, headers: dict[str, str], body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer(200, {}, {"data": []})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((time.monotonic(), dict(self.headers), body))
        status, headers = self.server.script.pop(0) if self.server.script else (200, {})
        self._answer(status, headers, OK if status == 200 else {"error": {"message": "slow down"}})


@pytest.fixture
def scripted() -> Iterator[Any]:
    servers = []

    def start(*script: tuple[int, dict[str, str]]) -> Scripted:
        server = Scripted(list(script))
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _request() -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": "hi"}], seed=1)


def test_a_429_is_retried_after_the_wait_retry_after_asks_for(scripted) -> None:
    server = scripted((429, {"Retry-After": "1"}), (503, {"Retry-After": "0"}))
    # a backoff of its own would wait 30 s: only Retry-After makes the retries come this soon
    policy = OpenAIPolicy(server.url, "m", backoff_base_s=30, backoff_cap_s=30, max_retries=2)
    try:
        assert policy.generate([_request()])[0].ok
    finally:
        policy.close()
    times = [t for t, _, _ in server.seen]
    assert len(times) == 3 and 0.9 <= times[1] - times[0] < 5 and times[2] - times[1] < 5


def test_a_retry_after_past_the_attempt_deadline_ends_the_request_at_once(scripted) -> None:
    server = scripted((429, {"Retry-After": "120"}))
    policy = OpenAIPolicy(server.url, "m", timeout_s=5, max_retries=3)
    try:
        out = policy.generate([_request()])[0]
    finally:
        policy.close()
    assert out.error == "request_error" and "retry after 120s, past the 5s deadline" in (out.error_message or "")
    assert len(server.seen) == 1


def test_backoff_without_retry_after_is_exponential_and_capped() -> None:
    policy = OpenAIPolicy("http://127.0.0.1:9/v1", "m", backoff_base_s=1, backoff_cap_s=5, max_retries=9)
    response = httpx.Response(429, request=httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions"))
    error = httpx.HTTPStatusError("429", request=response.request, response=response)
    try:
        assert [policy._after_failure(error, attempt, "e") for attempt in range(5)] == [1, 2, 4, 5, 5]
    finally:
        policy.close()
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0 and retry_after("soon") is None


def test_eval_sends_the_api_key_and_the_tool_choice(scripted, tmp_path, monkeypatch) -> None:
    server = scripted()
    args = ["eval", "--env", "MATH-Tools-v0", "--base-url", server.url, "--model", "m", "--limit", "1"]
    args += ["--max-turns", "1", "--no-progress", "--no-report"]
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    assert main([*args, "--out", str(tmp_path / "a"), "--tool-choice", "required"]) == 0
    assert main([*args, "--out", str(tmp_path / "b"), "--api-key", "from-flag"]) == 0
    (_, env_headers, env_body), (_, flag_headers, flag_body) = server.seen
    assert env_headers["Authorization"] == "Bearer from-env" and env_body["tool_choice"] == "required"
    assert flag_headers["Authorization"] == "Bearer from-flag" and flag_body["tool_choice"] == "none"
