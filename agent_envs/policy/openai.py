"""A policy over any OpenAI-compatible chat-completions server (vLLM, SGLang, ``agent-envs serve``).

Failure handling: up to ``max_retries`` extra attempts on 429, 5xx and transport errors, waiting
what the server's ``Retry-After`` says or else ``min(backoff_base * 2**attempt, backoff_cap)``
seconds (exponential), other 4xx at once, and a context-length 400 becomes ``context_length_exceeded`` instead of an error.
``timeout_s`` is a total deadline per attempt, connection to last byte (httpx's own timeouts are per
read, so a server trickling a byte a second never trips them): an attempt still unanswered then is
abandoned as :class:`AttemptDeadline`, a transport error, retried like one.  The synchronous path
runs the same coroutines on an event loop of its worker thread, so both paths share one deadline.
Recent vLLM servers no longer send that 400 when the prompt fits but ``max_tokens`` does not: they
shorten the generation.  The protocol's context check (prompt + ``max_tokens`` within the window) is
then applied to the reply, with the window that ``GET /models`` reports.

Image content parts travel as they are (``image_url`` parts holding data URLs, the format these
servers take); a ``processor`` makes the local context check exact for them, and without one a
chat with images is left to the server to check.

A request that carries its own ``prompt_token_ids`` (an environment's token trajectory) goes to
``/completions`` with the ids as its prompt, which vLLM and SGLang take as they are; every other
request goes to ``/chat/completions``.  ``request.logprobs`` asks either route for the sampled
tokens' log-probabilities, and ``request.tools`` sends the tool schemas for the chat template with
``tool_choice`` (``"none"`` by default: vLLM then renders the tools but leaves the calls in the text,
where the native parser reads them, outside thinking; ``"auto"`` asks a server started with a tool
parser for its ``tool_calls``; vLLM refuses ``"auto"`` without one).
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Coroutine, Sequence, TypeVar

import httpx

from ..core.content import has_images
from ..core.tokens import TokenCounter
from .base import CONTEXT_LENGTH_EXCEEDED, Completion, GenerationRequest, Policy, error_text
from ..protocol.budget import token_cap
from .sampling import SamplingConfig, context_overflow

T = TypeVar("T")

#: retried besides every 5xx: 429 Too Many Requests (a hosted endpoint's rate limit)
RETRIED_STATUSES = frozenset({429})


def retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (it is a number of seconds or an HTTP date); None when
    absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class ContextLengthError(Exception):
    pass


class AttemptDeadline(httpx.TimeoutException):
    """An attempt that had no complete answer within ``timeout_s`` (retried like a transport error)."""


#: ``error.param`` of vLLM's context-length 400s: too many prompt tokens, or (checked before
#: tokenising) too many prompt characters
CONTEXT_PARAMS = ("input_tokens", "input_text")


def is_context_length_error(status: int, body: str) -> bool:
    """vLLM-style 400: ``error.param`` in :data:`CONTEXT_PARAMS` with a context-length message, or a
    body naming both the context length and the maximum input length."""
    if status != 400:
        return False
    lowered = body.lower()
    if "context length" in lowered and "maximum input length" in lowered:
        return True
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return False
    return (
        isinstance(error, dict)
        and error.get("param") in CONTEXT_PARAMS
        and "context length" in str(error.get("message", "")).lower()
    )


def response_logprobs(choice: dict[str, Any]) -> list[float] | None:
    """The sampled tokens' log-probabilities of a chat choice (``logprobs.content[].logprob``) or a
    completions choice (``logprobs.token_logprobs``); None when the server sent none."""
    block = choice.get("logprobs")
    if not isinstance(block, dict):
        return None
    if block.get("content") is not None:
        return [float(entry["logprob"]) for entry in block["content"]]
    values = block.get("token_logprobs")
    return None if values is None else [float("nan") if v is None else float(v) for v in values]


#: bounds on one attempt's deadline and on the extra attempts: ``inf`` waits forever, and 10**9
#: retries kept an eval retrying a closed port for 11 minutes and more
MAX_TIMEOUT_S = 24 * 3600.0
MAX_RETRIES = 100


def check_request_limits(
    timeout_s: float | None, max_retries: int | None, names: tuple[str, str] = ("timeout_s", "max_retries")
) -> None:
    """ValueError naming the setting (``names``: how the caller spells them, e.g. its flags) when
    the deadline is not in ``(0, MAX_TIMEOUT_S]`` (NaN is not) or the retries not in ``[0, MAX_RETRIES]``."""
    if timeout_s is not None and not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(f"{names[0]} must be > 0 and at most {MAX_TIMEOUT_S:g} seconds, got {timeout_s:g}")
    if max_retries is not None and not 0 <= max_retries <= MAX_RETRIES:
        raise ValueError(f"{names[1]} must be >= 0 and at most {MAX_RETRIES}, got {max_retries}")


class OpenAIPolicy(Policy):
    """``base_urls`` are API roots such as ``http://127.0.0.1:8000/v1``."""

    name = "openai"

    def __init__(
        self,
        base_urls: list[str] | str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 3,
        backoff_base_s: float = 2.0,
        backoff_cap_s: float = 10.0,
        tokenizer: Any = None,
        sampling: SamplingConfig | None = None,
        max_model_len: int | None = None,
        samples_per_row: int = 1,
        max_concurrency: int = 64,
        request_token_ids: bool = True,
        processor: Any = None,
        tool_choice: str = "none",
    ):
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("OpenAIPolicy needs at least one base URL")
        self.endpoints = [u.rstrip("/") for u in urls]
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else getattr(processor, "tokenizer", None)
        self.processor = processor
        self.sampling = sampling or SamplingConfig()
        self.counter = TokenCounter(tokenizer, enable_thinking=self.sampling.enable_thinking, processor=processor)
        self.max_model_len = max_model_len
        self.max_retries, self.backoff_base_s, self.backoff_cap_s = max_retries, backoff_base_s, backoff_cap_s
        self.samples_per_row = samples_per_row
        self.request_token_ids = request_token_ids
        check_request_limits(timeout_s, max_retries)
        self.timeout_s = timeout_s
        self.tool_choice = tool_choice
        api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")  # as the SDK does
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._aclients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        #: event loops of the sync path's worker threads (one each, closed by ``close``)
        self._thread_loops = threading.local()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency)
        self._round_robin = itertools.count()
        self._rr_lock = threading.Lock()
        self._windows: dict[str, int | None] = {}

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "model": self.model,
            "base_urls": self.endpoints,
            "sampling": self.sampling.model_dump(),
        }

    # ------------------------------------------------------------------ request building
    def endpoint_for(self, request: GenerationRequest) -> str:
        """Job ``row * samples + sample`` goes to endpoint ``job mod n`` (protocol 4.7); requests without
        a position take the next endpoint in turn."""
        if request.row_index is not None and request.sample_index is not None:
            job = request.row_index * self.samples_per_row + request.sample_index
        else:
            with self._rr_lock:
                job = next(self._round_robin)
        return self.endpoints[job % len(self.endpoints)]

    @staticmethod
    def route(request: GenerationRequest) -> str:
        """``completions`` for a request with its own prompt ids, else ``chat/completions``."""
        return "chat/completions" if request.prompt_token_ids is None else "completions"

    def body(self, request: GenerationRequest) -> dict[str, Any]:
        s = self.sampling.for_request(request)
        prompt = request.prompt_token_ids
        tokens_in = prompt is not None
        body: dict[str, Any] = {"model": self.model}
        if prompt is not None:
            body["prompt"] = list(prompt)
        else:
            body["messages"] = request.messages
        body.update(
            {
                "temperature": s.temperature,
                "top_p": s.top_p,
                "top_k": s.top_k,
                "min_p": s.min_p,
                "presence_penalty": s.presence_penalty,
                "repetition_penalty": s.repetition_penalty,
                "stop": s.stop_for(request),
            }
        )
        if not tokens_in:
            body["chat_template_kwargs"] = {"enable_thinking": s.enable_thinking}
        if request.seed is not None:
            body["seed"] = request.seed
        if (cap := token_cap(request.max_tokens)) is not None:
            body["max_tokens"] = cap
        elif tokens_in:  # the completions route otherwise stops after 16 tokens
            body["max_tokens"] = None
        if self.request_token_ids or tokens_in:
            body["return_token_ids"] = True
        if request.logprobs:  # the sampled token's own log-probability (top 0 alternatives)
            body["logprobs"] = 0 if tokens_in else True
        if request.tools and not tokens_in:
            body["tools"], body["tool_choice"] = request.tools, self.tool_choice
        return body

    def _too_long(self, request: GenerationRequest) -> Completion | None:
        """Check locally when the tokenizer (and, for images, the processor) and the window are
        known (saves a round trip); a request with its own prompt ids needs only the window."""
        if request.prompt_token_ids is not None and self.max_model_len is not None:
            return context_overflow(len(request.prompt_token_ids), request.max_tokens, self.max_model_len, self.name)
        if self.tokenizer is None or self.max_model_len is None:
            return None
        if self.processor is None and has_images(request.messages):
            return None  # an estimate must not refuse what the server would take
        try:
            prompt = self.counter.prompt_tokens(request.messages)
        except Exception as exc:  # e.g. an image that does not decode: a record, not an exception
            return Completion.failed(exc, engine=self.name)
        return context_overflow(prompt, request.max_tokens, self.max_model_len, self.name)

    async def _send(self, method: str, url: str, body: dict[str, Any] | None = None) -> httpx.Response:
        """One attempt, abandoned at the per-attempt deadline (:class:`AttemptDeadline`)."""
        try:
            return await asyncio.wait_for(self._aclient().request(method, url, json=body), self.timeout_s)
        except asyncio.TimeoutError:
            raise AttemptDeadline(f"no complete answer from {url} within {self.timeout_s:g}s") from None

    def window(self, endpoint: str) -> int | None:
        """The context window: ``max_model_len``, else the ``max_model_len`` that ``GET /models`` lists for
        this model (vLLM and ``agent-envs serve`` do), asked once per endpoint; None when unknown."""
        return self._on_thread_loop(self.awindow(endpoint))

    async def awindow(self, endpoint: str) -> int | None:
        """:meth:`window` for a running event loop."""
        if self.max_model_len is not None:
            return self.max_model_len
        if endpoint not in self._windows:
            try:
                response = await self._send("GET", f"{endpoint}/models")
                response.raise_for_status()
                cards = response.json().get("data") or []
            except httpx.TransportError:
                return None  # asked again next time: the server may not be up yet
            except (httpx.HTTPStatusError, ValueError, AttributeError):
                cards = []
            found = [c.get("max_model_len") for c in cards if isinstance(c, dict) and c.get("id") == self.model]
            self._windows[endpoint] = found[0] if found and isinstance(found[0], int) else None
        return self._windows[endpoint]

    def check_endpoints(self) -> None:
        """Ask each endpoint once, before a run, whether a server is there at all: ConnectionError
        naming the first one nothing listens at (else every episode of the run failed on it, one
        by one).  Any answer will do, even an error status or none within a second: a server
        that is there but slow or failing is each request's error, as one that dies mid-run is."""
        timeout = httpx.Timeout(min(self.timeout_s, 10.0), read=min(self.timeout_s, 1.0))
        for endpoint in self.endpoints:
            try:
                with httpx.Client(headers=self._headers, timeout=timeout) as client:
                    client.get(f"{endpoint}/models")
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as exc:
                raise ConnectionError(f"no server answers at {endpoint} ({type(exc).__name__}: {exc})") from None
            except httpx.TransportError:
                continue

    # ------------------------------------------------------------------ responses
    def _fit(self, completion: Completion, request: GenerationRequest, window: int | None) -> Completion:
        """A reply whose prompt leaves less than ``max_tokens`` free becomes ``context_length_exceeded``."""
        if not completion.ok or completion.prompt_tokens is None:
            return completion
        overflow = context_overflow(
            completion.prompt_tokens, request.max_tokens, window, completion.engine or self.name
        )
        return overflow if overflow is not None else completion

    def _parse(self, response: httpx.Response, endpoint: str, request: GenerationRequest) -> Completion:
        if is_context_length_error(response.status_code, response.text):
            raise ContextLengthError(response.text[:500])
        response.raise_for_status()
        data = response.json()
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        ids = choice.get("token_ids")
        message = choice.get("message")
        extra: dict[str, Any] = {}
        if message is not None and message.get("tool_calls"):
            extra["tool_calls"] = list(message["tool_calls"])
        if request.logprobs:
            extra["logprobs"] = response_logprobs(choice)
            prompt = choice.get("prompt_token_ids") or data.get("prompt_token_ids")
            extra["prompt_token_ids"] = list(prompt) if prompt is not None else None
        text = choice.get("text") if message is None else message.get("content")
        return Completion(
            text=text or "",
            token_ids=ids,
            completion_tokens=usage.get("completion_tokens"),
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens"),
            engine=endpoint,
            **extra,
        )

    def _after_failure(self, exc: Exception, attempt: int, endpoint: str) -> Completion | float:
        """The record a failed attempt ends with, or the wait (seconds) before the next attempt:
        the server's ``Retry-After`` when it sends one, else ``min(backoff_base * 2**attempt,
        backoff_cap)``.  A ``Retry-After`` longer than ``timeout_s`` (an attempt's own deadline)
        ends the request at once instead of holding its episode."""
        if isinstance(exc, ContextLengthError):
            return Completion(error=CONTEXT_LENGTH_EXCEEDED, error_message=str(exc), engine=endpoint)
        wait: float | None = None
        if isinstance(exc, httpx.HTTPStatusError):
            retryable = exc.response.status_code in RETRIED_STATUSES or exc.response.status_code >= 500
            wait = retry_after(exc.response.headers.get("Retry-After"))
        else:
            retryable = isinstance(exc, httpx.TransportError)
        if not retryable or attempt >= self.max_retries:
            return Completion.failed(exc, engine=endpoint)
        if wait is None:
            return min(self.backoff_base_s * float(2**attempt), self.backoff_cap_s)
        if wait > self.timeout_s:
            detail = f"the server asks to retry after {wait:g}s, past the {self.timeout_s:g}s deadline"
            return Completion.failed(exc, engine=endpoint).model_copy(
                update={"error_message": f"{error_text(exc)} ({detail})"}
            )
        return wait

    # ------------------------------------------------------------------ sync and async paths
    def complete(self, request: GenerationRequest) -> Completion:
        """:meth:`agenerate` on this thread's own event loop (call it from a thread running none)."""
        return self._on_thread_loop(self.agenerate(request))

    def _on_thread_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        loop = getattr(self._thread_loops, "loop", None)
        if loop is None:
            loop = self._thread_loops.loop = asyncio.new_event_loop()
            self._loops.append(loop)
        return loop.run_until_complete(coroutine)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return list(self._pool.map(self.complete, requests))

    def _aclient(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if loop not in self._aclients:  # an AsyncClient's connections belong to one event loop
            # no httpx timeouts: they count per read; the deadline in ``_send`` is the total
            self._aclients[loop] = httpx.AsyncClient(timeout=httpx.Timeout(None), headers=self._headers)
        return self._aclients[loop]

    async def agenerate(self, request: GenerationRequest) -> Completion:  # type: ignore[return]  # the loop returns
        early = self._too_long(request)
        if early is not None:
            return early
        endpoint, body = self.endpoint_for(request), self.body(request)
        for attempt in itertools.count():
            try:
                completion = self._parse(
                    await self._send("POST", f"{endpoint}/{self.route(request)}", body), endpoint, request
                )
            except Exception as exc:  # every failure becomes a record, never an exception
                verdict = self._after_failure(exc, attempt, endpoint)
                if isinstance(verdict, Completion):
                    return verdict
                await asyncio.sleep(verdict)
            else:
                return self._fit(completion, request, await self.awindow(endpoint))

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for loop, client in list(self._aclients.items()):
            if not loop.is_closed() and not loop.is_running():
                loop.run_until_complete(client.aclose())
        self._aclients.clear()
        for loop in self._loops:
            if not loop.is_running():  # a request still in flight ends at its deadline
                loop.close()
        self._loops.clear()
