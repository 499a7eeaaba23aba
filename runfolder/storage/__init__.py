"""Object storage for a run: one small interface over S3, GCS and local files.

A :class:`Store` is rooted at a run URI (``s3://bucket/runs/id``, ``gs://bucket/runs/id``,
``file:///abs/runs/id`` or ``file://./runs/id`` relative to the working directory) and
speaks in keys relative to that root (``checkpoints/ckpt-10/COMMITTED``).

TF 2.21 has no ``s3://`` filesystem, so the trainer writes to local disk and this module
moves bytes: boto3 for S3, google-cloud-storage for GCS (it honours
``STORAGE_EMULATOR_HOST`` and, unlike gcsfs, needs no switch to avoid stalls against the
emulator), plain files for ``file://``. Endpoints come only from the standard variables
``AWS_ENDPOINT_URL`` and ``STORAGE_EMULATOR_HOST``, which the client libraries read.

Every write is all-or-nothing from a reader's point of view: object stores only publish a
finished object, and local files are written to a hidden temporary name and renamed.
Reads into local files go to a temporary name first too. Transfers are retried on
transient errors only: botocore's adaptive mode inside each S3 call, google-api-core's
retry inside each GCS call, and tenacity (exponential backoff with a cap) around each
whole transfer, which catches what those do not (a multipart upload that gave up, a reset
while streaming a download, a flaky network filesystem). ``Store.on_retry`` sees every
retry, so the trainer can report it.

Conditional writes (:meth:`Store.put_bytes_if`, against the version :meth:`Store.get_versioned`
read) let one writer claim an object (the run's lease, :mod:`runfolder.lease`) with the
store deciding races: S3 ``If-None-Match``/``If-Match`` on the ETag, GCS ``ifGenerationMatch``.

A ranged read (:meth:`Store.get_range`: S3 ``Range``, GCS ``start``/``end``, a seek locally) fetches
only part of an object, so a reader following an object that grows (a TensorBoard event
file) fetches only what was added since its last read.

An upload given a ``cancel`` event stops at its next read of the file once the event is
set (a newer synchronous checkpoint commit takes the bandwidth). Large files go to GCS as
parallel parts composed into one object; S3 uploads them as parallel multipart parts.

The package, by section: :mod:`~runfolder.storage.keys` (key checks, URI parsing, local
walks), :mod:`~runfolder.storage.errors` (what a store raises), :mod:`~runfolder.storage.retry`
(which errors are transient, the retry policy), :mod:`~runfolder.storage.base` (the interface
and what it builds on the primitives), and one module per backend
(:mod:`~runfolder.storage.local`, :mod:`~runfolder.storage.s3`, :mod:`~runfolder.storage.gcs`).
Import from here: ``from runfolder.storage import open_store, NotFound``.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

from runfolder.storage.base import ObjectInfo, ObjectStore, Store
from runfolder.storage.errors import Cancelled, NotFound, PreconditionFailed, WriteConflict
from runfolder.storage.gcs import GCSStore
from runfolder.storage.keys import TMP_MARK, check_key, walk_files
from runfolder.storage.local import FileStore
from runfolder.storage.retry import is_transient
from runfolder.storage.s3 import S3Store

__all__ = [
    "NotFound",
    "PreconditionFailed",
    "WriteConflict",
    "Cancelled",
    "ObjectInfo",
    "Store",
    "ObjectStore",
    "FileStore",
    "S3Store",
    "GCSStore",
    "open_store",
    "download_many",
    "read_json",
    "is_transient",
    "check_key",
    "walk_files",
    "TMP_MARK",
]


def open_store(uri: str) -> Store:
    """Return the :class:`Store` for a run root URI (``s3://``, ``gs://`` or ``file://``)."""
    if not isinstance(uri, str) or "://" not in uri:
        raise ValueError(f"run URI {uri!r} must start with s3://, gs:// or file://")
    scheme = uri.split("://", 1)[0].lower()
    if scheme == "file":
        return FileStore(uri)
    if scheme == "s3":
        return S3Store(uri)
    if scheme == "gs":
        return GCSStore(uri)
    raise ValueError(f"run URI {uri!r} has unsupported scheme {scheme!r}; use s3://, gs:// or file://")


def download_many(
    store: Store, keys_to_paths: dict[str, str], *, workers: int = 8, skip_existing: bool = True
) -> int:
    """Download many keys to local paths in parallel; return how many were downloaded.

    With ``skip_existing`` a local file that already has the stored size is kept (a
    rebooted machine does not download its data again). Files appear only when complete,
    so a same-size file is never a leftover of an interrupted download.
    """
    if workers < 1:
        raise ValueError(f"download_many needs workers >= 1, got {workers}")
    for key in keys_to_paths:
        check_key(key)
    todo = dict(keys_to_paths)
    if skip_existing and any(os.path.isfile(p) for p in todo.values()):
        prefix = os.path.commonprefix(list(todo))
        sizes = {k: info.size for k, info in store.stat(prefix).items()}
        for key, path in list(todo.items()):
            if key in sizes and os.path.isfile(path) and os.path.getsize(path) == sizes[key]:
                del todo[key]
    if not todo:
        return 0
    with ThreadPoolExecutor(max_workers=min(workers, len(todo)), thread_name_prefix="download") as pool:
        futures = [pool.submit(store.get_file, key, path) for key, path in todo.items()]
        # Surface the first failure, but only after every download has finished or failed.
        errors = [f.exception() for f in futures]
    for err in errors:
        if err is not None:
            raise err
    return len(todo)



def read_json(store: Store, key: str) -> dict | None:
    """The small JSON object at ``key``: ``None`` when absent, ``{}`` when present but not a JSON object.

    One answer for every reader of the run's small documents (markers, COMPLETE, progress): an
    object that exists counts as existing even when it cannot be parsed (a torn or foreign
    write), and its fields read as missing. Transient errors are retried by the store; others
    (no permission, no bucket) are raised.
    """
    try:
        raw = store.get_bytes(key)
    except NotFound:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:  # also a UnicodeDecodeError
        return {}
    return doc if isinstance(doc, dict) else {}
