"""An OpenAI-compatible chat-completions client: one request, retried, classified.

Standard library only. Each thread keeps one keep-alive connection, so a pool
of `concurrency` threads holds `concurrency` connections, as a plain client
would. A request that finally fails says why in a short, countable reason
(``http 500``, ``connection refused``, ``timeout``), which the stage reports
as its skip reason, and whether trying again later could help.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from remote.infer.infer_files import InferError
from remote.infer.infer_settings import InferSettings

#: HTTP statuses worth another attempt: the server is busy, restarting or overloaded.
RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
#: Longest single backoff, so a long outage is polled, not waited out blindly.
MAX_BACKOFF = 60.0


@dataclass(frozen=True)
class Answer:
    """The assistant's turn as the server returned it."""

    content: str
    reasoning_content: str | None
    finish_reason: str | None
    completion_tokens: int
    #: The calls it made, in OpenAI shape (arguments as JSON text).
    tool_calls: list[dict[str, Any]] | None = None
    #: The ids it generated, when asked for them and the server returns them (SGLang's `response_token_ids`).
    output_ids: list[int] | None = None

    def turn(self) -> dict[str, Any]:
        """The turn as the history sent back holds it: the reasoning too, for the chat template to keep or
        drop (Kimi-K2.5's keeps it within a chain of tool calls, drops it before the last plain answer)."""
        turn: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content:
            turn["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            turn["tool_calls"] = self.tool_calls
        return turn

    def says_something(self) -> bool:
        return bool(self.content or self.reasoning_content or self.tool_calls)


#: The most of a server's error body kept (its message, or its text): enough for "model 'x' not found".
DETAIL_LIMIT = 300


class RequestFailed(Exception):
    """A request that got no usable answer. `reason` is short and countable; `detail` is what the
    server said about it (an error body's message, bounded), or ""."""

    def __init__(self, reason: str, retryable: bool, retry_after: float | None = None, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.retryable = retryable
        self.retry_after = retry_after
        self.detail = detail


@dataclass
class Result:
    """What became of one record: an answer, or the last failure; and how many retries it took."""

    record: dict[str, Any]
    answer: Answer | None = None
    failure: RequestFailed | None = None
    retries: int = 0
    #: How long the answered attempt took (what the server's load made it cost).
    seconds: float = 0.0


class ChatClient:
    """Sends chat-completion requests to one server, with retries and backoff."""

    def __init__(self, settings: InferSettings, rng: random.Random | None = None) -> None:
        self.settings = settings
        url = urlsplit(settings.server_url.rstrip("/"))
        self._https = url.scheme == "https"
        self._host = url.hostname or "127.0.0.1"
        self._port = url.port or (443 if self._https else 80)
        base = url.path if url.path.endswith("/v1") else url.path + "/v1"
        self.path = base + "/chat/completions"
        self._local = threading.local()
        self._rng = rng or random.Random()

    def body(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        s = self.settings
        body: dict[str, Any] = {
            "model": s.model,
            "messages": messages,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "stream": False,
        }
        # NOTE: sent only when set: strict OpenAI-style servers reject unknown fields.
        if s.chat_template_kwargs:
            body["chat_template_kwargs"] = s.chat_template_kwargs
        if tools:
            body["tools"] = tools
        if s.return_token_ids:
            body["return_token_ids"] = True
        return body

    def answer(self, record: dict[str, Any]) -> Result:
        """Ask for the answer to the record's conversation (with its tools), retrying what may pass;
        never raises `RequestFailed`."""
        result = Result(record)
        payload = json.dumps(self.body(record["conversations"], record.get("tools"))).encode()
        for attempt in range(self.settings.retries + 1):
            try:
                started = time.monotonic()
                result.answer = self.post(payload)
                result.seconds = time.monotonic() - started
                result.failure = None
                return result
            except RequestFailed as failure:
                result.failure = failure
                if not failure.retryable or attempt == self.settings.retries:
                    return result
                result.retries += 1
                time.sleep(self.backoff(attempt, failure.retry_after))
        return result

    def backoff(self, attempt: int, retry_after: float | None = None) -> float:
        """Full-jitter exponential backoff; a server's Retry-After is a floor."""
        ceiling = min(MAX_BACKOFF, self.settings.backoff * 2**attempt)
        delay = self._rng.uniform(0, ceiling)
        return max(delay, min(retry_after, MAX_BACKOFF)) if retry_after else delay

    def post(self, payload: bytes) -> Answer:
        """One request. Raises `RequestFailed` with a countable reason."""
        try:
            status, headers, data = self._exchange(payload)
        except (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as exc:
            raise RequestFailed(_connection_reason(exc), retryable=True) from None
        except http.client.RemoteDisconnected:
            raise RequestFailed("connection closed", retryable=True) from None
        except (socket.timeout, TimeoutError):
            raise RequestFailed("timeout", retryable=True) from None
        except (OSError, http.client.HTTPException) as exc:
            raise RequestFailed(f"connection error ({type(exc).__name__})", retryable=True) from None
        if status != 200:
            raise RequestFailed(f"http {status}", status in RETRYABLE_STATUS, _retry_after(headers), error_detail(data))
        return _parse(data)

    def _exchange(self, payload: bytes) -> tuple[int, Any, bytes]:
        connection, reused = self._connection()
        try:
            return self._roundtrip(connection, payload)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            if not reused:
                raise
        # NOTE: a kept-alive connection that the server closed while idle fails
        # on first use; one immediate try on a fresh connection is not a retry.
        connection, _ = self._connection()
        return self._roundtrip(connection, payload)

    def _roundtrip(self, connection: http.client.HTTPConnection, payload: bytes) -> tuple[int, Any, bytes]:
        try:
            connection.request("POST", self.path, payload, {"Content-Type": "application/json"})
            response = connection.getresponse()
            data = response.read()
        except BaseException:
            self._drop()
            raise
        if response.will_close:
            self._drop()
        return response.status, response.headers, data

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection, and whether it was used before."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            return connection, True
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = cls(self._host, self._port, timeout=self.settings.timeout)
        self._local.connection = connection
        return connection, False

    def _drop(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def close(self) -> None:
        """Close this thread's connection (the others close with their threads)."""
        self._drop()


def _parse(data: bytes) -> Answer:
    """The first choice of a chat completion; a body without one is a (retryable) bad response."""
    try:
        body = json.loads(data)
        choice = body["choices"][0]
        message = choice["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise RequestFailed("bad response", retryable=True) from None
    usage = body.get("usage") or {}
    # SGLang and older vLLM say `reasoning_content`; newer vLLM says `reasoning`.
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    ids = choice.get("response_token_ids")
    return Answer(
        content=message.get("content") or "",
        reasoning_content=reasoning or None,
        finish_reason=choice.get("finish_reason"),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        tool_calls=_calls(message.get("tool_calls")),
        output_ids=[int(i) for i in ids] if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None,
    )


def _calls(raw: Any) -> list[dict[str, Any]] | None:
    """The answer's calls in OpenAI shape; a malformed one is a bad response (retryable: sampled again)."""
    if not raw:
        return None
    try:
        calls = [{"id": str(call.get("id") or f"call_{k}"), "type": "function",
                  "function": {"name": call["function"]["name"], "arguments": _arguments(call["function"].get("arguments"))}}
                 for k, call in enumerate(raw)]
    except (KeyError, TypeError, AttributeError):
        raise RequestFailed("bad response (a tool call without a function name)", retryable=True) from None
    return calls


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {}, ensure_ascii=False)


def error_detail(data: bytes) -> str:
    """What an error body says, on one line and bounded: the message of OpenAI's ``{"error": {"message"}}``,
    FastAPI's ``{"detail"}`` or a bare ``{"message"}``, else the body's text."""
    text = data[: 16 * DETAIL_LIMIT].decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        found = body.get("error") or body.get("detail") or body.get("message")
        found = found.get("message", found) if isinstance(found, dict) else found
        text = found if isinstance(found, str) else json.dumps(found) if found else text
    line = " ".join(text.split())
    return line if len(line) <= DETAIL_LIMIT else line[: DETAIL_LIMIT - 1] + "…"


def _connection_reason(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, BrokenPipeError):
        return "connection closed"
    return "connection reset"


def _retry_after(headers: Any) -> float | None:
    try:
        return float(headers.get("Retry-After"))
    except (TypeError, ValueError):
        return None


def check_reachable(settings: InferSettings) -> None:
    """Fail at once, in one line, when nothing answers at the server's address.

    NOTE: any HTTP answer will do (even a 404): the point is to tell "no server"
    from "a server that fails some requests", which the retries handle.
    """
    url = settings.server_url.rstrip("/") + "/models"
    try:
        urllib.request.urlopen(url, timeout=min(settings.timeout, 30)).close()
    except urllib.error.HTTPError:
        return
    except OSError as exc:
        reason = getattr(exc, "reason", exc)
        raise InferError(
            f"no inference server answers at {settings.server_url} ({reason}): start it, "
            "or fix stages.infer.server_url in the inventory"
        ) from None
