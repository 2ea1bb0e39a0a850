"""Real receivers for notification tests: an SMTP server (aiosmtpd) and an HTTP one.

Both listen on 127.0.0.1 on a free port, in a thread of the test process, so
a worker subprocess reaches them as it would a real mail server or webhook.
"""

from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aiosmtpd.controller import Controller


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Mail:
    envelope_to: list[str]
    message: EmailMessage

    @property
    def body(self) -> str:
        part = self.message.get_body(preferencelist=("plain", "html"))
        return part.get_content() if part is not None else ""

    def part(self, subtype: str) -> str:
        """The message's ``plain`` or ``html`` part ("" when it has none)."""
        part = self.message.get_body(preferencelist=(subtype,))
        if part is None or part.get_content_subtype() != subtype:
            return ""
        return part.get_content()

    def headers(self, name: str) -> list[str]:
        return [str(v) for v in self.message.get_all(name, [])]


class _Handler:
    def __init__(self, sink: SmtpSink) -> None:
        self.sink = sink

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
        message = email.message_from_bytes(
            envelope.original_content or envelope.content, policy=email.policy.default
        )
        with self.sink.lock:
            self.sink.mails.append(Mail(list(envelope.rcpt_tos), message))
        return "250 OK"


@dataclass
class SmtpSink:
    """A real SMTP server that keeps every message it accepts."""

    port: int = 0
    mails: list[Mail] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    controller: Controller | None = None

    def start(self) -> SmtpSink:
        self.port = free_port()
        self.controller = Controller(
            _Handler(self), hostname="127.0.0.1", port=self.port
        )
        self.controller.start()
        return self

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()

    @property
    def url(self) -> str:
        """The Apprise URL of this server, as PIPPA_NOTIFY_URLS names it."""
        return f"mailto://127.0.0.1:{self.port}?from=pippa@example.org&mode=insecure"

    def to(self, address: str) -> list[Mail]:
        with self.lock:
            return [m for m in self.mails if address in m.envelope_to]


@dataclass
class HttpSink:
    """A real HTTP server that records each POST; ``fail`` makes it answer 500."""

    port: int = 0
    requests: list[dict] = field(default_factory=list)
    fail: int = 0  # answer 500 to this many requests first
    server: ThreadingHTTPServer | None = None

    def start(self) -> HttpSink:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                sink.requests.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers.items()),
                        "json": json.loads(raw or b"{}"),
                    }
                )
                status = 500 if sink.fail > 0 else 200
                sink.fail = max(0, sink.fail - 1)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    @property
    def url(self) -> str:
        """An Apprise json:// URL that posts here."""
        return f"json://127.0.0.1:{self.port}/hook"
