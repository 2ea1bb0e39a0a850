"""``{% kept_rows %}``: a task page's rows, the ones that may be kept from the rows cache."""

from __future__ import annotations

from django import template
from django.utils.datastructures import DeferredSubDict

from dashboard.rowcache import KINDS, LatePart, render_rows, template_version

register = template.Library()


class KeptRowsNode(template.Node):
    def __init__(self, kind, items, partials, version: str):
        self.kind = kind
        self.items = items
        self.partials = partials
        self.version = version

    def render(self, context):
        items = self.items.resolve(context, ignore_failures=True) or []
        partial = self.partials[self.kind.partial]
        return render_rows(self.kind, partial, context, items, self.version)


@register.tag
def kept_rows(parser, token):
    """``{% kept_rows "step-row" rows %}``: ``{% for row in rows %}{% partial
    step-row %}{% endfor %}``, each row that may be kept drawn once and then
    read from Django's cache (``dashboard.rowcache``; the kind's ``var`` is
    the loop's name). The key holds a hash of this template's source, as its
    loader read it."""
    bits = token.split_contents()
    if len(bits) != 3 or bits[1].strip("\"'") not in KINDS:
        raise template.TemplateSyntaxError(
            f"usage: {{% kept_rows KIND LIST %}}, KIND one of {sorted(KINDS)}"
        )
    origin = parser.origin
    if origin.loader is None:
        raise template.TemplateSyntaxError("'kept_rows' needs a template from a loader")
    return KeptRowsNode(
        KINDS[bits[1].strip("\"'")],
        parser.compile_filter(bits[2]),
        DeferredSubDict(parser.extra_data, "partials"),
        template_version(origin.loader.get_contents(origin)),
    )


@register.tag
def late(parser, token):
    """``{% late if CONDITION %}…{% endlate %}`` in a row's partial: a part
    shown when ``CONDITION`` (one variable of the page, with filters) holds,
    read once a list at every draw; the part itself is kept with its row
    (``dashboard.rowcache.LatePart``). The condition reads only the page's
    names (not the row, not a ``{% with %}`` name around it); no part is
    inside another."""
    bits = token.split_contents()
    if len(bits) != 3 or bits[1] != "if":
        raise template.TemplateSyntaxError(
            "usage: {% late if CONDITION %}…{% endlate %}"
        )
    condition = parser.compile_filter(bits[2])
    nodelist = parser.parse(("endlate",))
    parser.delete_first_token()
    if nodelist.get_nodes_by_type(LatePart):
        raise template.TemplateSyntaxError("a {% late %} part is inside another")
    number = parser.extra_data.get("pippa_late_parts", 0) + 1  # in this template
    parser.extra_data["pippa_late_parts"] = number
    return LatePart(condition, nodelist, number)
