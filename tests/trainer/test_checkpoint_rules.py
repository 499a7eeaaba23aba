"""The checkpoint commit protocol's rules on a local run (trainer/checkpoint_store.py), one at a time:
what it refuses, what a marker holds, why a checkpoint is skipped, how the lease fences it,
what pruning keeps, and which retries are reported. The stores' own behaviour, the TensorFlow
round trip and the background races are in test_checkpoints.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import threading

import pytest

from runfolder import layout
from runfolder.lease import LeaseLost
from runfolder.storage import open_store
from tests.trainer.test_checkpoint_store import Events, hold_marker, write_dir
from trainer.checkpoint_store import CheckpointError, CheckpointStore


@pytest.fixture
def store(file_run):
    return open_store(file_run.uri)


def _marker(store, step: int) -> dict:
    return json.loads(store.get_bytes(layout.committed_key(step)))


# -- what it refuses --

@pytest.mark.parametrize("step", [True, -1, 1.0, "3", None])
def test_a_step_is_a_non_negative_int(store, tmp_path, step):
    ckpts = CheckpointStore(store)
    local = write_dir(tmp_path, "c", {"d": b"x"})
    for call in (ckpts.commit, ckpts.commit_async, ckpts.restore_step):
        with pytest.raises(ValueError, match=re.escape(f"checkpoint step must be a non-negative int, got {step!r}")):
            call(step, local)
    assert ckpts.commit(0, local)["step"] == 0  # 0 is a step


@pytest.mark.parametrize("keep", [0, True, "2", 1.5])
def test_keep_is_an_int_of_at_least_one(store, keep):
    with pytest.raises(ValueError, match=re.escape(
            f"keep must be an int >= 1 (the newest checkpoint is always kept), got {keep!r}")):
        CheckpointStore(store, keep=keep)
    assert CheckpointStore(store, keep=1).keep == 1


def test_upload_workers_is_at_least_one(store):
    with pytest.raises(ValueError, match=r"^upload_workers must be >= 1, got 0$"):
        CheckpointStore(store, upload_workers=0)
    assert CheckpointStore(store, upload_workers=1).upload_workers == 1


def test_a_missing_empty_or_marker_holding_directory_is_refused(store, tmp_path):
    ckpts = CheckpointStore(store)
    missing = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=re.escape(f"checkpoint directory {missing!r} does not exist")):
        ckpts.commit(1, missing)
    (tmp_path / "empty").mkdir()
    empty = str(tmp_path / "empty")
    with pytest.raises(ValueError, match=re.escape(f"checkpoint directory {empty!r} holds no files; nothing to commit")):
        ckpts.commit(1, empty)
    reserved = write_dir(tmp_path, "r", {"d": b"x", "COMMITTED": b"{}"})
    with pytest.raises(ValueError, match=re.escape(
            f"checkpoint directory {reserved!r} holds a file named COMMITTED, which is reserved")):
        ckpts.commit(1, reserved)
    # A file so named deeper down is the checkpoint's own.
    assert ckpts.commit(1, write_dir(tmp_path, "s", {"sub/COMMITTED": b"x"}))["files"].keys() == {"sub/COMMITTED"}
    assert store.list("checkpoints/") == [layout.committed_key(1), "checkpoints/ckpt-1/sub/COMMITTED"]


# -- what a commit writes and returns --

def test_the_marker_describes_every_file_and_the_result_adds_time_and_place(store, tmp_path):
    commits = []
    ckpts = CheckpointStore(store, on_commit=commits.append)
    files = {"z.data": b"z" * 300, "a.index": b"a", "sub/b": b"bb"}
    info = ckpts.commit(7, write_dir(tmp_path, "c", files))
    marker = _marker(store, 7)
    assert list(marker) == ["format", "step", "bytes", "created", "files"]
    assert (marker["format"], marker["step"], marker["bytes"]) == (1, 7, 303)
    assert list(marker["files"]) == ["a.index", "sub/b", "z.data"]  # sorted
    assert marker["files"] == {rel: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                               for rel, data in files.items()}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", marker["created"])
    assert info == {**marker, "seconds": info["seconds"], "uri": f"{store.uri}/checkpoints/ckpt-7/"}
    assert isinstance(info["seconds"], float) and info["seconds"] >= 0
    assert commits == [info]


def test_the_same_content_committed_again_keeps_its_marker(store, tmp_path):
    ckpts = CheckpointStore(store)
    local = write_dir(tmp_path, "c", {"d": b"one"})
    first = ckpts.commit(3, local)
    again = ckpts.commit(3, local)
    assert again == {**first, "seconds": again["seconds"]} and again["uri"] == f"{store.uri}/checkpoints/ckpt-3/"


def test_an_upload_that_fails_names_how_many_files_and_marks_nothing(store, tmp_path, monkeypatch):
    ckpts = CheckpointStore(store, upload_workers=1)
    real = store.put_file

    def denied(key, path, **kw):
        if key.endswith("/b"):
            raise PermissionError(f"access denied to {key}")
        real(key, path, **kw)

    monkeypatch.setattr(store, "put_file", denied)
    with pytest.raises(CheckpointError) as err:
        ckpts.commit(4, write_dir(tmp_path, "c", {"a": b"1", "b": b"2", "c": b"3"}))
    assert str(err.value) == (f"checkpoint 4: 1 of 3 files failed to upload to {store.uri}/checkpoints/ckpt-4/; "
                              "not committed")
    assert isinstance(err.value.__cause__, PermissionError)
    assert not store.exists(layout.committed_key(4))


@pytest.mark.parametrize(("stored", "got"), [(None, "missing"), (2, "2 bytes")])
def test_a_file_the_store_does_not_hold_in_full_is_not_committed(store, tmp_path, monkeypatch, stored, got):
    ckpts = CheckpointStore(store)
    real = store.stat

    def short(prefix=""):
        out = dict(real(prefix))
        key = "checkpoints/ckpt-5/d"
        if stored is None:
            out.pop(key)
        else:
            out[key] = dataclasses.replace(out[key], size=stored)
        return out

    monkeypatch.setattr(store, "stat", short)
    with pytest.raises(CheckpointError) as err:
        ckpts.commit(5, write_dir(tmp_path, "c", {"d": b"abc", "e": b"e"}))
    assert str(err.value) == (f"checkpoint 5: d should hold 3 bytes in {store.uri}/checkpoints/ckpt-5/ but is "
                              f"{got}; not committed")
    assert not store.exists(layout.committed_key(5))


# -- the lease --

class Lease:
    """A lease already taken: records fence() and check(); `lost` makes them raise LeaseLost."""

    def __init__(self, store, epoch: int = 3) -> None:
        self.store, self.epoch, self.lost, self.calls = store, epoch, False, []

    def _writes(self) -> list[str]:
        return [k for k in self.store.list("checkpoints/")]

    def fence(self) -> None:
        self.calls.append(("fence", self._writes()))
        if self.lost:
            raise LeaseLost("taken over")

    def check(self) -> None:
        self.calls.append(("check", None))
        if self.lost:
            raise LeaseLost("taken over")


def test_the_marker_goes_out_right_after_the_lease_is_fenced_and_names_its_epoch(store, tmp_path):
    lease = Lease(store, epoch=3)
    ckpts = CheckpointStore(store, lease=lease)
    info = ckpts.commit(1, write_dir(tmp_path, "c", {"d": b"x"}))
    # Fenced once, after the files and before the marker; then the prune checked it.
    assert lease.calls == [("fence", ["checkpoints/ckpt-1/d"]), ("check", None)]
    assert info["lease_epoch"] == 3 and _marker(store, 1)["lease_epoch"] == 3


def test_a_lost_lease_marks_nothing_withdraws_nothing_and_prunes_nothing(store, tmp_path):
    ckpts = CheckpointStore(store, keep=1)
    ckpts.commit(1, write_dir(tmp_path, "c1", {"d": b"one"}))
    ckpts.commit(2, write_dir(tmp_path, "c2", {"d": b"two"}))
    store.put_bytes("checkpoints/ckpt-1/d", b"one")  # an old partial the prune would delete
    before = store.list("checkpoints/")
    lease = Lease(store)
    lease.lost = True
    fenced = CheckpointStore(store, keep=1, lease=lease)
    with pytest.raises(LeaseLost):
        fenced.commit(3, write_dir(tmp_path, "c3", {"d": b"three"}))
    assert not store.exists(layout.committed_key(3))
    with pytest.raises(LeaseLost):
        fenced.commit(2, write_dir(tmp_path, "c2b", {"d": b"other"}))  # a different step 2: its marker stays
    assert _marker(store, 2)["files"]["d"]["size"] == 3
    fenced.prune()
    assert [k for k in store.list("checkpoints/") if "ckpt-3" not in k] == before


def test_replacing_a_committed_step_fences_before_withdrawing_its_marker(store, tmp_path):
    CheckpointStore(store).commit(2, write_dir(tmp_path, "c", {"d": b"two"}))
    lease = Lease(store)
    CheckpointStore(store, lease=lease).commit(2, write_dir(tmp_path, "c2", {"d": b"TWO!"}))
    # The first fence saw the old marker still there: it came before the withdrawal.
    assert lease.calls[0] == ("fence", [layout.committed_key(2), "checkpoints/ckpt-2/d"])
    assert [c for c, _ in lease.calls] == ["fence", "fence", "check"]
    assert _marker(store, 2)["files"]["d"]["size"] == 4


# -- why a checkpoint is skipped --

def _committed(store, tmp_path, step: int = 2) -> dict:
    CheckpointStore(store).commit(step, write_dir(tmp_path, f"c{step}", {"d": b"data"}))
    return _marker(store, step)


SHA = "a" * 64


@pytest.mark.parametrize(("change", "reason"), [
    (lambda m: {**m, "step": 3}, "marker names step 3"),
    (lambda m: {k: v for k, v in m.items() if k != "step"}, "marker names step None"),
    (lambda m: {**m, "step": "2"}, "marker names step '2'"),
    (lambda m: {**m, "files": {}}, "marker lists no files"),
    (lambda m: {**m, "files": ["d"]}, "marker lists no files"),
    (lambda m: {k: v for k, v in m.items() if k != "files"}, "marker lists no files"),
    (lambda m: {**m, "files": {"../d": {"size": 4, "sha256": SHA}}}, "marker lists an unsafe path '../d'"),
    (lambda m: {**m, "files": {"d": "4"}}, "marker entry for d lacks size or sha256"),
    (lambda m: {**m, "files": {"d": {"size": "4", "sha256": SHA}}}, "marker entry for d lacks size or sha256"),
    (lambda m: {**m, "files": {"d": {"sha256": SHA}}}, "marker entry for d lacks size or sha256"),
    (lambda m: {**m, "files": {"d": {"size": 4}}}, "marker entry for d lacks size or sha256"),
    (lambda m: {**m, "files": {"d": {"size": 4, "sha256": SHA.upper()}}}, "marker entry for d lacks size or sha256"),
    (lambda m: {**m, "files": {"d": {"size": 4, "sha256": SHA + "0"}}}, "marker entry for d lacks size or sha256"),
    (lambda m: {**m, "files": {"d": {"size": 4, "sha256": "x" + SHA}}}, "marker entry for d lacks size or sha256"),
])
def test_a_marker_that_cannot_be_trusted_is_skipped_saying_why(store, tmp_path, change, reason):
    marker = _committed(store, tmp_path)
    store.put_bytes(layout.committed_key(2), json.dumps(change(marker)).encode())
    events = Events()
    ckpts = CheckpointStore(store, emit=events)
    assert ckpts.restore_latest(str(tmp_path / "r")) is None
    assert ckpts.restore_step(2, str(tmp_path / "s")) is False
    assert events.of(layout.CHECKPOINT_SKIPPED) == [{"step": 2, "reason": reason}] * 2
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()


def test_a_well_formed_marker_restores(store, tmp_path):
    _committed(store, tmp_path)
    events = Events()
    ckpts = CheckpointStore(store, emit=events)
    assert ckpts.restore_latest(str(tmp_path / "r")) == 2 and events == []
    assert (tmp_path / "r" / "d").read_bytes() == b"data"


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda store: store.put_bytes("checkpoints/ckpt-2/d", b"dat"), "file d holds 3 bytes, marker says 4"),
    (lambda store: store.put_bytes("checkpoints/ckpt-2/d", b"DATA"), "file d fails its sha256 check"),
    (lambda store: store.delete_prefix("checkpoints/ckpt-2/d"), "file d is missing"),
])
def test_a_damaged_file_is_named_in_the_skip(store, tmp_path, damage, reason):
    _committed(store, tmp_path)
    damage(store)
    events = Events()
    ckpts = CheckpointStore(store, emit=events)
    assert ckpts.restore_step(2, str(tmp_path / "s")) is False
    assert ckpts.restore_latest(str(tmp_path / "r")) is None
    assert events.of(layout.CHECKPOINT_SKIPPED) == [{"step": 2, "reason": reason}] * 2


def test_every_damaged_file_is_named(store, tmp_path):
    CheckpointStore(store).commit(2, write_dir(tmp_path, "c", {"a": b"aa", "b": b"bb"}))
    store.delete_prefix("checkpoints/ckpt-2/a")
    store.put_bytes("checkpoints/ckpt-2/b", b"b")
    events = Events()
    assert CheckpointStore(store, emit=events).restore_step(2, str(tmp_path / "s")) is False
    assert events.of(layout.CHECKPOINT_SKIPPED) == [{"step": 2, "reason": "file a is missing; file b holds 1 bytes, "
                                                                        "marker says 2"}]


def test_restore_step_replaces_the_folder_with_the_checkpoint_or_says_why_not(store, tmp_path):
    events = Events()
    ckpts = CheckpointStore(store, emit=events)
    dest = tmp_path / "s"
    assert ckpts.restore_step(2, str(dest)) is False
    store.put_bytes(layout.committed_key(2), b"{torn")
    assert ckpts.restore_step(2, str(dest)) is False
    assert events.of(layout.CHECKPOINT_SKIPPED) == [{"step": 2, "reason": "no COMMITTED marker"},
                                                    {"step": 2, "reason": "COMMITTED marker is not valid JSON"}]
    _committed(store, tmp_path)
    dest.mkdir()
    (dest / "stale").write_bytes(b"old")
    assert ckpts.restore_step(2, str(dest)) is True
    assert sorted(p.name for p in dest.iterdir()) == ["d"] and len(events) == 2


def test_restore_latest_replaces_a_file_in_the_way_and_makes_its_parent(store, tmp_path):
    _committed(store, tmp_path)
    ckpts = CheckpointStore(store)
    (tmp_path / "f").write_bytes(b"a file where the folder goes")
    assert ckpts.restore_latest(str(tmp_path / "f")) == 2 and (tmp_path / "f" / "d").read_bytes() == b"data"
    assert ckpts.restore_latest(str(tmp_path / "new" / "parent" / "r")) == 2
    assert (tmp_path / "new" / "parent" / "r" / "d").read_bytes() == b"data"


def test_a_marker_gone_between_listing_and_reading_is_skipped(store, tmp_path, monkeypatch):
    _committed(store, tmp_path, 1)
    _committed(store, tmp_path, 2)
    events = Events()
    ckpts = CheckpointStore(store, emit=events)
    real = ckpts._scan
    monkeypatch.setattr(ckpts, "_scan", lambda: (real(), store.delete_prefix(layout.committed_key(2)))[0])
    assert ckpts.restore_latest(str(tmp_path / "r")) == 1
    assert events.of(layout.CHECKPOINT_SKIPPED) == [{"step": 2, "reason": "COMMITTED marker vanished"}]


def test_a_step_this_store_is_uploading_is_not_a_candidate(store, tmp_path, monkeypatch):
    _committed(store, tmp_path, 1)
    ckpts = CheckpointStore(store)
    release, uploading = threading.Event(), threading.Event()
    real = store.put_file

    def held(key, path, **kw):
        real(key, path, **kw)
        uploading.set()
        assert release.wait(10)

    monkeypatch.setattr(store, "put_file", held)
    ckpts.commit_async(2, write_dir(tmp_path, "c2", {"d": b"two"}))
    assert uploading.wait(10)
    events = Events()
    ckpts.emit = events
    try:
        assert ckpts.restore_latest(str(tmp_path / "r")) == 1
    finally:
        release.set()
        ckpts.wait(10)
    assert events == []  # passed over without a word, not skipped as a partial


# -- pruning --

def test_protected_checkpoints_outlive_the_keep_count_until_unprotected(store, tmp_path):
    ckpts = CheckpointStore(store, keep=1)
    ckpts.protect = {1}
    for step in (1, 2, 3):
        ckpts.commit(step, write_dir(tmp_path, f"c{step}", {"d": bytes([step])}))
    assert ckpts.committed_steps() == [1, 3]
    store.put_bytes("checkpoints/ckpt-0/d", b"a partial")
    ckpts.protect = {0, 1}  # a partial is not kept for being protected
    ckpts.prune()
    assert ckpts.committed_steps() == [1, 3] and store.list("checkpoints/ckpt-0/") == []
    ckpts.protect = set()
    ckpts.prune()
    assert ckpts.committed_steps() == [3] and store.list("checkpoints/ckpt-1/") == []


def test_pruning_deletes_the_marker_before_the_files(store, tmp_path, monkeypatch):
    ckpts = CheckpointStore(store, keep=1)
    ckpts.commit(1, write_dir(tmp_path, "c1", {"d": b"1"}))
    deleted = []
    real = store.delete_prefix
    monkeypatch.setattr(store, "delete_prefix", lambda prefix: (deleted.append(prefix), real(prefix))[1])
    ckpts.commit(2, write_dir(tmp_path, "c2", {"d": b"2"}))
    assert deleted == [layout.committed_key(1), "checkpoints/ckpt-1/"]
    assert store.list("checkpoints/") == [layout.committed_key(2), "checkpoints/ckpt-2/d"]


def test_nothing_is_pruned_while_no_checkpoint_is_good(store, tmp_path):
    store.put_bytes("checkpoints/ckpt-1/d", b"a partial")
    CheckpointStore(store).prune()
    assert store.list("checkpoints/") == ["checkpoints/ckpt-1/d"]


# -- retries reported --

def test_retries_of_checkpoint_transfers_are_reported_and_the_hook_already_there_kept(store):
    earlier = []
    store.on_retry = lambda *args: earlier.append(args)
    events = Events()
    CheckpointStore(store, emit=events)
    error = OSError("connection reset")
    store.on_retry("put", "checkpoints/ckpt-1/d", 2, error)
    store.on_retry("put", layout.EVENTS_KEY, 1, error)
    assert earlier == [("put", "checkpoints/ckpt-1/d", 2, error), ("put", layout.EVENTS_KEY, 1, error)]
    assert events == [(layout.UPLOAD_RETRY, {"retry": 2, "error": "OSError: connection reset", "op": "put",
                                             "key": "checkpoints/ckpt-1/d"})]


def test_retries_are_reported_with_no_hook_there_before(store):
    events = Events()
    CheckpointStore(store, emit=events)
    store.on_retry("get", "checkpoints/ckpt-1/d", 1, TimeoutError("slow"))
    assert events == [(layout.UPLOAD_RETRY, {"retry": 1, "error": "TimeoutError: slow", "op": "get",
                                             "key": "checkpoints/ckpt-1/d"})]


def test_without_emit_the_stores_hook_is_left_alone(store):
    store.on_retry = hook = lambda *args: None
    CheckpointStore(store)
    assert store.on_retry is hook


# -- waiting --

def test_wait_times_out_naming_the_step_still_uploading(store, tmp_path, monkeypatch):
    ckpts = CheckpointStore(store)
    release, uploading = threading.Event(), threading.Event()
    real = store.put_file

    def held(key, path, **kw):
        uploading.set()
        assert release.wait(10)
        real(key, path, **kw)

    monkeypatch.setattr(store, "put_file", held)
    ckpts.commit_async(6, write_dir(tmp_path, "c6", {"d": b"six"}))
    assert uploading.wait(10)
    with pytest.raises(TimeoutError, match=r"^checkpoint upload of step 6 still running after 0.05 s$"):
        ckpts.wait(timeout=0.05)
    release.set()
    ckpts.wait(timeout=10)
    assert ckpts.committed_steps() == [6]


# -- the background upload's snapshot --

def _held_uploads(store, monkeypatch):
    """Hold every upload until `release` is set; `uploading` is set by the first."""
    release, uploading = threading.Event(), threading.Event()
    real = store.put_file

    def held(key, path, **kw):
        uploading.set()
        assert release.wait(10)
        real(key, path, **kw)

    monkeypatch.setattr(store, "put_file", held)
    return release, uploading


def test_the_snapshot_is_hard_links_next_to_the_folder_and_goes_once_uploaded(store, tmp_path, monkeypatch):
    ckpts = CheckpointStore(store)
    release, uploading = _held_uploads(store, monkeypatch)
    (tmp_path / "work").mkdir()
    local = write_dir(tmp_path / "work", "c", {"a": b"1", "sub/b": b"2", "with space": b"3"})
    ckpts.commit_async(1, local)
    assert uploading.wait(10)
    try:
        # One worker, a daemon: an upload still running never keeps the trainer's process alive.
        assert (ckpts._uploads.worker.name, ckpts._uploads.worker.daemon) == ("checkpoint-upload", True)
        snaps = [p for p in (tmp_path / "work").iterdir() if p.name != "c"]
        assert len(snaps) == 1 and snaps[0].name.startswith(".trainstack-snapshot-")
        for rel in ("a", "sub/b", "with space"):
            assert (snaps[0] / rel).stat().st_ino == (tmp_path / "work" / "c" / rel).stat().st_ino
    finally:
        release.set()
    ckpts.wait(10)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["c"]
    assert ckpts.restore_latest(str(tmp_path / "r")) == 1
    assert (tmp_path / "r" / "with space").read_bytes() == b"3" and (tmp_path / "r" / "sub" / "b").read_bytes() == b"2"


def test_the_snapshot_is_a_copy_where_links_fail(store, tmp_path, monkeypatch):
    import os

    def no_links(src, dst):
        raise OSError("links not supported")

    monkeypatch.setattr(os, "link", no_links)
    ckpts = CheckpointStore(store)
    local = write_dir(tmp_path, "c", {"a": b"one", "sub/b": b"two"})
    ckpts.commit_async(1, local)
    ckpts.wait(10)
    assert ckpts.restore_latest(str(tmp_path / "r")) == 1
    assert (tmp_path / "r" / "a").read_bytes() == b"one" and (tmp_path / "r" / "sub" / "b").read_bytes() == b"two"


def test_a_snapshot_that_fails_is_removed_and_its_error_raised(store, tmp_path, monkeypatch):
    import os
    import shutil

    def no_links(src, dst):
        raise OSError("links not supported")

    def disk_full(src, dst):
        raise PermissionError("disk full")

    monkeypatch.setattr(os, "link", no_links)
    monkeypatch.setattr(shutil, "copy2", disk_full)
    ckpts = CheckpointStore(store)
    local = write_dir(tmp_path, "c", {"a": b"one"})
    with pytest.raises(PermissionError, match="disk full"):
        ckpts.commit_async(1, local)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "runs") == ["c"]
    assert ckpts._uploads.worker is None and store.list("checkpoints/") == []


def test_a_commit_after_a_background_one_finished(store, tmp_path):
    ckpts = CheckpointStore(store)
    ckpts.commit_async(1, write_dir(tmp_path, "c1", {"d": b"one"}))
    ckpts.wait(10)
    assert ckpts.commit(2, write_dir(tmp_path, "c2", {"d": b"two"}))["step"] == 2
    assert ckpts.committed_steps() == [1, 2]


def test_transfers_run_on_at_most_upload_workers_named_threads(store, tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from trainer import checkpoint_store as checkpoints

    pools = []

    def recorded(*args, **kwargs):
        pools.append((args, kwargs))
        return ThreadPoolExecutor(*args, **kwargs)

    monkeypatch.setattr(checkpoints, "ThreadPoolExecutor", recorded)
    ckpts = CheckpointStore(store, upload_workers=2)
    ckpts.commit(1, write_dir(tmp_path, "c1", {"a": b"1", "b": b"2", "c": b"3"}))
    ckpts.commit(2, write_dir(tmp_path, "c2", {"a": b"1"}))
    assert ckpts.restore_latest(str(tmp_path / "r")) == 2 and ckpts.restore_step(1, str(tmp_path / "s"))
    # Never more threads than files, nor than upload_workers.
    assert pools == [((), {"max_workers": 2, "thread_name_prefix": "ckpt-up"}),
                     ((), {"max_workers": 1, "thread_name_prefix": "ckpt-up"}),
                     ((), {"max_workers": 1, "thread_name_prefix": "ckpt-down"}),
                     ((), {"max_workers": 2, "thread_name_prefix": "ckpt-down"})]


def test_restore_latest_says_why_it_passes_over_a_partial_and_a_torn_marker(store, tmp_path):
    _committed(store, tmp_path, 1)
    store.put_bytes(layout.committed_key(2), b"{torn")
    store.put_bytes("checkpoints/ckpt-2/d", b"data")
    store.put_bytes("checkpoints/ckpt-3/d", b"partial")
    events = Events()
    assert CheckpointStore(store, emit=events).restore_latest(str(tmp_path / "r")) == 1
    assert events.of(layout.CHECKPOINT_SKIPPED) == [
        {"step": 3, "reason": "no COMMITTED marker (upload never finished)"},
        {"step": 2, "reason": "COMMITTED marker is not valid JSON"}]


def test_a_newest_checkpoint_with_a_bad_marker_does_not_push_out_the_resumed_runs(store, tmp_path):
    _committed(store, tmp_path, 3)
    store.put_bytes(layout.committed_key(3), json.dumps({"step": 3, "files": {}}).encode())
    ckpts = CheckpointStore(store, keep=1)
    assert ckpts.restore_latest(str(tmp_path / "r")) is None
    ckpts.commit(2, write_dir(tmp_path, "c2", {"d": b"two"}))
    assert ckpts.committed_steps() == [2, 3]
    assert ckpts.restore_latest(str(tmp_path / "r")) == 2


def test_a_restore_downloads_next_to_its_destination(store, tmp_path, monkeypatch):
    _committed(store, tmp_path, 1)
    real = store.get_file
    into = []
    monkeypatch.setattr(store, "get_file", lambda key, path: (into.append(path), real(key, path))[1])
    dest = tmp_path / "deep" / "r"
    assert CheckpointStore(store).restore_latest(str(dest)) == 1
    (staged,) = into
    # Staged beside it (one filesystem, so the final rename is atomic), then renamed into place.
    staging = staged[: -len("/d")]
    assert staging.startswith(str(tmp_path / "deep" / ".trainstack-restore-")) and "/" not in staging[len(str(dest.parent)) + 1:]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["r"]


def test_a_synchronous_commit_takes_the_place_of_a_queued_one_of_its_step(store, tmp_path, monkeypatch):
    commits = []
    ckpts = CheckpointStore(store, on_commit=commits.append)
    release, uploading = threading.Event(), threading.Event()
    real = store.put_file

    def step_1_held(key, path, **kw):
        if key.startswith("checkpoints/ckpt-1/"):
            uploading.set()
            assert release.wait(10)
        real(key, path, **kw)

    monkeypatch.setattr(store, "put_file", step_1_held)
    (tmp_path / "work").mkdir()
    ckpts.commit_async(1, write_dir(tmp_path / "work", "c1", {"d": b"one"}))
    assert uploading.wait(10)
    local = write_dir(tmp_path / "work", "c2", {"d": b"two"})
    ckpts.commit_async(2, local)  # queued behind step 1
    assert len([p for p in (tmp_path / "work").iterdir() if p.name.startswith(".trainstack-snapshot-")]) == 2
    info = ckpts.commit(2, local)
    # The queued snapshot is gone at once, and step 2 goes up once, here.
    assert len([p for p in (tmp_path / "work").iterdir() if p.name.startswith(".trainstack-snapshot-")]) == 1
    release.set()
    ckpts.wait(10)
    assert commits == [info] and ckpts.committed_steps() == [2]
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["c1", "c2"]


@pytest.mark.parametrize(("held", "keep", "left"), [
    ("marker", 1, [2]),  # past its last cancel check: its marker lands after the commit's prune
    ("marker", 2, [1, 2]),  # ... and stays where the keep rule keeps it
    ("file", 1, [2]),  # cancelled mid-upload: its partial goes
])
def test_an_upload_a_synchronous_commit_cancelled_is_pruned_when_it_ends_and_nobody_waits(
        store, tmp_path, monkeypatch, held, keep, left):
    ckpts = CheckpointStore(store, keep=keep)
    release, holding = threading.Event(), threading.Event()
    put_file, put_bytes = store.put_file, store.put_bytes

    def hold(key: str) -> None:
        if key.startswith("checkpoints/ckpt-1/") and (key == layout.committed_key(1)) == (held == "marker"):
            holding.set()
            assert release.wait(10)

    def file_then_held(key, path, **kw):
        put_file(key, path, **kw)
        hold(key)

    def marker_held(key, data, **kw):
        hold(key)
        put_bytes(key, data, **kw)

    monkeypatch.setattr(store, "put_file", file_then_held)
    monkeypatch.setattr(store, "put_bytes", marker_held)
    ckpts.commit_async(1, write_dir(tmp_path, "c1", {"d": b"one"}))
    assert holding.wait(10)
    info = ckpts.commit(2, write_dir(tmp_path, "c2", {"d": b"two"}))
    # The commit and its prune ended while step 1 is held (it waited for nothing), step 1 going up untouched.
    assert not release.is_set() and info["step"] == 2 and ckpts.committed_steps() == [2]
    assert store.list("checkpoints/ckpt-1/") != []
    release.set()
    ckpts.wait(10)
    assert ckpts.committed_steps() == left
    assert {layout.checkpoint_key_step(k)[0] for k in store.list("checkpoints/")} == set(left)


def test_an_upload_queued_after_a_newer_synchronous_commit_prunes_itself_when_it_ends(store, tmp_path):
    # A background write that outlived the synchronous save's wait can still hand its older step over.
    ckpts = CheckpointStore(store, keep=1)
    ckpts.commit(2, write_dir(tmp_path, "c2", {"d": b"two"}))
    ckpts.commit_async(1, write_dir(tmp_path, "c1", {"d": b"one"}))
    ckpts.wait(10)
    assert ckpts.committed_steps() == [2] and store.list("checkpoints/ckpt-1/") == []


def test_a_failed_prune_after_a_cancelled_upload_is_reported_and_left_to_the_next_commit(store, tmp_path, monkeypatch):
    events = Events()
    ckpts = CheckpointStore(store, keep=1, emit=events)
    release, holding = hold_marker(store, 1, monkeypatch)
    delete_prefix = store.delete_prefix

    def denied(prefix):
        if prefix.startswith("checkpoints/ckpt-1/"):
            raise PermissionError(f"access denied to {prefix}")
        delete_prefix(prefix)

    monkeypatch.setattr(store, "delete_prefix", denied)
    ckpts.commit_async(1, write_dir(tmp_path, "c1", {"d": b"one"}))
    assert holding.wait(10)
    ckpts.commit(2, write_dir(tmp_path, "c2", {"d": b"two"}))
    release.set()
    ckpts.wait(10)  # not raised: the run goes on
    assert ckpts.committed_steps() == [1, 2]
    assert events.of(layout.CHECKPOINT_FAILED) == [{
        "reason": "checkpoint 1, superseded by a newer commit, is not pruned yet (the next commit prunes it): "
                  "PermissionError: access denied to checkpoints/ckpt-1/COMMITTED"}]
    monkeypatch.setattr(store, "delete_prefix", delete_prefix)
    ckpts.commit(3, write_dir(tmp_path, "c3", {"d": b"three"}))
    assert ckpts.committed_steps() == [3]


def test_a_step_being_committed_synchronously_is_not_a_restore_candidate(store, tmp_path, monkeypatch):
    _committed(store, tmp_path, 1)
    ckpts = CheckpointStore(store)
    release, uploading = threading.Event(), threading.Event()
    real = store.put_file

    def held(key, path, **kw):
        real(key, path, **kw)
        uploading.set()
        assert release.wait(10)

    monkeypatch.setattr(store, "put_file", held)
    result = {}
    committing = threading.Thread(target=lambda: result.update(ckpts.commit(5, write_dir(tmp_path, "c5", {"d": b"5"}))))
    committing.start()
    try:
        assert uploading.wait(10)
        events = Events()
        ckpts.emit = events
        assert ckpts.restore_latest(str(tmp_path / "r")) == 1
        assert events == []  # passed over without a word, not skipped as a partial
    finally:
        release.set()
        committing.join(10)
    assert result["step"] == 5 and ckpts.committed_steps() == [1, 5]


class _Monotonic:
    """Stands in for the module's `time`: each monotonic() call returns the next of `readings`."""

    def __init__(self, *readings: float) -> None:
        self.readings = list(readings)

    def monotonic(self) -> float:
        return self.readings.pop(0)


def test_a_commit_reports_its_seconds_to_the_millisecond(store, tmp_path, monkeypatch):
    from trainer import checkpoint_store as checkpoints

    ckpts = CheckpointStore(store)
    local = write_dir(tmp_path, "c", {"d": b"x"})
    monkeypatch.setattr(checkpoints, "time", _Monotonic(100.0, 101.23456))
    assert ckpts.commit(1, local)["seconds"] == 1.235
    # The same content again: the marker is kept, and the time is still the call's own.
    monkeypatch.setattr(checkpoints, "time", _Monotonic(200.0, 200.0004))
    kept = ckpts.commit(1, local)
    assert kept["seconds"] == 0.0 and isinstance(kept["seconds"], float)
    monkeypatch.setattr(checkpoints, "time", _Monotonic(300.0, 302.71828))
    assert ckpts.commit(1, local)["seconds"] == 2.718


def test_the_marker_is_dated_in_utc_whatever_the_machines_zone(store, tmp_path, monkeypatch):
    import time
    from datetime import UTC, datetime

    monkeypatch.setenv("TZ", "Asia/Kolkata")  # UTC+5:30, no daylight saving
    time.tzset()
    try:
        before = datetime.now(tz=UTC)
        CheckpointStore(store).commit(1, write_dir(tmp_path, "c", {"d": b"x"}))
        after = datetime.now(tz=UTC)
    finally:
        monkeypatch.undo()
        time.tzset()
    created = datetime.strptime(_marker(store, 1)["created"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert before <= created <= after


def test_by_default_three_checkpoints_are_kept_and_four_files_go_up_at_once(store):
    ckpts = CheckpointStore(store)
    assert (ckpts.keep, ckpts.upload_workers) == (3, 4)
