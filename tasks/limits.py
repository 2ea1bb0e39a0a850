"""The limits of a task's documents and of the names runners give themselves.

Each is the one constant its rule reads: the service that enforces it
(``tasks.resume_document``, ``tasks.services``), every door that states it in
a schema (the JSON API, MCP) and the brain runner's tool specs
(``brains.prompt``). Plain numbers in a module with no imports, so the runner
reads them without a Django project (``brains.runner.HttpBackend`` runs on
another machine).
"""

from __future__ import annotations

# The resume document's JSON, in characters (``tasks.resume_document``): at
# most this many; a door may ask for less, down to the minimum.
DOCUMENT_MAX_CHARS = 4000
DOCUMENT_MIN_CHARS = 1500
# ``read_steps``: a page's default and largest size.
PAGE_STEPS = 20
MAX_PAGE_STEPS = 50
# The brain's note on a task (``tasks.services.task_note_write``).
NOTE_MAX_CHARS = 1000
# The name a runner or an agent gives itself at a door (the API's and MCP's
# ``worker``); its lease is held under it (``tasks.lease.door_worker_id``).
WORKER_NAME_MAX = 80
