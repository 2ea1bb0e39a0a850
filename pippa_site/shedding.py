"""The deadlines and the connection cap uvicorn does not have.

uvicorn's h11 protocol starts its keep-alive timer only once a response is
complete, and any byte received cancels it; nothing times a client that sends
nothing, trickles its request head or its body, or never reads its answer
(uvicorn's issue #157 has asked for such timeouts since 2018), and it accepts
connections until the process runs out of files. ``Protocol`` is uvicorn's
h11 protocol (uvicorn's ``http`` setting takes a protocol class) with a timer
per connection for each phase the client controls, and a cap:

1. **Head**: from the connection's start, and from the end of each answer,
   the next request's head (first byte to blank line) must be in within
   ``PIPPA_HEAD_SECONDS``. A client that sent nothing is closed; one that
   sent part of a head is answered 408.
2. **Body**: from the head, ``PIPPA_BODY_SECONDS`` plus one second for every
   ``PIPPA_BODY_MIN_RATE`` bytes received so far (Apache's mod_reqtimeout
   counts the same way), so a large upload at a fair speed goes through and
   a trickle does not. Past it: 408 (or, once answering, the connection
   closes).
3. **Answer**: while the client leaves the answer unread (the socket's
   buffer is full and uvicorn waits to write), at most
   ``PIPPA_ANSWER_SECONDS``; then the connection is dropped.
4. **Connections**: at most ``PIPPA_MAX_CONNECTIONS`` per process, and never
   more than half of what the file limit leaves (each connection may hold
   a spooled body's file too). A connection past the cap sheds the one that
   has waited longest for a request head (idle, or trickling one); when
   every open connection is busy with a request, the new one is answered
   503 and closed.

The timers run on the event loop; the app never sees them, except as
``http.disconnect`` when a connection closes under it (Django's handler then
stops reading the body, or stops sending the answer). Everything here goes
through uvicorn's protocol hooks (``connection_made``, ``data_received``,
``handle_events``, ``on_response_complete``, ``pause_writing``,
``resume_writing``, ``connection_lost``) and its request cycle's flags
(``more_body``, ``response_started``); ``tests/test_serving.py`` runs every
phase against the real server, so an uvicorn that changes them fails there.
"""

from __future__ import annotations

import asyncio
import resource
from functools import cache

from uvicorn.protocols.http.h11_impl import H11Protocol

# A request's answer when it has to be refused before the app sees it.
_CANNED = (
    b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s"
)
TIMED_OUT = (408, b"Request Timeout", b"the request did not arrive in time\n")
BUSY = (503, b"Service Unavailable", b"the server has no room for another connection\n")
# Files a process keeps for itself (database, logs, the listening sockets).
FILES_KEPT = 64


@cache
def limits() -> dict[str, float]:
    """The site's bounds, read once per process (after Django's settings)."""
    from django.conf import settings

    return {
        "head": settings.PIPPA_HEAD_SECONDS,
        "body": settings.PIPPA_BODY_SECONDS,
        "rate": settings.PIPPA_BODY_MIN_RATE,
        "answer": settings.PIPPA_ANSWER_SECONDS,
        "connections": connection_cap(settings.PIPPA_MAX_CONNECTIONS),
    }


def connection_cap(configured: int) -> int:
    """``configured``, bounded by the process's file limit: each connection is a
    socket and may hold a spooled body's file, and the process keeps some."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(8, min(configured, (soft - FILES_KEPT) // 2))


class Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline per client phase and a connection cap."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._timer: asyncio.TimerHandle | None = None
        self._phase = ""
        self._since = 0.0
        self._received = 0  # bytes received in this phase
        self._timed_cycle = None
        self._wait("head")
        if len(self.connections) > limits()["connections"]:
            self._make_room()

    def data_received(self, data: bytes) -> None:
        self._received += len(data)
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if cycle is None or self._phase == "closed":
            return
        if cycle is not self._timed_cycle:  # a request's head is in
            self._timed_cycle = cycle
            if cycle.more_body:
                self._wait("body")
            else:
                self._stop()
        elif self._phase == "body" and not cycle.more_body:
            self._stop()

    def on_response_complete(self) -> None:
        # Armed before uvicorn goes on to a pipelined request, which re-arms it.
        self._wait("head")
        super().on_response_complete()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._phase in ("", "body"):
            self._wait("answer")

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._phase == "answer":
            self._stop()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        self._phase = "closed"
        super().connection_lost(exc)

    # -- the timer ---------------------------------------------------------------

    def _wait(self, phase: str) -> None:
        self._stop()
        self._phase = phase
        self._since = self.loop.time()
        self._received = 0
        self._timer = self.loop.call_later(limits()[phase], self._expired)

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._phase != "closed":
            self._phase = ""

    def _expired(self) -> None:
        self._timer = None
        phase = self._phase
        if phase == "body":
            # One more second for every BODY_MIN_RATE bytes that came.
            bounds = limits()
            allowed = self._since + bounds["body"] + self._received / bounds["rate"]
            left = allowed - self.loop.time()
            if left > 0:
                self._timer = self.loop.call_later(left, self._expired)
                return
        if self.transport.is_closing():
            return
        if phase == "answer" or self.transport.get_write_buffer_size():
            self.transport.abort()  # an unread answer is dropped with it
        elif self._received and not (self.cycle and self.cycle.response_started):
            self._refuse(TIMED_OUT)
        else:
            self.transport.close()

    # -- the cap -----------------------------------------------------------------

    def _make_room(self) -> None:
        """Close the connection waiting longest for a request head, or refuse this one."""
        waiting = [
            c
            for c in self.connections
            if c is not self and getattr(c, "_phase", "") == "head"
        ]
        if waiting:
            oldest = min(waiting, key=lambda c: c._since)
            if not oldest.transport.is_closing():
                oldest.transport.close()
            return
        self._refuse(BUSY)

    def _refuse(self, answer: tuple[int, bytes, bytes]) -> None:
        status, reason, body = answer
        self._stop()
        self.transport.write(_CANNED % (status, reason, len(body), body))
        self.transport.close()
