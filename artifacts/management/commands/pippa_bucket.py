"""``manage.py pippa_bucket``: make the bucket ready and check the server keeps the store's promises.

With ``PIPPA_BLOB_URL=s3://bucket/prefix`` (and boto3's variables for the
endpoint and credentials), create the bucket if it is missing, then check,
under the prefix, what ``artifacts.s3.S3Store`` relies on:

1. a put whose bytes do not hash to the sha256 sent with it is refused;
2. a put with ``If-None-Match: *`` of a key that exists is refused (412);
3. a blob put through the store reads back whole and intact, and goes.

An S3-compatible server that accepts either refused put would let a damaged
or a second write stand: the command then fails, saying which. ``--wait``
retries until the server answers (it may still be starting).
"""

from __future__ import annotations

import hashlib
import time
from io import BytesIO

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from artifacts.store import default_store

ERR_NO_BUCKET = "PIPPA_BLOB_URL is not set: the blobs are in the folder {folder}"
ERR_CHECKSUM = "the server stored bytes that do not match the sha256 sent with them"
ERR_CONDITIONAL = "the server let a conditional put (If-None-Match: *) replace a key"
ERR_READ_BACK = "a blob put through the store did not read back intact"


class Command(BaseCommand):
    help = "Create the bucket PIPPA_BLOB_URL names and check the server's puts."

    def add_arguments(self, parser):
        parser.add_argument(
            "--wait",
            type=float,
            default=0,
            help="seconds to keep trying while the server does not answer",
        )

    def handle(self, *args, **options):
        if not settings.PIPPA_BLOB_URL:
            raise CommandError(ERR_NO_BUCKET.format(folder=settings.BLOB_DIR))
        from botocore.exceptions import ClientError

        store = default_store()
        deadline = time.monotonic() + options["wait"]
        while True:
            try:
                made = store.bucket_create()
                break
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise CommandError(f"{store.describe()}: {exc}") from exc
                time.sleep(0.5)
        self.stdout.write(
            f"{'created' if made else 'found'} {store.describe()}", ending="\n"
        )
        probe = f"pippa_bucket check {time.time_ns()}".encode()
        sha = hashlib.sha256(probe).hexdigest()
        client, bucket = store.client, store.bucket
        try:
            wrong = probe[:-1] + b"?"  # the same length, one byte off
            store._send(sha, len(probe), BytesIO(wrong))
        except ClientError:
            pass
        else:
            client.delete_object(Bucket=bucket, Key=store.key(sha))
            raise CommandError(ERR_CHECKSUM)
        put = store.put_bytes(probe)
        try:
            if not (put.created and store.get(sha) == probe and store.verify(sha)):
                raise CommandError(ERR_READ_BACK)
            try:
                store._send(sha, len(probe), BytesIO(probe), IfNoneMatch="*")
            except ClientError:
                pass
            else:
                raise CommandError(ERR_CONDITIONAL)
        finally:
            store.unlink(sha)
        self.stdout.write(
            self.style.SUCCESS(
                "the server checks each put's sha256, refuses a second conditional "
                "put of a key, and reads back what was stored"
            )
        )
