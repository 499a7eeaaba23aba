"""Tests for the checkpoint commit protocol (trainer.checkpoint_store) on file://, S3 and GCS emulators."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from runfolder import layout, storage
from runfolder.storage import open_store
from trainer.checkpoint_store import CheckpointError, CheckpointStore


@pytest.fixture(scope="module")
def tf():
    import tensorflow

    return tensorflow


def _tf_checkpoint(tf, directory: Path, step: int, values: list[float]) -> Path:
    """Save a real TF checkpoint (a variable, an optimizer slot-like var, a step) into ``directory``."""
    ckpt = tf.train.Checkpoint(w=tf.Variable(values), m=tf.Variable([v * 2 for v in values]), step=tf.Variable(step))
    tf.train.CheckpointManager(ckpt, str(directory), max_to_keep=1).save(checkpoint_number=step)
    return directory


def _tf_load(tf, directory: Path) -> tuple[list[float], int]:
    w = tf.Variable([0.0] * 3)
    m = tf.Variable([0.0] * 3)
    step = tf.Variable(0)
    path = tf.train.latest_checkpoint(str(directory))
    assert path is not None, f"no TF checkpoint in {directory}: {os.listdir(directory)}"
    tf.train.Checkpoint(w=w, m=m, step=step).restore(path).assert_consumed()
    return [float(x) for x in w.numpy()], int(step.numpy())


def write_dir(tmp_path: Path, name: str, files: dict[str, bytes]) -> str:
    """A folder ``tmp_path/name`` holding ``files`` (relative path -> bytes); its path."""
    root = tmp_path / name
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return str(root)


def hold_marker(store, step: int, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Hold the write of `step`'s completion marker until `release` is set; `holding` is set once it is held.

    Returns (release, holding): an upload past its last cancel check, made to wait there."""
    release, holding = threading.Event(), threading.Event()
    put_bytes = store.put_bytes

    def marker_held(key, data, **kw):
        if key == layout.committed_key(step):
            holding.set()
            assert release.wait(10)
        put_bytes(key, data, **kw)

    monkeypatch.setattr(store, "put_bytes", marker_held)
    return release, holding


class Events(list):
    """Collects emit(kind, fields) calls."""

    def __call__(self, kind: str, fields: dict) -> None:
        self.append((kind, fields))

    def of(self, kind: str) -> list[dict]:
        return [f for k, f in self if k == kind]


def test_commit_restore_round_trip_with_tf(run_root, tmp_path, tf):
    store = open_store(run_root.uri)
    events = Events()
    commits = []
    ckpts = CheckpointStore(store, emit=events, on_commit=commits.append)
    local = _tf_checkpoint(tf, tmp_path / "local", 10, [1.0, 2.0, 3.0])

    info = ckpts.commit(10, str(local))

    local_files = sorted(os.listdir(local))
    assert sorted(info["files"]) == local_files
    assert info["step"] == 10 and info["bytes"] == sum(os.path.getsize(local / f) for f in local_files)
    assert info["seconds"] >= 0 and commits == [info]
    assert ckpts.committed_steps() == [10]
    marker = json.loads(store.get_bytes(layout.committed_key(10)))
    assert marker["files"] == info["files"] and marker["step"] == 10

    dest = tmp_path / "restored"
    assert ckpts.restore_latest(str(dest)) == 10
    assert sorted(os.listdir(dest)) == local_files
    assert _tf_load(tf, dest) == ([1.0, 2.0, 3.0], 10)
    assert events == []


def test_marker_is_written_last_and_a_crash_before_it_is_ignored(run_root, tmp_path, tf):
    store = open_store(run_root.uri)
    events = Events()
    ckpts = CheckpointStore(store, emit=events)
    ckpts.commit(10, str(_tf_checkpoint(tf, tmp_path / "a", 10, [1.0, 1.0, 1.0])))

    writes: list[str] = []
    real_put_file, real_put_bytes = store.put_file, store.put_bytes

    def put_file(key, path):
        writes.append(key)
        real_put_file(key, path)

    def put_bytes(key, data):
        writes.append(key)
        if key.endswith(layout.COMMITTED):
            raise KeyboardInterrupt("machine lost before the marker")  # not retried, like a kill
        real_put_bytes(key, data)

    store.put_file, store.put_bytes = put_file, put_bytes
    with pytest.raises(KeyboardInterrupt):
        ckpts.commit(20, str(_tf_checkpoint(tf, tmp_path / "b", 20, [2.0, 2.0, 2.0])))
    store.put_file, store.put_bytes = real_put_file, real_put_bytes

    assert writes[-1] == layout.committed_key(20)
    assert len(writes) == 4 and all(not k.endswith(layout.COMMITTED) for k in writes[:-1])
    assert len(store.list("checkpoints/ckpt-20/")) == 3  # files are there, the marker is not
    assert ckpts.committed_steps() == [10]

    dest = tmp_path / "restored"
    assert ckpts.restore_latest(str(dest)) == 10
    assert _tf_load(tf, dest) == ([1.0, 1.0, 1.0], 10)
    assert [(e["step"], "no COMMITTED marker" in e["reason"]) for e in events.of("checkpoint_skipped")] == [(20, True)]


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "garbage-marker", "lying-marker"])
def test_damaged_checkpoint_is_skipped_and_older_restored(run_root, tmp_path, damage):
    store = open_store(run_root.uri)
    events = Events()
    ckpts = CheckpointStore(store, emit=events)
    ckpts.commit(1, write_dir(tmp_path, "a", {"model.data": b"A" * 1000, "sub/model.index": b"a-index"}))
    ckpts.commit(2, write_dir(tmp_path, "b", {"model.data": b"B" * 1000, "sub/model.index": b"b-index"}))
    key = "checkpoints/ckpt-2/model.data"
    if damage == "flip":
        store.put_bytes(key, b"B" * 999 + b"C")
    elif damage == "truncate":
        store.put_bytes(key, b"B" * 10)
    elif damage == "delete":
        store.delete_prefix(key)
    elif damage == "garbage-marker":
        store.put_bytes(layout.committed_key(2), b"{not json")
    elif damage == "lying-marker":
        marker = json.loads(store.get_bytes(layout.committed_key(2)))
        marker["files"]["../../escape"] = marker["files"].pop("model.data")
        store.put_bytes(layout.committed_key(2), json.dumps(marker).encode())

    dest = tmp_path / "restored"
    dest.mkdir()
    (dest / "stale").write_bytes(b"old local file")
    assert ckpts.restore_latest(str(dest)) == 1
    assert (dest / "model.data").read_bytes() == b"A" * 1000
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == ["model.data", "sub/model.index"]
    skipped = events.of("checkpoint_skipped")
    assert [e["step"] for e in skipped] == [2]
    expected_reason = {
        "flip": "sha256",
        "truncate": "bytes",
        "delete": "missing",
        "garbage-marker": "not valid JSON",
        "lying-marker": "unsafe path",
    }[damage]
    assert expected_reason in skipped[0]["reason"]
    # Nothing is left over next to the destination (staging directories are cleaned up).
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []


def test_restore_with_nothing_committed(run_root, tmp_path):
    store = open_store(run_root.uri)
    events = Events()
    ckpts = CheckpointStore(store, emit=events)
    assert ckpts.restore_latest(str(tmp_path / "r")) is None
    store.put_bytes("checkpoints/ckpt-5/model.data", b"partial")
    assert ckpts.committed_steps() == []
    assert ckpts.restore_latest(str(tmp_path / "r")) is None
    assert [e["step"] for e in events.of("checkpoint_skipped")] == [5]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("run_root", ["file", "s3"], indirect=True)
def test_prune_keeps_k_and_never_the_newest(run_root, tmp_path):
    store = open_store(run_root.uri)
    ckpts = CheckpointStore(store, keep=2)
    for step in (1, 2, 3):
        ckpts.commit(step, write_dir(tmp_path, f"c{step}", {"d": bytes([step]) * 10}))
    assert ckpts.committed_steps() == [2, 3]
    # A partial older than the newest commit is stale; a newer one may be an upload in progress.
    store.put_bytes("checkpoints/ckpt-2x/ignored", b"not a checkpoint name")
    store.put_bytes("checkpoints/ckpt-0/d", b"stale partial")
    store.put_bytes("checkpoints/ckpt-9/d", b"in progress")
    ckpts.commit(4, write_dir(tmp_path, "c4", {"d": b"\x04" * 10}))
    assert ckpts.committed_steps() == [3, 4]
    assert store.list("checkpoints/") == [
        "checkpoints/ckpt-2x/ignored",
        layout.committed_key(3),
        "checkpoints/ckpt-3/d",
        layout.committed_key(4),
        "checkpoints/ckpt-4/d",
        "checkpoints/ckpt-9/d",
    ]

    single = CheckpointStore(store, keep=1)
    single.prune()
    assert single.committed_steps() == [4]
    assert store.exists("checkpoints/ckpt-4/d")
    with pytest.raises(ValueError, match="keep"):
        CheckpointStore(store, keep=0)


@pytest.mark.parametrize("run_root", ["file", "s3"], indirect=True)
def test_resumed_run_past_a_damaged_newest_keeps_its_new_checkpoints(run_root, tmp_path):
    store = open_store(run_root.uri)
    events = Events()
    ckpts = CheckpointStore(store, keep=1, emit=events)
    ckpts.commit(1, write_dir(tmp_path, "c1", {"d": b"one"}))
    ckpts.commit(3, write_dir(tmp_path, "c3", {"d": b"three"}))
    store.put_bytes("checkpoints/ckpt-1/d", b"one")  # pruned with keep=1: put back as a partial
    assert ckpts.committed_steps() == [3]
    store.put_bytes("checkpoints/ckpt-3/d", b"THREE")  # damaged after commit

    resumed = CheckpointStore(store, keep=1, emit=events)
    assert resumed.restore_latest(str(tmp_path / "r")) is None  # 3 is damaged, 1 has no marker
    assert [e["step"] for e in events.of("checkpoint_skipped")] == [3, 1]
    resumed.commit(2, write_dir(tmp_path, "c2", {"d": b"two"}))
    # The damaged 3 does not push out the resumed run's newest good checkpoint.
    assert resumed.committed_steps() == [2, 3]
    assert not store.exists("checkpoints/ckpt-1/d")
    assert resumed.restore_latest(str(tmp_path / "r")) == 2
    # Committing step 3 again replaces the damaged one for good.
    resumed.commit(3, write_dir(tmp_path, "c3b", {"d": b"three"}))
    assert resumed.committed_steps() == [3]
    assert resumed.restore_latest(str(tmp_path / "r")) == 3
    assert (tmp_path / "r" / "d").read_bytes() == b"three"


def test_recommit_of_same_step_keeps_or_replaces_consistently(run_root, tmp_path):
    store = open_store(run_root.uri)
    ckpts = CheckpointStore(store)
    first = ckpts.commit(7, write_dir(tmp_path, "a", {"d": b"same"}))
    again = ckpts.commit(7, write_dir(tmp_path, "b", {"d": b"same"}))
    assert again["created"] == first["created"]  # identical content: left as committed
    changed = ckpts.commit(7, write_dir(tmp_path, "c", {"d": b"different", "e": b"x"}))
    assert sorted(changed["files"]) == ["d", "e"]
    assert ckpts.restore_latest(str(tmp_path / "r")) == 7
    assert (tmp_path / "r" / "d").read_bytes() == b"different"


def _slow_uploads(store, monkeypatch, seconds: float, gate: threading.Event | None = None):
    real = store.put_file
    started = []

    def slow(key, path, **kw):
        started.append(key)
        if gate is not None:
            gate.wait(timeout=10)
        time.sleep(seconds)
        real(key, path, **kw)

    monkeypatch.setattr(store, "put_file", slow)
    return started


@pytest.mark.parametrize("run_root", ["file", "s3"], indirect=True)
def test_commit_async_returns_at_once_and_newer_replaces_queued(run_root, tmp_path, monkeypatch):
    store = open_store(run_root.uri)
    commits = []
    ckpts = CheckpointStore(store, on_commit=commits.append)
    gate = threading.Event()
    started = _slow_uploads(store, monkeypatch, 0.0, gate)

    returned = []
    for step in (1, 2, 3):
        local = write_dir(tmp_path, f"c{step}", {"model.data": bytes([step]) * 5000, "model.index": b"i"})
        ckpts.commit_async(step, local)
        # It returned while every upload is held at the gate: the caller never waits for one (a
        # caller that did would return only after the gate's own 10 s timeout, with a commit made).
        returned.append((step, gate.is_set(), list(commits), ckpts.committed_steps()))
        # The caller may delete its directory as soon as commit_async returns.
        shutil.rmtree(local)
        if step == 1:
            deadline = time.monotonic() + 5
            while not started and time.monotonic() < deadline:
                time.sleep(0.01)
            assert started, "the background upload of step 1 never began"
    assert returned == [(1, False, [], []), (2, False, [], []), (3, False, [], [])]
    assert ckpts.committed_steps() == []
    with pytest.raises(TimeoutError, match="step 1"):
        ckpts.wait(timeout=0.1)
    gate.set()
    ckpts.wait(timeout=30)

    # Step 2 was replaced by step 3 while it waited in the queue.
    assert [c["step"] for c in commits] == [1, 3]
    assert ckpts.committed_steps() == [1, 3]
    assert ckpts.restore_latest(str(tmp_path / "r")) == 3
    assert (tmp_path / "r" / "model.data").read_bytes() == b"\x03" * 5000
    # Snapshots were cleaned up: only the restored directory (and a file run root) remain.
    assert sorted(os.listdir(tmp_path)) in (["r"], ["r", "runs"])


def test_wait_reraises_background_failure_once(tmp_path, monkeypatch):
    store = open_store(f"file://{tmp_path}/run")
    ckpts = CheckpointStore(store)
    calls = []

    def denied(key, path, **kw):
        calls.append(key)
        raise PermissionError(f"access denied to {key}")

    monkeypatch.setattr(store, "put_file", denied)
    ckpts.commit_async(1, write_dir(tmp_path, "c1", {"d": b"x"}))
    with pytest.raises(CheckpointError, match="not committed") as err:
        ckpts.wait(timeout=10)
    assert isinstance(err.value.__cause__, PermissionError)
    assert calls == ["checkpoints/ckpt-1/d"]  # not retried: not transient
    ckpts.wait(timeout=10)  # reported once
    assert ckpts.committed_steps() == []


def test_sync_commit_stops_older_background_upload(tmp_path, monkeypatch):
    store = open_store(f"file://{tmp_path}/run")
    ckpts = CheckpointStore(store, upload_workers=1)
    real = store.put_file
    started, uploading, synced = [], threading.Event(), threading.Event()

    def held(key, path, **kw):
        started.append(key)
        if key.startswith("checkpoints/ckpt-1/"):
            # The background upload's first file is held until the synchronous commit is done.
            uploading.set()
            assert synced.wait(10), "the synchronous commit did not end"
        real(key, path, **kw)

    monkeypatch.setattr(store, "put_file", held)
    ckpts.commit_async(1, write_dir(tmp_path, "c1", {f"f{i}": b"1" for i in range(5)}))
    assert uploading.wait(10), "the background upload of step 1 never began"
    ckpts.commit(2, write_dir(tmp_path, "c2", {"f0": b"2"}))
    synced.set()
    ckpts.wait(timeout=10)
    assert ckpts.committed_steps() == [2]
    # It stopped before its next file: only the one it was sending when the commit came.
    assert [k for k in started if k.startswith("checkpoints/ckpt-1/")] == ["checkpoints/ckpt-1/f0"]
    ckpts.prune()
    assert store.list("checkpoints/ckpt-1/") == []


def test_sync_commit_of_the_step_uploading_in_background_waits_for_it(tmp_path, monkeypatch):
    store = open_store(f"file://{tmp_path}/run")
    commits = []
    ckpts = CheckpointStore(store, on_commit=commits.append)
    gate = threading.Event()
    started = _slow_uploads(store, monkeypatch, 0.0, gate)
    local = write_dir(tmp_path, "c5", {"model.data": b"5" * 100, "model.index": b"i"})
    ckpts.commit_async(5, local)
    deadline = time.monotonic() + 5
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    threading.Timer(0.2, gate.set).start()
    info = ckpts.commit(5, local)
    ckpts.wait(timeout=10)
    assert info["step"] == 5 and ckpts.committed_steps() == [5]
    assert sorted(started) == ["checkpoints/ckpt-5/model.data", "checkpoints/ckpt-5/model.index"]  # once each
    assert [c["created"] for c in commits] == [info["created"], info["created"]]


def test_a_cancelled_upload_whose_marker_lands_after_the_commits_prune_is_pruned_when_it_ends(run_root, tmp_path,
                                                                                                 monkeypatch):
    """The background upload is past its last cancel check when the synchronous commit comes: that
    commit neither waits for it nor prunes it (still going up); its marker lands later, and it prunes
    itself as it ends, marker first (test_checkpoint_rules.py holds the other cases, on file://)."""
    store = open_store(run_root.uri)
    ckpts = CheckpointStore(store, keep=1)
    (release, holding), deleted = hold_marker(store, 1, monkeypatch), []
    delete_prefix = store.delete_prefix
    monkeypatch.setattr(store, "delete_prefix", lambda prefix: (deleted.append(prefix), delete_prefix(prefix))[1])
    ckpts.commit_async(1, write_dir(tmp_path, "c1", {"d": b"one"}))
    assert holding.wait(10)
    ckpts.commit(2, write_dir(tmp_path, "c2", {"d": b"two"}))
    assert not release.is_set() and deleted == []
    release.set()
    ckpts.wait(10)
    assert ckpts.committed_steps() == [2] and store.list("checkpoints/ckpt-1/") == []
    assert deleted == [layout.committed_key(1), "checkpoints/ckpt-1/"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["503", "drop"])
@pytest.mark.parametrize("backend", ["s3", "gs"])
def test_flaky_store_commit_succeeds_and_reports_retries(request, tmp_path, backend, mode):
    faulty = request.getfixturevalue(f"faulty_{backend}")
    store = open_store(faulty.uri)
    events = Events()
    ckpts = CheckpointStore(store, emit=events)
    # Over the multipart threshold, so part uploads meet the faults too.
    local = write_dir(tmp_path, "c", {"model.data": os.urandom(10 * 1024 * 1024), "model.index": b"idx"})
    faulty.proxy.fail_for(1.0, mode)
    info = ckpts.commit(5, local)
    assert faulty.proxy.failed > 0
    assert events.of("upload_retry"), "retries were not reported"
    retries = events.of("upload_retry")
    assert all({"retry", "error"} <= set(e) and e["key"].startswith("checkpoints/ckpt-5/") for e in retries), retries
    assert ckpts.restore_latest(str(tmp_path / "r")) == 5
    assert (tmp_path / "r" / "model.data").read_bytes() == Path(local, "model.data").read_bytes()
    assert info["bytes"] == 10 * 1024 * 1024 + 3


@pytest.mark.slow
def test_outage_longer_than_retries_commits_nothing(faulty_s3, tmp_path, monkeypatch):
    # Fewer retries so the outage outlasts them within a short test.
    monkeypatch.setattr(storage.retry, "S3_MAX_ATTEMPTS", 2)
    monkeypatch.setattr(storage.retry, "TRANSFER_ATTEMPTS", 2)
    monkeypatch.setattr(storage.retry, "BACKOFF_INITIAL_S", 0.05)
    store = open_store(faulty_s3.uri)
    events = Events()
    ckpts = CheckpointStore(store, emit=events, upload_workers=1)  # files go up in order: d, e
    ckpts.commit(1, write_dir(tmp_path, "c1", {"d": b"good" * 100, "e": b"e"}))

    local = write_dir(tmp_path, "c2", {"d": b"newer" * 100, "e": b"e2"})
    # Let the first file through, then drop everything: a half-uploaded checkpoint.
    real = store.put_file
    first = []

    def put_file(key, path):
        if first:
            faulty_s3.proxy.fail_for(10.0, "drop")
        first.append(key)
        real(key, path)

    monkeypatch.setattr(store, "put_file", put_file)
    with pytest.raises(CheckpointError, match="not committed"):
        ckpts.commit(2, local)
    faulty_s3.proxy.heal()
    assert faulty_s3.proxy.failed > 0
    assert store.exists("checkpoints/ckpt-2/d") and not store.exists(layout.committed_key(2))
    assert ckpts.committed_steps() == [1]
    assert ckpts.restore_latest(str(tmp_path / "r")) == 1
    assert (tmp_path / "r" / "d").read_bytes() == b"good" * 100
    assert [e["step"] for e in events.of("checkpoint_skipped")] == [2]


@pytest.mark.slow
def test_100mb_checkpoint_commits_to_s3_within_preemption_window(s3_run, tmp_path, tf):
    store = open_store(s3_run.uri)
    ckpts = CheckpointStore(store)
    size = 25 * 1024 * 1024  # float32 values: 100 MiB
    ckpt = tf.train.Checkpoint(w=tf.Variable(tf.random.normal([size], seed=1)))
    t0 = time.monotonic()
    tf.train.CheckpointManager(ckpt, str(tmp_path / "big"), max_to_keep=1).save(checkpoint_number=1)
    save_s = time.monotonic() - t0
    info = ckpts.commit(1, str(tmp_path / "big"))
    t1 = time.monotonic()
    assert ckpts.restore_latest(str(tmp_path / "r")) == 1
    restore_s = time.monotonic() - t1
    print(f"\n100MiB checkpoint: TF save {save_s:.2f}s, commit {info['seconds']:.2f}s, restore {restore_s:.2f}s")
    assert info["bytes"] >= 100 * 1024 * 1024
    assert save_s + info["seconds"] < 20.0


def _checkpointer(tf, store, work: Path, w, rng, extra):
    from trainer.tf_checkpoint import Checkpointer

    # The TF checkpoint holds `w` and `rng`; the fingerprint covers `extra` too, as it would
    # a variable the model has but the checkpoint failed to restore.
    ckpt = tf.train.Checkpoint(model=[w, rng])
    return Checkpointer(CheckpointStore(store), ckpt, work=str(work), chief=True, variables=[w, rng, extra])


def test_restore_is_checked_against_the_saved_fingerprint(tf, tmp_path):
    from trainer.tf_checkpoint import ResumeMismatch

    store = open_store(f"file://{tmp_path}/run")
    saver = _checkpointer(tf, store, tmp_path / "a", tf.Variable([1.0, 2.0]),
                          tf.Variable([7, 9], dtype=tf.int64, name="seed_generator_state"), tf.Variable(3.0))
    state = {"step": 5, "batches_seen": 5, "examples_seen": 160}
    assert saver.commit(5, saver.save_local(5, state), sync=True)
    saved = json.loads(store.get_bytes("checkpoints/ckpt-5/state.json"))
    fp = saved["fingerprint"]
    assert (fp["step"], fp["batches_seen"], fp["examples_seen"]) == (5, 5, 160) and fp["rng"] and fp["variables"]

    # Same variables restored: the fingerprint matches and the state comes back.
    same = _checkpointer(tf, store, tmp_path / "b", tf.Variable([0.0, 0.0]),
                         tf.Variable([0, 0], dtype=tf.int64, name="seed_generator_state"), tf.Variable(3.0))
    step, restored = same.restore()
    assert step == 5 and restored["batches_seen"] == 5
    assert same.variables[0].numpy().tolist() == [1.0, 2.0] and same.rng_variables[0].numpy().tolist() == [7, 9]

    # A variable that the checkpoint did not bring back: refused, naming what differs.
    other = _checkpointer(tf, store, tmp_path / "c", tf.Variable([0.0, 0.0]),
                          tf.Variable([0, 0], dtype=tf.int64, name="seed_generator_state"), tf.Variable(4.0))
    with pytest.raises(ResumeMismatch, match=r"ckpt-5 did not restore the state it recorded \(variables: saved"):
        other.restore()


def test_a_synchronous_commit_aborts_the_background_upload_mid_file(tmp_path, monkeypatch):
    """GCE gives 30 s: the commit on SIGTERM must not share the link with an older upload
    still sending a large file. The background upload stops at its next read."""
    from runfolder.storage import local
    from runfolder.storage.keys import CancellableReader

    monkeypatch.setattr(local, "COPY_CHUNK", 256 * 1024)
    store = open_store(f"file://{tmp_path}/run")
    ckpts = CheckpointStore(store, upload_workers=1)
    reading, reads_after = threading.Event(), []
    cancelled_at = []
    real_read = CancellableReader.read

    def slow_read(self, size=-1):
        reading.set()
        if cancelled_at:
            reads_after.append(size)
        time.sleep(0.02)  # 256 KiB per 20 ms: the 16 MiB file needs well over a second
        return real_read(self, size)

    monkeypatch.setattr(CancellableReader, "read", slow_read)
    ckpts.commit_async(1, write_dir(tmp_path, "c1", {"big": os.urandom(16 * 1024 * 1024)}))
    assert reading.wait(10)
    cancelled_at.append(time.monotonic())
    info = ckpts.commit(2, write_dir(tmp_path, "c2", {"small": b"x" * 100}))
    ckpts.wait(5)  # the background worker has wound down
    assert info["step"] == 2
    # It stopped at once, not at the end of the file: counted in reads of the big file (64 of
    # 256 KiB), not in seconds, which a loaded machine stretches.
    assert len(reads_after) <= 2, reads_after
    assert ckpts.committed_steps() == [2]
    assert not store.exists("checkpoints/ckpt-1/big")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["s3", "gs"])
def test_a_synchronous_commit_aborts_the_background_upload_mid_request_on_a_slow_link(request, backend, tmp_path):
    """The link is slow (1 MiB/s through the fault proxy) and a 16 MiB checkpoint is going up in
    the background when the notice's synchronous commit starts: the big file's requests end
    mid-body at once (the proxy saw them cut short), the small commit completes, and the
    cancelled checkpoint leaves nothing behind (no object, no open multipart upload or part)."""
    run = request.getfixturevalue(f"faulty_{backend}")
    proxy = run.proxy
    store = open_store(run.uri)
    ckpts = CheckpointStore(store, upload_workers=1)
    size = 16 * 1024 * 1024
    proxy.throttle(1024 * 1024)
    ckpts.commit_async(1, write_dir(tmp_path, "c1", {"big": os.urandom(size)}))
    deadline = time.monotonic() + 30
    while proxy.received < 1024 * 1024 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proxy.received >= 1024 * 1024, "the background upload never got going"
    t0 = time.monotonic()
    info = ckpts.commit(2, write_dir(tmp_path, "c2", {"small": b"x" * 100}))
    took = time.monotonic() - t0
    ckpts.wait(30)
    # The big file alone needs 16 s on this link: a commit that waited for it could not end
    # sooner. 10 s leaves a loaded machine room and still tells the two apart (what was sent
    # for the big file is checked in bytes below).
    assert info["step"] == 2 and took < 10.0, took
    # Requests carrying the big file, cut short: the proxy read part of their bodies, then the
    # client was gone. (The proxy records a request once its body ends, whole or not.)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        cut = [(p, got) for m, p, got, whole in proxy.bodies if m in ("PUT", "POST") and not whole and got > 0]
        if cut:
            break
        time.sleep(0.2)
    assert cut, proxy.bodies
    assert all(got < size for _, got in cut)
    sent_for_big = sum(got for m, p, got, whole in proxy.bodies if "ckpt-1" in p or "upload_id" in p or "uploadId" in p)
    assert sent_for_big < size, (sent_for_big, proxy.bodies)
    proxy.throttle(0)
    assert ckpts.committed_steps() == [2]
    assert store.list("checkpoints/ckpt-1/") == []
    if backend == "s3":
        import boto3

        s3 = boto3.client("s3", endpoint_url=run.vars["AWS_ENDPOINT_URL"])
        assert not s3.list_multipart_uploads(Bucket=run.bucket).get("Uploads")


@pytest.mark.parametrize(("key", "expected"), [
    ("checkpoints/ckpt-10/COMMITTED", (10, "COMMITTED")),
    ("checkpoints/ckpt-7/sub/ckpt.index", (7, "sub/ckpt.index")),
    ("checkpoints/ckpt-10/", None),
    ("checkpoints/ckpt-x/COMMITTED", None),
    ("checkpoints/other-3/COMMITTED", None),
    ("tensorboard/ckpt-3/COMMITTED", None),
])
def test_checkpoint_keys_are_read_as_layout_writes_them(key, expected):
    assert layout.checkpoint_key_step(key) == expected
    if expected is not None:
        assert key.startswith(layout.checkpoint_dir(expected[0]) + "/")


def test_the_commit_protocol_imports_no_tensorflow():
    import subprocess
    import sys

    # ops imports CheckpointStore on a laptop: loading TensorFlow there would cost seconds and a dependency.
    code = ("import sys; from trainer.checkpoint_store import CheckpointStore; "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')); "
            "print(CheckpointStore.__name__, heavy)")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "CheckpointStore []", out.stdout + out.stderr
