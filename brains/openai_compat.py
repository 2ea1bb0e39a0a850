"""OpenAI-compatible Chat Completions (REST ``v1``): OpenAI/Codex, Kimi, Grok, GLM, Ollama.

Wire format (POST ``{base_url}/chat/completions``, ``Authorization: Bearer``):
request ``{"model", "messages", "tools": [{"type": "function", "function":
{"name", "description", "parameters"}}]}``, with ``max_tokens`` only when one
is set (OpenAI's reasoning models refuse it: they take
``max_completion_tokens``; llama.cpp and Ollama honour it); the assistant's
calls come back in ``choices[0].message.tool_calls[]`` as ``{"id", "type": "function",
"function": {"name", "arguments": "<JSON string>"}}`` with ``finish_reason``
"tool_calls"; each result goes back as ``{"role": "tool", "tool_call_id",
"content"}``. Ollama serves the same shape at ``http://host:11434/v1``.

An assistant turn that carries tool calls goes back with ``"content": ""``,
never ``null``: OpenAI takes either, but llama-cpp-python's server refuses
``null`` (its request model wants a string; HTTP 500) and its chat templates
fail without the key. Token counts come in ``usage`` (``prompt_tokens``,
``completion_tokens``, ``total_tokens``), from OpenAI, llama.cpp and Ollama alike.
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

# Where each brain's OpenAI-compatible endpoint lives by default.
DEFAULT_BASE_URLS = {
    "codex": "https://api.openai.com/v1",
    "kimi": "https://api.moonshot.ai/v1",
    "grok": "https://api.x.ai/v1",
    "glm": "https://open.bigmodel.cn/api/paas/v4",
    "ollama": "http://127.0.0.1:11434/v1",
}


class OpenAICompatBrain(HttpBrainAdapter):
    vendor = "openai-compatible"

    def __init__(
        self,
        *,
        model: str,
        brain: str = "codex",
        base_url: str | None = None,
        api_key: str = "",
        timeout: float = TIMEOUT,
        retries: int = RETRIES,
        backoff: float = BACKOFF,
        max_tokens: int | None = None,
    ):
        self.vendor = f"{brain} (OpenAI-compatible)"
        super().__init__(
            brain=brain,
            model=model,
            api_key=api_key,
            base_url=base_url or DEFAULT_BASE_URLS.get(brain, ""),
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_tokens=max_tokens,
        )

    def endpoint(self) -> str:
        return f"{self.base_url}/chat/completions"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def request_body(
        self, *, system: str, messages: list[Message], tools: list[ToolSpec]
    ) -> dict[str, Any]:
        wire: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for m in messages:
            if m.role == "user":
                wire.append({"role": "user", "content": m.text})
            elif m.role == "assistant":
                entry: dict[str, Any] = {"role": "assistant", "content": m.text}
                if m.tool_calls:
                    entry["tool_calls"] = [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {
                                "name": c.name,
                                "arguments": json.dumps(c.arguments),
                            },
                        }
                        for c in m.tool_calls
                    ]
                wire.append(entry)
            elif m.role == "tool":
                wire.append(
                    {
                        "role": "tool",
                        "tool_call_id": m.tool_call_id,
                        "content": json.dumps(m.result),
                    }
                )
        body: dict[str, Any] = {"model": self.model, "messages": wire}
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ]
            body["tool_choice"] = "auto"
        return body

    def parse_reply(self, data: dict[str, Any]) -> BrainReply:
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise shape_error(
                vendor=self.vendor, what="no choices[0].message"
            ) from None
        if not isinstance(message, dict):
            raise shape_error(vendor=self.vendor, what="no choices[0].message")
        calls = []
        raw_calls = message.get("tool_calls")
        for i, raw in enumerate(
            objects(raw_calls, vendor=self.vendor, what="message.tool_calls")
        ):
            fn = raw.get("function")
            fn = fn if isinstance(fn, dict) else {}
            calls.append(
                tool_call_read(
                    id=str(raw.get("id") or f"call_{i}"),
                    name=fn.get("name"),
                    raw=fn.get("arguments"),
                )
            )
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        text = message.get("content")
        return BrainReply(
            text=text if isinstance(text, str) else "",
            tool_calls=calls,
            stop_reason=choice.get("finish_reason") or "",
            usage=usage,
            tokens=usage_tokens(usage) if usage else None,
        )


def usage_tokens(usage: dict[str, Any]) -> TokenUsage:
    """Read an OpenAI-style ``usage``; a missing total is the sum of the parts."""
    read = count(usage.get("prompt_tokens"))
    wrote = count(usage.get("completion_tokens"))
    return TokenUsage(
        input_tokens=read,
        output_tokens=wrote,
        total_tokens=count(usage.get("total_tokens")) or read + wrote,
    )
