"""Property tests of run URIs and store keys: they round-trip, and no key leaves the run's folder.

The machine's role may write only under `runs/<id>/` (components/aws/identity.py grants
`runs/<id>/*`), so a key that named an object outside it would fail on a real machine (or,
on a bucket with a looser role, overwrite another run). Every key either is refused by
`check_key` or becomes an object name under the run's root, on object stores and on local
files alike; URIs and checkpoint keys parse back to what formatted them.
"""

from __future__ import annotations

import os
import posixpath
import re
import tempfile

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from runfolder import layout
from runfolder.storage import FileStore, check_key
from runfolder.storage.base import ObjectStore
from runfolder.storage.keys import split_bucket_uri
from trainer.checkpoint_store import CheckpointStore

# What access.run.id accepts (components/settings/schema.py) and a bucket name both clouds take.
RUN_IDS = st.from_regex(r"[a-z0-9][a-z0-9-]{0,62}", fullmatch=True)
BUCKETS = st.from_regex(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]", fullmatch=True)
SEGMENT = st.text(st.characters(codec="utf-8", exclude_characters="/\\\x00"), min_size=1, max_size=12)
# Keys as anything might spell them: separators, dots, backslashes and NULs mixed in freely.
ANY_KEY = st.lists(st.sampled_from(["a", "b", ".", "..", "/", "\\", "\x00", "ckpt-1", "é", " "]), max_size=12).map(
    "".join) | st.text(max_size=30)
CLEAN_KEY = st.lists(SEGMENT.filter(lambda s: s not in (".", "..")), min_size=1, max_size=5).map("/".join)


class Names(ObjectStore):
    """An object store's naming alone (no client): how keys become object names under the root."""

    scheme = "s3"

    def _never(self, *args, **kwargs):
        raise AssertionError("naming only: no call reaches a store here")

    _delete_keys = _exists = _get_bytes = _get_file = _get_versioned = _never
    _put_bytes = _put_bytes_if = _put_file = _stat = _never


@given(st.sampled_from(["s3", "gs"]), BUCKETS, RUN_IDS)
def test_a_run_uri_parses_back_to_its_bucket_and_run_folder(scheme, bucket, run_id):
    uri = f"{scheme}://{bucket}/{layout.run_prefix(run_id).rstrip('/')}"
    assert split_bucket_uri(uri, scheme) == (bucket, f"runs/{run_id}")
    # A trailing slash or a doubled one at the end names the same folder.
    assert split_bucket_uri(uri + "/", scheme) == (bucket, f"runs/{run_id}")
    assert f"{scheme}://{bucket}/{split_bucket_uri(uri, scheme)[1]}" == uri


@given(BUCKETS, RUN_IDS, ANY_KEY)
@example("b0", "run", "../other/x")
@example("b0", "run", "a/../../x")
@example("b0", "run", "/etc/passwd")
@example("b0", "run", "a\\..\\..\\x")
@example("b0", "run", "a//b")
def test_no_key_names_an_object_outside_the_run_folder(bucket, run_id, key):
    store = Names(f"s3://{bucket}/runs/{run_id}")
    try:
        check_key(key)
    except ValueError:
        # Refused before any request: every public Store method calls check_key first.
        with pytest.raises(ValueError):
            store.exists(key)
        return
    name = store._name(key)
    assert name.startswith(f"runs/{run_id}/"), name
    # Resolved as a path (what a file store or a proxy might do), it is still inside, and not a
    # sibling run whose id merely starts the same (runs/<id>0/).
    assert posixpath.normpath(name).startswith(f"runs/{run_id}/"), name
    assert store._key(name) == key


@given(CLEAN_KEY)
def test_a_clean_key_is_a_file_inside_a_local_run_folder(key):
    check_key(key)
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStore(f"file://{tmp}/runs/r")
        path = os.path.realpath(store._path(key))
        assert path.startswith(os.path.realpath(store.root) + os.sep), (key, path)
        store.put_bytes(key, b"x")
        assert store.list("") == [key] and store.get_bytes(key) == b"x"


@given(st.integers(0, 10**12), st.sampled_from(["COMMITTED", "ckpt.index", "sub/ckpt.data-00000-of-00001"]))
def test_a_checkpoint_key_parses_back_to_its_step(step, name):
    key = f"{layout.checkpoint_dir(step)}/{name}"
    assert check_key(key) == key and layout.is_checkpoint_key(key)
    assert re.fullmatch(rf"checkpoints/ckpt-{step}/.+", key)
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStore(f"file://{tmp}/runs/r")
        store.put_bytes(key, b"{}")
        # Only the marker makes a step count; the scan reads the step back from the key.
        assert CheckpointStore(store).committed_steps() == ([step] if name == layout.COMMITTED else [])
