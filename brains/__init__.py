"""Brain adapters: one neutral interface over the vendors' chat APIs.

``brain_make`` builds an adapter from plain options (the ``pippa_brain``
command and tests use it): ``kind`` picks the wire format, ``brain`` the name
recorded on the task (a ``tasks.models.Brain`` value).
"""

from __future__ import annotations

from brains.base import BACKOFF, RETRIES, TIMEOUT, BrainAdapter, BrainError

KINDS = ("openai", "anthropic", "gemini", "scripted")
# The wire format each brain speaks by default.
DEFAULT_KIND = {
    "claude": "anthropic",
    "gemini": "gemini",
    "codex": "openai",
    "kimi": "openai",
    "grok": "openai",
    "glm": "openai",
    "ollama": "openai",
    "scripted": "scripted",
}
ERR_UNKNOWN_KIND = "unknown brain kind {kind!r}: use one of " + ", ".join(KINDS)

__all__ = ["KINDS", "BrainAdapter", "BrainError", "brain_make"]


def brain_make(
    *,
    kind: str,
    brain: str = "",
    model: str = "",
    base_url: str | None = None,
    api_key: str = "",
    timeout: float = TIMEOUT,
    retries: int = RETRIES,
    backoff: float = BACKOFF,
    max_tokens: int | None = None,
) -> BrainAdapter:
    """Return the adapter for ``kind`` (see ``KINDS``). ``max_tokens`` bounds one
    answer (the vendor's default when None; Anthropic's adapter sends 4096)."""
    options = {"timeout": timeout, "retries": retries, "backoff": backoff}
    if max_tokens:
        options["max_tokens"] = max_tokens
    # Each adapter is imported when it is chosen: a runner loads one vendor's code.
    if kind == "openai":
        from brains.openai_compat import OpenAICompatBrain

        return OpenAICompatBrain(
            model=model,
            brain=brain or "codex",
            base_url=base_url,
            api_key=api_key,
            **options,
        )
    if kind == "anthropic":
        from brains.anthropic import AnthropicBrain

        extra = {"base_url": base_url} if base_url else {}
        return AnthropicBrain(
            model=model, api_key=api_key, brain=brain or "claude", **extra, **options
        )
    if kind == "gemini":
        from brains.gemini import GeminiBrain

        extra = {"base_url": base_url} if base_url else {}
        return GeminiBrain(
            model=model, api_key=api_key, brain=brain or "gemini", **extra, **options
        )
    if kind == "scripted":
        from brains.scripted import ScriptedBrain

        return ScriptedBrain(brain=brain or "scripted")
    raise ValueError(ERR_UNKNOWN_KIND.format(kind=kind))
