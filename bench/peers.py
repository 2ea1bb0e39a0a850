"""One system, one fresh process: ``python -m bench.peers SYSTEM --dir DIR --steps N``.

``bench_peers`` starts this once per system and repetition (under ``eatmydata``
for the software-cost figures) and reads one JSON line back:
``{"system": ..., "steps": N, "seconds": ...}``. Set-up (imports, schema,
tasks) is outside the timing; the timing covers N sequential durable steps,
each producing a fresh 1 KiB payload.

Systems, each as its users would set it up on SQLite:

- ``pippa``: ``tasks.executor.step``, the project's own executor as shipped:
  two commits a step, the payload a file (linked under its sha, then the
  file and its folder fsynced), SQLite ``synchronous=FULL`` except the start of a call without
  outside effects (NORMAL: losing it re-runs a call nobody saw).
- ``pippa_normal``: the same with ``PIPPA_SQLITE_SYNCHRONOUS=NORMAL`` (every
  commit outside the envelope at NORMAL; the result's commit is FULL at every
  setting), beside LangGraph at NORMAL.
- ``raw``: the same writes, files and commits with the ``sqlite3`` module
  (``bench_executor.RawExecutor``).
- ``orm``: the Django ORM doing one UPDATE and three INSERTs per step in one
  transaction, no payload file: what the ORM alone costs.
- ``langgraph``: a LangGraph loop graph, one node per superstep, checkpointed by
  ``SqliteSaver`` with ``durability="sync"`` (its saver runs WAL, and SQLite's
  default ``synchronous=FULL``).
- ``langgraph_normal``: the same with the saver's connection at
  ``synchronous=NORMAL``.
- ``langgraph_files``: LangGraph doing the design's work, as shipped otherwise:
  each node writes its payload as a content-addressed file with our
  ``FolderStore`` (linked under its sha, the file and its folder fsynced) and
  its state holds the sha, so the checkpoint holds a ref, never the payload.
  Not a target: the like-for-like figure beside the one the issue asks for.
- ``dbos``: a DBOS workflow of N ``@DBOS.step`` calls on a SQLite system
  database. DBOS 3.4's SQLite system database fails to launch under Python
  3.12 and 3.13 and runs under 3.11, so ``bench_peers`` runs this one under an
  interpreter of its own (``DBOS_PYTHON``, or a venv made from the machine's
  ``python3`` 3.11); this module imports nothing of Django for it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

SYSTEMS = (
    "pippa",
    "pippa_normal",
    "raw",
    "orm",
    "langgraph",
    "langgraph_normal",
    "langgraph_files",
    "dbos",
)
REPO = Path(__file__).resolve().parent.parent


def payload(n: int, size: int) -> bytes:
    head = f"bench step {n} {time.time_ns()} ".encode()
    return (head * (size // len(head) + 1))[:size]


def _django(data_dir: Path, template: Path | None) -> None:
    """Set Django up on a fresh data dir, from a migrated template database."""
    os.environ["PIPPA_DATA_DIR"] = str(data_dir)
    os.environ.pop("PIPPA_BLOB_DIR", None)
    os.environ.pop("PIPPA_SQLITE_PATH", None)
    os.environ.pop("DATABASE_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "pippa_site.settings"
    os.environ.setdefault("PIPPA_PLAIN_STATIC", "1")
    data_dir.mkdir(parents=True, exist_ok=True)
    if template is not None:
        shutil.copyfile(template, data_dir / "pippa.sqlite3")
    sys.path.insert(0, str(REPO))
    import django

    django.setup()


def prepare(data_dir: Path) -> Path:
    """Migrate a database once; the Django-based systems start from a copy."""
    _django(data_dir, None)
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()
    return data_dir / "pippa.sqlite3"


def _conversation():
    from django.contrib.auth import get_user_model

    from tasks.models import Conversation

    user = get_user_model().objects.create(username="bench")
    return Conversation.objects.create(owner=user, title="bench")


def run_pippa(data_dir: Path, template: Path, steps: int, size: int) -> float:
    _django(data_dir, template)
    from bench import bench_executor

    bench_executor.PAYLOAD_BYTES = size
    bench_executor.tool_setup()
    side = bench_executor.ExecutorSide(
        bench_executor._make_tasks(_conversation(), steps)
    )
    return side.run(steps)


def run_pippa_normal(data_dir: Path, template: Path, steps: int, size: int) -> float:
    """Ours with ``PIPPA_SQLITE_SYNCHRONOUS=NORMAL``: the opt-in to less
    durability outside the envelope (the result's commit stays FULL)."""
    os.environ["PIPPA_SQLITE_SYNCHRONOUS"] = "NORMAL"
    return run_pippa(data_dir, template, steps, size)


def run_raw(data_dir: Path, template: Path, steps: int, size: int) -> float:
    _django(data_dir, template)
    from django.conf import settings
    from django.db import connection

    from bench import bench_executor

    bench_executor.PAYLOAD_BYTES = size
    bench_executor.tool_setup()
    task_ids = bench_executor._make_tasks(_conversation(), steps)
    connection.close()
    raw = bench_executor.RawExecutor(
        settings.DATABASES["default"]["NAME"], Path(settings.BLOB_DIR), task_ids
    )
    seconds = raw.run(steps)
    raw.db.close()
    return seconds


def run_orm(data_dir: Path, template: Path, steps: int, size: int) -> float:
    _django(data_dir, template)
    from django.db import transaction
    from django.db.models import F
    from django.utils import timezone

    from tasks.models import Event, Task

    task = Task.objects.create(conversation=_conversation(), title="orm")
    started = time.perf_counter()
    for n in range(steps):
        with transaction.atomic():
            Task.objects.filter(pk=task.pk).update(
                last_seq=F("last_seq") + 3, updated_at=timezone.now()
            )
            for i, kind in enumerate(
                ("tool_call_started", "payload_persisted", "tool_result_persisted")
            ):
                Event.objects.create(
                    task=task, seq=3 * n + i + 1, kind=kind, data={"n": n}
                )
    return time.perf_counter() - started


def run_langgraph(
    data_dir: Path,
    template: Path,
    steps: int,
    size: int,
    synchronous: str = "",
    files: bool = False,
) -> float:
    import sqlite3
    from typing import TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        n: int
        payload: bytes | str  # the bytes, or with ``files`` their sha

    def work(state: State) -> dict:
        out = payload(state["n"], size)
        if files:
            out = store.put_bytes(out).sha256
        return {"n": state["n"] + 1, "payload": out}

    graph = StateGraph(State)
    graph.add_node("work", work)
    graph.add_edge(START, "work")
    graph.add_conditional_edges(
        "work", lambda state: "work" if state["n"] < steps else END
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    if files:
        from artifacts.store import FolderStore  # a filesystem class: no Django set-up

        store = FolderStore(data_dir / "blobs")
    conn = sqlite3.connect(data_dir / "langgraph.sqlite", check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    if synchronous:
        conn.execute(f"PRAGMA synchronous={synchronous}")
    app = graph.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "bench"}, "recursion_limit": steps + 10}
    started = time.perf_counter()
    final = app.invoke({"n": 0, "payload": b""}, config, durability="sync")
    seconds = time.perf_counter() - started
    assert final["n"] == steps, final["n"]
    conn.close()
    return seconds


def run_langgraph_normal(
    data_dir: Path, template: Path, steps: int, size: int
) -> float:
    return run_langgraph(data_dir, template, steps, size, synchronous="NORMAL")


def run_langgraph_files(data_dir: Path, template: Path, steps: int, size: int) -> float:
    return run_langgraph(data_dir, template, steps, size, files=True)


def _sqlite_subsec_shim() -> None:
    """Give SQLite < 3.42 the ``unixepoch('subsec')`` DBOS's schema defaults use.

    Debian 12's SQLite is 3.40, where that call returns NULL and DBOS fails to
    launch (NOT NULL on ``version_timestamp``). The shim is one Python call per
    defaulted column on insert, the same work the built-in does.
    """
    import sqlite3

    if sqlite3.sqlite_version_info >= (3, 42):
        return
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def unixepoch(*args):
        return time.time() if args and args[-1] == "subsec" else int(time.time())

    @event.listens_for(Engine, "connect")
    def _register(dbapi_conn, record) -> None:
        if isinstance(dbapi_conn, sqlite3.Connection):
            dbapi_conn.create_function("unixepoch", -1, unixepoch)


def run_dbos(data_dir: Path, template: Path, steps: int, size: int) -> float:
    import logging

    from dbos import DBOS

    _sqlite_subsec_shim()
    data_dir.mkdir(parents=True, exist_ok=True)
    DBOS(
        config={
            "name": "pippa-bench",
            "system_database_url": f"sqlite:///{data_dir / 'dbos.sqlite'}",
            "log_level": "WARNING",
        }
    )
    logging.getLogger("dbos").setLevel(logging.WARNING)

    @DBOS.step()
    def work(n: int) -> bytes:
        return payload(n, size)

    @DBOS.workflow()
    def workflow(count: int) -> int:
        for n in range(count):
            work(n)
        return count

    DBOS.launch()
    try:
        started = time.perf_counter()
        done = workflow(steps)
        seconds = time.perf_counter() - started
        assert done == steps
    finally:
        DBOS.destroy()
    return seconds


RUNNERS = {
    "pippa": run_pippa,
    "pippa_normal": run_pippa_normal,
    "raw": run_raw,
    "orm": run_orm,
    "langgraph": run_langgraph,
    "langgraph_normal": run_langgraph_normal,
    "langgraph_files": run_langgraph_files,
    "dbos": run_dbos,
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers")
    parser.add_argument("system", choices=[*SYSTEMS, "prepare"])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--template", type=Path)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--payload", type=int, default=1024)
    args = parser.parse_args(argv)
    if args.system == "prepare":
        print(json.dumps({"template": str(prepare(args.dir))}))
        return 0
    seconds = RUNNERS[args.system](args.dir, args.template, args.steps, args.payload)
    print(json.dumps({"system": args.system, "steps": args.steps, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
