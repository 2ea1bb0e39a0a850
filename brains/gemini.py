"""Gemini ``generateContent`` (Google AI Studio REST, API version ``v1beta``).

Wire format (POST ``{base_url}/v1beta/models/{model}:generateContent`` with
``x-goog-api-key``): request ``{"systemInstruction": {"parts": [{"text"}]},
"contents": [{"role": "user"|"model", "parts": [...]}], "tools":
[{"functionDeclarations": [{"name", "description", "parametersJsonSchema"}]}]}``.
The answer's ``candidates[0].content.parts[]`` holds ``{"text"}`` and
``{"functionCall": {"name", "args", "id"?}}`` parts; results go back as a user
turn of ``{"functionResponse": {"name", "id"?, "response": {...}}}`` parts.

Thought signatures: a part may carry ``thoughtSignature``, and the model's
turn must come back with each signature on the part that carried it, or the
API answers 400 in the middle of a function-calling turn. The adapter keeps
the model's parts as they came (``BrainReply.replay["gemini"]``) and sends
that turn back verbatim, the way the official SDK's chat keeps its history.

Declarations use ``parametersJsonSchema`` (a JSON Schema, as the runner writes
it) rather than ``parameters`` (an OpenAPI subset that refuses, among other
things, an OBJECT without properties, such as a tool's free-form ``args``).

Token counts come in ``usageMetadata``: ``promptTokenCount`` (cached content
included) and ``toolUsePromptTokenCount`` read, ``candidatesTokenCount`` and
``thoughtsTokenCount`` written, ``totalTokenCount`` all of them.
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import quote

from brains.base import (
    BACKOFF,
    RETRIES,
    TIMEOUT,
    BrainReply,
    HttpBrainAdapter,
    Message,
    TokenUsage,
    ToolSpec,
    count,
    objects,
    shape_error,
    tool_call_read,
)

REPLAY_KEY = "gemini"


def _declaration(tool: ToolSpec) -> dict[str, Any]:
    """A function declaration; a tool without arguments gets no parameters."""
    decl: dict[str, Any] = {"name": tool.name, "description": tool.description}
    if tool.parameters.get("properties"):
        decl["parametersJsonSchema"] = tool.parameters
    return decl


class GeminiBrain(HttpBrainAdapter):
    name = "gemini"
    vendor = "Gemini"

    def __init__(
        self,
        *,
        model: str,
        api_key: str,
        base_url: str = "https://generativelanguage.googleapis.com",
        timeout: float = TIMEOUT,
        retries: int = RETRIES,
        backoff: float = BACKOFF,
        brain: str = "gemini",
        max_tokens: int | None = None,
    ):
        super().__init__(
            brain=brain,
            model=model,
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_tokens=max_tokens,
        )

    def endpoint(self) -> str:
        model = quote(self.model, safe="")
        return f"{self.base_url}/v1beta/models/{model}:generateContent"

    def headers(self) -> dict[str, str]:
        return {"x-goog-api-key": self.api_key}

    def request_body(
        self, *, system: str, messages: list[Message], tools: list[ToolSpec]
    ) -> dict[str, Any]:
        contents: list[dict[str, Any]] = []
        for m in messages:
            if m.role == "user":
                contents.append({"role": "user", "parts": [{"text": m.text}]})
            elif m.role == "assistant":
                parts: list[dict[str, Any]] = copy.deepcopy(
                    list(m.replay.get(REPLAY_KEY) or [])
                )
                if parts:
                    # The model's own turn, signatures on the parts that bore them.
                    contents.append({"role": "model", "parts": parts})
                    continue
                if m.text:
                    parts.append({"text": m.text})
                for c in m.tool_calls:
                    call: dict[str, Any] = {"name": c.name, "args": c.arguments}
                    if not c.id.startswith("gemini-"):
                        call["id"] = c.id
                    parts.append({"functionCall": call})
                if parts:  # the API refuses a turn without parts
                    contents.append({"role": "model", "parts": parts})
            elif m.role == "tool":
                response: dict[str, Any] = {
                    "name": m.tool_name,
                    "response": m.result or {},
                }
                if not m.tool_call_id.startswith("gemini-"):
                    response["id"] = m.tool_call_id
                part = {"functionResponse": response}
                last = contents[-1] if contents else None
                if (
                    last
                    and last["role"] == "user"
                    and "functionResponse" in last["parts"][0]
                ):
                    last["parts"].append(part)
                else:
                    contents.append({"role": "user", "parts": [part]})
        body: dict[str, Any] = {
            "systemInstruction": {"parts": [{"text": system}]},
            "contents": contents,
        }
        if tools:
            body["tools"] = [{"functionDeclarations": [_declaration(t) for t in tools]}]
        if self.max_tokens:
            body["generationConfig"] = {"maxOutputTokens": self.max_tokens}
        return body

    def parse_reply(self, data: dict[str, Any]) -> BrainReply:
        try:
            candidate = data["candidates"][0]
        except (KeyError, IndexError, TypeError):
            feedback = (data.get("promptFeedback") or {}).get("blockReason")
            what = (
                f"no candidates (blocked: {feedback})" if feedback else "no candidates"
            )
            raise shape_error(vendor=self.vendor, what=what) from None
        content = candidate.get("content") if isinstance(candidate, dict) else None
        if not isinstance(candidate, dict) or not isinstance(content or {}, dict):
            raise shape_error(
                vendor=self.vendor, what="candidates[0].content is not an object"
            )
        parts = objects(
            (content or {}).get("parts"),
            vendor=self.vendor,
            what="candidates[0].content.parts",
        )
        texts, calls = [], []
        for i, part in enumerate(parts):
            if "text" in part and not part.get("thought"):
                texts.append(part["text"] or "")
            elif "functionCall" in part:
                fc = part["functionCall"]
                fc = fc if isinstance(fc, dict) else {}
                calls.append(
                    tool_call_read(
                        # Older models send no id; keep one locally, never sent back.
                        id=str(fc.get("id") or f"gemini-{i}"),
                        name=fc.get("name"),
                        raw=fc.get("args"),
                    )
                )
        usage = data.get("usageMetadata")
        usage = usage if isinstance(usage, dict) else {}
        return BrainReply(
            text="".join(texts),
            tool_calls=calls,
            stop_reason=candidate.get("finishReason") or "",
            usage=usage,
            tokens=usage_tokens(usage) if usage else None,
            replay={REPLAY_KEY: copy.deepcopy(parts)} if parts else {},
        )


def usage_tokens(usage: dict[str, Any]) -> TokenUsage:
    """Read Gemini's ``usageMetadata``; a missing total is the sum of the parts."""
    read = count(usage.get("promptTokenCount")) + count(
        usage.get("toolUsePromptTokenCount")
    )
    wrote = count(usage.get("candidatesTokenCount")) + count(
        usage.get("thoughtsTokenCount")
    )
    return TokenUsage(
        input_tokens=read,
        output_tokens=wrote,
        total_tokens=count(usage.get("totalTokenCount")) or read + wrote,
    )
