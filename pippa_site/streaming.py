"""Large answers a chunk at a time under ASGI.

Django's ASGI handler serves a streamed answer by iterating it
asynchronously; an answer made of a synchronous iterator (``FileResponse``
over a file, ``StreamingHttpResponse`` over a generator) is first read whole
into memory (Django warns, then ``list()``s it). ``stream`` and ``file_streamed`` give such an
answer, when the request came through the ASGI handler, an asynchronous
iterator that reads one chunk at a time on a worker thread
(``StreamingHttpResponse`` takes one, as Django's docs describe), so a
64 MiB download costs one chunk of memory and stops being read when the
client leaves (Django's handler then closes the iterator). Under WSGI (the
test client, ``runserver``) the answer is left as it is.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.http import FileResponse, HttpRequest

CHUNK_BYTES = 64 * 1024


def stream(request: HttpRequest, chunks: Iterator[bytes]):
    """``chunks`` as the handler serving ``request`` reads them best: an
    asynchronous iterator over ASGI, the iterator itself under WSGI."""
    return _chunks(chunks) if hasattr(request, "scope") else chunks


def file_streamed(request: HttpRequest, response: FileResponse) -> FileResponse:
    """``response`` (its headers already set from its file), read a chunk at a
    time over ASGI; the file is closed with the answer, as before."""
    handle = response.file_to_stream
    if handle is not None and hasattr(request, "scope"):
        response.streaming_content = _chunks(
            iter(lambda: handle.read(CHUNK_BYTES), b"")
        )
    return response


class _Guarded:
    """A synchronous iterator that worker threads read and close one at a time.

    When the client leaves, the handler cancels the answer while a chunk may
    still be read on a worker thread; closing a generator another thread is
    running raises ``ValueError`` and leaves it open. Here the close waits for
    that read to end."""

    def __init__(self, source: Iterator[bytes]) -> None:
        self.source = source
        self.lock = threading.Lock()

    def next(self) -> bytes | None:
        with self.lock:
            return next(self.source, None)

    def close(self) -> None:
        with self.lock:
            close = getattr(self.source, "close", None)
            if close is not None:
                close()


async def _chunks(source: Iterator[bytes]) -> AsyncIterator[bytes]:
    guarded = _Guarded(source)
    take = sync_to_async(guarded.next, thread_sensitive=False)
    try:
        while (chunk := await take()) is not None:
            yield chunk
    finally:
        await sync_to_async(guarded.close, thread_sensitive=False)()
