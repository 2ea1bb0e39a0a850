"""Child process: append N events to one task as fast as possible.

Usage: python -m tests.support.append_events TASK_ID N LABEL
Waits for the file named by $PIPPA_GO (if set) so both children start together.
"""

from __future__ import annotations

import os
import sys
import time

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pippa_site.settings")
    django.setup()
    from tasks.services import event_append

    task_id, count, label = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    go = os.environ.get("PIPPA_GO")
    if go:
        open(f"{go}.{label}.ready", "w").close()
    deadline = time.monotonic() + 30
    while go and not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.time()
    for i in range(count):
        event_append(task_id=task_id, kind="probe", data={"writer": label, "i": i})
    if go:
        with open(f"{go}.{label}.span", "w") as fh:
            fh.write(f"{started} {time.time()}")


if __name__ == "__main__":
    main()
