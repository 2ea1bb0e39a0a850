"""Widget previews: capped render cost, and serving a cached preview.

- Render (cold): ``render_png`` starts a fresh locked-down subprocess for every
  widget, so every render is cold. Baseline: the same cairosvg + Pillow work
  in this process with no isolation, i.e. what the caps and the subprocess cost.
- Serving: GET of a widget's cached preview PNG through the whole stack (session,
  owner check through lineage, blob open) against a static file of the same
  size served by ``django.views.static.serve`` through the same middleware.
- Context size: the branch context with a 5 MB widget against one with a 4 KB
  widget; the ratio shows it does not grow with the payload.
"""

from __future__ import annotations

import http.client
import io
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.test.utils import override_settings
from django.urls import include, path
from django.views.static import serve

from artifacts.preview import CAPS, render_png
from artifacts.store import default_store
from bench.harness import Report, interleaved_ms, median_ms
from bench.server import collectstatic, gunicorn, server_env
from council.demo import demo_round_load, risk_map_svg
from council.services import (
    context_bytes,
    round_start,
    serialize_branch_context,
    turn_add,
)
from tasks.models import Conversation

STATIC_DIR = Path(tempfile.mkdtemp(prefix="bench-static-"))


urlpatterns = [
    path("bench-static/<path:path>", serve, {"document_root": str(STATIC_DIR)}),
    path("", include("pippa_site.urls")),
]


def large_widget(shapes: int = 4000) -> bytes:
    """About 400 KB: a scatter plot with ``shapes`` labelled points."""
    parts = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="1200" height="800" '
        'viewBox="0 0 1200 800" font-family="sans-serif">'
    ]
    for i in range(shapes):
        x, y = (i * 37) % 1180 + 10, (i * 53) % 780 + 10
        hue = (i * 47) % 360
        parts.append(
            f'<circle cx="{x}" cy="{y}" r="6" fill="hsl({hue}, 60%, 55%)" '
            f'stroke="#1d2330" stroke-width="0.5" opacity="0.85"/>'
        )
    parts.append("</svg>")
    return "".join(parts).encode()


def _in_process(svg: bytes, width: int, height: int) -> bytes:
    import cairosvg
    from PIL import Image

    png = cairosvg.svg2png(bytestring=svg, output_width=width, output_height=height)
    with Image.open(io.BytesIO(png)) as image:
        image.thumbnail((CAPS["thumb_side"], CAPS["thumb_side"]))
        out = io.BytesIO()
        image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def _bench_render(report: Report, repeat: int) -> None:
    for label, svg, size in (
        ("small widget (risk map)", risk_map_svg(), (960, 657)),
        ("large widget (4,000 shapes)", large_widget(), (960, 640)),
    ):
        result = render_png(data=svg, media_type="image/svg+xml")
        assert result.ok, result.reason
        value = median_ms(
            lambda svg=svg: render_png(data=svg, media_type="image/svg+xml"), repeat
        )
        baseline = median_ms(lambda svg=svg, size=size: _in_process(svg, *size), repeat)
        report.add(
            group="preview",
            figure=f"render {label}, {len(svg) / 1024:,.0f} KiB, cold subprocess",
            value=value,
            baseline_name="same render in-process, no caps",
            baseline=baseline,
            unit="ms",
            higher_is_better=False,
            target="< 1,000 ms small; under the 8 s cap large",
        )


def _bench_serve(report: Report, repeat: int) -> None:
    User = get_user_model()
    dad = User.objects.create_user(username=f"bench-preview-{time.time_ns()}")
    council_round = demo_round_load(owner=dad)
    widget = (
        council_round.turns.order_by("order")
        .first()
        .artifact_links.get(role="produced", artifact__media_type="image/svg+xml")
        .artifact
    )
    preview_id = widget.meta["preview"]["artifact_id"]
    png = default_store().get(widget.meta["preview"]["sha256"])
    (STATIC_DIR / "same-size.png").write_bytes(png)

    client = Client()
    client.force_login(dad)
    preview_url = f"/artifacts/{widget.pk}/preview.png"
    static_url = "/bench-static/same-size.png"
    for url in (preview_url, static_url):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        assert len(b"".join(response.streaming_content)) == len(png)

    def get(url: str) -> None:
        response = client.get(url)
        b"".join(response.streaming_content)

    medians = interleaved_ms(
        {"preview": lambda: get(preview_url), "static": lambda: get(static_url)},
        repeat,
    )
    report.add(
        group="preview",
        figure=f"GET cached preview PNG ({len(png) / 1024:,.0f} KiB, artifact {preview_id})",
        value=medians["preview"],
        baseline_name="static file, same size, same stack",
        baseline=medians["static"],
        unit="ms",
        higher_is_better=False,
        target="(in-process; static needs no login)",
    )
    etag = f'"{widget.meta["preview"]["sha256"]}"'
    revalidate = median_ms(
        lambda: client.get(preview_url, headers={"If-None-Match": etag}),
        repeat,
    )
    report.add(
        group="preview",
        figure="revalidate cached preview (ETag, 304), in-process",
        value=revalidate,
        baseline_name="static file, same size, same stack",
        baseline=medians["static"],
        unit="ms",
        higher_is_better=False,
        target="(diagnostic)",
    )
    _bench_serve_http(report, repeat, dad, widget, png)


def _bench_serve_http(report: Report, repeat: int, dad, widget, png: bytes) -> None:
    """The same requests through gunicorn, the server ``make run`` starts.

    The baseline is what a static file costs there: whitenoise serving a file
    of the preview's size from the collected static folder.
    """
    env = server_env(PIPPA_BLOB_DIR=str(settings.BLOB_DIR))
    collectstatic(env)
    static_root = Path(settings.STATIC_ROOT)
    (static_root / "bench").mkdir(parents=True, exist_ok=True)
    (static_root / "bench" / "same-size.png").write_bytes(png)
    client = Client()
    client.force_login(dad)
    cookie = {"Cookie": f"sessionid={client.cookies['sessionid'].value}"}
    preview_url = f"/artifacts/{widget.pk}/preview.png"
    etag = {"If-None-Match": f'"{widget.meta["preview"]["sha256"]}"', **cookie}
    cases = {
        "static": ("/static/bench/same-size.png", {}, 200),
        "get": (preview_url, cookie, 200),
        "304": (preview_url, etag, 304),
    }
    with gunicorn(env) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

        def fetch(url: str, headers: dict, status: int) -> None:
            conn.request("GET", url, headers=headers)
            response = conn.getresponse()
            body = response.read()
            assert response.status == status, (url, response.status)
            assert status == 304 or len(body) == len(png), (url, len(body))

        # The first few rounds warm both workers' imports and caches.
        medians = interleaved_ms(
            {name: partial(fetch, *case) for name, case in cases.items()},
            repeat,
            warmup=5,
        )
        conn.close()
    shutil.rmtree(static_root, ignore_errors=True)
    static_ms = medians["static"]
    report.add(
        group="preview",
        figure="repeat view of a cached preview (If-None-Match, 304) on gunicorn",
        value=medians["304"],
        baseline_name="static file, same size, whitenoise on gunicorn",
        baseline=static_ms,
        unit="ms",
        higher_is_better=False,
        target="<= 2.0 x baseline",
    )
    report.add(
        group="preview",
        figure=f"GET cached preview PNG ({len(png) / 1024:,.0f} KiB) on gunicorn",
        value=medians["get"],
        baseline_name="static file, same size, whitenoise on gunicorn",
        baseline=static_ms,
        unit="ms",
        higher_is_better=False,
        target="(first view: login + owner check)",
    )


def _bench_context(report: Report) -> None:
    User = get_user_model()
    owner = User.objects.create_user(username=f"bench-context-{time.time_ns()}")
    sizes = {}
    for label, filler in (("small", 0), ("5 MB", 5 * 1024 * 1024)):
        council_round = round_start(
            conversation=Conversation.objects.create(owner=owner, title=label),
            topic="size",
            participants=[("Ada", "claude"), ("Grace", "gemini")],
        )
        ada, grace = council_round.participants.order_by("position")
        svg = risk_map_svg()
        if filler:
            svg = svg.replace(b"</svg>", b"<!--" + b"p" * filler + b"--></svg>")
        turn_add(council_round=council_round, participant=ada, text="map", widget=svg)
        sizes[label] = len(
            context_bytes(serialize_branch_context(council_round, grace))
        )
    report.add(
        group="preview",
        figure="branch context size with a 5 MB widget",
        value=sizes["5 MB"],
        baseline_name="same context with a 4 KB widget",
        baseline=sizes["small"],
        unit="bytes",
        higher_is_better=False,
        target="ratio ~1 (refs, never payloads)",
    )


def run(report: Report) -> None:
    repeat = 3 if report.quick else 9
    with override_settings(
        ROOT_URLCONF="bench.bench_preview",
        ALLOWED_HOSTS=["testserver"],
        DEBUG=False,
        BLOB_DIR=Path(settings.DATA_DIR) / "preview-blobs",
    ):
        _bench_render(report, repeat)
        _bench_serve(report, repeat * 10)
        _bench_context(report)
