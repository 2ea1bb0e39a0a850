"""Render one untrusted widget to a PNG preview, inside a locked-down subprocess.

Run only by ``artifacts.preview`` as ``python -I render_worker.py <caps as JSON>``
with the widget bytes on stdin. This file imports nothing from the project, so
``-I`` (no cwd, no user site, no PYTHON* variables) works.

1. Cap our own address space and CPU time before anything else.
2. Import the renderer and warm it up on a tiny known-good SVG, so every lazy
   import and plug-in load happens now, while opening files is still allowed;
   then forbid writing files (``RLIMIT_FSIZE`` 0).
3. Read the widget from stdin, then install an audit hook: from here on any
   Python-level attempt to open a file, open a socket, fetch a URL or start a
   process kills this process with exit code 4 and a reason on stderr.
4. Validate: non-empty, under the byte cap, strict UTF-8, the ``<svg>`` inside
   HTML, well-formed XML without DTD or entities (defusedxml), root ``svg`` in
   the SVG namespace, element count, depth, ``<use>`` expansion, references that
   leave the document (``href``, ``url(...)``, ``@import``), declared size.
5. Re-serialize the parsed tree (drops DTD, processing instructions, comments,
   ``<script>`` and ``<foreignObject>``) and hand cairosvg only that, as a
   non-empty ``bytestring=`` with ``output_width``/``output_height`` always set.
6. Thumbnail with Pillow (lowered ``MAX_IMAGE_PIXELS``) and write the PNG to
   stdout. Exit 0.

Refusals exit 3 with a one-line reason on stderr; the parent turns every other
ending (time cap, signal, crash) into its own reason. Fail closed throughout.
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys

EXIT_OK = 0
EXIT_REFUSED = 3
EXIT_SANDBOX = 4

SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"

# Audit events that mean "reaching outside": files, sockets, URLs, processes.
_DENIED_EVENTS = (
    "open",
    "os.listdir",
    "os.scandir",
    "socket.",
    "urllib.Request",
    "http.client.",
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.startfile",
    "ctypes.dlopen",
    "shutil.",
    "glob.glob",
    "pathlib.Path.glob",
)

_URL_RE = re.compile(r"url\(\s*(['\"]?)\s*([^'\")]*)", re.IGNORECASE)
_LENGTH_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z%]*)\s*$")
_UNIT_PX = {
    "": 1.0,
    "px": 1.0,
    "pt": 96 / 72,
    "pc": 16.0,
    "mm": 96 / 25.4,
    "cm": 96 / 2.54,
    "in": 96.0,
    "em": 16.0,
    "ex": 8.0,
}
_SAFE_DATA_PREFIXES = ("data:image/png", "data:image/jpeg", "data:image/gif")
_DROPPED_TAGS = {f"{{{SVG_NS}}}script", f"{{{SVG_NS}}}foreignObject"}

WARMUP_SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8">'
    b'<rect width="8" height="8" fill="#123"/><text x="1" y="7">a</text></svg>'
)


class Refused(Exception):
    """The widget fails a check; the message is the user-facing reason."""


def _apply_limits(caps: dict) -> None:
    mem = int(caps["memory_bytes"])
    cpu = int(caps["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    # Soft limit sends SIGXCPU; the hard limit one second later is SIGKILL.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _sandbox_hook(event: str, args: tuple) -> None:
    # cairosvg reads data: URIs through urllib, which needs neither a file
    # nor a socket; every other URL is denied.
    if event == "urllib.Request" and str(args[0] if args else "").startswith("data:"):
        return
    if event.startswith(_DENIED_EVENTS):
        detail = ""
        if args:
            detail = str(args[0])[:120]
        message = f"sandbox: render tried {event} {detail}".strip()
        os.write(2, message.encode("utf-8", "replace") + b"\n")
        os._exit(EXIT_SANDBOX)


def lockdown() -> None:
    """Install the audit hook; it cannot be removed for the life of the process."""
    sys.addaudithook(_sandbox_hook)


def _parse_length(value: str | None) -> float | None:
    if value is None:
        return None
    match = _LENGTH_RE.match(value)
    if not match:
        return None
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit == "%":
        return None
    if unit not in _UNIT_PX:
        return None
    return number * _UNIT_PX[unit]


def _viewbox(value: str | None) -> tuple[float, float] | None:
    if not value:
        return None
    parts = value.replace(",", " ").split()
    if len(parts) != 4:
        return None
    try:
        w, h = float(parts[2]), float(parts[3])
    except ValueError:
        return None
    if w <= 0 or h <= 0:
        return None
    return w, h


def _extract_svg(text: str, media_type: str) -> str:
    if media_type == "image/svg+xml":
        return text
    start = text.lower().find("<svg")
    end = text.lower().rfind("</svg>")
    if start < 0 or end < start:
        raise Refused("no <svg> element in the HTML")
    return text[start : end + len("</svg>")]


def _check_reference(value: str) -> None:
    target = value.strip()
    if not target or target.startswith("#"):
        return
    if target.lower().startswith(_SAFE_DATA_PREFIXES):
        return
    shown = target[:60]
    raise Refused(f"external reference refused ({shown})")


def _check_embedded_image(value: str, caps: dict) -> None:
    """Refuse a data: raster whose header declares more pixels than the cap.

    The renderer decodes PNGs without Pillow's bomb check, so a 100 KB PNG
    declaring 30000×30000 pixels would allocate gigabytes.
    """
    target = value.strip()
    if not target.lower().startswith(_SAFE_DATA_PREFIXES):
        return
    import base64
    import binascii
    import io

    from PIL import Image

    header, _, payload = target.partition(",")
    if ";base64" not in header.lower():
        raise Refused("embedded image must be base64")
    try:
        raw = base64.b64decode(payload, validate=False)
        with Image.open(io.BytesIO(raw)) as image:
            width, height = image.size
    except Image.DecompressionBombError:
        raise Refused(
            f"embedded image declares more than {caps['max_output_pixels']:,} pixels"
        ) from None
    except (binascii.Error, ValueError, OSError):
        raise Refused("embedded image is unreadable") from None
    if width * height > caps["max_output_pixels"]:
        raise Refused(
            f"embedded image declares {width:,}×{height:,} px; "
            f"the cap is {caps['max_output_pixels']:,} pixels"
        )


def _check_urls(text: str) -> None:
    if "@import" in text.lower():
        raise Refused("external reference refused (@import in a stylesheet)")
    for match in _URL_RE.finditer(text):
        _check_reference(match.group(2))


def validate(data: bytes, media_type: str, caps: dict):
    """Return (svg bytes to render, output width, output height) or raise Refused."""
    import xml.etree.ElementTree as ET

    from defusedxml import DefusedXmlException
    from defusedxml import ElementTree as DET

    if not data:
        raise Refused("empty widget: nothing to render")
    if len(data) > caps["max_input_bytes"]:
        raise Refused(
            f"widget is {len(data):,} bytes; the render cap is {caps['max_input_bytes']:,}"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("not UTF-8 text") from None
    svg_text = _extract_svg(text, media_type)
    if "<?xml-stylesheet" in svg_text:
        raise Refused("external stylesheet instruction refused (xml-stylesheet)")
    try:
        root = DET.fromstring(
            svg_text.encode("utf-8"),
            forbid_dtd=True,
            forbid_entities=True,
            forbid_external=True,
        )
    except DefusedXmlException:
        raise Refused("DTD, entity or external declarations are refused") from None
    except DET.ParseError as exc:
        raise Refused(f"malformed XML ({str(exc)[:80]})") from None
    if root.tag != f"{{{SVG_NS}}}svg":
        raise Refused("root element is not <svg> in the SVG namespace")

    # Walk without recursion: count, depth, references, ids for <use>.
    count = 0
    uses: list = []
    ids: dict = {}
    stack = [(root, 1)]
    dropped: list = []
    while stack:
        elem, depth = stack.pop()
        count += 1
        if count > caps["max_elements"]:
            raise Refused(f"too many elements (cap {caps['max_elements']:,})")
        if depth > caps["max_depth"]:
            raise Refused(f"nesting too deep (cap {caps['max_depth']} levels)")
        if not isinstance(elem.tag, str):
            continue
        for name, value in elem.attrib.items():
            # A link (<a href>) is never fetched by the renderer; any other
            # href (image, use, pattern, XInclude…) would be.
            if name in ("href", f"{{{XLINK_NS}}}href") and elem.tag != f"{{{SVG_NS}}}a":
                _check_reference(value)
                _check_embedded_image(value, caps)
            _check_urls(value)
            if name == "id":
                ids[value] = elem
        if elem.tag == f"{{{SVG_NS}}}style" and elem.text:
            _check_urls(elem.text)
        if elem.tag == f"{{{SVG_NS}}}use":
            uses.append(elem)
        for child in elem:
            if isinstance(child.tag, str) and child.tag in _DROPPED_TAGS:
                dropped.append((elem, child))
            stack.append((child, depth + 1))
    if len(uses) > caps["max_uses"]:
        raise Refused(f"too many <use> elements (cap {caps['max_uses']})")
    if uses:
        _check_use_expansion(root, ids, caps["max_expanded"])

    width, height = _output_size(root, caps)
    for parent, child in dropped:
        parent.remove(child)
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", XLINK_NS)
    clean = ET.tostring(root, encoding="utf-8")
    return clean, width, height


def _check_use_expansion(root, ids: dict, cap: int) -> None:
    """Refuse a tree whose <use> references expand past ``cap`` rendered nodes."""
    memo: dict = {}
    active: set = set()
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))

    def size(elem) -> int:
        key = id(elem)
        if key in memo:
            return memo[key]
        if key in active:
            raise Refused("a <use> reference loops back on itself")
        active.add(key)
        total = 1
        for child in elem:
            total += size(child)
            if total > cap:
                break
        if elem.tag == f"{{{SVG_NS}}}use":
            ref = elem.get("href") or elem.get(f"{{{XLINK_NS}}}href") or ""
            target = ids.get(ref.strip()[1:]) if ref.strip().startswith("#") else None
            if target is not None:
                total += size(target)
        active.discard(key)
        if total > cap:
            raise Refused(f"<use> references expand past {cap:,} elements")
        memo[key] = total
        return total

    size(root)


def _output_size(root, caps: dict) -> tuple[int, int]:
    declared_w = _parse_length(root.get("width"))
    declared_h = _parse_length(root.get("height"))
    limit = caps["max_declared_px"]
    for value in (declared_w, declared_h):
        if value is not None and value > limit:
            raise Refused(
                f"declared size {declared_w or 0:,.0f}×{declared_h or 0:,.0f} px "
                f"exceeds the {limit:,} px cap"
            )
    box = _viewbox(root.get("viewBox"))
    if declared_w and declared_h:
        w, h = declared_w, declared_h
    elif box:
        w, h = box
        if declared_w:
            w, h = declared_w, declared_w * box[1] / box[0]
        elif declared_h:
            w, h = declared_h * box[0] / box[1], declared_h
    else:
        w, h = 300.0, 150.0  # the CSS default replaced-element size
    if w <= 0 or h <= 0:
        raise Refused("declared size is zero")
    side = caps["render_side"]
    scale = min(side / w, side / h)
    out_w = max(1, round(w * scale))
    out_h = max(1, round(h * scale))
    if out_w * out_h > caps["max_output_pixels"]:
        raise Refused("output would exceed the pixel cap")
    return out_w, out_h


def render(svg: bytes, width: int, height: int, thumb_side: int) -> bytes:
    import io

    import cairosvg
    from PIL import Image

    png = cairosvg.svg2png(
        bytestring=svg, output_width=width, output_height=height, unsafe=False
    )
    with Image.open(io.BytesIO(png)) as image:
        image.load()
        image.thumbnail((thumb_side, thumb_side))
        out = io.BytesIO()
        image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def main(argv: list[str]) -> int:
    caps = json.loads(argv[1])
    _apply_limits(caps)

    # A warning would read source lines (an open) after the lockdown.
    import warnings

    import cairosvg  # noqa: F401  (loaded now, before the lockdown)
    import defusedxml.ElementTree  # noqa: F401
    from PIL import Image, PngImagePlugin  # noqa: F401

    warnings.simplefilter("ignore")
    Image.MAX_IMAGE_PIXELS = caps["max_output_pixels"]
    Image.init()
    render(WARMUP_SVG, 8, 8, 8)  # load every lazy module while files may open
    validate(WARMUP_SVG, "image/svg+xml", caps)
    # Library loading may use temp files (ctypes' find_library); from here on
    # no file may be written, whatever the renderer tries.
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    data = sys.stdin.buffer.read(caps["max_input_bytes"] + 1)
    out = sys.stdout.buffer
    lockdown()
    try:
        svg, width, height = validate(data, caps["media_type"], caps)
        png = render(svg, width, height, caps["thumb_side"])
    except Refused as exc:
        os.write(2, str(exc).encode("utf-8", "replace")[:300] + b"\n")
        return EXIT_REFUSED
    except MemoryError:
        os.write(2, b"render ran out of its memory cap\n")
        return EXIT_REFUSED
    except RecursionError:
        os.write(2, b"nesting too deep for the renderer\n")
        return EXIT_REFUSED
    except Exception as exc:  # the renderer's own failure: fail closed
        os.write(2, f"renderer failed ({type(exc).__name__})".encode() + b"\n")
        return EXIT_REFUSED
    out.write(png)
    out.flush()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv))
