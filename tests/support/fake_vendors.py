"""Loopback stand-ins for the vendors' chat APIs, answering in their documented shapes.

Each fake listens on 127.0.0.1 (a free port), checks every request the way the
vendor would (path, auth header, body shape, tool-call ids that answer earlier
calls) and answers like a small deterministic model: it calls
``run_next_step`` until the task is settled, then replies with text. Faults can
be queued: an HTTP error in the vendor's error shape, a delay longer than the
client's timeout, or a body that is not JSON.

- ``FakeOpenAI``: ``POST /v1/chat/completions`` (Bearer auth), ``tool_calls`` with
  JSON-string arguments, ``role: tool`` results.
- ``FakeAnthropic``: ``POST /v1/messages`` (``x-api-key`` + ``anthropic-version``),
  ``tool_use`` / ``tool_result`` content blocks.
- ``FakeGemini``: ``POST /v1beta/models/{model}:generateContent``
  (``x-goog-api-key``), ``functionCall`` / ``functionResponse`` parts.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_KEY = "test-key-not-secret"
SETTLED = {"done", "failed", "needs_review", "paused"}


class BadRequest(Exception):
    pass


@dataclass
class Fault:
    status: int = 0
    delay: float = 0.0
    garbage: bool = False
    message: str = "injected fault"


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Move:
    """The fake model's next message: tool calls, or text when ``calls`` is empty."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    text: str = ""


def drive_policy(
    results: list[tuple[str, dict[str, Any]]], *, read_outputs: bool
) -> Move:
    """Call run_next_step until the task settles; optionally read each new output."""
    if not results:
        return Move(calls=[("run_next_step", {})])
    name, last = results[-1]
    status = (last.get("task") or {}).get("status", "")
    if last.get("error"):
        return Move(text=f"Stopping: {last['error']}")
    if name == "run_next_step":
        output = (last.get("step") or {}).get("output")
        if read_outputs and output:
            return Move(calls=[("read_artifact", {"artifact_id": output["id"]})])
        if status in SETTLED or last.get("ran") is False:
            return Move(text=f"The task is {status}.")
    return Move(calls=[("run_next_step", {})])


class FakeVendor:
    vendor = "fake"

    def __init__(self, *, read_outputs: bool = False, script: list[Move] | None = None):
        self.read_outputs = read_outputs
        self.script = list(script or [])
        self.faults: list[Fault] = []
        self.requests: list[Recorded] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._counter = 0

    # -- lifecycle ------------------------------------------------------------

    def __enter__(self) -> FakeVendor:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                fake._handle(self)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def root(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        return self.root

    # -- request handling -----------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length)
        with self._lock:
            fault = self.faults.pop(0) if self.faults else None
            self._counter += 1
            counter = self._counter
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        headers = {k.lower(): v for k, v in handler.headers.items()}
        self.requests.append(Recorded(handler.path, headers, body))
        if fault and fault.delay:
            time.sleep(fault.delay)
        if fault and fault.garbage:
            return self._send(handler, 200, b"<html>gateway hiccup</html>", "text/html")
        if fault and fault.status:
            return self._send_json(
                handler, fault.status, self.error_body(fault.status, fault.message)
            )
        try:
            self.check(handler.path, headers, body)
            results = self.tool_results(body)
        except BadRequest as exc:
            self.errors.append(str(exc))
            return self._send_json(handler, 400, self.error_body(400, str(exc)))
        if self.script:
            move = self.script.pop(0)
        else:
            move = drive_policy(results, read_outputs=self.read_outputs)
        return self._send_json(handler, 200, self.reply_body(move, counter, body))

    def _send_json(self, handler, status: int, body: dict) -> None:
        self._send(handler, status, json.dumps(body).encode(), "application/json")

    @staticmethod
    def _send(handler, status: int, data: bytes, content_type: str) -> None:
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    # -- per vendor -----------------------------------------------------------

    def check(self, path: str, headers: dict[str, str], body: dict) -> None:
        raise NotImplementedError

    def tool_results(self, body: dict) -> list[tuple[str, dict[str, Any]]]:
        raise NotImplementedError

    def reply_body(self, move: Move, counter: int, request: dict) -> dict:
        raise NotImplementedError

    def error_body(self, status: int, message: str) -> dict:
        raise NotImplementedError

    def tool_names(self, body: dict) -> list[str]:
        raise NotImplementedError


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise BadRequest(message)


class FakeOpenAI(FakeVendor):
    vendor = "openai"

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def check(self, path, headers, body):
        _require(path == "/v1/chat/completions", f"unknown path {path}")
        _require(
            headers.get("authorization") == f"Bearer {API_KEY}",
            "Incorrect API key provided",
        )
        _require(
            isinstance(body.get("model"), str), "you must provide a model parameter"
        )
        messages = body.get("messages")
        _require(
            isinstance(messages, list) and messages,
            "messages must be a non-empty array",
        )
        open_ids: set[str] = set()
        for m in messages:
            role = m.get("role")
            _require(
                role in {"system", "user", "assistant", "tool"}, f"bad role {role}"
            )
            if role == "assistant":
                for call in m.get("tool_calls") or []:
                    _require(
                        call.get("type") == "function",
                        "tool_calls[].type must be function",
                    )
                    _require(
                        isinstance(call["function"].get("arguments"), str),
                        "tool_calls[].function.arguments must be a JSON string",
                    )
                    open_ids.add(call["id"])
            if role == "tool":
                _require(
                    m.get("tool_call_id") in open_ids,
                    "messages with role 'tool' must be a response to a preceding tool_calls",
                )
                _require(
                    isinstance(m.get("content"), str), "tool content must be a string"
                )
        for t in body.get("tools") or []:
            _require(t.get("type") == "function", "tools[].type must be function")
            _require(t["function"].get("name"), "tools[].function.name is required")
            _require(
                isinstance(t["function"].get("parameters"), dict),
                "parameters must be an object",
            )

    def tool_names(self, body):
        return [t["function"]["name"] for t in body.get("tools") or []]

    def tool_results(self, body):
        names = {}
        out = []
        for m in body["messages"]:
            for call in m.get("tool_calls") or []:
                names[call["id"]] = call["function"]["name"]
            if m["role"] == "tool":
                out.append((names[m["tool_call_id"]], json.loads(m["content"])))
        return out

    def reply_body(self, move, counter, request):
        message: dict[str, Any] = {"role": "assistant", "content": move.text or None}
        if move.calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{counter}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for i, (name, args) in enumerate(move.calls)
            ]
        return {
            "id": f"chatcmpl-{counter}",
            "object": "chat.completion",
            "created": 1_790_000_000 + counter,
            "model": request.get("model", ""),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if move.calls else "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }

    def error_body(self, status, message):
        kinds = {
            400: "invalid_request_error",
            401: "invalid_request_error",
            429: "rate_limit_exceeded",
        }
        return {
            "error": {
                "message": message,
                "type": kinds.get(status, "server_error"),
                "param": None,
                "code": None,
            }
        }


class FakeAnthropic(FakeVendor):
    vendor = "anthropic"

    def check(self, path, headers, body):
        _require(path == "/v1/messages", f"unknown path {path}")
        _require(headers.get("x-api-key") == API_KEY, "invalid x-api-key")
        _require(
            headers.get("anthropic-version") == "2023-06-01",
            "anthropic-version header is required",
        )
        _require(isinstance(body.get("max_tokens"), int), "max_tokens: Field required")
        _require(isinstance(body.get("system", ""), str), "system must be a string")
        messages = body.get("messages")
        _require(
            isinstance(messages, list) and messages,
            "messages: at least one message is required",
        )
        _require(messages[0]["role"] == "user", "first message must use the user role")
        tool_use_ids: set[str] = set()
        for prev, m in zip([None, *messages], messages, strict=False):
            _require(m["role"] in {"user", "assistant"}, f"bad role {m['role']}")
            if prev is not None:
                _require(
                    prev["role"] != m["role"],
                    "roles must alternate between user and assistant",
                )
            content = m["content"]
            if isinstance(content, str):
                continue
            for block in content:
                if block["type"] == "tool_use":
                    _require(
                        m["role"] == "assistant",
                        "tool_use blocks come from the assistant",
                    )
                    _require(
                        isinstance(block.get("input"), dict),
                        "tool_use.input must be an object",
                    )
                    tool_use_ids.add(block["id"])
                elif block["type"] == "tool_result":
                    _require(
                        block.get("tool_use_id") in tool_use_ids,
                        "tool_result block(s) provided without a preceding tool_use",
                    )
        for t in body.get("tools") or []:
            _require(
                t.get("name") and isinstance(t.get("input_schema"), dict),
                "tools[]: name and input_schema required",
            )

    def tool_names(self, body):
        return [t["name"] for t in body.get("tools") or []]

    def tool_results(self, body):
        names = {}
        out = []
        for m in body["messages"]:
            if isinstance(m["content"], str):
                continue
            for block in m["content"]:
                if block["type"] == "tool_use":
                    names[block["id"]] = block["name"]
                elif block["type"] == "tool_result":
                    out.append(
                        (names[block["tool_use_id"]], json.loads(block["content"]))
                    )
        return out

    def reply_body(self, move, counter, request):
        content: list[dict[str, Any]] = []
        if move.text:
            content.append({"type": "text", "text": move.text})
        for i, (name, args) in enumerate(move.calls):
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{counter}_{i}",
                    "name": name,
                    "input": args,
                }
            )
        return {
            "id": f"msg_{counter}",
            "type": "message",
            "role": "assistant",
            "model": request.get("model", ""),
            "content": content,
            "stop_reason": "tool_use" if move.calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }

    def error_body(self, status, message):
        kinds = {
            400: "invalid_request_error",
            401: "authentication_error",
            429: "rate_limit_error",
            529: "overloaded_error",
        }
        return {
            "type": "error",
            "error": {"type": kinds.get(status, "api_error"), "message": message},
        }


class FakeGemini(FakeVendor):
    vendor = "gemini"

    def check(self, path, headers, body):
        _require(
            path.startswith("/v1beta/models/") and path.endswith(":generateContent"),
            f"unknown path {path}",
        )
        _require(
            headers.get("x-goog-api-key") == API_KEY,
            "API key not valid. Please pass a valid API key.",
        )
        contents = body.get("contents")
        _require(isinstance(contents, list) and contents, "contents is not specified")
        system = body.get("systemInstruction") or {}
        _require(
            isinstance(system.get("parts", []), list),
            "systemInstruction.parts must be a list",
        )
        called: list[str] = []
        for c in contents:
            _require(c.get("role") in {"user", "model"}, f"bad role {c.get('role')}")
            _require(
                isinstance(c.get("parts"), list) and c["parts"],
                "parts must not be empty",
            )
            for part in c["parts"]:
                if "functionCall" in part:
                    _require(
                        c["role"] == "model", "functionCall parts come from the model"
                    )
                    _require(
                        isinstance(part["functionCall"].get("args", {}), dict),
                        "args must be an object",
                    )
                    called.append(part["functionCall"]["name"])
                if "functionResponse" in part:
                    fr = part["functionResponse"]
                    _require(
                        fr.get("name") in called,
                        "functionResponse without a matching functionCall",
                    )
                    _require(
                        isinstance(fr.get("response"), dict),
                        "functionResponse.response must be an object",
                    )
        for tool in body.get("tools") or []:
            for decl in tool.get("functionDeclarations") or []:
                _require(decl.get("name"), "functionDeclarations[].name is required")

    def tool_names(self, body):
        return [
            d["name"]
            for t in body.get("tools") or []
            for d in t.get("functionDeclarations") or []
        ]

    def tool_results(self, body):
        out = []
        for c in body["contents"]:
            for part in c["parts"]:
                if "functionResponse" in part:
                    fr = part["functionResponse"]
                    out.append((fr["name"], fr["response"]))
        return out

    def reply_body(self, move, counter, request):
        parts: list[dict[str, Any]] = []
        if move.text:
            parts.append({"text": move.text})
        for name, args in move.calls:
            parts.append({"functionCall": {"name": name, "args": args}})
        return {
            "candidates": [
                {
                    "content": {"role": "model", "parts": parts},
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 10,
                "candidatesTokenCount": 5,
                "totalTokenCount": 15,
            },
            "modelVersion": "gemini-fake",
        }

    def error_body(self, status, message):
        statuses = {
            400: "INVALID_ARGUMENT",
            403: "PERMISSION_DENIED",
            429: "RESOURCE_EXHAUSTED",
            500: "INTERNAL",
            503: "UNAVAILABLE",
        }
        return {
            "error": {
                "code": status,
                "message": message,
                "status": statuses.get(status, "UNKNOWN"),
            }
        }


FAKES = {"openai": FakeOpenAI, "anthropic": FakeAnthropic, "gemini": FakeGemini}
