"""runfolder/storage/keys.py at its edges: the key checks' messages, file:// roots, local walks, and
the cancellable reader the cloud clients read uploads through."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import pytest

from runfolder.storage.errors import Cancelled
from runfolder.storage.keys import TMP_MARK, CancellableReader, check_key, file_root, split_bucket_uri, walk_files


@pytest.mark.parametrize(("key", "message"), [
    (b"bytes", "store key must be a string, got bytes"),
    ("", "store key must not be empty"),
    ("/abs", "store key '/abs' must be relative"),
    ("a\\b", "without backslashes"),
    ("a\x00b", "without backslashes"),
    ("a/../b", "must not contain '.', '..' or empty path segments"),
    ("./a", "must not contain"),
    ("a//b", "must not contain"),
    ("a/.", "must not contain"),
])
def test_a_bad_key_is_refused_saying_why(key, message):
    with pytest.raises(ValueError) as e:
        check_key(key)
    assert str(e.value).startswith("store key") and message in str(e.value)


@pytest.mark.parametrize("key", ["a", "a/b", "a/b/", "runs/r/checkpoints/ckpt-1/x.index", "a..b/c.d"])
def test_a_clean_key_is_returned_as_it_is(key):
    assert check_key(key) == key


def test_an_empty_key_is_allowed_only_when_asked_for():
    assert check_key("", allow_empty=True) == ""
    with pytest.raises(ValueError, match="must be relative"):
        check_key("/", allow_empty=True)


@pytest.mark.parametrize(("uri", "scheme", "expected"), [
    ("s3://b/runs/x", "s3", ("b", "runs/x")),
    ("S3://b/runs/x/", "s3", ("b", "runs/x")),
    ("gs://b", "gs", ("b", "")),
    ("s3://b/X/", "s3", ("b", "X")),
])
def test_split_bucket_uri(uri, scheme, expected):
    assert split_bucket_uri(uri, scheme) == expected


@pytest.mark.parametrize(("uri", "scheme"), [("s3:///runs/x", "s3"), ("gs://b/x", "s3"), ("b/x", "s3")])
def test_split_bucket_uri_refuses_a_uri_without_its_bucket(uri, scheme):
    with pytest.raises(ValueError, match=f"expected {scheme}://bucket/prefix"):
        split_bucket_uri(uri, scheme)


def test_file_roots(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert file_root("file:///abs/run") == "/abs/run"
    assert file_root("file://localhost/abs/run") == "/abs/run"
    assert file_root("file://./rel/run") == str(tmp_path / "rel" / "run")
    assert file_root("file://rel") == str(tmp_path / "rel")
    with pytest.raises(ValueError, match="names no directory; use file:///abs/path"):
        file_root("file://")


def test_walk_files_lists_every_file_sorted_without_temporaries(tmp_path):
    for rel in ["b/2", "a/z/1", "a/0", f"a/{TMP_MARK}x", "c"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    found = walk_files(str(tmp_path))
    assert [r for r, _ in found] == ["a/0", "a/z/1", "b/2", "c"]
    assert all(Path(p).read_text() == r for r, p in found)
    assert walk_files(str(tmp_path / "missing")) == []


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "data"
    path.write_bytes(bytes(range(100)))
    with open(path, "rb") as f:
        yield f


def test_the_reader_is_a_window_of_the_file(data_file):
    r = CancellableReader(data_file, None, offset=10, length=20)
    assert (len(r), r.readable(), r.seekable(), r.tell()) == (20, True, True, 0)
    assert r.read(5) == bytes(range(10, 15)) and r.tell() == 5
    assert r.read() == bytes(range(15, 30)) and r.tell() == 20
    assert r.read() == b"" and r.read(3) == b""
    assert r.seek(0) == 0 and r.read(0) == b"" and r.tell() == 0
    assert r.seek(2) == 2 and r.read(None) == bytes(range(12, 30))


def test_the_reader_seeks_from_each_end_and_stays_inside_its_window(data_file):
    r = CancellableReader(data_file, None, offset=10, length=20)
    assert r.seek(-4, io.SEEK_END) == 16 and r.read(2) == bytes([26, 27])
    assert r.seek(-1, io.SEEK_CUR) == 17 and r.read(1) == bytes([27])
    assert r.seek(100) == 20 and r.read() == b""
    assert r.seek(-100, io.SEEK_CUR) == 0 and r.read(1) == bytes([10])


def test_the_reader_reads_to_the_files_end_by_default(data_file):
    r = CancellableReader(data_file, None, offset=90)
    assert len(r) == 10
    buf = bytearray(4)
    assert r.readinto(buf) == 4 and bytes(buf) == bytes(range(90, 94))
    buf = bytearray(10)
    assert r.readinto(buf) == 6 and bytes(buf[:6]) == bytes(range(94, 100))
    whole = CancellableReader(data_file, None)
    assert len(whole) == 100 and whole.read() == bytes(range(100))


def test_the_reader_stops_once_cancelled(data_file):
    cancel = threading.Event()
    r = CancellableReader(data_file, cancel)
    assert r.read(10) == bytes(range(10))
    cancel.set()
    with pytest.raises(Cancelled, match="^transfer cancelled$"):
        r.read(10)
    with pytest.raises(Cancelled):
        r.readinto(bytearray(4))
    assert os.path.getsize(data_file.name) == 100
