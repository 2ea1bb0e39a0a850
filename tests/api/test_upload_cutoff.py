"""Uploads are all or nothing: a body cut off mid-way, over a real socket,
leaves no row, no link, no blob and no temp file; the API answers 400 when the
client can still read."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest
from django.core.signals import request_finished

from api.services import token_create
from artifacts.models import Artifact
from tasks.models import Conversation, Task, TaskArtifact

# Each test talks to the live server over a raw socket.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DECLARED = 8 * 1024 * 1024
SENT = 1024 * 1024


@pytest.fixture
def target(make_user):
    user = make_user()
    task = Task.objects.create(
        conversation=Conversation.objects.create(owner=user, title="c"), title="t"
    )
    raw = token_create(user=user, name="runner").raw
    return task, raw


@pytest.fixture
def finished():
    """Set once the server has finished a request (its response closed)."""
    done = threading.Event()

    def receiver(**kwargs):
        done.set()

    request_finished.connect(receiver, weak=False)
    yield done
    request_finished.disconnect(receiver)


def _head(live_server, task_id, raw, lines) -> bytes:
    host = f"{live_server.thread.host}:{live_server.thread.port}"
    return (
        f"POST /api/v1/tasks/{task_id}/artifacts?artifact_class=3&title=cut HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        f"Authorization: Bearer {raw}\r\n"
        "Content-Type: application/octet-stream\r\n"
        + "".join(f"{line}\r\n" for line in lines)
        + "Connection: close\r\n\r\n"
    ).encode()


def _connect(live_server) -> socket.socket:
    return socket.create_connection(
        (live_server.thread.host, live_server.thread.port), timeout=60
    )


def _stop_sending(sock) -> None:
    """The client stops sending and still reads. The server may have answered
    and closed first (a chunked body is refused before it is read): its reset
    makes ``shutdown`` fail with ENOTCONN, and the answer is still there to
    read."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


def _read_all(sock) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _nothing_stored(blob_store) -> None:
    assert not Artifact.objects.exists()
    assert not TaskArtifact.objects.exists()
    assert list(blob_store.shas()) == []
    assert list(blob_store.iter_temp_files()) == []


def test_a_body_shorter_than_declared_is_a_400_and_nothing_is_kept(
    live_server, target, blob_store
):
    task, raw = target
    with _connect(live_server) as sock:
        sock.sendall(_head(live_server, task.pk, raw, [f"Content-Length: {DECLARED}"]))
        sock.sendall(b"x" * SENT)
        _stop_sending(sock)
        answer = _read_all(sock)

    assert answer.startswith(b"HTTP/1.1 400")
    assert f"received {SENT} of the {DECLARED} bytes declared".encode() in answer
    _nothing_stored(blob_store)


def test_a_client_gone_mid_body_leaves_no_row_link_blob_or_temp_file(
    live_server, target, blob_store, finished
):
    task, raw = target
    sock = _connect(live_server)
    sock.sendall(_head(live_server, task.pk, raw, [f"Content-Length: {DECLARED}"]))
    sock.sendall(b"y" * SENT)
    sock.close()  # gone: nobody reads the answer

    assert finished.wait(timeout=120), "the server never finished the request"
    _nothing_stored(blob_store)


def test_a_chunked_body_cut_off_stores_nothing(live_server, target, blob_store):
    task, raw = target
    with _connect(live_server) as sock:
        sock.sendall(_head(live_server, task.pk, raw, ["Transfer-Encoding: chunked"]))
        sock.sendall(b"100000\r\n" + b"z" * 4096)  # a 1 MiB chunk, cut short
        _stop_sending(sock)
        answer = _read_all(sock)

    assert answer.startswith(b"HTTP/1.1 400")
    _nothing_stored(blob_store)


def test_a_complete_body_over_the_same_socket_is_stored(
    live_server, target, blob_store
):
    task, raw = target
    body = b"complete " * 1000
    with _connect(live_server) as sock:
        sock.sendall(_head(live_server, task.pk, raw, [f"Content-Length: {len(body)}"]))
        sock.sendall(body)
        answer = _read_all(sock)

    assert answer.startswith(b"HTTP/1.1 201")
    artifact = Artifact.objects.get()
    assert artifact.size == len(body)
    assert TaskArtifact.objects.filter(task=task, artifact=artifact).exists()
    assert list(blob_store.iter_temp_files()) == []
