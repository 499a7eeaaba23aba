"""``gs://`` run roots: google-cloud-storage (honours ``STORAGE_EMULATOR_HOST``), each call retried and reported."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from runfolder import layout
from runfolder.storage import retry
from runfolder.storage.base import ObjectInfo, ObjectStore
from runfolder.storage.errors import Cancelled, NotFound, PreconditionFailed, WriteConflict
from runfolder.storage.keys import CancellableReader

# Files this large go up as parallel parts composed into one object (see _put_parallel).
PARALLEL_THRESHOLD = 32 * 1024 * 1024
PART_MIN = 8 * 1024 * 1024
PARALLEL_PARTS = 8
MAX_COMPOSE = 32  # GCS composes at most 32 objects in one call
# Resumable uploads send this much per request, so a cancel or a retry is never far away.
RESUMABLE_CHUNK = 8 * 1024 * 1024
PARTS_PREFIX = ".trainstack-parts/"


class _Either:
    """Set when either of two events is (quacks like ``threading.Event.is_set``)."""

    def __init__(self, a: threading.Event | None, b: threading.Event) -> None:
        self.a, self.b = a, b

    def is_set(self) -> bool:
        return self.b.is_set() or (self.a is not None and self.a.is_set())


class GCSStore(ObjectStore):
    """A run root in a Google Cloud Storage bucket (or the emulator at ``STORAGE_EMULATOR_HOST``)."""

    scheme = "gs"

    def __init__(self, uri: str) -> None:
        from google.api_core import retry as gretry
        from google.cloud import storage
        from google.cloud.storage.retry import DEFAULT_RETRY

        super().__init__(uri)
        # Credentials and project come from the environment (metadata server on GCE,
        # anonymous when STORAGE_EMULATOR_HOST is set).
        self.client = storage.Client()
        self.bucket = self.client.bucket(self.bucket_name)
        self._timeout = (retry.CONNECT_TIMEOUT_S, retry.READ_TIMEOUT_S)
        self._predicate = DEFAULT_RETRY._predicate
        self._gretry = gretry

    def _retry(self, op: str, key: str):
        """google-api-core retry for one call, reporting each retry with its key.

        Our writes replace an object with identical content, so they are safe to retry
        even without generation preconditions (the library's default retries only calls
        it knows to be idempotent).
        """
        attempts = [0]

        def on_error(exc: BaseException) -> None:
            attempts[0] += 1
            self._notify_retry(op, key, attempts[0], exc)

        return self._gretry.Retry(
            predicate=self._predicate,
            initial=retry.BACKOFF_INITIAL_S,
            maximum=retry.BACKOFF_MAX_S,
            multiplier=2.0,
            timeout=retry.TRANSFER_MAX_SECONDS,
            on_error=on_error,
        )

    def _blob(self, name: str, *, checkpoint: bool, chunk_size: int | None = None):
        """A blob to upload; a checkpoint's (and every parallel-upload part) gets its Custom-Time.

        The bucket's short noncurrent rule matches on Custom-Time (see `runfolder.layout`): it
        is sent with the upload itself, so every generation of the object carries it.
        """
        blob = self.bucket.blob(name, chunk_size=chunk_size)
        if checkpoint:
            blob.custom_time = datetime.now(tz=UTC)
        return blob

    def _put_bytes(self, key: str, data: bytes) -> None:
        blob = self._blob(self._name(key), checkpoint=layout.is_checkpoint_key(key))
        blob.upload_from_string(data, timeout=self._timeout, retry=self._retry("put", key))

    def _get_bytes(self, key: str) -> bytes:
        from google.api_core.exceptions import NotFound as GNotFound

        try:
            return self.bucket.blob(self._name(key)).download_as_bytes(
                timeout=self._timeout, retry=self._retry("get", key)
            )
        except GNotFound as e:
            raise NotFound(f"{self.uri}/{key}") from e

    def _get_range(self, key: str, start: int, end: int | None) -> bytes:
        from google.api_core.exceptions import NotFound as GNotFound
        from google.api_core.exceptions import RequestRangeNotSatisfiable

        blob = self.bucket.blob(self._name(key))
        try:
            # `end` is inclusive in the client, as in HTTP's Range.
            return blob.download_as_bytes(start=start, end=None if end is None else end - 1, timeout=self._timeout,
                                          retry=self._retry("get", key))
        except RequestRangeNotSatisfiable:
            # 416: the object ends before `start` (or is empty): nothing to read there.
            if not self._exists(key):
                raise NotFound(f"{self.uri}/{key}") from None
            return b""
        except GNotFound as e:
            raise NotFound(f"{self.uri}/{key}") from e

    def _get_versioned(self, key: str) -> tuple[bytes, str]:
        from google.api_core.exceptions import NotFound as GNotFound
        from google.api_core.exceptions import PreconditionFailed as GPreconditionFailed

        name = self._name(key)
        for _ in range(5):
            blob = self.bucket.get_blob(name, timeout=self._timeout, retry=self._retry("get", key))
            if blob is None:
                raise NotFound(f"{self.uri}/{key}")
            generation = blob.generation  # read first: a download resets it from its own headers
            try:
                # Pinned to the generation just read, so content and version belong together.
                data = blob.download_as_bytes(if_generation_match=generation, timeout=self._timeout,
                                              retry=self._retry("get", key))
            except GPreconditionFailed:
                continue  # replaced between the two calls: read the newer one
            except GNotFound as e:
                raise NotFound(f"{self.uri}/{key}") from e
            return data, str(generation)
        raise RuntimeError(f"{self.uri}/{key} changed on every read (5 times); try again")

    def _put_bytes_if(self, key: str, data: bytes, version: str | None) -> str:
        from google.api_core.exceptions import Conflict as GConflict
        from google.api_core.exceptions import NotFound as GNotFound
        from google.api_core.exceptions import PreconditionFailed as GPreconditionFailed

        blob = self.bucket.blob(self._name(key))
        expected = 0 if version is None else int(version)  # generation 0: "no live object"
        try:
            blob.upload_from_string(data, if_generation_match=expected, timeout=self._timeout,
                                    retry=self._retry("put", key))
        except GConflict as e:
            # 409: a concurrent change to the object ("edited during the operation, please try
            # again"); the client's retry policy does not retry it. Decided nothing: read again.
            raise WriteConflict(f"{self.uri}/{key}: 409 (another write to it was in flight)") from e
        except (GPreconditionFailed, GNotFound) as e:
            raise PreconditionFailed(f"{self.uri}/{key}: {'exists' if version is None else 'changed since generation ' + version}") from e
        return str(blob.generation)

    def _put_file(self, key: str, path: str, cancel) -> None:
        size = os.path.getsize(path)
        if size >= PARALLEL_THRESHOLD:
            self._put_parallel(key, path, size, cancel)
            return
        with open(path, "rb") as f:
            self._upload_part(self._name(key), key, f, 0, size, cancel, checkpoint=layout.is_checkpoint_key(key))

    def _upload_part(self, name: str, key: str, f, offset: int, length: int, cancel, *, checkpoint: bool) -> None:
        if cancel is not None and length > 0:
            self._upload_streamed(name, key, f, offset, length, cancel, checkpoint=checkpoint)
            return
        # Small objects go in one request; larger ones resumable, a chunk per request.
        blob = self._blob(name, checkpoint=checkpoint, chunk_size=RESUMABLE_CHUNK if length > RESUMABLE_CHUNK else None)
        blob.upload_from_file(CancellableReader(f, cancel, offset, length), size=length, rewind=False,
                              timeout=self._timeout, retry=self._retry("put", key))

    def _upload_streamed(self, name: str, key: str, f, offset: int, length: int, cancel, *, checkpoint: bool) -> None:
        """One resumable session, its whole span sent in one request read lazily from the file.

        The client library reads each chunk into memory before sending it, so a cancel would
        wait for up to a chunk per connection. Here the request's body is the file itself,
        read a few KiB at a time as the socket takes it: a cancel ends the request mid-body.
        As the library does, the CRC32C of what was sent is compared with the one GCS stored.
        """
        import base64

        import google_crc32c
        from google.api_core import exceptions as gexc

        crc = google_crc32c.Checksum()
        f.seek(offset)
        left = length
        while left:
            if cancel.is_set():
                raise Cancelled(f"upload of {self.uri}/{key} cancelled")
            piece = f.read(min(left, 4 * 1024 * 1024))
            if not piece:
                raise OSError(f"{key}: the local file shrank while it was being uploaded")
            crc.update(piece)
            left -= len(piece)
        blob = self._blob(name, checkpoint=checkpoint)
        url = blob.create_resumable_upload_session(size=length, timeout=self._timeout, retry=self._retry("put", key),
                                                   checksum=None)
        body = CancellableReader(f, cancel, offset, length)
        resp = self.client._http.put(url, data=body, timeout=self._timeout, headers={
            "Content-Length": str(length), "Content-Range": f"bytes 0-{length - 1}/{length}"})
        if resp.status_code not in (200, 201):
            raise gexc.from_http_response(resp)
        stored = (resp.json() or {}).get("crc32c") if resp.content else None
        sent = base64.b64encode(crc.digest()).decode()
        if stored and stored != sent:
            from google.resumable_media.common import DataCorruption

            raise DataCorruption(resp, f"{key}: GCS stored CRC32C {stored}, the file's is {sent}; uploading again")

    def _put_parallel(self, key: str, path: str, size: int, cancel) -> None:
        """Upload a large file as parts in parallel, then compose them into the object (GCS's
        parallel composite upload); the parts are deleted whatever happens.

        One stream to GCS moves a large checkpoint too slowly for GCE's 30 s notice; parts
        go up side by side. Parts live under a hidden folder of the run root, so the
        machine's own permissions cover them and no listing of the run's folders sees them.
        Deleting a part leaves it as a noncurrent version in the versioned bucket: every part
        carries the checkpoint mark (Custom-Time), so the bucket's short rule removes it, whatever
        the file it was part of.
        """
        part = max(PART_MIN, -(-size // MAX_COMPOSE))
        spans = [(off, min(part, size - off)) for off in range(0, size, part)]
        folder = f"{self._name(PARTS_PREFIX)}{uuid.uuid4().hex}/"
        names = [f"{folder}{i:03d}" for i in range(len(spans))]
        stop = threading.Event()  # one failed part stops the others

        def one(i: int) -> None:
            either = _Either(cancel, stop)
            with open(path, "rb") as f:
                try:
                    self._upload_part(names[i], key, f, spans[i][0], spans[i][1], either, checkpoint=True)
                except BaseException:
                    stop.set()
                    raise

        try:
            with ThreadPoolExecutor(max_workers=min(PARALLEL_PARTS, len(spans)), thread_name_prefix="gcs-part") as pool:
                errors = [f.exception() for f in [pool.submit(one, i) for i in range(len(spans))]]
            cancelled = [e for e in errors if isinstance(e, Cancelled)]
            failed = [e for e in errors if e is not None and not isinstance(e, Cancelled)]
            if failed:
                raise failed[0]
            if cancelled:
                raise cancelled[0]
            target = self._blob(self._name(key), checkpoint=layout.is_checkpoint_key(key))
            target.compose([self.bucket.blob(n) for n in names], timeout=self._timeout,
                           retry=self._retry("put", key))
        finally:
            for n in names:
                with contextlib.suppress(Exception):  # a part never written, or a store gone: best effort
                    self.bucket.blob(n).delete(timeout=self._timeout, retry=self._retry("delete", key))

    def _get_file(self, key: str, path: str) -> None:
        from google.api_core.exceptions import NotFound as GNotFound

        try:
            self.bucket.blob(self._name(key)).download_to_filename(
                path, timeout=self._timeout, retry=self._retry("get", key)
            )
        except GNotFound as e:
            raise NotFound(f"{self.uri}/{key}") from e

    def _exists(self, key: str) -> bool:
        return self.bucket.blob(self._name(key)).exists(timeout=self._timeout, retry=self._retry("stat", key))

    def _stat(self, prefix: str) -> dict[str, ObjectInfo]:
        out: dict[str, ObjectInfo] = {}
        blobs = self.client.list_blobs(
            self.bucket_name, prefix=self._name(prefix), timeout=self._timeout, retry=self._retry("list", prefix)
        )
        for blob in blobs:
            modified = blob.updated or datetime.now(tz=UTC)
            out[self._key(blob.name)] = ObjectInfo(int(blob.size or 0), modified)
        return out

    def _folders(self, prefix: str) -> set[str]:
        blobs = self.client.list_blobs(self.bucket_name, prefix=self._name(prefix), delimiter="/",
                                       timeout=self._timeout, retry=self._retry("list", prefix))
        for _page in blobs.pages:  # the prefixes are gathered as the pages are read
            pass
        return {self._key(p) for p in blobs.prefixes}

    def _delete_keys(self, keys: list[str]) -> None:
        from google.api_core.exceptions import NotFound as GNotFound

        for key in keys:
            # Already gone is the outcome we want (a retried delete may find it so).
            with contextlib.suppress(GNotFound):
                self.bucket.blob(self._name(key)).delete(timeout=self._timeout, retry=self._retry("delete", key))

