"""Reads for the dashboard: one module per part of the pages it serves.

- ``home``: the home and conversation pages (the list, its totals and version,
  the to-do list, a conversation's tasks and rounds);
- ``timeline``: the task page's step rows (attempts, notes, advice, bars);
- ``clock``: the task's time axis (its span, time paused);
- ``outputs``: what a row shows of a step's output (previews, excerpts, a
  saved search's headlines, the artifact pages' addresses);
- ``events``: the task page's event log and the resume document's fold.

Every selector returns rows with their related objects already joined
(``select_related``) or batched (``prefetch_related``), so a page's number of
queries does not grow with the number of conversations, steps or events.

Who sees what is ``pippa_site.owners``' rule: the selectors take ``staff``
from the view (default False), and a page that reads passes
``staff_reads(request)``, so staff see every row on the dashboard's pages; a
page that writes, or its confirmation, acts on the user's own rows.
"""
