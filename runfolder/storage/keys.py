"""Keys and run URIs: what a store key may look like, how a URI names a bucket and root, local file walks.

Written once for every backend: a key is relative and '/'-separated; a cloud run URI is
``<scheme>://<bucket>/<root>``; local temporaries carry :data:`TMP_MARK` so listings,
mirrors and checkpoint uploads never pick them up.
"""

from __future__ import annotations

import io
import os
import threading
from urllib.parse import urlparse

from runfolder.storage.errors import Cancelled

# Local temporary files carry this marker so listings and mirrors never show them.
TMP_MARK = ".trainstack-tmp-"


def check_key(key: str, *, allow_empty: bool = False) -> str:
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


def split_bucket_uri(uri: str, scheme: str) -> tuple[str, str]:
    """``<scheme>://bucket/some/root`` → ``("bucket", "some/root")`` (root may be empty)."""
    parsed = urlparse(uri)
    if parsed.scheme.lower() != scheme or not parsed.netloc:
        raise ValueError(f"run URI {uri!r} names no bucket; expected {scheme}://bucket/prefix")
    return parsed.netloc, parsed.path.strip("/")


def file_root(uri: str) -> str:
    """The absolute directory of a ``file://`` URI (``file:///abs`` or ``file://./rel`` from the cwd)."""
    rest = uri[len("file://") :]
    if rest.startswith("localhost/"):
        rest = rest[len("localhost") :]
    if not rest:
        raise ValueError(f"run URI {uri!r} names no directory; use file:///abs/path or file://./rel/path")
    return os.path.abspath(rest)


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


class CancellableReader(io.RawIOBase):
    """A read-only view of ``length`` bytes of an open file from ``offset``, that stops when ``cancel`` is set.

    Handed to the client libraries instead of a path, so a transfer can be abandoned
    between two of their reads (every few hundred KiB) rather than only between files:
    the next read raises :class:`Cancelled`, which ends the request and, for multipart
    uploads, makes the library abort the upload.
    """

    def __init__(self, f, cancel: threading.Event | None, offset: int = 0, length: int | None = None) -> None:
        super().__init__()
        self._f = f
        self._cancel = cancel
        self._start = offset
        self._length = os.fstat(f.fileno()).st_size - offset if length is None else length
        self._pos = 0
        f.seek(offset)

    def __len__(self) -> int:
        return self._length

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, min(self._length, base + pos))
        self._f.seek(self._start + self._pos)
        return self._pos

    def read(self, size: int = -1) -> bytes:
        if self._cancel is not None and self._cancel.is_set():
            raise Cancelled("transfer cancelled")
        left = self._length - self._pos
        n = left if size is None or size < 0 else min(size, left)
        data = self._f.read(n) if n > 0 else b""
        self._pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)
