"""The checkpoint commit protocol in the bucket: upload, verify, mark committed, restore, prune.

A checkpoint is the set of files TF wrote into a local directory. It is uploaded to
``<run-uri>/checkpoints/ckpt-<step>/<same relative paths>`` and becomes visible only when
``checkpoints/ckpt-<step>/COMMITTED`` exists. That marker is JSON::

    {"format": 1, "step": 100, "bytes": 1234, "created": "2026-...Z",
     "files": {"ckpt.index": {"size": 10, "sha256": "..."}, ...}}

and is written last, after every file was uploaded (each upload retried on transient
errors, see :mod:`runfolder.storage`; in transit each request carries a checksum the store
checks: CRC32 from botocore, CRC32C from google-cloud-storage) and a listing confirmed
every size. The SHA-256 of each file is checked again after download. A checkpoint
without the marker, or whose files do not match it on download, is never restored: it is
skipped with a ``checkpoint_skipped`` event and the next older one is tried. Pruning
deletes a marker before the files it describes, so a half-deleted checkpoint is never
taken for a committed one.

A checkpoint here is any folder of files: this module knows nothing of TensorFlow and
imports none of it, so ``ops`` (status, pull) reads a run's checkpoints on a laptop without
it. What goes into the folder, and how it is restored into a model, is
:mod:`trainer.tf_checkpoint`'s.

Given the run's lease (:class:`runfolder.lease.RunLease`), the store fences its writes: the
COMMITTED marker is written only right after a successful renewal of the lease (a
conditional write the bucket decides), and pruning deletes nothing unless that renewal
still covers it. A trainer that lost the run to another machine commits and deletes nothing
(:class:`~runfolder.lease.LeaseLost` is raised instead), so no two machines ever commit to one run.

Background uploads (:meth:`CheckpointStore.commit_async`) run on one worker thread. The
caller's directory is snapshotted first with hard links (a copy where links are not
possible), which costs no data copy: TF writes each checkpoint to new files and renames
them into place, so the linked files stay intact while the caller saves the next one and
deletes old ones. The caller may reuse or delete ``local_dir`` as soon as
``commit_async`` returns, but must not rewrite its files in place. A synchronous commit
cancels an older background upload and never waits for it; that upload, once it ends
(its marker written or not), prunes on its own thread, so it outlives the keep rule no
longer than its own end.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from runfolder import layout
from runfolder.checkpoints import committed_steps, marker_problem, scan
from runfolder.storage import Cancelled, NotFound, Store, read_json, walk_files

__all__ = ["CheckpointStore", "CheckpointError", "MARKER_FORMAT", "download_verified", "marker_problem", "scan"]

MARKER_FORMAT = 1
_HASH_CHUNK = 1024 * 1024

Emit = Callable[[str, dict], None]


class CheckpointError(RuntimeError):
    """A checkpoint could not be committed (nothing was marked committed)."""


class _Cancelled(Exception):
    """A background upload was superseded by a newer synchronous commit."""


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
    return step


def _local_files(local_dir: str) -> list[tuple[str, str]]:
    if not os.path.isdir(local_dir):
        raise FileNotFoundError(f"checkpoint directory {local_dir!r} does not exist")
    files = walk_files(local_dir)
    if not files:
        raise ValueError(f"checkpoint directory {local_dir!r} holds no files; nothing to commit")
    if any(rel == layout.COMMITTED for rel, _ in files):
        raise ValueError(f"checkpoint directory {local_dir!r} holds a file named {layout.COMMITTED}, which is reserved")
    return files


def _base(step: int) -> str:
    return layout.checkpoint_dir(step) + "/"


def _report_retries(store: Store, emit: Emit) -> None:
    """Chain an `upload_retry` event for checkpoint keys onto `store.on_retry`, keeping the hook there."""
    previous = store.on_retry

    def on_retry(op: str, key: str, attempt: int, error: BaseException) -> None:
        if previous is not None:
            previous(op, key, attempt, error)
        # Only checkpoint transfers: reporting retries of other writes (the event
        # log itself) would feed a failing store more writes.
        if layout.is_checkpoint_key(key):
            emit(
                layout.UPLOAD_RETRY,
                # `retry`, not `attempt`: every event's `attempt` is the run's attempt that wrote it.
                {"retry": attempt, "error": f"{type(error).__name__}: {error}", "op": op, "key": key},
            )

    store.on_retry = on_retry


def _snapshot(local_dir: str, files: list[tuple[str, str]]) -> str:
    """Hard links to `files` in a new folder beside `local_dir` (copies where links cannot be made)."""
    parent = os.path.dirname(os.path.abspath(local_dir))
    snap = tempfile.mkdtemp(prefix=".trainstack-snapshot-", dir=parent)
    try:
        for rel, path in files:
            dest = os.path.join(snap, *rel.split("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            try:
                os.link(path, dest)
            except OSError:
                shutil.copy2(path, dest)  # another filesystem, or links not supported
    except BaseException:
        shutil.rmtree(snap, ignore_errors=True)
        raise
    return snap


def _verify_stored(store: Store, step: int, manifest: dict[str, dict]) -> None:
    """Every uploaded file is in the store at its size; else CheckpointError (nothing is marked)."""
    base = _base(step)
    stored = store.stat(base)
    for rel, meta in manifest.items():
        info = stored.get(base + rel)
        if info is None or info.size != meta["size"]:
            got = "missing" if info is None else f"{info.size} bytes"
            raise CheckpointError(
                f"checkpoint {step}: {rel} should hold {meta['size']} bytes in {store.uri}/{base} "
                f"but is {got}; not committed"
            )


def _marker(step: int, manifest: dict[str, dict], lease_epoch: int | None) -> dict:
    """The COMMITTED marker's content for the uploaded `manifest` (see the module docstring)."""
    marker = {
        "format": MARKER_FORMAT,
        "step": step,
        "bytes": sum(m["size"] for m in manifest.values()),
        "created": datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "files": dict(sorted(manifest.items())),
    }
    if lease_epoch is not None:
        marker["lease_epoch"] = lease_epoch  # which holder of the run committed it
    return marker


def download_verified(store: Store, step: int, files: dict[str, dict], staging: str, workers: int) -> str | None:
    """Download checkpoint `step`'s `files` (the marker's) into `staging`; None, or what failed to verify."""
    base = _base(step)
    plan = {rel: os.path.join(staging, *rel.split("/")) for rel in files}

    def fetch(rel: str) -> str | None:
        try:
            store.get_file(base + rel, plan[rel])
        except NotFound:
            return f"file {rel} is missing"
        size = os.path.getsize(plan[rel])
        if size != files[rel]["size"]:
            return f"file {rel} holds {size} bytes, marker says {files[rel]['size']}"
        if _sha256(plan[rel]) != files[rel]["sha256"]:
            return f"file {rel} fails its sha256 check"
        return None

    with ThreadPoolExecutor(max_workers=min(workers, len(files)), thread_name_prefix="ckpt-down") as pool:
        results = list(pool.map(fetch, sorted(files)))
    problems = [r for r in results if r]
    return "; ".join(problems) if problems else None


class _Uploads:
    """The background upload (one worker thread, the newest queued snapshot) and every step going up.

    `upload(step, snapshot dir, cancel)` commits a queued snapshot; a synchronous commit
    `take_over`s: a queued older snapshot is dropped, a running older upload cancelled, one of
    the same step waited for. The steps going up (`active_steps`) are never restored or pruned.
    A cancelled upload may already be past its last check and write its marker after the
    synchronous commit pruned (which passed over it, going up), and one queued late (a write that
    outlived the commit's wait) goes up after it: so once a background upload of a step older than
    a synchronous commit's ends, marker written or not and no longer going up, `superseded(step)`
    runs on the upload's thread (the store prunes), and nobody waits for it.
    """

    def __init__(self, upload: Callable[[int, str, threading.Event], None],
                 superseded: Callable[[int], None]) -> None:
        self.upload = upload
        self.superseded = superseded
        self.cond = threading.Condition()
        self.pending: tuple[int, str] | None = None  # (step, snapshot dir) waiting to upload
        self.in_flight: int | None = None  # step the background thread is uploading
        self.cancel = threading.Event()  # tells the background upload to stop early
        self.active: set[int] = set()  # steps being uploaded now (sync or background)
        self.newest_sync: int | None = None  # the newest step a synchronous commit took over for
        self.worker: threading.Thread | None = None
        self.error: BaseException | None = None

    def queue(self, step: int, snap: str) -> None:
        """Upload `snap` as `step` in the background, replacing a snapshot still queued."""
        with self.cond:
            if self.pending is not None:
                _, old = self.pending
                shutil.rmtree(old, ignore_errors=True)
            self.pending = (step, snap)
            if self.worker is None:
                self.worker = threading.Thread(target=self._work, name="checkpoint-upload", daemon=True)
                self.worker.start()
            self.cond.notify_all()

    def take_over(self, step: int) -> None:
        """A synchronous commit of `step` starts (see the class docstring)."""
        with self.cond:
            if self.pending is not None and self.pending[0] <= step:
                _, snap = self.pending
                self.pending = None
                shutil.rmtree(snap, ignore_errors=True)
                self.cond.notify_all()
            if self.in_flight is not None and self.in_flight < step:
                self.cancel.set()
            # The same step already going up in the background: let it finish rather than
            # upload it twice; if it committed, the commit finds it and returns.
            self.cond.wait_for(lambda: self.in_flight != step)
            self.active.add(step)
            self.newest_sync = step if self.newest_sync is None else max(self.newest_sync, step)

    def done(self, step: int) -> None:
        """A synchronous commit of `step` ended, committed or not."""
        with self.cond:
            self.active.discard(step)

    def active_steps(self) -> set[int]:
        """The steps being uploaded now, synchronously or in the background."""
        with self.cond:
            return set(self.active)

    def _work(self) -> None:
        while True:
            with self.cond:
                if self.pending is None:
                    self.worker = None
                    self.cond.notify_all()
                    return
                step, snap = self.pending
                self.pending = None
                self.in_flight = step
                self.active.add(step)
                self.cancel.clear()
            try:
                self.upload(step, snap, self.cancel)
            except _Cancelled:
                pass  # a newer synchronous commit took over; the prune below removes the partial
            except BaseException as e:  # kept for wait(): a background thread has no caller to raise to
                with self.cond:
                    if self.error is None:
                        self.error = e
            finally:
                shutil.rmtree(snap, ignore_errors=True)
                with self.cond:
                    # `cancel` is set by `take_over` only while this step was in flight: a newer commit
                    # took its place; or that commit came before this upload even began.
                    superseded = self.cancel.is_set() or (self.newest_sync is not None and self.newest_sync > step)
                    self.in_flight = None
                    self.active.discard(step)
                    self.cond.notify_all()
            if superseded:
                self.superseded(step)  # before the worker is idle: `wait` returns on a pruned store

    def wait(self, timeout: float | None) -> None:
        """Until nothing is queued or running; re-raise a background failure once."""
        with self.cond:
            idle = self.cond.wait_for(lambda: self.worker is None and self.pending is None, timeout)
            if not idle:
                raise TimeoutError(f"checkpoint upload of step {self.in_flight} still running after {timeout} s")
            error, self.error = self.error, None
        if error is not None:
            raise error


class CheckpointStore:
    """Checkpoints of one run in a :class:`~runfolder.storage.Store` (see module docstring).

    ``emit(kind, fields)`` receives ``checkpoint_skipped`` (step, reason) and
    ``upload_retry`` (retry, error, op, key) for retried transfers of checkpoint keys;
    it may be called from upload threads. The retry hook is chained onto
    ``store.on_retry``, keeping any hook already there.
    ``on_commit(info)`` is called with :meth:`commit`'s result after every successful
    commit, background ones included, so the caller can report them.
    ``lease`` (a :class:`~runfolder.lease.RunLease` already taken, or anything with its
    ``fence()`` and ``check()``) fences markers and pruning, see the module docstring.
    """

    def __init__(
        self,
        store: Store,
        *,
        keep: int = 3,
        emit: Emit | None = None,
        on_commit: Callable[[dict], None] | None = None,
        upload_workers: int = 4,
        lease=None,
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1 (the newest checkpoint is always kept), got {keep!r}")
        if upload_workers < 1:
            raise ValueError(f"upload_workers must be >= 1, got {upload_workers!r}")
        self.store = store
        self.keep = keep
        self.emit = emit
        self.on_commit = on_commit
        self.upload_workers = upload_workers
        self.lease = lease
        # The background upload, and every step going up.
        self._uploads = _Uploads(self._upload_queued, self._prune_superseded)
        self._prune_lock = threading.Lock()
        # Committed steps that failed verification in restore_latest: never ranked as the
        # newest or kept in their place, so the checkpoints a resumed run writes survive.
        self._bad: set[int] = set()
        # Steps kept whatever their age (the run's best checkpoint, --keep-best): set by the caller.
        self.protect: set[int] = set()
        if emit is not None:
            _report_retries(store, emit)

    # -- naming ------------------------------------------------------------------------

    def _scan(self) -> tuple[set[int], set[int]]:
        """(steps with any object, steps with a marker) under the prefix, in one listing."""
        return scan(self.store)

    def _skip(self, step: int, reason: str) -> None:
        if self.emit is not None:
            self.emit(layout.CHECKPOINT_SKIPPED, {"step": step, "reason": reason})

    # -- committing --------------------------------------------------------------------

    def commit(self, step: int, local_dir: str) -> dict:
        """Upload ``local_dir`` as checkpoint ``step``, verify it, mark it committed, prune.

        Synchronous. Returns the marker's content plus ``seconds`` (wall time of the whole
        commit) and ``uri``. Raises on failure, in which case no marker was written. A
        background upload of an older step still in flight is aborted at once, mid-file
        (its reads of the file stop, see ``Store.put_file``), so this one gets the bandwidth
        (what a preempted machine needs) and not waited for (it prunes once it ends, see
        ``_Uploads``); one of the same step is waited for instead of repeated.
        """
        _check_step(step)
        files = _local_files(local_dir)
        self._uploads.take_over(step)
        try:
            info = self._upload(step, files, cancel=None)
        finally:
            self._uploads.done(step)
        self.prune()
        self._committed(info)
        return info

    def _committed(self, info: dict) -> None:
        if self.on_commit is not None:
            self.on_commit(info)

    def _upload(self, step: int, files: list[tuple[str, str]], cancel: threading.Event | None) -> dict:
        t0 = time.monotonic()
        base = _base(step)
        marker_key = layout.committed_key(step)

        def check_cancel() -> None:
            if cancel is not None and cancel.is_set():
                raise _Cancelled(step)

        # Re-committing a step (e.g. right after a resume) must never leave a marker that
        # disagrees with the files: if the same content is already committed, keep it;
        # otherwise withdraw the marker before replacing the files.
        manifest: dict[str, dict] = {}

        def upload_one(item: tuple[str, str]) -> None:
            rel, path = item
            check_cancel()
            size = os.path.getsize(path)
            digest = _sha256(path)
            try:
                # A background upload is aborted mid-file when a synchronous commit takes over.
                if cancel is None:
                    self.store.put_file(base + rel, path)
                else:
                    self.store.put_file(base + rel, path, cancel=cancel)
            except Cancelled as e:
                raise _Cancelled(step) from e
            manifest[rel] = {"size": size, "sha256": digest}

        existing = self._read_marker(step)
        if existing is not None:
            local = {rel: {"size": os.path.getsize(p), "sha256": _sha256(p)} for rel, p in files}
            if existing.get("files") == local and step not in self._bad:
                return {**existing, "seconds": round(time.monotonic() - t0, 3), "uri": f"{self.store.uri}/{base}"}
            if self.lease is not None:
                self.lease.fence()  # withdrawing a marker is a commit's write too
            self.store.delete_prefix(marker_key)

        with ThreadPoolExecutor(max_workers=min(self.upload_workers, len(files)), thread_name_prefix="ckpt-up") as pool:
            futures = [pool.submit(upload_one, item) for item in files]
            errors = [f.exception() for f in futures]
        failures = [e for e in errors if e is not None]
        if failures:
            if any(isinstance(e, _Cancelled) for e in failures):
                raise _Cancelled(step)
            raise CheckpointError(
                f"checkpoint {step}: {len(failures)} of {len(files)} files failed to upload to "
                f"{self.store.uri}/{base}; not committed"
            ) from failures[0]
        check_cancel()

        _verify_stored(self.store, step, manifest)  # what the store holds, before declaring it committed

        if self.lease is not None:
            # The last moment before the checkpoint counts: only the lease's holder may
            # make it count (raises LeaseLost, and nothing is marked, if another took over).
            self.lease.fence()
        marker = _marker(step, manifest, None if self.lease is None else self.lease.epoch)
        self.store.put_bytes(marker_key, json.dumps(marker, indent=1).encode())
        self._bad.discard(step)
        return {**marker, "seconds": round(time.monotonic() - t0, 3), "uri": f"{self.store.uri}/{base}"}

    def commit_async(self, step: int, local_dir: str) -> None:
        """Queue ``local_dir`` as checkpoint ``step`` for upload in the background; return at once.

        At most one upload runs; a newer request replaces an older one still queued. The
        directory is snapshotted with hard links before returning (see module docstring).
        A failure is kept and re-raised by :meth:`wait`.
        """
        _check_step(step)
        self._uploads.queue(step, _snapshot(local_dir, _local_files(local_dir)))

    def _upload_queued(self, step: int, snap: str, cancel: threading.Event) -> None:
        # The background thread's commit of a snapshot: as `commit`, but cancellable.
        info = self._upload(step, walk_files(snap), cancel=cancel)
        self.prune()
        self._committed(info)

    def _prune_superseded(self, step: int) -> None:
        # The end of a background upload older than a synchronous commit (on its thread): that
        # commit cancelled it, or came before it began; its prune passed over it while it was going
        # up, and it may have written its marker since. Pruning now keeps it only if the keep rule
        # does. A failure (after the store's retries) is reported and left to the next prune: the
        # run's checkpoints are safe.
        try:
            self.prune()
        except Exception as e:  # noqa: BLE001 - an extra checkpoint kept a while is no reason to stop a run
            if self.emit is not None:
                self.emit(layout.CHECKPOINT_FAILED, {
                    "reason": f"checkpoint {step}, superseded by a newer commit, is not pruned yet "
                              f"(the next commit prunes it): {type(e).__name__}: {e}"})

    def wait(self, timeout: float | None = None) -> None:
        """Wait until no upload is queued or running; re-raise a background failure.

        Raises ``TimeoutError`` if uploads are still running after ``timeout`` seconds.
        A failure is raised once; later calls succeed unless another upload fails.
        """
        self._uploads.wait(timeout)

    # -- reading -----------------------------------------------------------------------

    def committed_steps(self) -> list[int]:
        """Steps that have a ``COMMITTED`` marker, ascending."""
        return committed_steps(self.store)

    def _read_marker(self, step: int) -> dict | None:
        return read_json(self.store, layout.committed_key(step))

    def restore_step(self, step: int, dest_dir: str) -> bool:
        """Download committed checkpoint ``step`` into ``dest_dir`` if it verifies; False (and a
        ``checkpoint_skipped`` event) when it is missing or damaged."""
        marker = self._read_marker(_check_step(step))
        problem = "no COMMITTED marker" if marker is None else (
            marker_problem(step, marker) if marker else "COMMITTED marker is not valid JSON")
        if problem is None:
            shutil.rmtree(dest_dir, ignore_errors=True)
            os.makedirs(dest_dir)
            problem = download_verified(self.store, step, marker["files"], dest_dir, self.upload_workers)
        if problem:
            self._skip(step, problem)
            return False
        return True

    def restore_latest(self, dest_dir: str) -> int | None:
        """Download the newest committed checkpoint that verifies into ``dest_dir``; return its step.

        ``dest_dir`` is replaced by the checkpoint's files (same relative layout as the
        committed directory) only once all of them verified. Checkpoints with no marker,
        a bad marker, or a missing, short or corrupt file are skipped with a
        ``checkpoint_skipped`` event. Returns None when nothing restorable exists.
        Network failures that outlast the retries are raised, not taken for corruption.
        """
        present, committed = self._scan()
        dest_dir = os.path.abspath(dest_dir)
        parent = os.path.dirname(dest_dir)
        os.makedirs(parent, exist_ok=True)
        for step in sorted(present, reverse=True):
            if step in self._uploads.active_steps():
                continue  # our own upload in progress, not a candidate
            if step not in committed:
                self._skip(step, "no COMMITTED marker (upload never finished)")
                continue
            marker = self._read_marker(step)
            if marker is None:  # deleted between listing and reading
                self._skip(step, "COMMITTED marker vanished")
                continue
            problem = marker_problem(step, marker) if marker else "COMMITTED marker is not valid JSON"
            if problem:
                self._bad.add(step)
                self._skip(step, problem)
                continue
            staging = tempfile.mkdtemp(prefix=".trainstack-restore-", dir=parent)
            try:
                problem = download_verified(self.store, step, marker["files"], staging, self.upload_workers)
                if problem:
                    self._bad.add(step)
                    self._skip(step, problem)
                    continue
                if os.path.isdir(dest_dir):
                    shutil.rmtree(dest_dir)
                elif os.path.exists(dest_dir):
                    os.unlink(dest_dir)
                os.replace(staging, dest_dir)
                return step
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return None

    # -- pruning -----------------------------------------------------------------------

    def prune(self) -> None:
        """Keep the newest ``keep`` committed checkpoints; delete the rest and stale partials.

        A partial (no marker) is stale once a newer checkpoint is committed. The newest
        committed checkpoint, any upload in progress and the committed steps in ``protect``
        (the run's best checkpoint, ``--keep-best``) are never touched. Checkpoints
        that :meth:`restore_latest` found damaged do not count: they are left alone while
        newer than the newest good one and deleted like any old one after that.
        """
        if self.lease is not None:
            from runfolder.lease import LeaseLost

            try:
                self.lease.check()
            except LeaseLost:
                return  # another machine owns the run now: its checkpoints are not ours to delete
        with self._prune_lock:
            present, committed = self._scan()
            good = committed - self._bad
            if not good:
                return
            newest = max(good)
            keep = set(sorted(good)[-self.keep :]) | {newest}
            active = self._uploads.active_steps()
            protect = set(self.protect)
            for step in sorted(present):
                if step in keep or step in active or step > newest or (step in protect and step in committed):
                    continue
                if step in committed:
                    # Marker first: from here on the checkpoint is no longer offered.
                    self.store.delete_prefix(layout.committed_key(step))
                    self.store.delete_prefix(_base(step))
                else:
                    self.store.delete_prefix(_base(step))
