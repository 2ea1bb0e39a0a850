"""The brain interface: one neutral conversation, many vendor wire formats.

A brain adapter turns the runner's neutral messages and tool specs into one
vendor's chat request, sends it, and turns the answer back into a neutral
``BrainReply`` (text and tool calls). The runner never sees a vendor format;
an adapter never touches task state.

HTTP is the standard library's ``urllib``: a timeout on every request, a few
retries with backoff for the failures that are worth retrying (timeouts,
connection errors, 408/409/429/5xx), and a ``BrainError`` that says which
vendor failed and why, in the vendor's own words when it gave any.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
MAX_RESPONSE_BYTES = 8 * 1024 * 1024

ERR_TIMEOUT = "{vendor}: no answer within {timeout:g}s ({attempts} attempts)"
ERR_CONNECT = "{vendor}: cannot connect to {url}: {reason}"
ERR_HTTP = "{vendor}: HTTP {status}: {message}"
ERR_NOT_JSON = "{vendor}: the answer is not JSON"
ERR_SHAPE = "{vendor}: unexpected answer shape: {what}"
ERR_TOO_LARGE = "{vendor}: the answer is larger than {limit} bytes"


class BrainError(Exception):
    """A brain call failed; ``retryable`` says whether a later try may work."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        kind: str = "shape",
    ):
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        # "timeout", "connect", "http" or "shape".
        self.kind = kind


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    # JSON Schema of the arguments object.
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class Message:
    """One neutral conversation entry.

    ``role`` is "user", "assistant" (text and/or ``tool_calls``) or "tool"
    (the result of the call ``tool_call_id`` to ``tool_name``).
    """

    role: str
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str = ""
    tool_name: str = ""
    result: dict[str, Any] | None = None


@dataclass(frozen=True)
class BrainReply:
    text: str
    tool_calls: list[ToolCall]
    stop_reason: str
    usage: dict[str, Any] = field(default_factory=dict)


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
    """A brain behind a vendor's HTTP chat API: endpoint, key, model, client."""

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
    ):
        self.name = brain
        self.model = model
        self.api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.http = HttpJsonClient(
            vendor=self.vendor, timeout=timeout, retries=retries, backoff=backoff
        )


def parse_arguments(raw: Any, *, vendor: str) -> dict[str, Any]:
    """Return tool-call arguments as a dict (some vendors send a JSON string)."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            raise BrainError(
                ERR_SHAPE.format(vendor=vendor, what="tool arguments are not JSON")
            ) from None
        if isinstance(value, dict):
            return value
    raise BrainError(
        ERR_SHAPE.format(vendor=vendor, what="tool arguments are not an object")
    )


class HttpJsonClient:
    """POST JSON, get JSON: timeouts, bounded retries with backoff, clear errors."""

    def __init__(
        self,
        *,
        vendor: str,
        timeout: float = 60.0,
        retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
    ):
        self.vendor = vendor
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff

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
                time.sleep(min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))
        assert last is not None
        if last.kind == "timeout" and attempts > 1:
            raise BrainError(
                ERR_TIMEOUT.format(
                    vendor=self.vendor, timeout=self.timeout, attempts=attempts
                ),
                retryable=True,
                kind="timeout",
            )
        raise last

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
            ) from None
        except TimeoutError:
            raise BrainError(
                ERR_TIMEOUT.format(
                    vendor=self.vendor, timeout=self.timeout, attempts=1
                ),
                retryable=True,
                kind="timeout",
            ) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError | socket.timeout):
                raise BrainError(
                    ERR_TIMEOUT.format(
                        vendor=self.vendor, timeout=self.timeout, attempts=1
                    ),
                    retryable=True,
                    kind="timeout",
                ) from None
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
            raise BrainError(
                ERR_SHAPE.format(vendor=self.vendor, what="not a JSON object")
            )
        return value


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
