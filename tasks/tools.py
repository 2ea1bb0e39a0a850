"""The tool registry: what a step may call, and how its output behaves on resume.

A tool is a function ``fn(ctx: ToolContext, **args) -> ToolResult`` registered
under a name with the artifact class of its output (1–4, docs/design.md "Four
artifact classes") and whether it has outside side effects. A tool that
declares no class is filed as class 3 (a snapshot: never re-run once its
output was persisted).

Built-in demo tools live in ``tasks.demo.tools``; users add their own by
listing modules in ``PIPPA_TOOLS`` (comma-separated import paths). The modules
are imported once, the first time the registry is read, and by the worker at
start-up so a broken module fails loudly there.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from pydantic import ConfigDict, PydanticUserError, create_model

from artifacts.models import ArtifactClass
from artifacts.store import PRIVATE_DIR, PRIVATE_FILE

log = logging.getLogger("pippa.tasks")

BUILTIN_TOOL_MODULES = ("tasks.demo.tools",)

ERR_UNKNOWN_TOOL = "no tool named {name!r} is registered"
ERR_DUPLICATE_TOOL = "a different tool is already registered as {name!r}"
ERR_BAD_TOOL_CLASS = "a tool's artifact class must be 1, 2, 3 or 4"
ERR_NO_EARLIER_OUTPUT = "step {position} has no saved output to read"
ERR_NO_ARGS_SCHEMA = "its arguments' types have no JSON schema ({why})"


class ToolNotFound(LookupError):
    pass


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    artifact_class: int = ArtifactClass.SNAPSHOT
    side_effects: bool = False
    media_type: str = "application/octet-stream"
    description: str = ""

    @functools.cached_property
    def args_schema(self) -> dict[str, Any]:
        """The JSON schema of a step's ``args``: the function's keyword arguments.

        Read from its signature (everything after ``ctx``), with the types,
        defaults and ``Field`` descriptions it declares; an argument it does not
        name is not accepted (the call would fail), so the schema says so,
        unless it takes ``**kwargs``. A type with no JSON schema (or one its
        module cannot name) gives a schema that says so instead of failing the
        list.
        """
        try:
            params = inspect.signature(self.fn, eval_str=True).parameters
            fields: dict[str, Any] = {}
            # **kwargs takes any name: the schema then names what it declares only.
            extra = "forbid"
            for param in list(params.values())[1:]:
                if param.kind == param.VAR_KEYWORD:
                    extra = "allow"
                if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                    continue
                annotation = (
                    Any if param.annotation is param.empty else param.annotation
                )
                default = ... if param.default is param.empty else param.default
                fields[param.name] = (annotation, default)
            model = create_model(
                f"{self.name} args",
                __config__=ConfigDict(extra=extra, arbitrary_types_allowed=True),
                **fields,
            )
            schema = model.model_json_schema()
        except (PydanticUserError, NameError, TypeError, ValueError) as exc:
            why = str(exc).splitlines()[0]
            return {"type": "object", "description": ERR_NO_ARGS_SCHEMA.format(why=why)}
        schema.pop("title", None)
        return schema


@dataclass
class ToolResult:
    """What a tool hands back.

    Classes 2–4 return ``data`` (the payload bytes). A class-1 tool writes its
    file under ``ctx.files_dir`` (with ``ctx.file_write``: read-only, 0400,
    like a blob) and returns its ``path``; the executor copies
    the bytes into the blob store and records the path and sha, and a resume
    reuses the file while it still hashes to that sha. ``source_ids`` names the
    artifacts a class-4 render was derived from.
    """

    data: bytes | None = None
    path: Path | str | None = None
    media_type: str = ""
    title: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    source_ids: list[int] = field(default_factory=list)


@dataclass
class ToolContext:
    """What a tool call may know: who it is, where to write, earlier outputs."""

    task_id: int
    step_id: int
    position: int
    generation: int
    attempt: int
    idempotency_key: str
    files_root: Path

    @property
    def files_dir(self) -> Path:
        """A folder for this call's class-1 files (created on first use, 0700
        like the blob store's folders, whatever the umask)."""
        path = folder_private(self.files_root)
        for part in (f"t{self.task_id}", f"s{self.step_id}-g{self.generation}"):
            path = folder_private(path / part)
        return path

    def file_write(self, name: str, data: bytes) -> Path:
        """Write one class-1 file in ``files_dir`` and return its path.

        Whole or not at all: a temp file, fsynced, made read-only (0400, as a
        blob is) and renamed over any earlier copy (a call again replaces it).
        """
        path = self.files_dir / name
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, PRIVATE_FILE)  # O_CREAT's mode only applies to a new file
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path

    def output(self, position: int):
        """Return the output artifact of an earlier step of this task."""
        # Tool modules (PIPPA_TOOLS) import this one before the apps are ready.
        from tasks.models import Step

        step = (
            Step.objects.select_related("output")
            .filter(task_id=self.task_id, position=position, output__isnull=False)
            .first()
        )
        if step is None:
            raise ToolNotFound(ERR_NO_EARLIER_OUTPUT.format(position=position))
        return step.output

    def read(self, position: int) -> bytes:
        """Return the payload bytes of an earlier step's output."""
        from artifacts.store import default_store

        return default_store().get(self.output(position).sha256)


_files_root: tuple[tuple, Path] | None = None


def files_root() -> Path:
    """Where class-1 tools write their files: beside the blob folder by default.

    Every step asks; the path is built once per setting.
    """
    global _files_root
    key = (getattr(settings, "PIPPA_FILES_DIR", None), settings.BLOB_DIR)
    if _files_root is None or _files_root[0] != key:
        root = Path(key[0]) if key[0] else Path(key[1]).parent / "files"
        _files_root = (key, root)
    return _files_root[1]


def folder_private(path: Path) -> Path:
    """Make ``path`` (and its missing parents) a folder; a new one is 0700,
    like the blob store's, whatever the umask."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(PRIVATE_DIR)  # mkdir's mode is cut by the umask; chmod is not
    return path


# A task's class-1 folder under the files root: ``t<task id>``.
TASK_FOLDER = re.compile(r"t([0-9]+)")


def task_folders() -> dict[int, Path]:
    """{task id: its class-1 folder} for every task folder under the files root."""
    try:
        entries = list(os.scandir(files_root()))
    except FileNotFoundError:
        return {}
    return {
        int(match[1]): Path(entry.path)
        for entry in entries
        if (match := TASK_FOLDER.fullmatch(entry.name)) and entry.is_dir()
    }


def task_folders_remove(task_ids) -> int:
    """Remove the class-1 folders of these tasks (gone: their delete has
    committed); return how many went. One that will not go is logged and
    left for ``pippa_doctor --repair`` (finding ``gone_task_files``)."""
    root = files_root()
    removed = 0
    for pk in task_ids:
        folder = root / f"t{int(pk)}"
        if not folder.is_dir():
            continue
        try:
            shutil.rmtree(folder)
            removed += 1
        except OSError as exc:
            if folder.exists():  # not a doctor's repair that took it first
                log.warning("could not remove %s: %s", folder, exc)
    return removed


def files_loose_paths() -> list[tuple[Path, int]]:
    """(path, the mode it should have) for each folder or file under the
    files root that other accounts may read (``pippa_doctor``): folders
    0700; a call's class-1 files (under ``t<task>/``) 0400, as
    ``ToolContext.file_write`` leaves them; a tool's own file at the root
    (the demo's outbox, appended to) its owner's bits only."""
    root = files_root()
    loose: list[tuple[Path, int]] = []
    for folder, _, names in os.walk(root):
        try:
            if os.stat(folder).st_mode & 0o077:
                loose.append((Path(folder), PRIVATE_DIR))
        except FileNotFoundError:
            continue
        for name in names:
            path = Path(folder) / name
            try:
                mode = os.stat(path).st_mode & 0o777
            except FileNotFoundError:
                continue
            if mode & 0o077:
                at_root = Path(folder) == root
                loose.append((path, mode & 0o700 if at_root else PRIVATE_FILE))
    return loose


_registry: dict[str, Tool] = {}
_loaded = False
_lock = threading.RLock()


def tool_register(
    name: str,
    fn: Callable[..., Any],
    *,
    artifact_class: int | None = None,
    side_effects: bool = False,
    media_type: str = "application/octet-stream",
    description: str = "",
) -> Tool:
    """Register ``fn`` as the tool ``name``; no class means class 3."""
    if artifact_class is None:
        artifact_class = ArtifactClass.SNAPSHOT
    try:
        artifact_class = ArtifactClass(int(artifact_class)).value
    except (TypeError, ValueError):
        raise ValueError(ERR_BAD_TOOL_CLASS) from None
    entry = Tool(
        name=name,
        fn=fn,
        artifact_class=artifact_class,
        side_effects=bool(side_effects),
        media_type=media_type,
        description=description or (fn.__doc__ or "").strip().split("\n")[0],
    )
    with _lock:
        existing = _registry.get(name)
        # Re-importing a module (autoreload, tests) registers the same function again.
        if existing is not None and (
            existing.fn.__module__,
            existing.fn.__qualname__,
        ) != (fn.__module__, fn.__qualname__):
            raise ValueError(ERR_DUPLICATE_TOOL.format(name=name))
        _registry[name] = entry
    return entry


def tool(
    name: str,
    *,
    artifact_class: int | None = None,
    side_effects: bool = False,
    media_type: str = "application/octet-stream",
    description: str = "",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator form of ``tool_register``."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        tool_register(
            name,
            fn,
            artifact_class=artifact_class,
            side_effects=side_effects,
            media_type=media_type,
            description=description,
        )
        return fn

    return decorate


def tools_load(modules: list[str] | None = None) -> list[str]:
    """Import the built-in tool modules and ``modules`` (by default those in
    ``PIPPA_TOOLS``); return the names imported."""
    global _loaded
    names = list(BUILTIN_TOOL_MODULES) + list(
        settings.PIPPA_TOOLS if modules is None else modules
    )
    with _lock:
        for module in names:
            importlib.import_module(module)
        _loaded = True
    return names


def _ensure_loaded() -> None:
    if not _loaded:
        tools_load()


def tool_get(name: str) -> Tool:
    _ensure_loaded()
    try:
        return _registry[name]
    except KeyError:
        raise ToolNotFound(ERR_UNKNOWN_TOOL.format(name=name)) from None


def tools_all() -> list[Tool]:
    _ensure_loaded()
    return sorted(_registry.values(), key=lambda t: t.name)
