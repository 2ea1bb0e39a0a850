"""Anthropic Messages API (Claude).

Wire format (POST ``{base_url}/v1/messages`` with ``x-api-key`` and
``anthropic-version``, the setting ``PIPPA_ANTHROPIC_VERSION``): request
``{"model", "max_tokens", "system", "messages", "tools": [{"name",
"description", "input_schema"}]}``. The answer's ``content[]`` holds
``{"type": "text"}`` and ``{"type": "tool_use", "id", "name", "input"}``
blocks with ``stop_reason`` "tool_use"; results go back in the next user
message as ``{"type": "tool_result", "tool_use_id", "content", "is_error"?}``
blocks. Token counts come in ``usage``: ``input_tokens`` (the uncached part of
the prompt), ``cache_creation_input_tokens``, ``cache_read_input_tokens`` and
``output_tokens``.
"""

from __future__ import annotations

import json
from typing import Any

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


class AnthropicBrain(HttpBrainAdapter):
    name = "claude"
    vendor = "Anthropic"

    def __init__(
        self,
        *,
        model: str,
        api_key: str,
        base_url: str = "https://api.anthropic.com",
        max_tokens: int = 4096,
        timeout: float = TIMEOUT,
        retries: int = RETRIES,
        backoff: float = BACKOFF,
        brain: str = "claude",
        api_version: str | None = None,
    ):
        from django.conf import settings

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
        self.api_version = api_version or settings.PIPPA_ANTHROPIC_VERSION

    def endpoint(self) -> str:
        return f"{self.base_url}/v1/messages"

    def headers(self) -> dict[str, str]:
        return {"x-api-key": self.api_key, "anthropic-version": self.api_version}

    def request_body(
        self, *, system: str, messages: list[Message], tools: list[ToolSpec]
    ) -> dict[str, Any]:
        wire: list[dict[str, Any]] = []
        for m in messages:
            if m.role == "user":
                wire.append({"role": "user", "content": m.text})
            elif m.role == "assistant":
                blocks: list[dict[str, Any]] = []
                if m.text:
                    blocks.append({"type": "text", "text": m.text})
                blocks.extend(
                    {
                        "type": "tool_use",
                        "id": c.id,
                        "name": c.name,
                        "input": c.arguments,
                    }
                    for c in m.tool_calls
                )
                wire.append({"role": "assistant", "content": blocks})
            elif m.role == "tool":
                block = {
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id,
                    "content": json.dumps(m.result),
                }
                if (m.result or {}).get("error"):
                    block["is_error"] = True
                # Consecutive tool results share one user message.
                if (
                    wire
                    and wire[-1]["role"] == "user"
                    and isinstance(wire[-1]["content"], list)
                ):
                    wire[-1]["content"].append(block)
                else:
                    wire.append({"role": "user", "content": [block]})
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": system,
            "messages": wire,
        }
        if tools:
            body["tools"] = [
                {
                    "name": t.name,
                    "description": t.description,
                    "input_schema": t.parameters,
                }
                for t in tools
            ]
        return body

    def parse_reply(self, data: dict[str, Any]) -> BrainReply:
        content = data.get("content")
        if data.get("type") == "error" or not isinstance(content, list):
            raise shape_error(vendor=self.vendor, what="no content[]")
        texts, calls = [], []
        for block in objects(content, vendor=self.vendor, what="content"):
            kind = block.get("type")
            if kind == "text":
                texts.append(block.get("text") or "")
            elif kind == "tool_use":
                if not block.get("id"):
                    # Its result could not be matched to it: the API's own fault.
                    raise shape_error(vendor=self.vendor, what="tool_use without id")
                calls.append(
                    tool_call_read(
                        id=block["id"], name=block.get("name"), raw=block.get("input")
                    )
                )
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        return BrainReply(
            text="\n".join(t for t in texts if t),
            tool_calls=calls,
            stop_reason=data.get("stop_reason") or "",
            usage=usage,
            tokens=usage_tokens(usage) if usage else None,
        )


def usage_tokens(usage: dict[str, Any]) -> TokenUsage:
    """Read Anthropic's ``usage``: the prompt is its uncached and cached parts."""
    read = (
        count(usage.get("input_tokens"))
        + count(usage.get("cache_creation_input_tokens"))
        + count(usage.get("cache_read_input_tokens"))
    )
    wrote = count(usage.get("output_tokens"))
    return TokenUsage(input_tokens=read, output_tokens=wrote, total_tokens=read + wrote)
