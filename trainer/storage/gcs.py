"""``gs://`` run roots: google-cloud-storage (honours ``STORAGE_EMULATOR_HOST``), each call retried and reported."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

from trainer.storage import retry
from trainer.storage.base import NotFound, ObjectInfo, ObjectStore


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

    def _put_bytes(self, key: str, data: bytes) -> None:
        self.bucket.blob(self._name(key)).upload_from_string(data, timeout=self._timeout, retry=self._retry("put", key))

    def _get_bytes(self, key: str) -> bytes:
        from google.api_core.exceptions import NotFound as GNotFound

        try:
            return self.bucket.blob(self._name(key)).download_as_bytes(
                timeout=self._timeout, retry=self._retry("get", key)
            )
        except GNotFound as e:
            raise NotFound(f"{self.uri}/{key}") from e

    def _put_file(self, key: str, path: str) -> None:
        self.bucket.blob(self._name(key)).upload_from_filename(path, timeout=self._timeout, retry=self._retry("put", key))

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

    def _delete_keys(self, keys: list[str]) -> None:
        from google.api_core.exceptions import NotFound as GNotFound

        for key in keys:
            # Already gone is the outcome we want (a retried delete may find it so).
            with contextlib.suppress(GNotFound):
                self.bucket.blob(self._name(key)).delete(timeout=self._timeout, retry=self._retry("delete", key))

