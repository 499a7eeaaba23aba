"""``file://`` run roots: a folder on the local (or a mounted) filesystem, written atomically."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime

from runfolder.storage.base import ObjectInfo, Store
from runfolder.storage.errors import NotFound, PreconditionFailed
from runfolder.storage.keys import TMP_MARK, CancellableReader, file_root, walk_files

COPY_CHUNK = 1024 * 1024  # a cancelled copy stops within one chunk


class FileStore(Store):
    """A run root on the local filesystem (or a mounted one)."""

    def __init__(self, uri: str) -> None:
        root = file_root(uri)
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

    def _get_range(self, key: str, start: int, end: int | None) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(end - start)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise NotFound(f"{self.uri}/{key}") from e

    def _get_versioned(self, key: str) -> tuple[bytes, str]:
        data = self._get_bytes(key)
        return data, hashlib.sha256(data).hexdigest()

    def _put_bytes_if(self, key: str, data: bytes, version: str | None) -> str:
        # Compare and replace under an exclusive lock on the object's folder (processes on one
        # host; a network filesystem's locks are its own): a lock file would stay in the run
        # folder. The version is the content's digest.
        dest = self._path(key)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        fd = os.open(os.path.dirname(dest), os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = self._get_versioned(key)[1]
            except NotFound:
                current = None
            if current != version:
                raise PreconditionFailed(f"{self.uri}/{key}: {'exists' if version is None else 'changed'}")
            self._put_bytes(key, data)
        finally:
            os.close(fd)  # releases the lock
        return hashlib.sha256(data).hexdigest()

    def _put_file(self, key: str, path: str, cancel) -> None:
        if cancel is None:
            self._write_atomic(key, lambda tmp: shutil.copyfile(path, tmp))
            return

        def copy(tmp: str) -> None:
            with open(path, "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(CancellableReader(src, cancel), dst, COPY_CHUNK)

        self._write_atomic(key, copy)

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

    def _folders(self, prefix: str) -> set[str]:
        start = self._path(prefix.rstrip("/")) if prefix else self.root
        try:
            entries = [e for e in os.scandir(start) if e.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return set()
        # As an object store has them: a folder is there while it holds an object (an emptied one is not).
        return {f"{prefix}{e.name}/" for e in entries
                if any(not f.startswith(TMP_MARK) for _d, _s, files in os.walk(e.path) for f in files)}

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

