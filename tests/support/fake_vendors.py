"""Loopback stand-ins for the vendors' chat APIs, judged by the vendors' own SDKs.

Each fake listens on 127.0.0.1 (a free port). Every request is judged by
``tests.support.vendor_judge``: the official SDK's request types (unknown
keys included) plus the protocol rules the vendors document. A request that
fails is answered 400 in the vendor's error shape and recorded in
``errors``. Every answer is built from the SDK's own response models
(``openai.types.chat.ChatCompletion``, ``anthropic.types.Message``,
``google.genai.types.GenerateContentResponse``) and serialized as the REST
API sends it. The fake model is small and deterministic: it calls
``run_next_step`` until the task is settled, then replies with text, unless a
``script`` of moves says otherwise. Faults can be queued: an HTTP error in the
vendor's error shape (with a ``Retry-After`` header if asked), a delay longer
than the client's timeout, or a body that is not JSON.

Each answer carries token counts in the vendor's own usage object, different
on every answer (``usage_for``) so that sums are real sums: OpenAI's
``usage``, Anthropic's ``usage`` (with cached prompt tokens) and Gemini's
``usageMetadata`` (with thinking tokens).

- ``FakeOpenAI``: ``POST /v1/chat/completions`` (Bearer auth).
- ``FakeAnthropic``: ``POST /v1/messages`` (``x-api-key`` + ``anthropic-version``).
- ``FakeGemini``: ``POST /v1beta/models/{model}:generateContent``
  (``x-goog-api-key``). Like Gemini 3 models it signs its turns: a
  ``thoughtSignature`` on each text part and on the first function call of a
  turn, and it refuses a request that sends one of its parts back without
  that signature (the API's 400 in a function-calling turn).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.vendor_judge import judge_anthropic, judge_gemini, judge_openai

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
    retry_after: str = ""


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


def usage_for(counter: int) -> dict[str, int]:
    """The counts the fake model reports for its ``counter``-th answer."""
    return {
        "prompt": 300 + 40 * counter,
        "cached": 25 * counter,
        "output": 11 + counter,
        "thinking": 3 * counter,
    }


class FakeVendor:
    vendor = "fake"

    def __init__(self, *, read_outputs: bool = False, script: list[Move] | None = None):
        self.read_outputs = read_outputs
        self.script = list(script or [])
        self.faults: list[Fault] = []
        self.requests: list[Recorded] = []
        self.responses: list[dict[str, Any]] = []
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
            extra = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            return self._send_json(
                handler,
                fault.status,
                self.error_body(fault.status, fault.message),
                extra,
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
        answer = self.reply_body(move, counter, body)
        self.responses.append(answer)
        return self._send_json(handler, 200, answer)

    def _send_json(self, handler, status: int, body: dict, headers=None) -> None:
        self._send(
            handler, status, json.dumps(body).encode(), "application/json", headers
        )

    @staticmethod
    def _send(handler, status: int, data: bytes, content_type: str, headers=None):
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            for name, value in (headers or {}).items():
                handler.send_header(name, value)
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


def _require_none(problems: list[str]) -> None:
    if problems:
        raise BadRequest("; ".join(problems))


class FakeOpenAI(FakeVendor):
    vendor = "openai"

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def check(self, path, headers, body):
        if path != "/v1/chat/completions":
            raise BadRequest(f"unknown path {path}")
        _require_none(judge_openai(body, headers, api_key=API_KEY))

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
        from openai.types.chat import ChatCompletion, ChatCompletionMessage
        from openai.types.chat.chat_completion import Choice
        from openai.types.chat.chat_completion_message_function_tool_call import (
            ChatCompletionMessageFunctionToolCall,
            Function,
        )
        from openai.types.completion_usage import CompletionUsage

        calls = [
            ChatCompletionMessageFunctionToolCall(
                id=f"call_{counter}_{i}",
                type="function",
                function=Function(name=name, arguments=json.dumps(args)),
            )
            for i, (name, args) in enumerate(move.calls)
        ]
        answer = ChatCompletion(
            id=f"chatcmpl-{counter}",
            object="chat.completion",
            created=1_790_000_000 + counter,
            model=request.get("model", ""),
            choices=[
                Choice(
                    index=0,
                    finish_reason="tool_calls" if calls else "stop",
                    logprobs=None,
                    message=ChatCompletionMessage(
                        role="assistant",
                        content=move.text or None,
                        refusal=None,
                        annotations=[],
                        **({"tool_calls": calls} if calls else {}),
                    ),
                )
            ],
            usage=CompletionUsage(
                prompt_tokens=(u := usage_for(counter))["prompt"],
                completion_tokens=u["output"],
                total_tokens=u["prompt"] + u["output"],
            ),
        )
        return answer.to_dict(mode="json")

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


def anthropic_versions() -> set[str]:
    """The versions the fake takes: the documented ones and the installed SDK's own."""
    from anthropic._constants import ANTHROPIC_API_VERSION

    return {"2023-06-01", "2026-10-21", ANTHROPIC_API_VERSION}


class FakeAnthropic(FakeVendor):
    vendor = "anthropic"

    def check(self, path, headers, body):
        if path != "/v1/messages":
            raise BadRequest(f"unknown path {path}")
        _require_none(
            judge_anthropic(
                body, headers, api_key=API_KEY, versions=anthropic_versions()
            )
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
        from anthropic.types import Message, TextBlock, ToolUseBlock, Usage

        content: list[Any] = []
        if move.text:
            content.append(TextBlock(type="text", text=move.text, citations=None))
        content += [
            ToolUseBlock(
                type="tool_use", id=f"toolu_{counter}_{i}", name=name, input=args
            )
            for i, (name, args) in enumerate(move.calls)
        ]
        answer = Message(
            id=f"msg_{counter}",
            type="message",
            role="assistant",
            model=request.get("model", ""),
            content=content,
            stop_reason="tool_use" if move.calls else "end_turn",
            stop_sequence=None,
            usage=Usage(
                input_tokens=(u := usage_for(counter))["prompt"],
                cache_read_input_tokens=u["cached"],
                cache_creation_input_tokens=0,
                output_tokens=u["output"],
            ),
        )
        return answer.to_dict(mode="json")

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


ERR_SIGNATURE = (
    "Function call is missing a thought_signature in functionCall parts "
    "(or a part came back without the signature it was given)"
)


class FakeGemini(FakeVendor):
    vendor = "gemini"

    def __init__(self, *, signs: bool = True, call_ids: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.signs = signs
        self.call_ids = call_ids
        # Each signed part as sent (signature removed) -> the signatures it bore.
        self.signed: dict[str, set[str]] = {}

    def check(self, path, headers, body):
        _require_none(judge_gemini(path, body, headers, api_key=API_KEY))
        for c in body["contents"]:
            if c["role"] != "model":
                continue
            for part in c["parts"]:
                bare = {k: v for k, v in part.items() if k != "thoughtSignature"}
                issued = self.signed.get(json.dumps(bare, sort_keys=True))
                if issued and part.get("thoughtSignature") not in issued:
                    raise BadRequest(ERR_SIGNATURE)

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
        from google.genai import types

        parts = []
        if move.text:
            parts.append(types.Part(text=move.text))
        for i, (name, args) in enumerate(move.calls):
            call = types.FunctionCall(name=name, args=args)
            if self.call_ids:
                call.id = f"fc-{counter}-{i}"
            parts.append(types.Part(function_call=call))
        if self.signs:
            first_call = True
            for i, part in enumerate(parts):
                if part.text is not None or (part.function_call and first_call):
                    part.thought_signature = f"sig-{counter}-{i}".encode()
                    first_call = first_call and part.function_call is None
        answer = types.GenerateContentResponse(
            candidates=[
                types.Candidate(
                    content=types.Content(role="model", parts=parts),
                    finish_reason=types.FinishReason.STOP,
                    index=0,
                )
            ],
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=(u := usage_for(counter))["prompt"],
                candidates_token_count=u["output"],
                thoughts_token_count=u["thinking"],
                total_token_count=u["prompt"] + u["output"] + u["thinking"],
            ),
            model_version="gemini-fake",
            response_id=f"resp-{counter}",
        )
        data = answer.model_dump(mode="json", by_alias=True, exclude_none=True)
        for part in data["candidates"][0]["content"]["parts"]:
            if "thoughtSignature" in part:
                bare = {k: v for k, v in part.items() if k != "thoughtSignature"}
                with self._lock:
                    self.signed.setdefault(json.dumps(bare, sort_keys=True), set()).add(
                        part["thoughtSignature"]
                    )
        return data

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


class ReplayOpenAI(FakeOpenAI):
    """Answers recorded from a real OpenAI-compatible server, served in order.

    Requests are still judged by the OpenAI SDK's request types; once the
    recording runs out, the last answer is served again.
    """

    def __init__(self, answers: list[dict[str, Any]], **kwargs):
        super().__init__(**kwargs)
        self.recorded = list(answers)

    def reply_body(self, move, counter, request):
        answer = self.recorded.pop(0) if len(self.recorded) > 1 else self.recorded[0]
        return json.loads(json.dumps(answer))


class RecordingProxy:
    """Forward POSTs to a real server unchanged; keep each request, status and answer.

    Stands between a runner and llama.cpp's server, so a test can read what
    the brain was sent and what it answered, HTTP errors included.
    """

    def __init__(self, upstream: str):
        # The server's root: requests come for /v1/... and go on unchanged.
        self.upstream = upstream.rstrip("/").removesuffix("/v1")
        self.exchanges: list[tuple[dict[str, Any], int, Any]] = []
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> RecordingProxy:
        import urllib.error
        import urllib.request

        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = urllib.request.Request(
                    proxy.upstream + self.path,
                    data=raw,
                    method="POST",
                    headers={"Content-Type": "application/json"},
                )
                try:
                    with urllib.request.urlopen(request, timeout=900) as response:
                        status, data = response.status, response.read()
                except urllib.error.HTTPError as exc:
                    status, data = exc.code, exc.read()
                try:
                    answer = json.loads(data)
                except ValueError:
                    answer = data.decode("utf-8", "replace")
                proxy.exchanges.append((json.loads(raw or b"{}"), status, answer))
                FakeVendor._send(self, status, data, "application/json")

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"
