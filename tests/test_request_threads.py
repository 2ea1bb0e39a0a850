"""Django's requests run on threads used again by later requests
(``pippa_site.request_threads``): no thread started per request, a database
connection kept between requests, and a request that ended badly never lends
its thread to the next."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import threading
import time

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.signals import request_finished
from django.db.backends.signals import connection_created

from pippa_site import request_threads
from pippa_site.request_threads import RequestThreads


@pytest.fixture
def pool():
    """A ``RequestThreads`` maker; each one's threads end with the test."""
    made: list[RequestThreads] = []

    def make(idle: int) -> RequestThreads:
        made.append(RequestThreads(idle=idle))
        return made[-1]

    yield make
    for threads in made:
        asyncio.run(threads.close())


def _until(done, seconds: float = 5) -> None:
    """Wait until ``done()`` holds (work ends on another thread), at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)


def _django_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("django")}


def _thread_of_one_request(threads: RequestThreads) -> int:
    """The thread a request's synchronous code runs on, inside Django's own
    ``ThreadSensitiveContext`` as its handler enters one."""

    async def request() -> int:
        async with threads(), ThreadSensitiveContext():
            return await sync_to_async(threading.get_ident)()

    return asyncio.run(request())


def test_the_next_request_runs_on_the_thread_the_last_one_gave_back(pool):
    threads = pool(idle=2)

    first = _thread_of_one_request(threads)
    second = _thread_of_one_request(threads)

    assert first == second
    assert len(threads.free) == 1


def test_past_the_idle_bound_a_thread_is_let_go_with_its_connections_closed(
    pool, monkeypatch
):
    threads = pool(idle=1)
    closed_on: list[int] = []
    ran_on: list[int] = []
    monkeypatch.setattr(
        request_threads.connections,
        "close_all",
        lambda: closed_on.append(threading.get_ident()),
    )
    all_in = asyncio.Event()

    async def request() -> None:
        async with threads():
            ran_on.append(await sync_to_async(threading.get_ident)())
            if len(ran_on) == 3:
                all_in.set()
            await all_in.wait()  # three requests at once

    async def burst() -> None:
        await asyncio.gather(*(request() for _ in range(3)))

    asyncio.run(burst())
    kept_on = threads.free[0].submit(threading.get_ident).result(5)
    _until(lambda: len(closed_on) >= 2)

    assert len(set(ran_on)) == 3
    assert len(threads.free) == 1  # one waits for the next request
    # The other two closed their database connections, each on its own thread.
    assert sorted(closed_on) == sorted(set(ran_on) - {kept_on})


def test_an_executor_never_called_is_let_go_without_starting_a_thread(pool):
    """A request refused before it reached a view (a body too large) ran
    nothing: letting its executor go starts no thread to close a connection."""
    threads = pool(idle=0)
    before = _django_threads()

    async def refused() -> None:
        async with threads():
            pass

    asyncio.run(refused())

    assert _django_threads() == before


def test_a_failed_request_does_not_give_its_thread_back(pool):
    threads = pool(idle=2)

    async def failing() -> None:
        async with threads():
            await sync_to_async(threading.get_ident)()
            raise ValueError("the view failed")

    with pytest.raises(ValueError, match="the view failed"):
        asyncio.run(failing())

    assert threads.free == []


def test_a_request_whose_client_left_mid_view_does_not_hold_up_the_next(pool):
    """When its client leaves, Django's handler stops waiting for the view and
    returns as usual, but the view runs on to its end on its thread: that
    thread is not given back, and the next request is answered on another
    one while the view goes on."""
    threads = pool(idle=2)
    in_view = threading.Event()
    release = threading.Event()
    slow_thread: list[int] = []

    def slow_view() -> None:
        slow_thread.append(threading.get_ident())
        in_view.set()
        release.wait(10)

    async def run() -> int:
        async with threads():
            view = asyncio.create_task(sync_to_async(slow_view)())
            await asyncio.to_thread(in_view.wait, 10)
            view.cancel()  # the client left: Django's handler stops waiting
            with contextlib.suppress(asyncio.CancelledError):
                await view
        async with threads():
            return await asyncio.wait_for(
                sync_to_async(threading.get_ident)(), timeout=5
            )

    try:
        answered_on = asyncio.run(run())
        view_still_running = not release.is_set()
    finally:
        release.set()

    assert view_still_running
    assert answered_on != slow_thread[0]
    assert len(threads.free) == 1  # only the second request's thread came back


def test_a_cancelled_request_does_not_give_its_thread_back(pool):
    threads = pool(idle=2)
    in_view = threading.Event()
    release = threading.Event()

    def slow_view() -> None:
        in_view.set()
        release.wait(10)

    async def run() -> None:
        async def request() -> None:
            async with threads():
                await sync_to_async(slow_view)()

        task = asyncio.create_task(request())
        await asyncio.to_thread(in_view.wait, 10)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        asyncio.run(run())
    finally:
        release.set()

    assert threads.free == []


def test_closing_lets_every_idle_thread_go(pool):
    threads = pool(idle=4)
    _thread_of_one_request(threads)
    executor = threads.free[0]

    asyncio.run(threads.close())

    assert threads.free == []
    with pytest.raises(RuntimeError):
        executor.submit(print)


# --- Under the real server (uvicorn, the site's ASGI application) ---


@pytest.fixture
def asgi_server(transactional_db):
    from tests.support.asgi_server import ThreadedServer

    server = ThreadedServer().start()
    yield server
    server.stop()


@pytest.mark.slow
def test_pages_reuse_their_threads_and_database_connections(asgi_server, client, user):
    """Twenty pages, one after another on a kept-alive connection, run on at
    most two threads (the next request may come while the last one is being
    finished) and open at most one database connection (that second
    thread's): Django's handler alone starts a thread and opens a connection
    for every request."""
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    threads: list[int] = []
    opened: list[int] = []

    def ran(**kwargs) -> None:
        threads.append(threading.get_native_id())

    def connected(**kwargs) -> None:
        opened.append(threading.get_native_id())

    conn = http.client.HTTPConnection("127.0.0.1", asgi_server.port, timeout=10)

    def page() -> int:
        conn.request("GET", "/", headers={"Cookie": cookie})
        response = conn.getresponse()
        response.read()
        return response.status

    request_finished.connect(ran, weak=False)
    connection_created.connect(connected, weak=False)
    try:
        assert [page() for _ in range(3)] == [200] * 3
        _until(lambda: len(threads) >= 3)  # a signal is sent after its answer
        del threads[:], opened[:]
        statuses = [page() for _ in range(20)]
        _until(lambda: len(threads) >= 20)
    finally:
        request_finished.disconnect(ran)
        connection_created.disconnect(connected)
        conn.close()

    assert statuses == [200] * 20
    assert len(threads) == 20
    assert len(set(threads)) <= 2
    assert len(opened) <= 1
