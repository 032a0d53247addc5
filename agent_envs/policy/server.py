"""A small but real OpenAI-compatible HTTP server around any :class:`Policy`.

``POST /v1/chat/completions``, ``POST /v1/completions`` (a prompt as text or token ids) and ``GET
/v1/models`` on 127.0.0.1 (``host=`` for another address), answering like vLLM does (token ids on
request, context-length 400s with ``param="input_tokens"``, streaming as server-sent events).  Each
body field is honoured or refused with a 400 naming it (:mod:`agent_envs.policy.wire`); a model name
other than the served one is a 404.  Message content may be a
string or OpenAI content parts; image parts must be base64 data URLs (nothing is fetched) and reach
a policy that has a processor (a vision-language model), counted exactly with it.  Tests use its failure injection
(``fail_next``, ``delay_next``) to exercise client retries against real sockets, and ``record=N`` to
keep the last N request bodies (none by default: a server keeps no request it answered).

Limits (docs/reliability.md#deadlines): a body over ``max_body_bytes`` gets a 413 unread; a request
whose head and body are not in within ``read_timeout_s`` (a half-open or trickling client) is cut
off, so it cannot pin a thread; a bad ``Content-Length`` and any body the API would refuse get a 400
naming the problem.

    python -m agent_envs.policy.server --policy cpu --port 8000      # or: agent-envs serve ...
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping, Sequence

from ..core.tokens import TokenCounter
from .base import CONTEXT_LENGTH_EXCEEDED, Completion, Policy, error_text
from ..protocol.budget import exceeds_context
from .wire import ClientError, ModelOutputError, parse_body, stream_chunks


#: default cap on a request body (a chat with a few base64 page images fits many times over)
MAX_BODY_BYTES = 64 << 20
#: default time a client has to send a whole request (head and body)
READ_TIMEOUT_S = 30.0


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class PolicyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        policy: Policy,
        *,
        model: str = "agent-envs",
        host: str = "127.0.0.1",
        port: int = 0,
        max_model_len: int | None = None,
        record: int = 0,
        max_body_bytes: int = MAX_BODY_BYTES,
        read_timeout_s: float = READ_TIMEOUT_S,
    ):
        super().__init__((host, port), _Handler)
        self.policy = policy
        self.model = model
        self.max_model_len = max_model_len or policy.max_model_len
        self.counter = TokenCounter(policy.tokenizer, processor=policy.processor)
        self.max_body_bytes, self.read_timeout_s = max_body_bytes, read_timeout_s
        #: the last ``record`` chat request bodies, in arrival order (tests check what clients sent)
        self.received: deque[dict[str, Any]] = deque(maxlen=record)
        self._faults: deque[tuple[int | None, float]] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{str(host)}:{port}/v1"

    def fail_next(self, status: int, times: int = 1) -> None:
        """Answer the next ``times`` chat requests with HTTP ``status``."""
        with self._lock:
            self._faults.extend([(status, 0.0)] * times)

    def delay_next(self, seconds: float, times: int = 1) -> None:
        """Hold the next ``times`` chat requests for ``seconds`` before answering (client timeouts)."""
        with self._lock:
            self._faults.extend([(None, seconds)] * times)

    def _take_fault(self) -> tuple[int | None, float]:
        with self._lock:
            return self._faults.popleft() if self._faults else (None, 0.0)

    def start(self) -> "PolicyServer":
        self._thread = threading.Thread(target=self.serve_forever, name="policy-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (e.g. after its own timeout) is routine; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def __enter__(self) -> "PolicyServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ request handling
    def answer(self, route: str, body: Any) -> tuple[int, dict[str, Any] | list[dict[str, Any]]]:
        """The status and JSON answer of a ``chat/completions`` or ``completions`` body: a list of
        stream chunks when the body asks to stream (agent_envs/policy/wire.py says what is read)."""
        with self._lock:
            self.received.append(body)
        status, delay = self._take_fault()
        if delay:
            time.sleep(delay)  # injected slowness: the client under test must time out
        if status is not None:
            return status, error_body(f"injected failure {status}", status)
        chat = route == "chat/completions"
        try:
            wire = parse_body(body, chat, self.policy.tokenizer)
        except (KeyError, TypeError, ValueError) as exc:
            param = exc.param if isinstance(exc, ClientError) else None
            message = error_text(exc) if isinstance(exc, KeyError) else str(exc)
            return 400, error_body(f"invalid request: {message}", 400, param)
        if wire.model is not None and wire.model != self.model:
            return 404, not_found(wire.model)
        first = wire.requests[0]
        if first.prompt_token_ids is not None:
            prompt_tokens = len(first.prompt_token_ids)
        else:
            prompt_tokens = self.counter.prompt_tokens(first.messages)
        if self.max_model_len is not None and exceeds_context(prompt_tokens, first.max_tokens, self.max_model_len):
            return 400, context_error(self.max_model_len, prompt_tokens)
        completions = self.policy.generate(wire.requests)
        for completion in completions:
            if completion.error == CONTEXT_LENGTH_EXCEEDED:
                return 400, context_error(self.max_model_len or 0, completion.prompt_tokens or prompt_tokens)
            if not completion.ok:
                return 500, error_body(completion.error_message or str(completion.error), 500)
        try:
            choices = [wire.choice(i, c, self.policy.tokenizer) for i, c in enumerate(completions)]
        except ClientError as exc:
            return 400, error_body(str(exc), 400, exc.param)
        except ModelOutputError as exc:
            return 500, error_body(str(exc), 500)
        prompt = completions[0].prompt_tokens or prompt_tokens
        generated = sum(self._generated(c) for c in completions)
        response = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            "usage": {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated},
        }
        return 200, stream_chunks(response, chat, wire.stream_usage) if wire.stream else response

    def _generated(self, completion: Completion) -> int:
        count = completion.num_tokens
        return self.counter.text_tokens(completion.text) if count is None else count

    def chat(self, body: Any) -> tuple[int, dict[str, Any] | list[dict[str, Any]]]:
        """:meth:`answer` for ``POST /v1/chat/completions``."""
        return self.answer("chat/completions", body)

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": self.model, "object": "model", "owned_by": "agent-envs", "max_model_len": self.max_model_len}
            ],
        }


def context_error(max_model_len: int, prompt_tokens: int) -> dict[str, Any]:
    return error_body(
        f"This model's maximum context length is {max_model_len} tokens. However, your request has "
        f"{prompt_tokens} input tokens. Please reduce the length of the input messages. "
        f"(parameter=input_tokens, value={prompt_tokens})",
        400,
        "input_tokens",
    )


def not_found(model: str) -> dict[str, Any]:
    """OpenAI's answer for a model the server does not serve (the SDK raises NotFoundError on it)."""
    body = error_body(f"The model `{model}` does not exist.", 404, "model")
    body["error"]["type"] = "NotFoundError"
    return body


class _Handler(BaseHTTPRequestHandler):
    server: PolicyServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests and evals own stdout
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.read_timeout_s)  # a silent client: each read

    def handle_one_request(self) -> None:
        """One request, cut off if its head and body are not in within ``read_timeout_s`` (a client
        trickling bytes passes every per-read timeout); generating the answer is not limited."""
        self._cut_off = False
        self._watchdog = threading.Timer(self.server.read_timeout_s, self._hang_up)
        self._watchdog.daemon = True
        self._watchdog.start()
        try:
            super().handle_one_request()
        finally:
            self._watchdog.cancel()

    def _hang_up(self) -> None:
        self._cut_off = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)  # wakes the blocked read with end-of-file
        except OSError:
            pass

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _refuse(self, status: int, message: str) -> None:
        """Answer before reading the body, then close (the unread body cannot start a request)."""
        self.close_connection = True
        self._send(status, error_body(message, status))

    def do_GET(self) -> None:
        self._watchdog.cancel()
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, self.server.models())
        else:
            self._send(404, error_body(f"no route {self.path}", 404))

    def _body(self) -> bytes | None:
        """The request body, or None once a refusal has been sent (or the client is gone)."""
        if self.headers.get("Transfer-Encoding"):
            self._refuse(411, "send the body with a Content-Length (no Transfer-Encoding)")
            return None
        declared = (self.headers.get("Content-Length") or "0").strip()
        if not (declared.isascii() and declared.isdigit()):
            self._refuse(400, f"Content-Length must be a whole number of bytes, got {declared[:40]!r}")
            return None
        length = int(declared)
        if length > self.server.max_body_bytes:
            self._refuse(413, f"the body has {length} bytes; this server takes at most {self.server.max_body_bytes}")
            return None
        raw = self.rfile.read(length)
        self._watchdog.cancel()
        if len(raw) < length:
            self.close_connection = True
            if not self._cut_off:  # the client ended its side early: it can still read why
                try:
                    self._refuse(400, f"the body ended after {len(raw)} of the {length} bytes of its Content-Length")
                except OSError:
                    pass  # it hung up altogether
            return None
        return raw

    def do_POST(self) -> None:
        raw = self._body()
        if raw is None:
            return
        route = self.path.rstrip("/").removeprefix("/v1/")
        if route not in ("chat/completions", "completions"):
            self._send(404, error_body(f"no route {self.path}", 404))
            return
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            self._send(400, error_body(f"body is not JSON: {exc}", 400))
            return
        try:
            status, payload = self.server.answer(route, body)
        except Exception as exc:  # the server reports, it does not die
            status, payload = 500, error_body(error_text(exc), 500)
        if isinstance(payload, list):
            self._stream(payload)
        else:
            self._send(status, payload)

    def _stream(self, chunks: list[dict[str, Any]]) -> None:
        """Server-sent events: one ``data: {json}`` event per chunk, then ``data: [DONE]``; the
        connection closes at the end (the stream has no length)."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-envs serve",
        description="Serve a policy over an OpenAI-compatible HTTP API "
        "(POST /v1/chat/completions and /v1/completions, GET /v1/models; docs/cli.md#serve lists the "
        "fields honoured and those refused with a 400).",
    )
    from .factory import BACKENDS, default_policy

    served = servable_backends()
    parser.add_argument(
        "--policy",
        choices=served,
        default=default_policy(None, []),
        help="; ".join(f"{name}: {BACKENDS[name].description}" for name in served)
        + " (a policy that is itself a client of a server is not served again)",
    )
    parser.add_argument(
        "--model",
        help="model folder or id, for a policy that needs one ("
        + ", ".join(n for n in served if BACKENDS[n].needs_model)
        + ")",
    )
    parser.add_argument(
        "--env",
        help="environment whose scripted baseline a scripted policy serves (milliseconds a reply: tests and "
        "client checks)",
    )
    parser.add_argument(
        "--served-model-name", default="agent-envs", help="the model name /v1/models lists (default agent-envs)"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument(
        "--max-model-len",
        type=int,
        help="context window in tokens: a prompt whose max_tokens do not fit gets a 400 (default: the policy's)",
    )
    parser.add_argument(
        "--max-body-mib",
        type=float,
        default=MAX_BODY_BYTES / (1 << 20),
        help="refuse (413) request bodies larger than this",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=READ_TIMEOUT_S,
        metavar="SECONDS",
        help="time a client has to send a whole request",
    )
    return parser


def servable_backends() -> list[str]:
    """The backends ``serve`` can put behind its API: every row but the HTTP clients'."""
    from .factory import BACKENDS

    return [name for name, backend in BACKENDS.items() if not backend.needs_endpoint]


def scripted_backends() -> list[str]:
    from .factory import BACKENDS

    return [name for name, backend in BACKENDS.items() if backend.scripted_baseline]


def main(argv: Sequence[str] | None = None, baselines: Mapping[str, Callable[[Any], str]] | None = None) -> int:
    """``agent-envs serve``; ``baselines`` are the scripted replies ``--policy scripted --env`` may
    serve, by environment id (the CLI passes the registry's: this layer does not know environments)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not (args.max_body_mib > 0 and args.read_timeout > 0):
        parser.error("--max-body-mib and --read-timeout must be > 0")
    from .factory import BACKENDS, PolicySettings, build_policy

    backend = BACKENDS[args.policy]
    script = None
    if backend.scripted_baseline:
        known = dict(baselines or {})
        if args.env not in known:
            parser.error(f"--policy {args.policy} needs --env, one of: {', '.join(sorted(known)) or 'none'}")
        script = known[args.env]
    elif args.env is not None:
        parser.error(f"--env goes with a scripted policy ({', '.join(scripted_backends()) or 'none'})")
    if backend.needs_model and not args.model:
        parser.error(f"--policy {args.policy} needs --model")
    policy: Policy = build_policy(args.policy, PolicySettings(model=args.model, script=script))
    server = PolicyServer(
        policy,
        model=args.served_model_name,
        host=args.host,
        port=args.port,
        max_model_len=args.max_model_len,
        max_body_bytes=int(args.max_body_mib * (1 << 20)),
        read_timeout_s=args.read_timeout,
    )
    print(f"serving {args.served_model_name} at {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        policy.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
