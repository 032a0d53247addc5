"""``agent-envs serve``'s limits against real clients on 127.0.0.1 (docs/reliability.md#deadlines):
bounded memory for request bodies, a deadline for receiving a request, and 400s that say what is
wrong instead of 500s or silence."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from agent_envs.policy.base import Completion
from agent_envs.policy.scripted import ScriptedPolicy
from agent_envs.policy.server import PolicyServer

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 1, "max_tokens": 8}


def _server(**kwargs) -> PolicyServer:
    return PolicyServer(ScriptedPolicy(lambda r: Completion(text=f"seed={r.seed}")), model="m", **kwargs).start()


def _raw(server: PolicyServer, data: bytes, wait_s: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection; everything the server sends until it closes."""
    host, port = server.server_address[:2]
    with socket.create_connection((host, port)) as conn:
        conn.sendall(data)
        conn.settimeout(wait_s)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def test_request_bodies_are_not_kept_unless_a_test_asks_and_then_only_the_last_n():
    quiet, recording = _server(), _server(record=2)
    try:
        for i in range(20):
            body = {**CHAT, "seed": i, "messages": [{"role": "user", "content": "x" * 100_000}]}
            assert httpx.post(quiet.url + "/chat/completions", json=body).status_code == 200
            assert httpx.post(recording.url + "/chat/completions", json=body).status_code == 200
        assert len(quiet.received) == 0
        assert [b["seed"] for b in recording.received] == [18, 19]
    finally:
        quiet.close()
        recording.close()


def test_a_body_over_the_cap_is_refused_unread():
    server = _server(max_body_bytes=1 << 20)
    try:
        started = time.monotonic()  # declares 150 MB and sends none of it: answered at once
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 157286400\r\n\r\n"
        )
        response = _raw(server, head)
        assert _status(response) == 413 and time.monotonic() - started < 5
        assert b"the body has 157286400 bytes; this server takes at most 1048576" in response
        assert len(server.received) == 0
        assert httpx.post(server.url + "/chat/completions", json=CHAT).status_code == 200
    finally:
        server.close()


@pytest.mark.parametrize("declared", [b"-5", b"abc", b"1e3", b"+7", b"\xd9\xa3"])
def test_a_bad_content_length_is_a_400_not_a_hang(declared):
    server = _server()
    try:
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + declared + b"\r\n\r\n{}"
        response = _raw(server, head)
        assert _status(response) == 400 and b"Content-Length must be a whole number of bytes" in response
    finally:
        server.close()


def test_a_body_shorter_than_its_content_length_then_half_closed_is_a_400():
    """The client sends 2 of 1000 declared bytes and shuts its side: it got no answer at all."""
    server = _server()
    try:
        host, port = server.server_address[:2]
        with socket.create_connection((host, port)) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{}")
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(10)
            response = b"".join(iter(lambda: conn.recv(65536), b""))
        assert (
            _status(response) == 400 and b"the body ended after 2 of the 1000 bytes of its Content-Length" in response
        )
    finally:
        server.close()


@pytest.mark.parametrize(
    "body, problem",
    [
        ([], "the body must be a JSON object, got list"),
        (None, "the body must be a JSON object, got NoneType"),
        (
            {**CHAT, "seed": 2**70},
            "'seed' must be a whole number from -9223372036854775808 to 9223372036854775807, "
            "got 1180591620717411303424",
        ),
        ({**CHAT, "seed": "1"}, "'seed' must be a whole number"),
        ({**CHAT, "max_tokens": 0}, "'max_tokens' must be a whole number from 1"),
        ({**CHAT, "max_tokens": True}, "'max_tokens' must be a whole number from 1"),
        ({"model": "m"}, "'messages' must be a list of message objects"),
        ({**CHAT, "messages": ["hi"]}, "'messages' must be a list of message objects"),
        ({**CHAT, "messages": [{"content": "hi"}]}, "KeyError: 'role'"),
        (
            {**CHAT, "response_format": {"type": "json_object"}, "logit_bias": {}},
            "unsupported field(s) logit_bias, response_format",
        ),
        ({**CHAT, "top_logprobs": 2, "logprobs": True}, "'top_logprobs' above 0"),
        ({**CHAT, "temperature": -1}, "temperature"),
    ],
)
def test_client_errors_are_400s_with_a_message(body, problem):
    server = _server()
    try:
        response = httpx.post(server.url + "/chat/completions", content=json.dumps(body))
        assert response.status_code == 400, response.text
        assert problem in response.json()["error"]["message"]
    finally:
        server.close()


def test_half_open_and_trickling_requests_are_cut_off_at_the_read_deadline():
    """40 clients that send half a request and wait, and one that trickles a byte every 0.2 s
    (each read well within any per-read timeout): all are hung up on after ``read_timeout_s``,
    and the server answers a real request meanwhile."""
    server = _server(read_timeout_s=1.5)
    host, port = server.server_address[:2]
    half_open = [socket.create_connection((host, port)) for _ in range(40)]
    try:
        for conn in half_open:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        assert (
            httpx.post(server.url + "/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
            == "seed=1"
        )
        started = time.monotonic()
        with socket.create_connection((host, port)) as trickler:
            trickler.settimeout(0.2)
            cut = False
            for byte in b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" * 4:
                try:
                    trickler.send(bytes([byte]))
                    if trickler.recv(1) == b"":
                        cut = True
                        break
                except socket.timeout:
                    continue
                except OSError:
                    cut = True
                    break
            assert cut and time.monotonic() - started < 4.0
        for conn in half_open:  # each was closed by the server: end-of-file (or a reset)
            conn.settimeout(5)
            try:
                assert conn.recv(1) == b""
            except ConnectionResetError:
                pass
    finally:
        for conn in half_open:
            conn.close()
        server.close()
