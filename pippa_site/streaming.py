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


async def _chunks(source: Iterator[bytes]) -> AsyncIterator[bytes]:
    take = sync_to_async(next, thread_sensitive=False)
    try:
        while (chunk := await take(source, None)) is not None:
            yield chunk
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            await sync_to_async(close, thread_sensitive=False)()
