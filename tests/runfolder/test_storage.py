"""Tests for runfolder.storage against file://, moto_server (S3) and the GCS emulator."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from runfolder import storage
from runfolder.storage import NotFound, open_store


def _write(path, data: bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def test_round_trips(run_root, tmp_path):
    store = open_store(run_root.uri)
    store.put_bytes("a/b/c.bin", b"\x00\x01hello")
    assert store.get_bytes("a/b/c.bin") == b"\x00\x01hello"
    store.put_bytes("a/b/c.bin", b"replaced")
    assert store.get_bytes("a/b/c.bin") == b"replaced"

    src = _write(tmp_path / "src" / "f.dat", os.urandom(300_000))
    store.put_file("files/f.dat", src)
    dest = tmp_path / "out" / "deep" / "f.dat"
    store.get_file("files/f.dat", str(dest))
    assert dest.read_bytes() == Path(src).read_bytes()
    # Nothing but the file itself is left next to the destination.
    assert os.listdir(dest.parent) == ["f.dat"]


def test_folders_names_the_folders_under_a_prefix_without_what_they_hold(run_root):
    """One delimited listing: the folders right under the prefix, each once, however deep their objects
    are; an object beside them is no folder, and a prefix that is no folder is refused."""
    store = open_store(run_root.uri)
    for key in ["runs/a/events.jsonl", "runs/a/checkpoints/ckpt-1/COMMITTED", "runs/b/x", "runs/c.txt",
                "runs/d/e/f", "runsx/g/h", "top"]:
        store.put_bytes(key, b"1")
    assert store.folders("runs/") == ["runs/a/", "runs/b/", "runs/d/"]
    assert store.folders("runs/a/") == ["runs/a/checkpoints/"]
    assert store.folders("") == ["runs/", "runsx/"]
    assert store.folders("runs/b/") == [] and store.folders("nothing/") == []
    store.delete_prefix("runs/b/")  # an emptied folder is gone, on files as in a bucket
    assert store.folders("runs/") == ["runs/a/", "runs/d/"]
    with pytest.raises(ValueError, match="ending in '/'"):
        store.folders("runs")


def test_get_range_reads_the_bytes_asked_for_and_nothing_past_the_end(run_root):
    store = open_store(run_root.uri)
    data = bytes(range(256)) * 4
    store.put_bytes("tb/events", data)
    store.put_bytes("tb/empty", b"")
    cases = {(0, None): data, (10, 20): data[10:20], (1000, None): data[1000:], (1020, 2000): data[1020:],
             (1024, None): b"", (1500, None): b"", (1500, 1600): b"", (7, 7): b"", (0, 1): data[:1]}
    got = {c: store.get_range("tb/events", *c) for c in cases}
    assert got == cases
    assert store.get_range("tb/empty", 0) == store.get_range("tb/empty", 0, 0) == store.get_range("tb/empty", 3) == b""
    for start, end in ((0, None), (5, 9), (3, 3)):
        with pytest.raises(NotFound):
            store.get_range("tb/missing", start, end)
    for start, end in ((-1, None), (5, 4), (1.5, None)):
        with pytest.raises(ValueError, match="needs 0 <= start <= end"):
            store.get_range("tb/events", start, end)


@pytest.mark.parametrize("backend", ["s3", "gs"])
def test_get_range_moves_only_its_bytes_over_the_network(request, backend):
    # Counted on the wire by the proxy in front of the emulator, not by the client.
    run = request.getfixturevalue(f"faulty_{backend}")
    store = open_store(run.uri)
    data = os.urandom(3 << 20)
    store.put_bytes("tb/events", data)
    run.proxy.answered.clear()
    assert store.get_range("tb/events", len(data) - 1000) == data[-1000:]
    assert store.get_range("tb/events", 4096, 8192) == data[4096:8192]
    assert store.get_range("tb/events", len(data) + 5) == b""
    read = sum(n for method, _path, n in run.proxy.answered if method == "GET")
    assert 1000 + 4096 <= read < 1000 + 4096 + 4096, run.proxy.answered


def test_list_exists_notfound(run_root, tmp_path):
    store = open_store(run_root.uri)
    for key in ["x/1", "x/2/3", "x2", "y"]:
        store.put_bytes(key, key.encode())
    assert store.list() == ["x/1", "x/2/3", "x2", "y"]
    assert store.list("x/") == ["x/1", "x/2/3"]
    assert store.list("x") == ["x/1", "x/2/3", "x2"]
    assert store.list("nothing/") == []
    assert store.exists("x/2/3") and not store.exists("x/2") and not store.exists("zz")
    assert store.stat("y")["y"].size == 1

    with pytest.raises(NotFound):
        store.get_bytes("missing")
    with pytest.raises(NotFound):
        store.get_file("missing", str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()

    store.delete_prefix("x/")
    assert store.list() == ["x2", "y"]
    with pytest.raises(ValueError, match="non-empty prefix"):
        store.delete_prefix("")


@pytest.mark.parametrize("run_root", ["s3", "gs"], indirect=True)
def test_store_root_is_isolated(run_root):
    """Keys of a run never leak into or out of its sibling run roots in the same bucket."""
    store = open_store(run_root.uri)
    sibling = open_store(run_root.uri + "-sibling")
    store.put_bytes("k", b"1")
    sibling.put_bytes("k", b"2")
    assert store.list() == ["k"] and sibling.list() == ["k"]
    assert store.get_bytes("k") == b"1"
    store.delete_prefix("k")
    assert sibling.get_bytes("k") == b"2"


def test_append_line(run_root):
    store = open_store(run_root.uri)
    store.append_line("events.jsonl", '{"event": "started"}')
    store.append_line("events.jsonl", '{"event": "resumed", "step": 3}')
    assert store.get_bytes("events.jsonl").decode().splitlines() == [
        '{"event": "started"}',
        '{"event": "resumed", "step": 3}',
    ]
    with pytest.raises(ValueError, match="one line"):
        store.append_line("events.jsonl", "a\nb")
    assert len(store.get_bytes("events.jsonl").decode().splitlines()) == 2
    # Several lines in one write, in order; a bad one refuses the whole batch.
    store.append_lines("events.jsonl", ['{"n": 3}', '{"n": 4}'])
    with pytest.raises(ValueError, match="one line"):
        store.append_lines("events.jsonl", ['{"n": 5}', "c\rd"])
    store.append_lines("events.jsonl", [])
    assert store.get_bytes("events.jsonl").decode().splitlines()[2:] == ['{"n": 3}', '{"n": 4}']


def test_upload_dir_changed_only(run_root, tmp_path):
    store = open_store(run_root.uri)
    local = tmp_path / "tb"
    _write(local / "train" / "events.1", b"a" * 10)
    _write(local / "train" / "events.2", b"b" * 10)
    _write(local / "saved_model.pb", b"model")
    assert store.upload_dir(str(local), "tensorboard") == 3
    assert store.list("tensorboard/") == [
        "tensorboard/saved_model.pb",
        "tensorboard/train/events.1",
        "tensorboard/train/events.2",
    ]
    assert store.upload_dir(str(local), "tensorboard") == 0

    # An event file grows: only it goes up again.
    with open(local / "train" / "events.2", "ab") as f:
        f.write(b"more")
    assert store.upload_dir(str(local), "tensorboard") == 1
    assert store.get_bytes("tensorboard/train/events.2") == b"b" * 10 + b"more"

    # A fresh process (fresh store) skips files whose stored copy has the same size and is
    # newer; files are aged so the check does not depend on sub-second timing.
    old = time.time() - 5
    for path in (local / "train" / "events.1", local / "train" / "events.2", local / "saved_model.pb"):
        os.utime(path, (old, old))
    assert open_store(run_root.uri).upload_dir(str(local), "tensorboard") == 0
    # Same size but changed after the upload: uploaded again.
    _write(local / "saved_model.pb", b"MODEL")
    assert open_store(run_root.uri).upload_dir(str(local), "tensorboard") == 1
    assert store.get_bytes("tensorboard/saved_model.pb") == b"MODEL"
    assert store.upload_dir(str(local), "tensorboard", changed_only=False) == 3


def test_download_many_skips_existing(run_root, tmp_path):
    store = open_store(run_root.uri)
    blobs = {f"data/part-{i}.tfrecord": os.urandom(1000 + i) for i in range(6)}
    for key, data in blobs.items():
        store.put_bytes(key, data)
    dest = tmp_path / "stage"
    plan = {key: str(dest / key.split("/")[-1]) for key in blobs}
    assert storage.download_many(store, plan, workers=4) == 6
    for key, path in plan.items():
        assert Path(path).read_bytes() == blobs[key]
    assert storage.download_many(store, plan, workers=4) == 0

    # A truncated file (wrong size) and a deleted one are fetched again; the rest stay.
    with open(plan["data/part-0.tfrecord"], "r+b") as f:
        f.truncate(10)
    os.unlink(plan["data/part-5.tfrecord"])
    assert storage.download_many(store, plan, workers=4) == 2
    assert Path(plan["data/part-0.tfrecord"]).read_bytes() == blobs["data/part-0.tfrecord"]
    assert storage.download_many(store, plan, skip_existing=False) == 6

    with pytest.raises(NotFound):
        storage.download_many(store, {"data/missing": str(dest / "missing")})


@pytest.mark.parametrize(
    "uri",
    ["file://", "ftp://x/y", "runs/x", "s3:///nobucket", "gs:///nobucket"],
)
def test_bad_uris_are_refused(uri):
    with pytest.raises(ValueError, match="run URI"):
        open_store(uri)


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a", "a\\b"])
def test_bad_keys_are_refused(tmp_path, key):
    store = open_store(f"file://{tmp_path}/r")
    with pytest.raises(ValueError, match="key"):
        store.put_bytes(key, b"x")
    assert not (tmp_path / "r").exists() or store.list() == []


def test_relative_file_uri_resolves_against_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = open_store("file://./runs/demo")
    assert store.uri == f"file://{tmp_path}/runs/demo"
    store.put_bytes("COMPLETE", b"{}")
    assert (tmp_path / "runs" / "demo" / "COMPLETE").read_bytes() == b"{}"


def test_file_writes_are_atomic(tmp_path, monkeypatch):
    """A write that dies mid-way leaves the old content and no visible temporary."""
    store = open_store(f"file://{tmp_path}/r")
    store.put_bytes("k", b"old")
    calls = []

    def broken_copy(src, dst):
        calls.append(src)
        with open(dst, "wb") as f:
            f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage.local.shutil, "copyfile", broken_copy)
    src = _write(tmp_path / "src", b"new content")
    with pytest.raises(OSError, match="No space"):
        store.put_file("k", src)
    assert calls == [src]  # not retried: a full disk is not transient
    assert store.get_bytes("k") == b"old"
    assert store.list() == ["k"]
    assert sorted(os.listdir(tmp_path / "r")) == ["k"]


def test_transient_errors_are_retried_and_reported(tmp_path, monkeypatch):
    store = open_store(f"file://{tmp_path}/r")
    seen = []
    store.on_retry = lambda op, key, attempt, err: seen.append((op, key, attempt, type(err).__name__))
    monkeypatch.setattr(storage.retry, "BACKOFF_INITIAL_S", 0.01)
    real = storage.FileStore._put_bytes
    failures = [ConnectionResetError("reset"), OSError(5, "I/O error")]

    def flaky(self, key, data):
        if failures:
            raise failures.pop(0)
        return real(self, key, data)

    monkeypatch.setattr(storage.FileStore, "_put_bytes", flaky)
    store.put_bytes("k", b"v")
    assert store.get_bytes("k") == b"v"
    assert seen == [("put", "k", 1, "ConnectionResetError"), ("put", "k", 2, "OSError")]


def test_is_transient_classification():
    import botocore.exceptions as bx
    from boto3.exceptions import S3UploadFailedError

    def client_error(status, code):
        return bx.ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")

    cases = {
        "503": (client_error(503, "SlowDown"), True),
        "500": (client_error(500, "InternalError"), True),
        "403": (client_error(403, "AccessDenied"), False),
        "404": (client_error(404, "NoSuchKey"), False),
        "closed": (bx.ConnectionClosedError(endpoint_url="http://x"), True),
        "reset": (ConnectionResetError(), True),
        "value": (ValueError("bad"), False),
    }
    try:
        raise S3UploadFailedError("gave up") from client_error(503, "SlowDown")
    except S3UploadFailedError as e:
        cases["wrapped"] = (e, True)
    results = {name: storage.is_transient(exc) for name, (exc, _) in cases.items()}
    assert results == {name: expected for name, (_, expected) in cases.items()}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["503", "drop"])
@pytest.mark.parametrize("backend", ["s3", "gs"])
def test_store_faults_are_retried(request, backend, mode):
    run = request.getfixturevalue(f"faulty_{backend}")
    store = open_store(run.uri)
    seen = []
    store.on_retry = lambda op, key, attempt, err: seen.append((op, key, attempt))
    run.proxy.fail_next(2, mode)
    store.put_bytes("k", b"payload")
    assert run.proxy.failed == 2
    assert store.get_bytes("k") == b"payload"
    # Every layer that retries reports it, except google-resumable-media's own retries.
    assert seen and {key for _, key, _ in seen} == {"k"}

    t0 = time.monotonic()
    run.proxy.fail_for(1.0, mode)
    assert store.list() == ["k"]
    assert time.monotonic() - t0 >= 0.9
    assert run.proxy.failed > 2
    assert run.proxy.requests > run.proxy.failed  # the successful calls went through the proxy


def test_s3_missing_key_under_prefix_scoped_listing_is_not_found(s3_run, tmp_path):
    """With ListBucket granted only under the run prefix (the machine role's policy), S3
    answers a HEAD/GET of a missing key with 403, not 404: the store must read that as
    absent (by listing under the key) and still raise on a real denial."""
    from botocore.awsrequest import AWSResponse

    store = open_store(s3_run.uri)
    store.put_bytes("present", b"1")
    denied = []

    class _Raw:
        def stream(self, **_):
            yield b""

    def forbid_missing(request, **_):
        name = request.url.split("?", 1)[0].rsplit("/", 1)[-1]
        if name in ("COMPLETE", "denied") and request.method in ("HEAD", "GET"):
            denied.append((request.method, name))
            body = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
            resp = AWSResponse(request.url, 403, {"content-type": "application/xml"}, _Raw())
            resp._content = body
            return resp
        return None

    store.client.meta.events.register("before-send.s3", forbid_missing)
    assert store.exists("COMPLETE") is False
    with pytest.raises(NotFound):
        store.get_bytes("COMPLETE")
    assert store.exists("present") is True
    # a key that does exist but is denied is a real error, not "absent"
    store.put_bytes("denied", b"x")
    with pytest.raises(Exception, match="AccessDenied|403|Forbidden"):
        store.get_bytes("denied")
    assert ("HEAD", "COMPLETE") in denied and ("GET", "COMPLETE") in denied and ("GET", "denied") in denied


@pytest.mark.parametrize(("uri", "expected"), [
    ("s3://b/runs/x/", ("b", "runs/x")),
    ("gs://b", ("b", "")),
    ("gs://b/a/b/c", ("b", "a/b/c")),
])
def test_bucket_uris_parse_the_same_for_both_clouds(uri, expected):
    from runfolder.storage.keys import split_bucket_uri

    scheme = uri.split("://")[0]
    assert split_bucket_uri(uri, scheme) == expected
    store_cls = {"s3": storage.S3Store, "gs": storage.GCSStore}[scheme]
    assert issubclass(store_cls, storage.ObjectStore) and store_cls.scheme == scheme


@pytest.mark.parametrize("uri", ["s3:///runs/x", "gs://", "gs:///x"])
def test_bucketless_uris_are_refused_with_the_expected_form(uri):
    with pytest.raises(ValueError, match=r"names no bucket; expected (s3|gs)://bucket/prefix"):
        open_store(uri)


def test_retry_jitter_leaves_the_global_random_state_alone(tmp_path, monkeypatch):
    """Keras seeds unseeded initializers from Python's global `random`: a retry on another
    thread must not draw from it, or a model built meanwhile gets other weights."""
    import random

    monkeypatch.setattr(storage.retry, "BACKOFF_INITIAL_S", 0.001)
    store = open_store(f"file://{tmp_path}/r")
    real = storage.FileStore._put_bytes
    failures = [ConnectionResetError("reset")] * 3

    def flaky(self, key, data):
        if failures:
            raise failures.pop()
        return real(self, key, data)

    monkeypatch.setattr(storage.FileStore, "_put_bytes", flaky)
    random.seed(5)
    before = random.getstate()
    store.put_bytes("k", b"v")
    assert not failures  # the three retries happened
    assert random.getstate() == before


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_append_is_not_doubled_when_the_answer_is_lost(request, backend, monkeypatch):
    """A write the store carried out but whose answer never came back is retried; the
    retried append must find its line already there rather than add it again (a doubled
    `started` line would count one attempt twice)."""
    run = request.getfixturevalue(f"{backend}_run")
    monkeypatch.setattr(storage.retry, "BACKOFF_INITIAL_S", 0.001)
    store = open_store(run.uri)
    store.append_line("events.jsonl", '{"n": 1}')
    cls = type(store)
    real = cls._append_line
    lost = []

    def carried_out_then_lost(self, key, text):
        real(self, key, text)
        if len(lost) < 2:
            lost.append(text)
            raise ConnectionResetError("connection reset before the answer")

    monkeypatch.setattr(cls, "_append_line", carried_out_then_lost)
    store.append_line("events.jsonl", '{"n": 2}')
    store.append_lines("events.jsonl", ['{"n": 3}', '{"n": 4}'])
    assert lost == ['{"n": 2}\n', '{"n": 3}\n{"n": 4}\n']
    assert store.get_bytes("events.jsonl").decode().splitlines() == ['{"n": 1}', '{"n": 2}', '{"n": 3}', '{"n": 4}']


def test_a_cancelled_upload_stops_mid_file_and_publishes_nothing(tmp_path, monkeypatch):
    import threading

    from runfolder.storage.keys import CancellableReader

    store = open_store(f"file://{tmp_path}/r")
    retries = []
    store.on_retry = lambda *a: retries.append(a)
    src = _write(tmp_path / "big.bin", os.urandom(8 * 1024 * 1024))
    cancel = threading.Event()
    reads = []
    real_read = CancellableReader.read

    def read(self, size=-1):
        reads.append(size)
        if len(reads) == 3:
            cancel.set()  # a synchronous commit takes over while this file is going up
        return real_read(self, size)

    monkeypatch.setattr(CancellableReader, "read", read)
    with pytest.raises(storage.Cancelled):
        store.put_file("ckpt/big.bin", src, cancel=cancel)
    assert len(reads) == 3  # stopped at the read after the cancel, 2 MiB into 8
    assert not store.exists("ckpt/big.bin") and not retries
    assert sorted(os.listdir(tmp_path / "r" / "ckpt")) == []  # no temporary left behind
    with pytest.raises(storage.Cancelled):
        store.put_file("ckpt/other.bin", src, cancel=cancel)  # already cancelled: not even started
    assert len(reads) == 3


@pytest.mark.slow
def test_large_gcs_uploads_go_as_parallel_parts_and_leave_none(gs_run, tmp_path, monkeypatch):
    import threading

    from runfolder.storage import gcs
    from runfolder.storage.keys import CancellableReader

    monkeypatch.setattr(gcs, "PARALLEL_THRESHOLD", 3 * 1024 * 1024)
    monkeypatch.setattr(gcs, "PART_MIN", 1024 * 1024)
    store = open_store(gs_run.uri)
    data = os.urandom(5 * 1024 * 1024 + 12345)
    src = _write(tmp_path / "big.bin", data)
    parts = []
    real_upload_part = gcs.GCSStore._upload_part

    def upload_part(self, name, key, f, offset, length, cancel, **kw):
        parts.append((name, offset, length, threading.current_thread().name))
        return real_upload_part(self, name, key, f, offset, length, cancel, **kw)

    monkeypatch.setattr(gcs.GCSStore, "_upload_part", upload_part)
    store.put_file("checkpoints/ckpt-1/big.bin", src)
    assert len(parts) == 6 and sum(length for _, _, length, _ in parts) == len(data)
    assert all(t.startswith("gcs-part") for *_, t in parts)
    store.get_file("checkpoints/ckpt-1/big.bin", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == data
    assert store.list("") == ["checkpoints/ckpt-1/big.bin"]  # the parts are gone

    # Cancelled part way: no object, no parts.
    cancel = threading.Event()
    real_read = CancellableReader.read

    def read(self, size=-1):
        cancel.set()
        return real_read(self, size)

    monkeypatch.setattr(CancellableReader, "read", read)
    with pytest.raises(storage.Cancelled):
        store.put_file("checkpoints/ckpt-2/big.bin", src, cancel=cancel)
    assert store.list("") == ["checkpoints/ckpt-1/big.bin"]


@pytest.mark.slow
def test_a_cancelled_s3_multipart_upload_is_aborted(s3_run, tmp_path, monkeypatch):
    import threading

    import boto3
    from s3transfer.utils import ReadFileChunk

    store = open_store(s3_run.uri)
    data = os.urandom(20 * 1024 * 1024 + 7)  # over the 8 MiB multipart threshold
    src = _write(tmp_path / "big.bin", data)
    cancel = threading.Event()
    store.put_file("a/whole.bin", src, cancel=cancel)  # not cancelled: goes up whole
    store.get_file("a/whole.bin", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == data

    reads = []
    real_read = ReadFileChunk.read

    def read(self, amount=None):
        # s3transfer reads each part's body from the file as the request sends it.
        reads.append(amount)
        if len(reads) == 2:
            cancel.set()
        return real_read(self, amount)

    monkeypatch.setattr(ReadFileChunk, "read", read)
    with pytest.raises(storage.Cancelled):
        store.put_file("a/cut.bin", src, cancel=cancel)
    assert store.list("a/") == ["a/whole.bin"]
    client = boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"])
    assert client.list_multipart_uploads(Bucket=s3_run.bucket).get("Uploads", []) == []  # aborted, not left to bill


def test_a_backend_missing_a_primitive_fails_when_constructed(tmp_path):
    # The primitives are abstract: a backend lacking one is refused at once, naming it.
    incomplete = type("Incomplete", (storage.Store,), {
        name: (lambda self, *a: None) for name in ("_put_bytes", "_get_bytes", "_put_file", "_get_versioned",
                                                  "_put_bytes_if", "_get_file", "_exists", "_delete_keys")})
    with pytest.raises(TypeError, match="_stat"):
        incomplete(f"file://{tmp_path}")
    assert set(storage.Store.__abstractmethods__) == {
        "_put_bytes", "_get_bytes", "_put_file", "_get_versioned", "_put_bytes_if", "_get_file", "_exists", "_stat",
        "_delete_keys"}
    for backend in (storage.FileStore, storage.S3Store, storage.GCSStore):
        assert not backend.__abstractmethods__, backend


@pytest.mark.parametrize(("stored", "expected"), [
    (None, None),  # absent
    (b'{"step": 3}', {"step": 3}),
    (b"{torn", {}),  # present but unreadable: counts as present, its fields read as missing
    (b"[1, 2]", {}),  # JSON, but not an object
    (b"\xff\xfe\x00", {}),  # not text
    (b"", {}),
])
def test_read_json_says_absent_or_corrupt_one_way(tmp_path, stored, expected):
    store = open_store(f"file://{tmp_path}/run")
    if stored is not None:
        store.put_bytes("COMPLETE", stored)
    assert storage.read_json(store, "COMPLETE") == expected


def test_read_json_raises_what_is_not_absence(tmp_path):
    store = open_store(f"file://{tmp_path}/run")
    with pytest.raises(ValueError, match="must not contain"):
        storage.read_json(store, "../COMPLETE")  # a bad key is the caller's error, not an absent object
