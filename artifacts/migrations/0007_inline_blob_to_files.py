"""Every payload a file: each ``InlineBlob`` row becomes a content-addressed
file under ``BLOB_DIR``, then the table goes.

Each row is written as the blob store writes (temp file in ``tmp/``, fsync,
rename onto ``<ab>/<sha>``, fsync the folder), and the file is read back and
checked against its sha before the table is dropped. A row whose bytes do not
hash to their sha stops the migration (nothing is dropped): the doctor's
integrity scan names such rows; they are not silently carried over. A file
already there with the right bytes is kept.

Written out here rather than through ``artifacts.store``, so the migration
does what it did the day it was written.
"""

import hashlib
import os
import tempfile

from django.conf import settings
from django.db import migrations

ERR_CORRUPT = "inline blob {sha} does not hash to its sha; run pippa_doctor first"


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _file_sha(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write(root, sha, data):
    folder = os.path.join(root, sha[:2])
    final = os.path.join(folder, sha)
    if os.path.isfile(final) and _file_sha(final) == sha:
        return
    for path in (root, os.path.join(root, "tmp"), folder):
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o700)
    fd, tmp = tempfile.mkstemp(dir=os.path.join(root, "tmp"), prefix="migrate-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o400)
        os.replace(tmp, final)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)
    if _file_sha(final) != sha:
        raise RuntimeError(f"blob {sha} was not written intact")


def inline_rows_to_files(apps, schema_editor):
    InlineBlob = apps.get_model("artifacts", "InlineBlob")
    root = os.fspath(settings.BLOB_DIR)
    rows = InlineBlob.objects.using(schema_editor.connection.alias).order_by("sha256")
    for sha in rows.values_list("sha256", flat=True).iterator():
        data = bytes(rows.filter(sha256=sha).values_list("data", flat=True).get())
        if hashlib.sha256(data).hexdigest() != sha:
            raise RuntimeError(ERR_CORRUPT.format(sha=sha))
        _write(root, sha, data)
    if os.path.isdir(root):
        _fsync_dir(root)


def files_to_inline_rows(apps, schema_editor):
    """Going back: the table is made again, empty; the files stay (a file is
    what every version of the store reads first)."""


class Migration(migrations.Migration):

    dependencies = [
        ("artifacts", "0006_inline_blob"),
    ]

    operations = [
        migrations.RunPython(inline_rows_to_files, files_to_inline_rows),
        migrations.DeleteModel(name="InlineBlob"),
    ]
