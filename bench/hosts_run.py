"""The child of ``bench_hosts``: ``python -m bench.hosts_run OUT URL STEPS FOLDER``.

Makes the bench's PostgreSQL database afresh, starts SeaweedFS, and for each
store and number of workers steps ``STEPS`` 1 KiB payload steps with that
many ``pippa_worker`` processes, each with its own data folder; writes the
steps/s of each run as JSON to OUT (or ``{"skipped": why}``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

STEPS_PER_TASK = 20
BUCKET = "pippa-bench"


def _database(url: str) -> None:
    """Drop and make the bench's database (never another host than loopback)."""
    import psycopg

    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("PIPPA_BENCH_DATABASE_URL must point at loopback")
    name = parts.path.lstrip("/")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            [name],
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def main(out: str, url: str, steps: int, folder: str) -> None:
    root = Path(folder)
    try:
        _database(url)
    except Exception as exc:  # noqa: BLE001 - said in the table, not raised
        Path(out).write_text(json.dumps({"skipped": f"no PostgreSQL at {url}: {exc}"}))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    # The tests' way to run SeaweedFS: one spelling of its ports and flags.
    from tests.support.seaweed import SeaweedFS, WeedUnavailable, s3_variables

    try:
        server = SeaweedFS.start(root / "seaweedfs")
    except WeedUnavailable as exc:
        Path(out).write_text(json.dumps({"skipped": str(exc)}))
        return
    try:
        os.environ.update(s3_variables(server.endpoint))
        os.environ["DATABASE_URL"] = url
        os.environ["PIPPA_DATA_DIR"] = str(root / "bench-data")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pippa_site.settings")
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        runs = []
        for store in ("folder", "s3"):
            for workers in (1, 2, 3):
                runs.append(_one(root, store, workers, steps, server))
        Path(out).write_text(json.dumps({"steps": steps, "runs": runs}))
    finally:
        server.stop()


def _one(root: Path, store: str, workers: int, steps: int, server) -> dict:
    from django.conf import settings
    from django.db.models import Max, Min

    from bench.bench_executor import tool_setup
    from tasks.models import Conversation, Step
    from tasks.plan import task_create

    tool_setup()
    from django.contrib.auth import get_user_model

    owner, _ = get_user_model().objects.get_or_create(username="bench-hosts")
    run = uuid.uuid4().hex[:8]
    blob_url = f"s3://{BUCKET}/{run}" if store == "s3" else ""
    settings.PIPPA_BLOB_URL = blob_url
    if store == "s3":
        from artifacts.store import default_store

        default_store().bucket_create()
    conversation = Conversation.objects.create(owner=owner, title=f"{store} {workers}")
    ids = []
    for start in range(0, steps, STEPS_PER_TASK):
        n = min(STEPS_PER_TASK, steps - start)
        ids.append(
            task_create(
                conversation=conversation,
                title="bench",
                steps=[
                    {"title": f"s{i}", "tool": "bench.payload", "args": {}}
                    for i in range(n)
                ],
            ).pk
        )
    shared_blobs = root / f"blobs-{run}"
    children = []
    for n in range(workers):
        host = root / f"{run}-host{n}"
        env = {
            **os.environ,
            "PIPPA_DATA_DIR": str(host),
            # The bucket's workers share nothing but it and the database; the
            # folder's share the one disk (the reference).
            "PIPPA_BLOB_DIR": str(host / "blobs" if store == "s3" else shared_blobs),
            "PIPPA_BLOB_URL": blob_url,
            "PIPPA_TOOLS": "bench.load_tools",
            "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        }
        argv = [sys.executable, "manage.py", "pippa_worker", "--until-idle"]
        argv += ["--worker-id", f"{run}-{n}", "--poll", "0.05", "-v", "0"]
        for task_id in ids:
            argv += ["--task", str(task_id)]
        children.append(
            subprocess.Popen(argv, cwd=Path(__file__).resolve().parent.parent, env=env)
        )
    for child in children:
        if child.wait(timeout=3600) != 0:
            raise SystemExit(f"a worker exited with {child.returncode}")
    done = Step.objects.filter(task_id__in=ids, status=Step.Status.DONE)
    span = done.aggregate(first=Min("finished_at"), last=Max("finished_at"))
    seconds = (span["last"] - span["first"]).total_seconds()
    count = done.count()
    if count != steps:
        raise SystemExit(f"{store}, {workers} workers: {count} of {steps} steps done")
    return {
        "store": store,
        "workers": workers,
        "steps": count,
        "seconds": round(seconds, 3),
        "steps_per_second": round(count / seconds, 1) if seconds > 0 else 0.0,
    }


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
