"""A TFRecord data set downloaded while training starts, and the index of its record counts.

`--data-uri` names a folder of `*.tfrecord*` files. A machine used to download all of them
before its first step (45–160 s for 50 GB, on every replacement machine). `Staging` downloads
them in the background instead, in the order the stream reads them (the seeded file order of
the epoch the run starts or resumes in, `trainer.data._permutation`), `DOWNLOAD_WORKERS` at a
time, each retried as the store retries a transfer; the stream opens a file only once it is
completely on disk (`Staging.ready`: the store writes a download to a temporary name and
renames it when whole). Every wait for a file is bounded (`--data-wait-s`) and its error names
the file; a download that fails (after the store's retries) fails the run with the file's name.

The stream needs the data set's record count only to place a resumed run in its epoch. It
comes from an index in the stack's own bucket, beside the package cache:
`cache/data/<digest>.json` (`runfolder.layout.data_index_key`), one entry per file (name, size,
records). The digest covers the data URI and every file's name, size and modification time,
so a changed data set has another index; the document is checked against the listing's names
and sizes all the same, and one that does not match is ignored (counted again, never
trusted). The first machine that counted every file writes it with a create-if-absent write
(S3 `If-None-Match: *`, GCS `ifGenerationMatch=0`), so two machines never write over each
other; a document found bad is replaced only by a write conditional on the version read. The
index lives in the stack's bucket and not beside the data: the machines may only read the data
(least privilege; it may be another account's bucket), and may create objects under `cache/`.
Without an index a run starting at step 0 does not wait for the count (the count is taken as
the files arrive, and the index written after); a resumed run waits for every file and counts
them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from urllib.parse import urlparse

from runfolder import layout

DOWNLOAD_WORKERS = 8
INDEX_VERSION = 1
# Records held at once while counting a file: 32 counts 32,000 small records in 0.42 s of CPU (256: 0.34 s)
# and holds 32 records, so a file of 10 MB records costs 320 MB while it is counted, not 2.5 GB.
COUNT_BATCH = 32


class StagingError(RuntimeError):
    """A file of the data set could not be put on disk (a failed download, or a wait past its bound)."""


def is_record_file(key: str) -> bool:
    """The keys under `--data-uri` that hold records: `*.tfrecord*` by name."""
    return ".tfrecord" in os.path.basename(key)


def default_data_dir() -> str:
    """A per-user cache folder, used when `--data-dir` is not given."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "trainstack", "data")


def local_root(data_uri: str, data_dir: str | None) -> str:
    """The local folder one data URI's files are staged to (one per URI, so two sets never mix)."""
    sub = hashlib.sha256(data_uri.encode()).hexdigest()[:16]
    return os.path.join(data_dir or default_data_dir(), sub)


def index_root(run_uri: str) -> str:
    """The root the data index lives under: the run's bucket (`s3://B`, `gs://B`), or for a local run
    the folder that holds `runs/` (else the run folder's parent)."""
    scheme = run_uri.split("://", 1)[0].lower()
    if scheme in ("s3", "gs"):
        return f"{scheme}://{urlparse(run_uri).netloc}"
    path = run_uri.rstrip("/")
    marker = "/" + layout.RUNS_PREFIX
    if marker in path:
        return path.rsplit(marker, 1)[0]
    return path.rsplit("/", 1)[0]


def listing_digest(data_uri: str, files: list[tuple[str, int, str]]) -> str:
    """The index's key digest: the data URI and every file's (name, size, modified), in name order."""
    text = json.dumps([data_uri, sorted(files)], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def check_index(doc: object, sizes: dict[str, int]) -> tuple[dict[str, int] | None, str]:
    """The per-file record counts of an index document, or None and why it cannot be trusted.

    It must name exactly the listed files with the listed sizes, each with a record count >= 0.
    """
    if not isinstance(doc, dict) or doc.get("version") != INDEX_VERSION or not isinstance(doc.get("files"), list):
        return None, f"not a version-{INDEX_VERSION} index"
    counts: dict[str, int] = {}
    for entry in doc["files"]:
        if not isinstance(entry, dict):
            return None, "an entry is not an object"
        name, size, records = entry.get("name"), entry.get("size"), entry.get("records")
        if not isinstance(name, str) or name in counts:
            return None, f"a bad or repeated name {name!r}"
        if type(size) is not int or type(records) is not int or records < 0:
            return None, f"{name}: size and records must be integers >= 0"
        if sizes.get(name) != size:
            return None, f"{name}: {size} bytes in the index, {sizes.get(name)} in the listing"
        counts[name] = records
    if set(counts) != set(sizes):
        missing = sorted(set(sizes) - set(counts))
        return None, f"{len(missing)} listed files are not in it (e.g. {missing[0]})"
    return counts, ""


def count_file(path: str) -> int:
    """Records in one TFRecord file (read whole by TensorFlow, so a damaged file fails here)."""
    return int(_record_counter()(path))


@functools.cache
def _record_counter():
    # Traced once for every file (a reduce traced per file cost about 0.1 s of CPU each), and
    # summed a batch at a time: the reduce's function runs per element, and per record it cost
    # eight times the CPU of the reading itself (16 files of 2,000 small records: 1.9 s, 0.21 s).
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
    def count(path):
        return tf.data.TFRecordDataset(path).batch(COUNT_BATCH).reduce(
            tf.constant(0, tf.int64), lambda n, batch: n + tf.shape(batch, out_type=tf.int64)[0])

    return count


class Staging:
    """The files under a data URI, downloaded in the background in a given order; see the module docstring.

    `emit(event, **fields)` receives `data_staged` once every file is on disk (and counted).
    """

    def __init__(self, data_uri: str, data_dir: str | None, *, run_uri: str, wait_s: float,
                 emit: Callable[..., object] | None = None, workers: int = DOWNLOAD_WORKERS,
                 min_records: int = 1) -> None:
        from runfolder.storage import open_store

        self.data_uri, self.wait_s, self.min_records = data_uri, wait_s, min_records
        self._emit = emit
        self.store = open_store(data_uri)
        listing = {k: v for k, v in self.store.stat("").items() if is_record_file(k)}
        if not listing:
            raise ValueError(f"--data-uri {data_uri}: no *.tfrecord* files there")
        self.keys = sorted(listing)
        self.sizes = {k: listing[k].size for k in self.keys}
        root = local_root(data_uri, data_dir)
        self.paths = {k: os.path.join(root, *k.split("/")) for k in self.keys}
        self.files = [self.paths[k] for k in self.keys]  # in name order: the stream's file list
        self._key_of = {p: k for k, p in self.paths.items()}
        self.workers = max(1, min(workers, len(self.keys)))
        digest = listing_digest(data_uri, [(k, listing[k].size, listing[k].modified.isoformat()) for k in self.keys])
        self.index_key = layout.data_index_key(digest)
        self._index_store = open_store(index_root(run_uri))
        self._index_version: str | None = None
        self._write_after = True  # write the index once every file is counted (not when one was used or unreadable)
        self.index_state = "absent"  # absent | used | ignored: <why>; then written | another machine's | unsaved: <why>
        self.counts: dict[str, int] = self._read_index() or {}
        self.counted_here = 0
        self._cond = threading.Condition()
        self._done: set[str] = set()
        self._error: StagingError | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue[str] = queue.Queue()
        self.downloaded = 0
        self.started = self.ended = None

    # -- the index --

    def _read_index(self) -> dict[str, int] | None:
        from runfolder.storage import NotFound

        try:
            raw, self._index_version = self._index_store.get_versioned(self.index_key)
        except NotFound:
            return None
        except Exception as e:  # noqa: BLE001 - an index that cannot be read is counted again, not a failure
            self.index_state = f"ignored: unreadable ({type(e).__name__}: {e})"
            self._write_after = False  # it may well be there: overwriting it blind is not ours to do
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        counts, why = check_index(doc, self.sizes)
        self.index_state = "used" if counts is not None else f"ignored: {why}"
        self._write_after = counts is None
        return counts

    def _write_index(self) -> None:
        from runfolder.storage import PreconditionFailed

        doc = {"version": INDEX_VERSION, "data_uri": self.data_uri,
               "files": [{"name": k, "size": self.sizes[k], "records": self.counts[k]} for k in self.keys]}
        body = json.dumps(doc, indent=1).encode()
        try:
            # Create-if-absent; a document found bad is replaced only while it is the one read.
            self._index_store.put_bytes_if(self.index_key, body, version=self._index_version)
            self.index_state = "written"
        except PreconditionFailed:
            self.index_state = "written by another machine"
        except Exception as e:  # noqa: BLE001 - the index saves a later machine time; training goes on without it
            self.index_state = f"unsaved: {type(e).__name__}: {e}"

    # -- downloads --

    def start(self, order: list[int]) -> Staging:
        """Start downloading, the files in `order` (indexes into `files`) first; returns self."""
        first = [self.keys[i] for i in order]
        seen = set(first)
        self.started = time.monotonic()
        for key in first + [k for k in self.keys if k not in seen]:
            self._queue.put(key)
        for i in range(self.workers):
            threading.Thread(target=self._work, name=f"stage-{i}", daemon=True).start()
        return self

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                key = self._queue.get_nowait()
            except queue.Empty:
                return
            path = self.paths[key]
            try:
                if not (os.path.isfile(path) and os.path.getsize(path) == self.sizes[key]):
                    self.store.get_file(key, path)
                    with self._cond:
                        self.downloaded += 1
                records = self.counts.get(key)
                if records is None:
                    records = count_file(path)
            except Exception as e:  # noqa: BLE001 - any failure of a file fails the run, with the file's name
                self._fail(StagingError(f"--data-uri {self.data_uri}: {key} could not be staged: "
                                        f"{type(e).__name__}: {e}"))
                return
            self._finished(key, records)

    def _fail(self, error: StagingError) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._stop.set()
            self._cond.notify_all()

    def _finished(self, key: str, records: int) -> None:
        with self._cond:
            if key not in self.counts:
                self.counts[key] = records
                self.counted_here += 1
            last = len(self._done) + 1 == len(self.keys)
            if not last:
                self._done.add(key)
                self._cond.notify_all()
                return
        # The last file: the count is whole. Checked and indexed before the file counts as on disk,
        # so whoever waited for every file finds the index written.
        total = sum(self.counts.values())
        if total < self.min_records:
            self._fail(StagingError(f"--data-uri {self.data_uri}: the data set holds {total} records, less than one "
                                    f"global batch ({self.min_records}); lower --batch-size or add data"))
            return
        if self._write_after:
            self._write_index()
        with self._cond:
            self._done.add(key)
            self.ended = time.monotonic()
            self._cond.notify_all()
        if self._emit is not None:
            with contextlib.suppress(Exception):  # the run may have ended meanwhile
                self._emit(layout.DATA_STAGED, files=len(self.keys), bytes=sum(self.sizes.values()),
                           downloaded=self.downloaded, records=total, counted=self.counted_here,
                           index=self.index_state, seconds=round(self.ended - self.started, 3))

    # -- what the stream and the loop ask --

    def ready(self, path: bytes | str) -> bytes | str:
        """Return `path` once its file is completely on disk; raise `StagingError` past `--data-wait-s` or on a failure."""
        name = path.decode() if isinstance(path, bytes) else path
        key = self._key_of[name]
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._done or self._error is not None, timeout=self.wait_s):
                raise StagingError(f"--data-uri {self.data_uri}: {key} was not on disk within --data-wait-s "
                                   f"{self.wait_s:g} s ({len(self._done)} of {len(self.keys)} files there)")
            if self._error is not None:
                raise self._error
        return path

    def wait_all(self) -> None:
        """Wait for every file, each within `--data-wait-s` of the one before it (in download order)."""
        for key in self.keys:
            self.ready(self.paths[key])

    def check(self) -> None:
        """Raise the staging's failure, if there is one (the loop asks between calls)."""
        if self._error is not None:
            raise self._error

    def all_local(self) -> bool:
        """Every file is on disk already, whole (a machine that staged them before): nothing to download."""
        return all(os.path.isfile(p) and os.path.getsize(p) == self.sizes[k] for k, p in self.paths.items())

    @property
    def complete(self) -> bool:
        """Every file is on disk."""
        return len(self._done) == len(self.keys)

    def records(self) -> int | None:
        """The data set's record count, when every file's is known (from the index or counted)."""
        return sum(self.counts.values()) if len(self.counts) == len(self.keys) else None

    def on_disk(self) -> dict:
        """How much of the data set is on disk now, for the `data_first_step` event."""
        with self._cond:
            done = list(self._done)
        return {"files": len(done), "bytes": sum(self.sizes[k] for k in done), "files_total": len(self.keys),
                "bytes_total": sum(self.sizes.values()),
                "seconds": round(time.monotonic() - self.started, 3) if self.started else 0.0}

    def close(self) -> None:
        """Start no more downloads (those under way finish); the files on disk stay for a later start."""
        self._stop.set()
