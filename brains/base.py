"""The brain interface: one neutral conversation, many vendor wire formats.

A brain adapter turns the runner's neutral messages and tool specs into one
vendor's chat request, sends it, and turns the answer back into a neutral
``BrainReply`` (text and tool calls). The runner never sees a vendor format;
an adapter never touches task state.

Some vendors hand state back that must return verbatim with the next request
(Gemini's thought signatures, on the very part that carried them). The adapter
keeps it in ``BrainReply.replay``; the runner appends ``reply.as_message()`` to
the conversation, which carries it back to the adapter unread.

HTTP is the standard library's ``urllib``: a timeout on every request, a few
retries with backoff for the failures that are worth retrying (timeouts,
connection errors, 408/409/429/500/502/503/504/529), waiting as long as a ``Retry-After``
header asks (up to a cap), and a ``BrainError`` that says which vendor failed
and why, in the vendor's own words when it gave any.
"""

from __future__ import annotations

import email.utils
import json
import socket
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
# Every adapter's defaults: seconds one request may take, retries after the
# first try, and the first back-off in seconds (doubled each retry).
TIMEOUT = 60.0
RETRIES = 2
BACKOFF = 0.5
MAX_RESPONSE_BYTES = 8 * 1024 * 1024

ERR_TIMEOUT = "{vendor}: no answer within {timeout:g}s ({attempts} attempts)"
ERR_CONNECT = "{vendor}: cannot connect to {url}: {reason}"
ERR_HTTP = "{vendor}: HTTP {status}: {message}"
ERR_NOT_JSON = "{vendor}: the answer is not JSON"
ERR_SHAPE = "{vendor}: unexpected answer shape: {what}"
ERR_TOO_LARGE = "{vendor}: the answer is larger than {limit} bytes"
ERR_WAIT_TOO_LONG = (
    "{message} (the vendor asks to retry after {seconds:g}s; the limit is {limit:g}s)"
)


class BrainError(Exception):
    """A brain call failed; ``retryable`` says whether a later try may work."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        kind: str = "shape",
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        # "timeout", "connect", "http" or "shape".
        self.kind = kind
        # Seconds the vendor asked to wait before the next try (Retry-After).
        self.retry_after = retry_after


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    # JSON Schema of the arguments object.
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """One call the brain asked for.

    ``error`` is set when the call cannot be carried out as sent (its
    arguments are not JSON or not an object, it names no tool): the runner
    answers it with that sentence as a tool error instead of calling anything,
    and the brain may try again. ``arguments`` is then empty.
    """

    id: str
    name: str
    arguments: dict[str, Any]
    error: str = ""


@dataclass(frozen=True)
class TokenUsage:
    """A turn's token counts in one shape, whichever vendor counted them.

    ``input_tokens`` is everything the brain read (cached prompt included),
    ``output_tokens`` everything it wrote (thinking included).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0

    def as_data(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
        }


@dataclass
class Message:
    """One neutral conversation entry.

    ``role`` is "user", "assistant" (text and/or ``tool_calls``) or "tool"
    (the result of the call ``tool_call_id`` to ``tool_name``). ``replay`` is
    what an adapter asked to get back with an assistant turn, keyed by the
    adapter's wire format; nobody else reads it.
    """

    role: str
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str = ""
    tool_name: str = ""
    result: dict[str, Any] | None = None
    replay: Mapping[str, Any] = field(default_factory=dict)


def message_chars(message: Message) -> int:
    """The characters a message carries: its text, each call's name and
    arguments, and its result, as JSON (what a turn's size is counted in)."""
    size = len(message.text)
    for call in message.tool_calls:
        size += len(call.name) + len(json.dumps(call.arguments, ensure_ascii=False))
    if message.result is not None:
        size += len(json.dumps(message.result, ensure_ascii=False, default=str))
    return size


@dataclass(frozen=True)
class BrainReply:
    text: str
    tool_calls: list[ToolCall]
    stop_reason: str
    # The vendor's own usage object, as it came; ``tokens`` is its reading.
    usage: dict[str, Any] = field(default_factory=dict)
    tokens: TokenUsage | None = None
    # Vendor state to send back verbatim with this turn (see the module docstring).
    replay: Mapping[str, Any] = field(default_factory=dict)

    def as_message(self) -> Message:
        """Return this reply as the assistant turn of the conversation."""
        return Message(
            role="assistant",
            text=self.text,
            tool_calls=list(self.tool_calls),
            replay=self.replay,
        )


class BrainAdapter(ABC):
    """A brain the runner can talk to. ``name`` is a ``tasks.models.Brain`` value."""

    name: str = "other"
    vendor: str = "brain"

    @abstractmethod
    def complete(
        self, *, system: str, messages: list[Message], tools: list[ToolSpec]
    ) -> BrainReply:
        """Send the conversation so far; return the brain's next message."""


class HttpBrainAdapter(BrainAdapter):
    """A brain behind a vendor's HTTP chat API: endpoint, key, model, client,
    and the bound on one answer's tokens that ``request_body`` sends."""

    def __init__(
        self,
        *,
        brain: str,
        model: str,
        api_key: str,
        base_url: str,
        timeout: float,
        retries: int,
        backoff: float,
        max_tokens: int | None = None,
    ):
        self.name = brain
        self.model = model
        # The most tokens one answer may take; None leaves it to the vendor.
        self.max_tokens = max_tokens
        self.api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.http = HttpJsonClient(
            vendor=self.vendor, timeout=timeout, retries=retries, backoff=backoff
        )

    def complete(
        self, *, system: str, messages: list[Message], tools: list[ToolSpec]
    ) -> BrainReply:
        data = self.http.post(
            self.endpoint(),
            self.request_body(system=system, messages=messages, tools=tools),
            self.headers(),
        )
        return self.parse_reply(data)

    @abstractmethod
    def endpoint(self) -> str:
        """Return the URL the chat request is POSTed to."""

    @abstractmethod
    def headers(self) -> dict[str, str]:
        """Return the vendor's authentication (and version) headers."""

    @abstractmethod
    def request_body(
        self, *, system: str, messages: list[Message], tools: list[ToolSpec]
    ) -> dict[str, Any]:
        """Return the vendor's JSON request for the neutral conversation."""

    @abstractmethod
    def parse_reply(self, data: dict[str, Any]) -> BrainReply:
        """Return the neutral reply in the vendor's JSON answer, or refuse it."""


def shape_error(*, vendor: str, what: str) -> BrainError:
    """Return the error for an answer whose shape an adapter cannot read."""
    return BrainError(ERR_SHAPE.format(vendor=vendor, what=what))


def objects(value: Any, *, vendor: str, what: str) -> list[dict[str, Any]]:
    """Return ``value`` as a list of JSON objects (missing: empty), or refuse it."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise shape_error(vendor=vendor, what=f"{what} is not a list of objects")
    return value


MAX_QUOTED_CHARS = 120
ERR_ARGS_NOT_JSON = "the arguments of {name} are not JSON ({reason}): {quoted}"
ERR_ARGS_NOT_OBJECT = "the arguments of {name} must be a JSON object, not {kind}"
ERR_NO_TOOL_NAME = "the tool call names no tool"


def tool_call_read(*, id: str, name: Any, raw: Any) -> ToolCall:
    """Return the call as the brain sent it; one that cannot run carries ``error``.

    Some vendors send arguments as a JSON string, some as an object. A string
    that is not JSON (small models often cut one short), a value that is not
    an object, or a missing name is no reason to stop a run: the call comes
    back with the sentence that says what is wrong.
    """
    name = name if isinstance(name, str) else ""
    if not name:
        return ToolCall(id=id, name="", arguments={}, error=ERR_NO_TOOL_NAME)
    if raw is None or raw == "":
        return ToolCall(id=id, name=name, arguments={})
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError as exc:
            quoted = (
                raw if len(raw) <= MAX_QUOTED_CHARS else raw[:MAX_QUOTED_CHARS] + "…"
            )
            reason = str(exc).split(":")[0]
            return ToolCall(
                id=id,
                name=name,
                arguments={},
                error=ERR_ARGS_NOT_JSON.format(
                    name=name, reason=reason, quoted=json.dumps(quoted)
                ),
            )
    if not isinstance(value, dict):
        return ToolCall(
            id=id,
            name=name,
            arguments={},
            error=ERR_ARGS_NOT_OBJECT.format(name=name, kind=json_kind(value)),
        )
    return ToolCall(id=id, name=name, arguments=value)


def json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "null" if value is None else type(value).__name__


def count(value: Any) -> int:
    """Return a vendor's token count as an int; anything else counts as 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(0, int(value))


class HttpJsonClient:
    """POST JSON, get JSON: timeouts, bounded retries with backoff, clear errors."""

    def __init__(
        self,
        *,
        vendor: str,
        timeout: float = TIMEOUT,
        retries: int = RETRIES,
        backoff: float = BACKOFF,
        max_backoff: float = 8.0,
        max_retry_after: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.vendor = vendor
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        # A Retry-After longer than this is not waited for: the error goes up.
        self.max_retry_after = max_retry_after
        self.sleep = sleep

    def post(
        self, url: str, body: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any]:
        data = json.dumps(body).encode()
        attempts = self.retries + 1
        last: BrainError | None = None
        for attempt in range(1, attempts + 1):
            try:
                return self._post_once(url, data, headers)
            except BrainError as exc:
                last = exc
                if not exc.retryable or attempt == attempts:
                    break
                wait = exc.retry_after
                if wait is None:
                    wait = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
                elif wait > self.max_retry_after:
                    raise BrainError(
                        ERR_WAIT_TOO_LONG.format(
                            message=exc, seconds=wait, limit=self.max_retry_after
                        ),
                        status=exc.status,
                        retryable=True,
                        kind=exc.kind,
                        retry_after=wait,
                    ) from None
                self.sleep(wait)
        assert last is not None
        if last.kind == "timeout" and attempts > 1:
            raise self._timed_out(attempts)
        raise last

    def _timed_out(self, attempts: int) -> BrainError:
        return BrainError(
            ERR_TIMEOUT.format(
                vendor=self.vendor, timeout=self.timeout, attempts=attempts
            ),
            retryable=True,
            kind="timeout",
        )

    def _post_once(
        self, url: str, data: bytes, headers: dict[str, str]
    ) -> dict[str, Any]:
        request = urllib.request.Request(
            url,
            data=data,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json",
                **headers,
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raw = exc.read(64 * 1024)
            raise BrainError(
                ERR_HTTP.format(
                    vendor=self.vendor,
                    status=exc.code,
                    message=_error_message(raw, exc.reason),
                ),
                status=exc.code,
                retryable=exc.code in RETRYABLE_STATUS,
                kind="http",
                retry_after=retry_after_seconds(exc.headers),
            ) from None
        except TimeoutError:
            raise self._timed_out(1) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError | socket.timeout):
                raise self._timed_out(1) from None
            raise BrainError(
                ERR_CONNECT.format(vendor=self.vendor, url=url, reason=exc.reason),
                retryable=True,
                kind="connect",
            ) from None
        except (ConnectionError, OSError) as exc:
            raise BrainError(
                ERR_CONNECT.format(vendor=self.vendor, url=url, reason=exc),
                retryable=True,
                kind="connect",
            ) from None
        if len(raw) > MAX_RESPONSE_BYTES:
            raise BrainError(
                ERR_TOO_LARGE.format(vendor=self.vendor, limit=MAX_RESPONSE_BYTES)
            )
        try:
            value = json.loads(raw)
        except ValueError:
            raise BrainError(ERR_NOT_JSON.format(vendor=self.vendor)) from None
        if not isinstance(value, dict):
            raise shape_error(vendor=self.vendor, what="not a JSON object")
        return value


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """Return the wait a 429/503 answer asks for, or None when it names none.

    ``Retry-After`` is seconds or an HTTP date (RFC 9110); OpenAI also sends
    ``retry-after-ms``.
    """
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = (headers.get(name) or "").strip()
        if not value:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            pass
        if scale == 1.0:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                return None
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            return max(0.0, (when - datetime.now(UTC)).total_seconds())
    return None


def _error_message(raw: bytes, fallback: object) -> str:
    """Pull the human message out of the vendors' error bodies.

    OpenAI-compatible and Gemini: {"error": {"message": ...}}; Anthropic:
    {"type": "error", "error": {"type": ..., "message": ...}}.
    """
    try:
        value = json.loads(raw)
    except ValueError:
        text = raw.decode("utf-8", "replace").strip()
        return text[:300] or str(fallback)
    if isinstance(value, dict):
        err = value.get("error")
        if isinstance(err, dict) and err.get("message"):
            kind = err.get("type") or err.get("status") or ""
            return f"{err['message']}" + (f" ({kind})" if kind else "")
        if isinstance(err, str):
            return err
        if value.get("message"):
            return str(value["message"])
    return str(fallback)
