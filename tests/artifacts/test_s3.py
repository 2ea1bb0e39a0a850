"""How the bucket store writes, against a real SeaweedFS: the sha256 sent with
each put, the conditional puts, a damaged object replaced safely, a bucket
that does not answer. (What every store promises is ``test_store.py``.)"""

from __future__ import annotations

import hashlib
import threading
import time
from io import BytesIO, StringIO

import pytest
from botocore.exceptions import ClientError
from django.core.management import CommandError, call_command

from artifacts.s3 import S3Store, StoreUnavailable, s3_client
from tests.support.blobs import blob_overwrite

pytestmark = pytest.mark.slow


@pytest.fixture
def store(any_store):
    if any_store.kind != "s3":
        pytest.skip("about the bucket store")
    return any_store


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("any_store", ["s3"], indirect=True)
def test_bytes_that_do_not_hash_to_the_sha_sent_are_refused_by_the_server(store):
    right = b"the bytes the key names"
    wrong = b"the bytes that arrived!"

    with pytest.raises(ClientError) as refused:
        store._send(sha(right), len(wrong), BytesIO(wrong), IfNoneMatch="*")

    assert refused.value.response["Error"]["Code"] == "BadDigest"
    assert not store.exists(sha(right))


@pytest.mark.parametrize("any_store", ["s3"], indirect=True)
def test_writers_of_the_same_bytes_at_once_store_them_once_and_all_succeed(store):
    data = b"written by eight at once" * 1000
    results, errors = [], []
    barrier = threading.Barrier(8)

    def put():
        try:
            barrier.wait()
            results.append(store.put_bytes(data))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=put) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert sum(r.created for r in results) == 1  # the first writer wins
    assert {r.sha256 for r in results} == {sha(data)}
    assert store.verify(sha(data))


@pytest.mark.parametrize("any_store", ["s3"], indirect=True)
def test_a_second_writer_checks_a_damaged_object_and_replaces_it(store):
    first = store.put_bytes(b"precious bytes")
    blob_overwrite(first.sha256, b"rotten bytes!!", store)
    assert not store.verify(first.sha256)

    again = store.put_bytes(b"precious bytes")

    assert not again.created
    assert store.get(first.sha256) == b"precious bytes"


@pytest.mark.parametrize("any_store", ["s3"], indirect=True)
def test_a_damaged_object_healed_by_another_writer_meanwhile_is_not_overwritten_blindly(
    store, monkeypatch
):
    """The replacement is conditional on the object being the damaged one we
    checked (If-Match: its etag): a writer that healed it first wins, and we
    check again instead of writing over it."""
    data = b"healed twice"
    first = store.put_bytes(data)
    blob_overwrite(first.sha256, b"rotten bytes", store)
    real_check = S3Store._check
    sends = []

    def check_then_heal(self, sha256):
        found = real_check(self, sha256)
        if not sends:  # another writer heals it between our check and our put
            sends.append("healed")
            self.client.put_object(Bucket=self.bucket, Key=self.key(sha256), Body=data)
        return found

    monkeypatch.setattr(S3Store, "_check", check_then_heal)
    again = store.put_bytes(data)

    assert not again.created
    assert store.verify(first.sha256)
    assert sends == ["healed"]


@pytest.mark.parametrize("any_store", ["s3"], indirect=True)
def test_storing_old_bytes_again_renews_the_object_so_the_doctor_waits_for_its_row(
    store,
):
    """As the folder store renews a file's mtime: the doctor's grace period
    runs from the object's LastModified."""
    first = store.put_bytes(b"stored long ago")
    [before] = [b.modified for b in store.iter_blobs()]
    time.sleep(1.1)  # LastModified counts whole seconds
    store.refresh_after = 0.5

    store.put_bytes(b"stored long ago")

    [after] = [b.modified for b in store.iter_blobs()]
    assert after > before
    assert store.verify(first.sha256)


@pytest.mark.parametrize("any_store", ["s3"], indirect=True)
def test_a_bucket_that_does_not_answer_is_an_os_error_and_a_counted_put_error(
    store, monkeypatch
):
    from tests.support.seaweed import free_ports

    [port] = free_ports(1)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{port}")
    gone = S3Store(store.bucket, store.prefix, client=s3_client())
    from pippa_site import metrics

    errors = metrics.BLOB_PUT_ERRORS.labels("s3")
    before = errors._value.get()

    with pytest.raises(StoreUnavailable) as refused:
        gone.put_bytes(b"nowhere to go")

    assert isinstance(refused.value, OSError)
    assert errors._value.get() == before + 1
    with pytest.raises(StoreUnavailable):
        gone.exists(sha(b"nowhere to go"))


@pytest.mark.parametrize("any_store", ["s3"], indirect=True)
def test_pippa_bucket_makes_the_bucket_and_checks_the_servers_puts(store, settings):
    settings.PIPPA_BLOB_URL = f"s3://pippa-new-{time.time_ns()}/blobs"
    out = StringIO()

    call_command("pippa_bucket", "--wait", "10", stdout=out)

    assert "created the bucket" in out.getvalue()
    assert "checks each put's sha256" in out.getvalue()
    call_command("pippa_bucket", stdout=(again := StringIO()))
    assert "found the bucket" in again.getvalue()


@pytest.mark.django_db
def test_pippa_bucket_without_a_bucket_says_where_the_blobs_are(settings):
    settings.PIPPA_BLOB_URL = ""
    with pytest.raises(CommandError, match="blobs are in the folder"):
        call_command("pippa_bucket")


@pytest.mark.django_db
@pytest.mark.parametrize("any_store", ["s3"], indirect=True)
def test_a_workers_probe_after_a_fault_asks_the_bucket(store, settings, monkeypatch):
    from tasks.faults import REASON_STORE, store_probe
    from tests.support.seaweed import free_ports

    assert store_probe() == ""
    [port] = free_ports(1)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{port}")
    settings.PIPPA_BLOB_URL = f"s3://{store.bucket}/{store.prefix}"  # a new client
    settings.PIPPA_DOCTOR_GRACE_SECONDS += 1

    assert store_probe().startswith(REASON_STORE)
