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
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlparse

import tenacity

__all__ = [
    "NotFound",
    "ObjectInfo",
    "Store",
    "FileStore",
    "S3Store",
    "GCSStore",
    "open_store",
    "download_many",
    "is_transient",
    "walk_files",
]

# A preempted machine has ~30 s (GCE) to ~2 min (EC2) of notice: a transfer must give up
# on a dead endpoint quickly and try again rather than hang.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 15
S3_MAX_ATTEMPTS = 10
# The outer retry sits on top of the client libraries' own retries, so it stays short.
TRANSFER_ATTEMPTS = 5
TRANSFER_MAX_SECONDS = 60
BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 5.0

# Local temporary files carry this marker so listings and mirrors never show them.
TMP_MARK = ".trainstack-tmp-"

RetryHook = Callable[[str, str, int, BaseException], None]


class NotFound(Exception):
    """The key does not exist in the store."""


@dataclass(frozen=True)
class ObjectInfo:
    """Size and last-modified time of one stored object."""

    size: int
    modified: datetime


def _check_key(key: str, *, allow_empty: bool = False) -> str:
    """Return ``key`` if it is a clean relative key, else raise ``ValueError`` saying why."""
    if not isinstance(key, str):
        raise ValueError(f"store key must be a string, got {type(key).__name__}")
    if not key:
        if allow_empty:
            return key
        raise ValueError("store key must not be empty")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise ValueError(f"store key {key!r} must be relative, '/'-separated, without backslashes")
    parts = key.split("/")
    if any(p in (".", "..") for p in parts) or any(p == "" for p in parts[:-1]):
        raise ValueError(f"store key {key!r} must not contain '.', '..' or empty path segments")
    return key


_TRANSIENT_ERRNOS = {errno.EIO, errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.EBUSY, errno.ESTALE}
_THROTTLE_CODES = {
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "RequestThrottled",
    "SlowDown",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "ServiceUnavailable",
}


def _is_transient_one(exc: BaseException) -> bool:
    # Imported lazily: a file:// run must not need the cloud libraries to be importable.
    try:
        import botocore.exceptions as bx
    except ImportError:  # pragma: no cover - boto3 is a trainer requirement
        bx = None
    if bx is not None:
        if isinstance(exc, bx.ClientError):
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            code = exc.response.get("Error", {}).get("Code", "")
            return status >= 500 or status == 429 or code in _THROTTLE_CODES
        if isinstance(
            exc, bx.ConnectionError | bx.HTTPClientError | bx.IncompleteReadError | bx.ResponseStreamingError
        ):
            return True
    try:
        import google.api_core.exceptions as gx
        import requests.exceptions as rx
    except ImportError:  # pragma: no cover - google-cloud-storage is a trainer requirement
        gx = rx = None
    if gx is not None:
        if isinstance(exc, gx.TooManyRequests | gx.ServerError | gx.RetryError):
            return True
        if isinstance(exc, rx.ConnectionError | rx.Timeout | rx.ChunkedEncodingError):
            return True
        try:
            from google.resumable_media import common as rm
        except ImportError:  # pragma: no cover
            rm = None
        if rm is not None:
            if isinstance(exc, rm.DataCorruption):
                return True
            if isinstance(exc, rm.InvalidResponse):
                status = getattr(exc.response, "status_code", 0) or 0
                return status >= 500 or status == 429
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or an error it wraps) is worth retrying: network, throttling, 5xx.

    boto3's transfer manager wraps the client error it gave up on, so the whole
    cause/context chain is examined.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, NotFound | ValueError | PermissionError | FileNotFoundError):
            return False
        if _is_transient_one(cur):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


class Store:
    """Keys and bytes under one run root. Use :func:`open_store` to get one.

    Subclasses implement the ``_``-prefixed primitives on full object names; this class
    validates keys, retries transfers and builds the composite operations on top.
    """

    uri: str
    #: Called as ``on_retry(operation, key, attempt, error)`` before each retry.
    on_retry: RetryHook | None

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.on_retry = None
        # Remembers what this process uploaded from which local file, so mirroring a
        # directory again skips files that did not change since.
        self._mirrored: dict[tuple[str, str], tuple[int, int]] = {}
        self._mirror_lock = threading.Lock()
        # Appends are read-modify-write on object stores: serialise them within a process.
        self._append_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    # -- retries ---------------------------------------------------------------------

    def _notify_retry(self, op: str, key: str, attempt: int, error: BaseException) -> None:
        hook = self.on_retry
        if hook is not None:
            # A failing listener must not turn a recoverable transfer into a failure.
            with contextlib.suppress(Exception):
                hook(op, key, attempt, error)

    def _retrying(self, op: str, key: str, fn: Callable[[], object]) -> object:
        def before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            if exc is not None:
                self._notify_retry(op, key, state.attempt_number, exc)

        retryer = tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_transient),
            stop=tenacity.stop_after_attempt(TRANSFER_ATTEMPTS) | tenacity.stop_after_delay(TRANSFER_MAX_SECONDS),
            wait=tenacity.wait_exponential_jitter(initial=BACKOFF_INITIAL_S, max=BACKOFF_MAX_S, jitter=BACKOFF_INITIAL_S),
            before_sleep=before_sleep,
            reraise=True,
        )
        return retryer(fn)

    # -- public API ------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any previous object, all or nothing."""
        _check_key(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValueError(f"put_bytes({key!r}) needs bytes, got {type(data).__name__}")
        data = bytes(data)
        self._retrying("put", key, lambda: self._put_bytes(key, data))

    def get_bytes(self, key: str) -> bytes:
        """Return the object at ``key``; raise :class:`NotFound` if there is none."""
        _check_key(key)
        return self._retrying("get", key, lambda: self._get_bytes(key))  # type: ignore[return-value]

    def put_file(self, key: str, path: str) -> None:
        """Upload the local file ``path`` to ``key``, all or nothing."""
        _check_key(key)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"cannot upload {path!r} to {self.uri}/{key}: no such local file")
        self._retrying("put", key, lambda: self._put_file(key, path))

    def get_file(self, key: str, path: str) -> None:
        """Download ``key`` to the local ``path`` (parents created); raise :class:`NotFound`.

        The file appears under ``path`` only once complete.
        """
        _check_key(key)
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)

        def once() -> None:
            fd, tmp = tempfile.mkstemp(prefix=TMP_MARK, dir=parent)
            os.close(fd)
            try:
                self._get_file(key, tmp)
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

        self._retrying("get", key, once)

    def exists(self, key: str) -> bool:
        """True if an object is stored at ``key``."""
        _check_key(key)
        return bool(self._retrying("stat", key, lambda: self._exists(key)))

    def stat(self, prefix: str = "") -> dict[str, ObjectInfo]:
        """Size and modification time of every key under ``prefix`` (a plain string prefix)."""
        _check_key(prefix.rstrip("/"), allow_empty=True)
        return self._retrying("list", prefix, lambda: self._stat(prefix))  # type: ignore[return-value]

    def list(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix`` (a plain string prefix), relative to the root, recursive, sorted."""
        return sorted(self.stat(prefix))

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key that starts with ``prefix``. An empty prefix is refused."""
        if not prefix:
            raise ValueError(f"delete_prefix needs a non-empty prefix; refusing to empty {self.uri}")
        _check_key(prefix.rstrip("/"))
        keys = self.list(prefix)
        if keys:
            self._retrying("delete", prefix, lambda: self._delete_keys(keys))

    def append_line(self, key: str, line: str) -> None:
        """Append one line (a newline is added) to the text object at ``key``.

        Object stores have no append, so this reads, extends and rewrites the object:
        correct for a single writer (the chief), which is how run files are written.
        """
        _check_key(key)
        if "\n" in line or "\r" in line:
            raise ValueError(f"append_line({key!r}) takes one line without line breaks")
        with self._append_lock:
            self._retrying("append", key, lambda: self._append_line(key, line + "\n"))

    def upload_dir(self, local_dir: str, prefix: str, *, changed_only: bool = True) -> int:
        """Mirror the files under ``local_dir`` to ``prefix``; return how many were uploaded.

        With ``changed_only`` a file is skipped when this store uploaded it from the same
        size and mtime before, or, the first time, when the stored copy has the same size
        and is newer than the local file (size and time, as rsync compares). Files are never deleted
        remotely: TensorBoard and SavedModel directories only grow or are rewritten.
        """
        if not os.path.isdir(local_dir):
            raise FileNotFoundError(f"cannot mirror {local_dir!r} to {self.uri}: not a directory")
        prefix = prefix.rstrip("/")
        if prefix:
            _check_key(prefix)
        base = f"{prefix}/" if prefix else ""
        remote = self.stat(base) if changed_only else {}
        uploaded = 0
        for rel, path in walk_files(local_dir):
            key = base + rel
            st = os.stat(path)
            sig = (st.st_size, st.st_mtime_ns)
            memo_key = (key, os.path.abspath(path))
            if changed_only:
                with self._mirror_lock:
                    seen = self._mirrored.get(memo_key)
                if seen == sig:
                    continue
                info = remote.get(key)
                if seen is None and info is not None and info.size == st.st_size:
                    # Stores keep whole seconds (S3): the stored copy must be newer than the
                    # local file even if its time was truncated, so round the local time up.
                    local_mtime = datetime.fromtimestamp(math.ceil(st.st_mtime), tz=UTC)
                    if info.modified >= local_mtime:
                        with self._mirror_lock:
                            self._mirrored[memo_key] = sig
                        continue
            self.put_file(key, path)
            with self._mirror_lock:
                self._mirrored[memo_key] = sig
            uploaded += 1
        return uploaded

    # -- primitives (keys already validated) -----------------------------------------

    def _put_bytes(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def _get_bytes(self, key: str) -> bytes:
        raise NotImplementedError

    def _put_file(self, key: str, path: str) -> None:
        raise NotImplementedError

    def _get_file(self, key: str, path: str) -> None:
        raise NotImplementedError

    def _exists(self, key: str) -> bool:
        raise NotImplementedError

    def _stat(self, prefix: str) -> dict[str, ObjectInfo]:
        raise NotImplementedError

    def _delete_keys(self, keys: list[str]) -> None:
        raise NotImplementedError

    def _append_line(self, key: str, text: str) -> None:
        try:
            old = self._get_bytes(key)
        except NotFound:
            old = b""
        if old and not old.endswith(b"\n"):
            old += b"\n"
        self._put_bytes(key, old + text.encode())


def walk_files(local_dir: str) -> list[tuple[str, str]]:
    """Return ``(relative '/'-separated path, path)`` for each file under ``local_dir``, sorted, no temporaries."""
    out = []
    for dirpath, dirnames, filenames in os.walk(local_dir):
        dirnames.sort()
        for name in filenames:
            if name.startswith(TMP_MARK):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, local_dir).replace(os.sep, "/")
            out.append((rel, path))
    return sorted(out)


class FileStore(Store):
    """A run root on the local filesystem (or a mounted one)."""

    def __init__(self, uri: str) -> None:
        rest = uri[len("file://") :]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        if not rest:
            raise ValueError(f"run URI {uri!r} names no directory; use file:///abs/path or file://./rel/path")
        root = os.path.abspath(rest)
        super().__init__("file://" + root)
        self.root = root

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def _write_atomic(self, key: str, write: Callable[[str], None]) -> None:
        dest = self._path(key)
        parent = os.path.dirname(dest)
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_MARK, dir=parent)
        os.close(fd)
        try:
            write(tmp)
            # Durable before visible: a crash must not leave a published empty file.
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _put_bytes(self, key: str, data: bytes) -> None:
        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                f.write(data)

        self._write_atomic(key, write)

    def _get_bytes(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise NotFound(f"{self.uri}/{key}") from e

    def _put_file(self, key: str, path: str) -> None:
        self._write_atomic(key, lambda tmp: shutil.copyfile(path, tmp))

    def _get_file(self, key: str, path: str) -> None:
        try:
            shutil.copyfile(self._path(key), path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise NotFound(f"{self.uri}/{key}") from e

    def _exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def _stat(self, prefix: str) -> dict[str, ObjectInfo]:
        # Walk only the directory the prefix lives in; the prefix itself may end mid-name.
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._path(head) if head else self.root
        out: dict[str, ObjectInfo] = {}
        if not os.path.isdir(start):
            return out
        for rel, path in walk_files(start):
            key = f"{head}/{rel}" if head else rel
            if not key.startswith(prefix):
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue  # deleted while listing
            out[key] = ObjectInfo(st.st_size, datetime.fromtimestamp(st.st_mtime, tz=UTC))
        return out

    def _delete_keys(self, keys: list[str]) -> None:
        dirs = set()
        for key in keys:
            path = self._path(key)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            d = os.path.dirname(path)
            while d.startswith(self.root + os.sep):
                dirs.add(d)
                d = os.path.dirname(d)
        # Remove directories left empty, deepest first, so a deleted prefix leaves no trace.
        for d in sorted(dirs, key=len, reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(d)

    def _append_line(self, key: str, text: str) -> None:
        # A local file can be appended in place: one write of one line.
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


class S3Store(Store):
    """A run root in an S3 bucket (or anything speaking S3 at ``AWS_ENDPOINT_URL``)."""

    def __init__(self, uri: str) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        parsed = urlparse(uri)
        if not parsed.netloc:
            raise ValueError(f"run URI {uri!r} names no bucket; expected s3://bucket/prefix")
        self.bucket = parsed.netloc
        self.root = parsed.path.strip("/")
        super().__init__(f"s3://{self.bucket}/{self.root}" if self.root else f"s3://{self.bucket}")
        self._config = Config(
            retries={"mode": "adaptive", "max_attempts": S3_MAX_ATTEMPTS},
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            max_pool_connections=32,
        )
        # boto3 reads AWS_ENDPOINT_URL and the region from the environment itself.
        self.client = boto3.session.Session().client("s3", config=self._config)
        self.client.meta.events.register_first("needs-retry.s3", self._observe_retry)
        # 8 MiB parts, 8 in parallel: a 100 MB checkpoint is 13 parts in flight together.
        self._transfer = TransferConfig(
            multipart_threshold=8 * 1024 * 1024,
            multipart_chunksize=8 * 1024 * 1024,
            max_concurrency=8,
            use_threads=True,
        )

    def _observe_retry(
        self, response=None, attempts=0, caught_exception=None, operation=None, request_dict=None, **_: object
    ):
        """See each failed attempt botocore is about to retry; returns None so botocore decides."""
        if attempts >= S3_MAX_ATTEMPTS:
            return None
        error: BaseException | None = None
        if caught_exception is not None and is_transient(caught_exception):
            error = caught_exception
        elif response is not None:
            http, parsed = response
            status = getattr(http, "status_code", 0) or 0
            code = (parsed or {}).get("Error", {}).get("Code", "")
            if status >= 500 or status == 429 or code in _THROTTLE_CODES:
                error = RuntimeError(f"HTTP {status} {code}".strip())
        if error is not None:
            name = getattr(operation, "name", "s3")
            params = ((request_dict or {}).get("context") or {}).get("input_params") or {}
            full = params.get("Key") or params.get("Prefix") or ""
            base = f"{self.root}/" if self.root else ""
            self._notify_retry(name, full[len(base) :] if full.startswith(base) else full, attempts, error)
        return None

    def _name(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def _not_found(self, e: BaseException, key: str) -> bool:
        import botocore.exceptions as bx

        if isinstance(e, bx.ClientError):
            code = e.response.get("Error", {}).get("Code", "")
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("404", "NoSuchKey", "NotFound") or status == 404:
                return True
            if code in ("403", "AccessDenied", "Forbidden") or status == 403:
                # S3 answers 403, not 404, for a missing key when the caller may list the
                # bucket only under a prefix (the machine role lists just runs/<id>/*): a
                # HEAD/GET carries no prefix, so the ListBucket condition does not match.
                # Listing with the key itself as prefix is allowed; no such key = absent.
                return not self._listed(key)
        return False

    def _listed(self, key: str) -> bool:
        name = self._name(key)
        resp = self.client.list_objects_v2(Bucket=self.bucket, Prefix=name, MaxKeys=1)
        return any(o["Key"] == name for o in resp.get("Contents", []))

    def _put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._name(key), Body=data)

    def _get_bytes(self, key: str) -> bytes:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._name(key))
            return resp["Body"].read()
        except Exception as e:
            if self._not_found(e, key):
                raise NotFound(f"{self.uri}/{key}") from e
            raise

    def _put_file(self, key: str, path: str) -> None:
        self.client.upload_file(path, self.bucket, self._name(key), Config=self._transfer)

    def _get_file(self, key: str, path: str) -> None:
        try:
            self.client.download_file(self.bucket, self._name(key), path, Config=self._transfer)
        except Exception as e:
            if self._not_found(e, key):
                raise NotFound(f"{self.uri}/{key}") from e
            raise

    def _exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._name(key))
            return True
        except Exception as e:
            if self._not_found(e, key):
                return False
            raise

    def _stat(self, prefix: str) -> dict[str, ObjectInfo]:
        base = f"{self.root}/" if self.root else ""
        out: dict[str, ObjectInfo] = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                out[obj["Key"][len(base) :]] = ObjectInfo(int(obj["Size"]), obj["LastModified"])
        return out

    def _delete_keys(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": self._name(k)} for k in keys[i : i + 1000]]
            resp = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            errors = resp.get("Errors") or []
            if errors:
                first = errors[0]
                raise RuntimeError(
                    f"could not delete {len(errors)} objects under {self.uri}, e.g. {first.get('Key')}: "
                    f"{first.get('Code')} {first.get('Message')}"
                )


class GCSStore(Store):
    """A run root in a Google Cloud Storage bucket (or the emulator at ``STORAGE_EMULATOR_HOST``)."""

    def __init__(self, uri: str) -> None:
        from google.api_core import retry as gretry
        from google.cloud import storage
        from google.cloud.storage.retry import DEFAULT_RETRY

        parsed = urlparse(uri)
        if not parsed.netloc:
            raise ValueError(f"run URI {uri!r} names no bucket; expected gs://bucket/prefix")
        self.bucket_name = parsed.netloc
        self.root = parsed.path.strip("/")
        super().__init__(f"gs://{self.bucket_name}/{self.root}" if self.root else f"gs://{self.bucket_name}")
        # Credentials and project come from the environment (metadata server on GCE,
        # anonymous when STORAGE_EMULATOR_HOST is set).
        self.client = storage.Client()
        self.bucket = self.client.bucket(self.bucket_name)
        self._timeout = (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
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
            initial=BACKOFF_INITIAL_S,
            maximum=BACKOFF_MAX_S,
            multiplier=2.0,
            timeout=TRANSFER_MAX_SECONDS,
            on_error=on_error,
        )

    def _name(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

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
        base = f"{self.root}/" if self.root else ""
        out: dict[str, ObjectInfo] = {}
        blobs = self.client.list_blobs(
            self.bucket_name, prefix=base + prefix, timeout=self._timeout, retry=self._retry("list", prefix)
        )
        for blob in blobs:
            modified = blob.updated or datetime.now(tz=UTC)
            out[blob.name[len(base) :]] = ObjectInfo(int(blob.size or 0), modified)
        return out

    def _delete_keys(self, keys: list[str]) -> None:
        from google.api_core.exceptions import NotFound as GNotFound

        for key in keys:
            # Already gone is the outcome we want (a retried delete may find it so).
            with contextlib.suppress(GNotFound):
                self.bucket.blob(self._name(key)).delete(timeout=self._timeout, retry=self._retry("delete", key))


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
        _check_key(key)
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
