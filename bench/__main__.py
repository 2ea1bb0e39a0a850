"""``make bench``: run every bench module and print one table.

``python -m bench`` runs all; ``python -m bench store executor`` runs some;
``--quick`` shrinks sizes for a smoke run.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import shutil
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    names = [a for a in argv if not a.startswith("-")]
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here.parent))
    data_dir = tempfile.mkdtemp(
        prefix="pippa-bench-", dir=os.environ.get("PIPPA_BENCH_DIR")
    )
    os.environ["PIPPA_DATA_DIR"] = data_dir
    os.environ.pop("PIPPA_BLOB_DIR", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pippa_site.settings")
    os.environ.setdefault("PIPPA_PLAIN_STATIC", "1")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    from bench.harness import Report

    report = Report(quick=quick)
    modules = sorted(
        m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_")
    )
    if names:
        modules = [m for m in modules if m.removeprefix("bench_") in names]
    started = time.time()
    for name in modules:
        print(f"[{name}]", flush=True)
        importlib.import_module(f"bench.{name}").run(report)
    print()
    print(
        f"Pippa Stateful benchmark ({'quick' if quick else 'full'} run, "
        f"{time.time() - started:.0f} s, data dir {data_dir}); ratio = value / baseline"
    )
    print(report.table())
    for section in report.sections:
        print()
        print(section)
    shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
