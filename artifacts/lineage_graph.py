"""The artifact page's lineage picture: where its boxes and arrows go.

Sources sit in rows above the artifact, what was derived from it in rows below,
and an arrow runs from each source to what was made from it. ``lineage_graph``
lays them out from rows already read by ``artifact_lineage``; the template
``artifacts/_lineage_graph.html`` draws the layout as inline SVG (no script, no
inline style: the site's CSP forbids both; colours from the stylesheet's custom
properties, so dark mode applies; every text escaped by the template engine).
The nested lists under it stay the complete, accessible account; the picture
shows at most ``MAX_LEVELS`` rows each way and ``MAX_PER_ROW`` boxes a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

from artifacts.models import Artifact
from artifacts.selectors import LineageNode

MAX_LEVELS = 3
MAX_PER_ROW = 5
BOX_W, BOX_H = 230, 54
GAP_X, GAP_Y = 16, 38
PAD = 8
# A box shows this many characters of a title (the template's
# ``truncatechars``, its "…" included); the list under the picture has it whole.
TITLE_CHARS = 22


@dataclass
class Box:
    artifact: Artifact | None  # None: the "+N more" box of a full row
    level: int
    more: int = 0
    x: int = 0
    y: int = 0

    @property
    def title(self) -> str:
        a = self.artifact
        return (a.title or f"Artifact {a.pk}") if a else ""

    # Where its words go: the class and id, then the title (or "N more").
    @property
    def text_x(self) -> int:
        return self.x + 16 if self.artifact else self.x + 12

    @property
    def kind_y(self) -> int:
        return self.y + 21

    @property
    def name_y(self) -> int:
        return self.y + 41 if self.artifact else self.y + 32


class Arrow(NamedTuple):
    """A curve from the bottom middle of a source's box to above its derived one."""

    x1: int
    y1: int
    x2: int
    y2: int
    mid: int


@dataclass
class Graph:
    rows: dict[int, list[Box]] = field(default_factory=dict)
    edges: set[tuple[int, int]] = field(default_factory=set)  # (from pk, to pk)
    hidden: dict[int, int] = field(default_factory=dict)  # level -> boxes left out
    width: int = 0
    height: int = 0
    arrows: list[Arrow] = field(default_factory=list)
    # The sizes every graph shares, for the template.
    box_w: ClassVar[int] = BOX_W
    box_h: ClassVar[int] = BOX_H
    title_chars: ClassVar[int] = TITLE_CHARS

    @property
    def boxes(self) -> list[Box]:
        """Every box, row by row from the top."""
        return [box for level in sorted(self.rows) for box in self.rows[level]]

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
    graph.width = max(b.x for b in graph.boxes) + BOX_W + PAD
    graph.height = max(b.y for b in graph.boxes) + BOX_H + PAD
    graph.arrows = _arrows(graph)
    return graph


def _arrows(graph: Graph) -> list[Arrow]:
    boxes = {b.artifact.pk: b for row in graph.rows.values() for b in row if b.artifact}
    arrows = []
    for src, dst in sorted(graph.edges):
        a, b = boxes[src], boxes[dst]
        x1, y1 = a.x + BOX_W // 2, a.y + BOX_H
        x2, y2 = b.x + BOX_W // 2, b.y - 4
        arrows.append(Arrow(x1, y1, x2, y2, (y1 + y2) // 2))
    return arrows
