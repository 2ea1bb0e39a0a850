"""Hostile widgets: every case fails closed, reads no file, opens no socket.

Proof of "reads no file / opens no socket", two ways:
- a canary FIFO: a thread blocks opening its write end, which returns only if
  some process opens the read end; and a listening socket on 127.0.0.1 whose
  accept loop records every connection. Each corpus case names both.
- the render subprocess's audit hook: code that opens a file or a socket after
  the lockdown kills the process (exit 4) before the open happens.
"""

from __future__ import annotations

import base64
import os
import socket
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest

from artifacts import preview as preview_mod
from artifacts.models import Artifact, ArtifactClass
from artifacts.preview import render_png
from artifacts.store import default_store
from council.services import widget_store

CORPUS = Path(__file__).resolve().parent / "hostile_corpus"

# file name -> words the failure reason must contain
EXPECTED = {
    "xxe_file_entity.svg": "DTD",
    "xxe_http_entity.svg": "DTD",
    "xxe_parameter_entity.svg": "DTD",
    "external_dtd.svg": "DTD",
    "billion_laughs.svg": "DTD",
    "image_file_href.svg": "external reference refused (file://",
    "image_http_xlink.svg": "external reference refused (http://127.0.0.1",
    "image_relative_path.svg": "external reference refused",
    "use_external.svg": "external reference refused (file://",
    "css_import.svg": "external reference refused (@import",
    "css_url_fill.svg": "external reference refused (http://",
    "font_face_file.svg": "external reference refused (file://",
    "xinclude_file.svg": "external reference refused (file://",
    "xml_stylesheet_pi.svg": "xml-stylesheet",
    "nested_svg_data_uri.svg": "external reference refused (data:image/svg+xml",
    "huge_declared_size.svg": "declared size 20,000×20,000 px exceeds",
    "huge_declared_size_units.svg": "declared size 28,800×192 px exceeds",
    "malformed.svg": "malformed XML",
    "non_utf8.svg": "not UTF-8",
    "not_svg_root.svg": "root element is not <svg>",
    "svg_without_namespace.svg": "root element is not <svg>",
    "use_cycle.svg": "loops back",
    "empty.svg": "empty widget",
    "html_without_svg.html": "no <svg> element in the HTML",
    "html_svg_external.html": "external reference refused (http://",
}


class Canary:
    """A FIFO that reports whether any process opened it for reading."""

    def __init__(self, path: Path):
        self.path = path
        os.mkfifo(path)
        self.opened = threading.Event()
        self.done = False
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        fd = os.open(self.path, os.O_WRONLY)  # blocks until a reader opens it
        if not self.done:
            self.opened.set()
        try:
            os.write(fd, b"CANARY-SECRET\n")
        except OSError:
            pass
        os.close(fd)

    def close(self) -> bool:
        """Release the waiting thread; return whether anyone had opened it."""
        self.done = True
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self.thread.join(timeout=5)
        os.close(fd)
        return self.opened.is_set()


class Listener:
    """A TCP socket on 127.0.0.1 that records every connection it accepts."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> int:
        self.stop = True
        self.thread.join(timeout=5)
        self.sock.close()
        return self.connections


@pytest.fixture
def canary(tmp_path):
    c = Canary(tmp_path / "canary-secret.txt")
    yield c
    if not c.done:
        c.close()


@pytest.fixture
def listener():
    s = Listener()
    yield s
    if not s.stop:
        s.close()


def _fill(raw: bytes, canary: Canary, listener: Listener) -> bytes:
    return raw.replace(b"{CANARY}", str(canary.path).encode()).replace(
        b"{PORT}", str(listener.port).encode()
    )


def _media_type(name: str) -> str:
    return "text/html" if name.endswith(".html") else "image/svg+xml"


def _png_bomb(side: int = 30000) -> bytes:
    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    rows = zlib.compress(b"\x00" * ((side // 8 + 1) * side), 9)
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", rows)
        + chunk(b"IEND", b"")
    )


SVG_OPEN = b'<svg xmlns="http://www.w3.org/2000/svg" width="400" height="400">'


def _use_amplification(levels: int = 10) -> bytes:
    parts = [SVG_OPEN, b'<defs><rect id="l0" width="1" height="1"/>']
    for i in range(1, levels):
        uses = b"".join(b'<use href="#l%d"/>' % (i - 1) for _ in range(10))
        parts.append(b'<g id="l%d">%s</g>' % (i, uses))
    parts.append(b'</defs><use href="#l%d"/></svg>' % (levels - 1))
    return b"".join(parts)


GENERATED = {
    "deep_nesting_60000": (
        SVG_OPEN + b"<g>" * 60_000 + b"</g>" * 60_000 + b"</svg>",
        "nesting too deep",
    ),
    "shapes_20000": (
        SVG_OPEN + b'<path d="M0 0h9"/>' * 20_000 + b"</svg>",
        "too many elements",
    ),
    "use_amplification": (_use_amplification(), "<use> references expand past"),
    "png_bomb_data_uri": (
        SVG_OPEN
        + b'<image width="10" height="10" href="data:image/png;base64,'
        + base64.b64encode(_png_bomb())
        + b'"/></svg>',
        "embedded image declares more than",
    ),
    "oversized_600k": (
        SVG_OPEN + b"<!--" + b"x" * 600_000 + b"--></svg>",
        "larger than the 512 KiB render cap",
    ),
}


def _owner():
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get_or_create(username="widget-owner")[0]


def _assert_fails_closed(widget: Artifact, preview, reason_words: str) -> None:
    assert preview is None
    state = widget.meta["preview"]
    assert state["status"] == "failed"
    assert reason_words in state["reason"]
    # The widget row and its blob survive the failed preview.
    assert Artifact.objects.filter(pk=widget.pk, artifact_class=4).exists()
    assert default_store().verify(widget.sha256)
    assert not Artifact.objects.filter(source_links__source=widget).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile_corpus_file_is_stored_with_a_failed_preview_and_touches_nothing(
    name, canary, listener
):
    data = _fill((CORPUS / name).read_bytes(), canary, listener)

    widget, preview = widget_store(
        owner=_owner(), data=data, media_type=_media_type(name), title=name
    )

    _assert_fails_closed(widget, preview, EXPECTED[name])
    assert canary.close() is False, "the render opened the canary file"
    assert listener.close() == 0, "the render connected to the listening socket"


def test_every_corpus_file_has_an_expected_reason():
    on_disk = {p.name for p in CORPUS.iterdir() if p.name != "README.md"}
    assert on_disk == set(EXPECTED)


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_hostile_widget_is_stored_with_a_failed_preview(
    name, canary, listener
):
    data, words = GENERATED[name]

    widget, preview = widget_store(owner=_owner(), data=data, title=name)

    _assert_fails_closed(widget, preview, words)
    assert canary.close() is False
    assert listener.close() == 0


@pytest.mark.django_db
def test_a_render_that_would_run_long_is_cut_at_a_time_cap_and_fails_closed():
    # 400 KB of text in one element passes every structural cap but would
    # keep cairo busy far longer than the CPU cap allows.
    slow = SVG_OPEN + b'<text x="0" y="20" font-size="1">' + b"x" * 400_000
    slow += b"</text></svg>"

    widget, preview = widget_store(owner=_owner(), data=slow, title="slow")

    # Whichever fires first on a loaded machine: the CPU or the wall clock cap.
    _assert_fails_closed(widget, preview, "")
    assert widget.meta["preview"]["reason"] in (
        preview_mod.REASON_CPU,
        preview_mod.REASON_TIMEOUT,
    )


def test_a_render_past_the_wall_clock_cap_is_killed_with_its_process_group(
    monkeypatch,
):
    monkeypatch.setattr(preview_mod, "WALL_SECONDS", 1.0)
    monkeypatch.setattr(preview_mod, "REASON_TIMEOUT", "render ran past its 1 s cap")
    slow = SVG_OPEN + b'<text x="0" y="20" font-size="1">' + b"x" * 400_000
    slow += b"</text></svg>"
    started = []
    real_popen = subprocess.Popen

    def spy(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(preview_mod.subprocess, "Popen", spy)

    result = render_png(data=slow, media_type="image/svg+xml")

    assert result.ok is False
    assert result.reason == "render ran past its 1 s cap"
    assert started[0].returncode is not None  # reaped, not left running
    with pytest.raises(ProcessLookupError):
        os.killpg(started[0].pid, 0)


def _run_in_locked_worker(code: str) -> subprocess.CompletedProcess:
    driver = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('w', {str(preview_mod.WORKER)!r})\n"
        "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
        "import socket, urllib.request, encodings.idna\n"
        "w.lockdown()\n" + code
    )
    return subprocess.run(
        [sys.executable, "-I", "-c", driver],
        capture_output=True,
        timeout=30,
        check=False,
    )


@pytest.mark.slow  # a locked-down Python of its own
def test_the_render_sandbox_kills_the_process_before_it_opens_a_file(canary):
    proc = _run_in_locked_worker(f"open({str(canary.path)!r}).read()\n")

    assert proc.returncode == 4
    assert b"sandbox: render tried open" in proc.stderr
    assert canary.close() is False


@pytest.mark.slow  # a locked-down Python of its own
def test_the_render_sandbox_kills_the_process_before_it_opens_a_socket(listener):
    proc = _run_in_locked_worker(
        f"socket.create_connection(('127.0.0.1', {listener.port}))\n"
    )

    assert proc.returncode == 4
    assert b"sandbox: render tried socket" in proc.stderr
    assert listener.close() == 0


@pytest.mark.slow  # a locked-down Python of its own
def test_the_render_sandbox_refuses_urls_other_than_data_uris(listener):
    proc = _run_in_locked_worker(
        "import urllib.request\n"
        f"urllib.request.urlopen('http://127.0.0.1:{listener.port}/x')\n"
    )

    assert proc.returncode == 4
    assert b"urllib.Request" in proc.stderr
    assert listener.close() == 0


@pytest.mark.django_db
def test_a_benign_widget_still_renders_next_to_the_hostile_ones(canary, listener):
    ok = (
        SVG_OPEN
        + b'<rect width="400" height="400" fill="#cfe8d5"/>'
        + b'<a href="https://example.com/report"><text x="10" y="30">report</text></a>'
        + b"</svg>"
    )

    widget, preview = widget_store(owner=_owner(), data=ok, title="benign")

    assert preview is not None
    assert preview.media_type == "image/png"
    assert widget.meta["preview"] == {
        "status": "ok",
        "artifact_id": preview.pk,
        "sha256": preview.sha256,
    }
    assert preview.artifact_class == ArtifactClass.RENDER
    assert canary.close() is False
    assert listener.close() == 0


def test_the_render_process_runs_under_its_memory_cap(monkeypatch):
    # A cap below what the renderer needs to start proves the limit is set in
    # the child and that running out fails closed with a plain reason.
    monkeypatch.setitem(preview_mod.CAPS, "memory_bytes", 40 * 1024 * 1024)
    result = render_png(data=SVG_OPEN + b"</svg>", media_type="image/svg+xml")
    assert result.ok is False
    assert result.reason == "render ran out of its memory cap"
