"""`ops runs` dates each run by its newest object, wherever that object falls in the listing.

A run's files change at different times (checkpoints long ago, progress a minute ago), and a
store lists them by name, not by time. Here every file of a run has a time of its own, and the
newest is neither the first nor the last key of its run, so only the newest of them all gives
the age and the order the operator expects.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ops import runs
from runfolder.storage import open_store
from runfolder.storage.keys import file_root

FILES = ["checkpoints/ckpt-10/COMMITTED", "events.jsonl", "progress.json", "tensorboard/events.out"]


def _run(bucket: str, run_id: str, ages: dict[str, float], now: float) -> None:
    """A run folder whose files were last written `ages[name]` seconds before `now`."""
    store = open_store(f"{bucket}/runs/{run_id}")
    for name in FILES:
        store.put_bytes(name, b"{}" if name.endswith(".json") else b"")
    root = Path(file_root(f"{bucket}/runs/{run_id}"))
    for name, age in ages.items():
        os.utime(root / name, (now - age, now - age))


@pytest.mark.parametrize("newest_of_recent", FILES[1:3])
def test_a_runs_age_and_order_come_from_its_newest_file(tmp_path, newest_of_recent):
    bucket, now = f"file://{tmp_path}/bucket", time.time()
    # "recent": one file a minute old between files hours old; "steady": every file 20-40 min old.
    recent = {name: 3600.0 * (i + 2) for i, name in enumerate(FILES)}
    recent[newest_of_recent] = 60.0
    _run(bucket, "recent", recent, now)
    _run(bucket, "steady", {name: 1200.0 + 300 * i for i, name in enumerate(FILES)}, now)
    _run(bucket, "old", {name: 86400.0 - 100 * i for i, name in enumerate(FILES)}, now)

    listed = runs.list_runs(bucket, now=now)

    assert [r["id"] for r in listed] == ["recent", "steady", "old"]
    ages = {r["id"]: r["age_seconds"] for r in listed}
    assert ages == pytest.approx({"recent": 60.0, "steady": 1200.0, "old": 86400.0 - 300}, abs=1.0)


def test_a_run_written_in_the_future_by_a_fast_clock_is_age_zero(tmp_path):
    bucket, now = f"file://{tmp_path}/bucket", time.time()
    _run(bucket, "ahead", {name: -30.0 for name in FILES}, now)
    _run(bucket, "behind", {name: 10.0 for name in FILES}, now)
    listed = runs.list_runs(bucket, now=now)
    assert [(r["id"], r["age_seconds"]) for r in listed] == [("ahead", 0.0), ("behind", 10.0)]


def test_the_listing_skips_stray_files_rounds_ages_and_names_each_run_under_its_bucket(tmp_path):
    bucket, now = f"file://{tmp_path}/bucket", time.time()
    store = open_store(bucket)
    store.put_bytes("runs/0-notes.txt", b"a file beside the runs, listed before them")
    _run(bucket, "a", {name: 12.345 for name in FILES}, now)
    _run(bucket, "b", {name: 99.96 for name in FILES}, now)

    listed = runs.list_runs(bucket + "/", now=now)

    assert [(r["id"], r["age_seconds"]) for r in listed] == [("a", 12.3), ("b", 100.0)]
    assert [r["uri"] for r in listed] == [f"{bucket}/runs/a", f"{bucket}/runs/b"]


@pytest.mark.parametrize(("uri", "bucket"), [
    ("s3://b/runs/r1", "s3://b"), ("gs://b/runs/r1/", "gs://b"),
    ("file:///data/runs/old/runs/r1", "file:///data/runs/old"),  # the last /runs/ is the run's
])
def test_a_run_uri_names_its_bucket(uri, bucket):
    assert runs.bucket_uri_of(uri) == bucket


@pytest.mark.parametrize("uri", ["s3://b/runs/", "s3://b/r1", "s3://b/runsr1"])
def test_a_uri_that_is_no_run_is_refused_with_what_to_pass(uri):
    with pytest.raises(runs.OpsError, match=r"is not of the form <bucket>/runs/<id>; pass --bucket-uri"):
        runs.bucket_uri_of(uri)


# -- stop -------------------------------------------------------------------------------


def _running(tmp_path) -> tuple[str, object]:
    from tests.ops.test_status import build

    uri = f"file://{tmp_path}/bucket/runs/r"
    store = open_store(uri)
    build("running", store, tmp_path / "ckpt")
    return uri, store


def test_stop_writes_one_request_with_when_who_why_and_the_state_then_keeps_it(tmp_path, monkeypatch):
    import getpass
    import json
    import socket

    from runfolder import layout

    uri, store = _running(tmp_path)
    monkeypatch.setattr(getpass, "getuser", lambda: "ana")
    monkeypatch.setattr(socket, "gethostname", lambda: "laptop")

    doc = runs.request_stop(uri, now=1_790_000_000.25)

    assert doc == {"requested": "2026-09-21T14:13:20.250+00:00", "by": "ana@laptop",
                   "reason": "asked to stop with ops stop", "state": "RUNNING"}
    assert json.loads(store.get_bytes(layout.STOP_KEY)) == doc
    again = runs.request_stop(uri, reason="a second time", store=store)
    assert again == {"already": True, **doc}
    store.put_bytes(layout.STOP_KEY, b"[1, 2]")
    assert runs.request_stop(uri) == {"already": True}
    store.put_bytes(layout.STOP_KEY, b"{torn")
    assert runs.request_stop(uri) == {"already": True}


def test_stop_names_the_state_of_a_run_that_has_ended(tmp_path):
    from tests.ops.test_status import write_complete_doc

    uri, store = _running(tmp_path)
    write_complete_doc(store, 130)
    with pytest.raises(runs.OpsError) as e:
        runs.request_stop(uri)
    assert str(e.value).startswith("the run has already ended: COMPLETE")
    assert "None" not in str(e.value) and "XX" not in str(e.value)


def test_each_runs_folder_is_listed_on_its_own_and_one_emptied_meanwhile_is_left_out(tmp_path):
    bucket, now = f"file://{tmp_path}/bucket", time.time()
    _run(bucket, "a", {name: 10.0 for name in FILES}, now)
    _run(bucket, "b", {name: 20.0 for name in FILES}, now)

    class Emptied:
        """The bucket's store, whose listing of folders still names a run deleted since."""

        def __init__(self, store) -> None:
            self.store, self.uri = store, store.uri

        def folders(self, prefix: str) -> list[str]:
            return [*self.store.folders(prefix), prefix + "gone/"]

        def stat(self, prefix: str = "") -> dict:
            return self.store.stat(prefix)

    listed = runs.run_listings(Emptied(open_store(bucket)))

    assert sorted(listed) == ["a", "b"]
    assert sorted(listed["a"]) == sorted(FILES)
    assert runs.changed_at(listed["b"]) == pytest.approx(now - 20.0, abs=0.01)


# -- a run read through its listing ------------------------------------------------------


class _Counting:
    """A run folder's view that counts what is fetched."""

    def __init__(self, uri: str, data: dict[str, bytes]) -> None:
        self.uri, self.data, self.fetched = uri, data, []

    def get_bytes(self, key: str) -> bytes:
        self.fetched.append(key)
        return self.data[key]


def _info(size: int, second: int):
    from datetime import UTC, datetime

    from runfolder.storage.base import ObjectInfo

    return ObjectInfo(size, datetime(2026, 12, 4, 10, 0, second, tzinfo=UTC))


def test_an_unchanged_object_is_fetched_once_between_refreshes():
    view = _Counting("s3://b/runs/r", {"progress.json": b"{}", "events.jsonl": b"e"})
    objects: dict = {}
    keys = {"progress.json": _info(2, 1), "events.jsonl": _info(1, 1)}
    first = runs.Listed(view, keys, objects)
    assert (first.get_bytes("progress.json"), first.get_bytes("events.jsonl")) == (b"{}", b"e")
    assert sorted(objects) == ["s3://b/runs/r/events.jsonl", "s3://b/runs/r/progress.json"]
    # The next refresh: progress.json rewritten (a new time), events.jsonl as it was.
    view.data["progress.json"] = b'{"step": 1}'
    again = runs.Listed(view, {"progress.json": _info(11, 2), "events.jsonl": _info(1, 1)}, objects)
    assert (again.get_bytes("progress.json"), again.get_bytes("events.jsonl")) == (b'{"step": 1}', b"e")
    assert view.fetched == ["progress.json", "events.jsonl", "progress.json"]
    # Without a cache every read fetches.
    plain = runs.Listed(view, keys)
    plain.get_bytes("events.jsonl")
    plain.get_bytes("events.jsonl")
    assert view.fetched[3:] == ["events.jsonl", "events.jsonl"]


def test_an_object_over_the_cache_limit_is_fetched_each_time():
    view = _Counting("s3://b/runs/r", {"at": b"a", "over": b"o"})
    objects: dict = {}
    listed = runs.Listed(view, {"at": _info(runs.CACHED_BYTES, 1), "over": _info(runs.CACHED_BYTES + 1, 1)}, objects)
    for _ in range(2):
        listed.get_bytes("at")
        listed.get_bytes("over")
    assert view.fetched == ["at", "over", "over"]
    assert list(objects) == ["s3://b/runs/r/at"]


def test_a_key_the_listing_lacks_is_not_asked_for():
    from runfolder.storage import NotFound

    view = _Counting("s3://b/runs/r", {"late": b"written after the listing"})
    listed = runs.Listed(view, {"COMPLETE": _info(3, 1)}, {})
    with pytest.raises(NotFound, match="^late$"):
        listed.get_bytes("late")
    assert view.fetched == [] and listed.exists("COMPLETE") and not listed.exists("late")
    assert listed.list("") == ["COMPLETE"] and listed.stat("C") == {"COMPLETE": _info(3, 1)} and listed.stat("x") == {}


def test_a_run_in_a_bucket_whose_names_end_in_x_keeps_its_whole_uri(tmp_path):
    bucket, now = f"file://{tmp_path}/bucketX", time.time()
    _run(bucket, "runX", {name: 5.0 for name in FILES}, now)
    [listed] = runs.list_runs(bucket, now=now)
    assert (listed["id"], listed["uri"]) == ("runX", f"{bucket}/runs/runX")
    assert runs.bucket_uri_of(f"{bucket}/runs/X") == bucket


class _Recording:
    """The bucket's store, recording each object fetched through it."""

    def __init__(self, store) -> None:
        self.store, self.uri, self.fetched = store, store.uri, []

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    def get_bytes(self, key: str) -> bytes:
        self.fetched.append(key)
        return self.store.get_bytes(key)


def test_the_listing_reads_every_run_through_the_buckets_one_client_and_no_checkpoint_marker(tmp_path, monkeypatch):
    from runfolder import storage
    from tests.ops.test_status import build

    bucket = f"file://{tmp_path}/bucket"
    build("resumed", open_store(f"{bucket}/runs/r"), tmp_path / "build")
    opened = []
    real = storage.open_store
    monkeypatch.setattr(storage, "open_store", lambda uri: opened.append(_Recording(real(uri))) or opened[-1])

    [run] = runs.list_runs(bucket)

    assert (run["state"], run["step"]) == ("RUNNING", 400)
    assert [s.uri for s in opened] == [bucket]  # one client for the bucket, none per run
    fetched = opened[0].fetched
    assert "runs/r/progress.json" in fetched and "runs/r/events.jsonl" in fetched
    assert not [k for k in fetched if k.endswith("/COMMITTED")]  # a listing shows no checkpoint's time


def test_the_listing_judges_each_run_at_the_time_it_is_given(tmp_path):
    from tests.ops.test_status import build

    bucket = f"file://{tmp_path}/bucket"
    build("running", open_store(f"{bucket}/runs/r"), tmp_path / "build")
    [now] = runs.list_runs(bucket)
    [later] = runs.list_runs(bucket, now=time.time() + 6 * 3600)
    assert (now["state"], later["state"]) == ("RUNNING", "STOPPED")  # a local run six hours silent
    assert later["age_seconds"] >= 6 * 3600 - 60


def test_sixteen_runs_are_read_at_once(tmp_path):
    import threading

    bucket = f"file://{tmp_path}/bucket"
    for i in range(runs.READERS):
        open_store(f"{bucket}/runs/r{i:02d}").put_bytes("progress.json", b"{}")
    together = threading.Barrier(runs.READERS, timeout=20)

    def read(run_id, _view, _keys, _changed):
        together.wait()  # every reader in flight before any returns
        return run_id

    assert sorted(runs.read_runs(open_store(bucket), read)) == [f"r{i:02d}" for i in range(runs.READERS)]
    assert runs.READERS == 16


def test_sixteen_run_folders_are_listed_at_once(tmp_path):
    import threading

    bucket = f"file://{tmp_path}/bucket"
    for i in range(runs.READERS):
        open_store(f"{bucket}/runs/r{i:02d}").put_bytes("progress.json", b"{}")
    together = threading.Barrier(runs.READERS, timeout=20)

    class Slow:
        """The bucket's store, whose listing of a run's folder waits until every one is asked for."""

        def __init__(self, store) -> None:
            self.store, self.uri = store, store.uri

        def folders(self, prefix: str) -> list[str]:
            return self.store.folders(prefix)

        def stat(self, prefix: str = "") -> dict:
            together.wait()
            return self.store.stat(prefix)

    assert sorted(runs.run_listings(Slow(open_store(bucket)))) == [f"r{i:02d}" for i in range(runs.READERS)]


def test_a_runs_folder_answers_as_a_store_of_its_own(tmp_path):
    bucket = f"file://{tmp_path}/bucket"
    store = open_store(bucket)
    store.put_bytes("runs/r/progress.json", b"{}")
    store.put_bytes("runs/r/checkpoints/ckpt-1/COMMITTED", b"{}")
    store.put_bytes("runs/other/progress.json", b"[]")
    view = runs.run_view(store, "r")
    assert view.uri == f"{bucket}/runs/r"
    assert view.list() == ["checkpoints/ckpt-1/COMMITTED", "progress.json"] == sorted(view.stat())
    assert view.list("checkpoints/") == ["checkpoints/ckpt-1/COMMITTED"]
    assert view.exists("progress.json") and not view.exists("events.jsonl") and view.get_bytes("progress.json") == b"{}"
    listed = runs.Listed(view, view.stat())
    assert listed.list() == view.list() and sorted(listed.stat()) == view.list()
