"""The store interface every backend implements, and what it builds on the backends' primitives.

A :class:`Store` is rooted at a run URI and speaks in keys relative to that root. Backends
implement the ``_``-prefixed primitives on validated keys; this class validates keys,
retries whole transfers on transient errors (:mod:`runfolder.storage.retry`) and builds
appends, directory mirrors and prefix deletes on top. :class:`ObjectStore` is the common
part of the cloud backends: a bucket and a root inside it, parsed from the URI once.
"""

from __future__ import annotations

import abc
import contextlib
import math
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from runfolder.storage.errors import Cancelled, NotFound
from runfolder.storage.keys import TMP_MARK, check_key, split_bucket_uri, walk_files
from runfolder.storage.retry import RetryHook, retrying


@dataclass(frozen=True)
class ObjectInfo:
    """Size and last-modified time of one stored object."""

    size: int
    modified: datetime


class Store(abc.ABC):
    """Keys and bytes under one run root. Use :func:`open_store` to get one.

    Subclasses implement the abstract ``_``-prefixed primitives on validated keys; this class
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
        return retrying(fn, on_retry=lambda n, exc: self._notify_retry(op, key, n, exc))

    # -- public API ------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any previous object, all or nothing."""
        check_key(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValueError(f"put_bytes({key!r}) needs bytes, got {type(data).__name__}")
        data = bytes(data)
        self._retrying("put", key, lambda: self._put_bytes(key, data))

    def get_bytes(self, key: str) -> bytes:
        """Return the object at ``key``; raise :class:`NotFound` if there is none."""
        check_key(key)
        return self._retrying("get", key, lambda: self._get_bytes(key))  # type: ignore[return-value]

    def get_range(self, key: str, start: int, end: int | None = None) -> bytes:
        """Bytes ``start`` up to ``end`` (excluded; ``None``: the object's end) of the object at ``key``.

        Fewer when the object is shorter, none when it ends before ``start``: a reader that follows
        a growing object (a TensorBoard event file) asks for what came after what it has read, and
        only that crosses the network. Raise :class:`NotFound` if there is no object.
        """
        check_key(key)
        if not isinstance(start, int) or start < 0 or (end is not None and (not isinstance(end, int) or end < start)):
            raise ValueError(f"get_range({key!r}) needs 0 <= start <= end, got start={start!r}, end={end!r}")
        if end == start:  # no Range header says "nothing" (S3 would send the whole object for `bytes=5-4`)
            if not self.exists(key):
                raise NotFound(f"{self.uri}/{key}")
            return b""
        return self._retrying("get", key, lambda: self._get_range(key, start, end))  # type: ignore[return-value]

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        """Return the object at ``key`` and its version (S3 ETag, GCS generation, a digest locally).

        The version is what :meth:`put_bytes_if` compares; raise :class:`NotFound` if there is none.
        """
        check_key(key)
        return self._retrying("get", key, lambda: self._get_versioned(key))  # type: ignore[return-value]

    def put_bytes_if(self, key: str, data: bytes, *, version: str | None) -> str:
        """Store ``data`` under ``key`` only if the object is still at ``version``; return the new version.

        ``version=None`` creates the object only if there is none (S3 ``If-None-Match: *``, GCS
        ``ifGenerationMatch=0``); otherwise the write replaces the object only while its version is
        ``version`` (S3 ``If-Match`` on the ETag, GCS ``ifGenerationMatch``). The store decides,
        atomically: of two writers racing from the same version, one gets
        :class:`PreconditionFailed`. A transient error is retried; when a write that reached the
        store lost its answer, the retry sees :class:`PreconditionFailed` too, so callers put
        something unique in ``data`` and read it back to tell the two apart.
        """
        check_key(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValueError(f"put_bytes_if({key!r}) needs bytes, got {type(data).__name__}")
        data = bytes(data)
        return self._retrying("put", key, lambda: self._put_bytes_if(key, data, version))  # type: ignore[return-value]

    def put_file(self, key: str, path: str, *, cancel: threading.Event | None = None) -> None:
        """Upload the local file ``path`` to ``key``, all or nothing.

        Setting ``cancel`` aborts the upload at the next read of the file (raises
        :class:`~runfolder.storage.keys.Cancelled`; nothing is published under ``key``).
        """
        check_key(key)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"cannot upload {path!r} to {self.uri}/{key}: no such local file")

        def once() -> None:
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"upload of {self.uri}/{key} cancelled")
            self._put_file(key, path, cancel)

        self._retrying("put", key, once)

    def get_file(self, key: str, path: str) -> None:
        """Download ``key`` to the local ``path`` (parents created); raise :class:`NotFound`.

        The file appears under ``path`` only once complete.
        """
        check_key(key)
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
        check_key(key)
        return bool(self._retrying("stat", key, lambda: self._exists(key)))

    def stat(self, prefix: str = "") -> dict[str, ObjectInfo]:
        """Size and modification time of every key under ``prefix`` (a plain string prefix)."""
        check_key(prefix.rstrip("/"), allow_empty=True)
        return self._retrying("list", prefix, lambda: self._stat(prefix))  # type: ignore[return-value]

    def list(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix`` (a plain string prefix), relative to the root, recursive, sorted."""
        return sorted(self.stat(prefix))

    def folders(self, prefix: str = "") -> list[str]:
        """The folders directly under ``prefix`` (a folder: empty or ending in ``/``), each as its own prefix
        (``runs/`` -> ``["runs/a/", "runs/b/"]``), sorted; a folder holds at least one object.

        One delimited listing on an object store: the objects inside are not listed, so it costs
        one request per thousand folders however much each one holds.
        """
        if prefix and not prefix.endswith("/"):
            raise ValueError(f"folders() takes a folder prefix ending in '/', not {prefix!r}")
        check_key(prefix.rstrip("/"), allow_empty=True)
        return sorted(self._retrying("list", prefix, lambda: self._folders(prefix)))  # type: ignore[arg-type]

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key that starts with ``prefix``. An empty prefix is refused."""
        if not prefix:
            raise ValueError(f"delete_prefix needs a non-empty prefix; refusing to empty {self.uri}")
        check_key(prefix.rstrip("/"))
        keys = self.list(prefix)
        if keys:
            self._retrying("delete", prefix, lambda: self._delete_keys(keys))

    def append_line(self, key: str, line: str) -> None:
        """Append one line (a newline is added) to the text object at ``key``."""
        self.append_lines(key, [line])

    def append_lines(self, key: str, lines: list[str]) -> None:
        """Append lines (each gets a newline) to the text object at ``key``, in one write.

        Object stores have no append, so this reads, extends and rewrites the object:
        correct for a single writer (the chief), which is how run files are written. A
        retry never appends the lines a second time.
        """
        check_key(key)
        if not lines:
            return
        for line in lines:
            if "\n" in line or "\r" in line:
                raise ValueError(f"append_line({key!r}) takes one line per entry, without line breaks")
        text = "".join(line + "\n" for line in lines)
        tried = [False]

        def once() -> None:
            # A retried append must not add the lines twice: when the write that failed had in
            # fact reached the store (the answer was lost), the object already ends with them.
            # Event lines carry a millisecond timestamp, so an equal ending is these lines.
            if tried[0] and self._ends_with(key, text):
                return
            tried[0] = True
            self._append_line(key, text)

        with self._append_lock:
            self._retrying("append", key, once)

    def _ends_with(self, key: str, text: str) -> bool:
        try:
            return self._get_bytes(key).endswith(text.encode())
        except NotFound:
            return False

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
            check_key(prefix)
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
    # Abstract, so a backend that lacks one fails when it is constructed, not at its first call.

    @abc.abstractmethod
    def _put_bytes(self, key: str, data: bytes) -> None:
        ...

    @abc.abstractmethod
    def _get_bytes(self, key: str) -> bytes:
        ...

    @abc.abstractmethod
    def _put_file(self, key: str, path: str, cancel: threading.Event | None) -> None:
        ...

    @abc.abstractmethod
    def _get_versioned(self, key: str) -> tuple[bytes, str]:
        ...

    @abc.abstractmethod
    def _put_bytes_if(self, key: str, data: bytes, version: str | None) -> str:
        ...

    @abc.abstractmethod
    def _get_file(self, key: str, path: str) -> None:
        ...

    @abc.abstractmethod
    def _exists(self, key: str) -> bool:
        ...

    @abc.abstractmethod
    def _stat(self, prefix: str) -> dict[str, ObjectInfo]:
        ...

    @abc.abstractmethod
    def _delete_keys(self, keys: list[str]) -> None:
        ...

    def _get_range(self, key: str, start: int, end: int | None) -> bytes:
        # The whole object, cut, where a backend has no ranged read (each of the three has one).
        return self._get_bytes(key)[start:end]

    def _folders(self, prefix: str) -> set[str]:
        # From the full listing where a backend has no cheaper way.
        return {prefix + rest.split("/", 1)[0] + "/" for rest in (k[len(prefix):] for k in self._stat(prefix))
                if "/" in rest}

    def _append_line(self, key: str, text: str) -> None:
        try:
            old = self._get_bytes(key)
        except NotFound:
            old = b""
        if old and not old.endswith(b"\n"):
            old += b"\n"
        self._put_bytes(key, old + text.encode())



class ObjectStore(Store):
    """A run root in a cloud bucket: ``<scheme>://bucket/root``; keys become ``root/key`` object names."""

    scheme = ""

    def __init__(self, uri: str) -> None:
        self.bucket_name, self.root = split_bucket_uri(uri, self.scheme)
        base = f"{self.scheme}://{self.bucket_name}"
        super().__init__(f"{base}/{self.root}" if self.root else base)

    @property
    def _base(self) -> str:
        """The object-name prefix of every key (``root/``, or nothing at the bucket root)."""
        return f"{self.root}/" if self.root else ""

    def _name(self, key: str) -> str:
        return self._base + key

    def _key(self, name: str) -> str:
        """An object name back to its key (names outside the root are returned whole)."""
        base = self._base
        return name[len(base) :] if name.startswith(base) else name

