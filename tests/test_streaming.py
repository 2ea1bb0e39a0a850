"""A download read a chunk at a time over ASGI (``pippa_site.streaming``) is
closed when its client leaves, even while a chunk is being read."""

from __future__ import annotations

import asyncio
import threading

from pippa_site.streaming import _chunks


def test_an_answer_cancelled_mid_read_closes_its_source_once_the_read_ends():
    reading = threading.Event()
    go_on = threading.Event()
    closed = threading.Event()

    def source():
        try:
            yield b"first"
            reading.set()
            go_on.wait(10)  # a slow disk: the second chunk is still being read
            yield b"second"
        finally:
            closed.set()

    async def client_leaves() -> list[bytes]:
        got: list[bytes] = []

        async def read() -> None:
            async for chunk in _chunks(source()):
                got.append(chunk)

        answer = asyncio.create_task(read())
        await asyncio.to_thread(reading.wait, 10)
        answer.cancel()  # what Django's handler does when the client leaves
        threading.Timer(0.2, go_on.set).start()
        try:
            await answer
        except asyncio.CancelledError:
            pass
        return got

    got = asyncio.run(client_leaves())

    assert got == [b"first"]
    assert closed.wait(5), "the source was left open"


def test_an_answer_read_to_its_end_closes_its_source():
    closed = threading.Event()

    def source():
        try:
            yield from (b"a", b"b")
        finally:
            closed.set()

    async def read_all() -> list[bytes]:
        return [chunk async for chunk in _chunks(source())]

    assert asyncio.run(read_all()) == [b"a", b"b"]
    assert closed.is_set()
