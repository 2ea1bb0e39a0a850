"""The artifact page's lineage picture: a small SVG graph drawn by the server.

Sources sit in rows above the artifact, what was derived from it in rows below,
and an arrow runs from each source to what was made from it. The SVG is plain
markup built here from rows already read by ``artifact_lineage``: no script, no
inline style (the site's CSP forbids both), colours from the stylesheet's
custom properties so dark mode applies, every text escaped. The nested lists
under it stay the complete, accessible account; the picture shows at most
``MAX_LEVELS`` rows each way and ``MAX_PER_ROW`` boxes a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from artifacts.models import Artifact
from artifacts.selectors import LineageNode

MAX_LEVELS = 3
MAX_PER_ROW = 5
BOX_W, BOX_H = 230, 54
GAP_X, GAP_Y = 16, 38
PAD = 8
TITLE_CHARS = 22


@dataclass
class Box:
    artifact: Artifact | None  # None: the "+N more" box of a full row
    level: int
    more: int = 0
    x: int = 0
    y: int = 0


@dataclass
class Graph:
    rows: dict[int, list[Box]] = field(default_factory=dict)
    edges: set[tuple[int, int]] = field(default_factory=set)  # (from pk, to pk)
    hidden: dict[int, int] = field(default_factory=dict)  # level -> boxes left out

    def place(self, artifact: Artifact, level: int) -> bool:
        """Add a box unless the artifact is already drawn; False if its row is full."""
        if any(
            b.artifact and b.artifact.pk == artifact.pk
            for r in self.rows.values()
            for b in r
        ):
            return True
        row = self.rows.setdefault(level, [])
        if len(row) >= MAX_PER_ROW:
            self.hidden[level] = self.hidden.get(level, 0) + 1
            return False
        row.append(Box(artifact, level))
        return True


def _walk(
    graph: Graph, nodes: list[LineageNode], below: Artifact, level: int, up: bool
):
    """Add ``nodes`` (sources when ``up``) one row further from the artifact."""
    if abs(level) > MAX_LEVELS:
        return
    for node in nodes:
        if not graph.place(node.artifact, level):
            continue
        pair = (node.artifact.pk, below.pk) if up else (below.pk, node.artifact.pk)
        graph.edges.add(pair)
        step = -1 if up else 1
        _walk(graph, node.children, node.artifact, level + step, up)


def lineage_graph(
    *, artifact: Artifact, lineage: dict[str, list[LineageNode]]
) -> Graph | None:
    """Lay out the boxes and arrows; None when the artifact has no lineage."""
    if not lineage["sources"] and not lineage["derived"]:
        return None
    graph = Graph()
    graph.place(artifact, 0)
    _walk(graph, lineage["sources"], artifact, -1, up=True)
    _walk(graph, lineage["derived"], artifact, 1, up=False)
    for level, count in graph.hidden.items():
        graph.rows[level].append(Box(None, level, more=count))
    widest = max(len(row) for row in graph.rows.values())
    width = widest * (BOX_W + GAP_X) - GAP_X
    for index, level in enumerate(sorted(graph.rows)):
        row = graph.rows[level]
        row_width = len(row) * (BOX_W + GAP_X) - GAP_X
        left = PAD + (width - row_width) // 2
        for i, box in enumerate(row):
            box.x = left + i * (BOX_W + GAP_X)
            box.y = PAD + index * (BOX_H + GAP_Y)
    return graph


def _short(text: str) -> str:
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"


def _box_svg(box: Box, current: Artifact) -> str:
    if box.artifact is None:
        return format_html(
            '<g class="more"><rect x="{}" y="{}" width="{}" height="{}" rx="8"/>'
            '<text x="{}" y="{}">and {} more (listed below)</text></g>',
            box.x,
            box.y,
            BOX_W,
            BOX_H,
            box.x + 12,
            box.y + 32,
            box.more,
        )
    a = box.artifact
    title = a.title or f"Artifact {a.pk}"
    inner = format_html(
        '<rect class="box" x="{x}" y="{y}" width="{w}" height="{h}" rx="8"/>'
        '<rect class="bar cls-fill-{c}" x="{x}" y="{y}" width="6" height="{h}" rx="3"/>'
        '<text class="kind" x="{tx}" y="{y1}">{label} · artifact {pk}</text>'
        '<text class="name" x="{tx}" y="{y2}">{short}</text>',
        x=box.x,
        y=box.y,
        w=BOX_W,
        h=BOX_H,
        c=a.artifact_class,
        tx=box.x + 16,
        y1=box.y + 21,
        y2=box.y + 41,
        label=a.class_label.lower(),
        pk=a.pk,
        short=_short(title),
    )
    # A link's name is its visible words (WCAG 2.5.3); a shortened title is
    # whole in the list under the picture.
    words = f"{a.class_label.lower()} · artifact {a.pk}: {_short(title)}"
    if a.pk == current.pk:
        return format_html(
            '<g class="node current" role="img" aria-label="{} (this artifact)">{}</g>',
            words,
            inner,
        )
    return format_html(
        '<a class="node" href="{}">{}</a>',
        a.get_absolute_url(),
        inner,
    )


def lineage_svg(
    *, artifact: Artifact, lineage: dict[str, list[LineageNode]]
) -> SafeString:
    """Return the lineage picture as inline SVG markup, or "" when there is none."""
    graph = lineage_graph(artifact=artifact, lineage=lineage)
    if graph is None:
        return mark_safe("")
    boxes = {b.artifact.pk: b for row in graph.rows.values() for b in row if b.artifact}
    width = max(b.x for row in graph.rows.values() for b in row) + BOX_W + PAD
    height = max(b.y for row in graph.rows.values() for b in row) + BOX_H + PAD
    arrows = []
    for src, dst in sorted(graph.edges):
        a, b = boxes[src], boxes[dst]
        x1, y1 = a.x + BOX_W // 2, a.y + BOX_H
        x2, y2 = b.x + BOX_W // 2, b.y - 4
        mid = (y1 + y2) // 2
        arrows.append(
            f'<path d="M{x1} {y1} C{x1} {mid} {x2} {mid} {x2} {y2}" marker-end="url(#arrow)"/>'
        )
    parts = [
        format_html(
            '<svg class="lineage-svg" xmlns="http://www.w3.org/2000/svg" width="{w}" '
            'height="{h}" viewBox="0 0 {w} {h}" role="group" aria-label="{label}">',
            w=width,
            h=height,
            label=f"Lineage of {artifact.title or 'this artifact'}",
        ),
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0 0L10 5L0 10z"/></marker></defs>',
        '<g class="edges" aria-hidden="true">',
        *arrows,
        "</g>",
        *(
            _box_svg(box, artifact)
            for level in sorted(graph.rows)
            for box in graph.rows[level]
        ),
        "</svg>",
    ]
    return mark_safe("".join(str(p) for p in parts))  # every piece escaped above
