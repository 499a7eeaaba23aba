"""A --data-uri data set downloaded while the stream runs: the same batches, the first before the last file, the index."""

from __future__ import annotations

import json
import os
import shutil
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from runfolder import layout
from trainer import data, staging
from trainer.staging import Staging, StagingError

SEQ = 8
PARSE = data.make_lm_parser(SEQ)
BATCH = 256
GATE_WAIT_S = 60  # a gate the test forgot to open fails the download instead of hanging


def _write_records(folder, n_files, per_file, seed=0):
    """`transformer-lm` records of SEQ + 1 tokens (small, so a test holds more than a shuffle window)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for f in range(n_files):
        with tf.io.TFRecordWriter(str(folder / f"part-{f:02d}.tfrecord")) as w:
            for _ in range(per_file):
                feat = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=rng.integers(0, 32, SEQ + 1)))}
                w.write(tf.train.Example(features=tf.train.Features(feature=feat)).SerializeToString())
    (folder / "README.txt").write_text("not a record file")


class Gates:
    """Stands in front of a staging's store: each file's download waits until the test opens its gate."""

    def __init__(self, st: Staging, fail: set[str] = frozenset()):
        self.real, self.fail = st.store, fail
        self.open = {k: threading.Event() for k in st.keys}
        self.asked: list[str] = []
        self._asked = threading.Condition()
        st.store = self

    def wait_asked(self, n: int) -> list[str]:
        """The first `n` keys asked for, once `n` downloads have started."""
        with self._asked:
            assert self._asked.wait_for(lambda: len(self.asked) >= n, GATE_WAIT_S), self.asked
            return self.asked[:n]

    def get_file(self, key, path):
        with self._asked:
            self.asked.append(key)
            self._asked.notify_all()
        if key in self.fail:
            raise PermissionError(f"AccessDenied for {key}")
        if not self.open[key].wait(GATE_WAIT_S):
            raise TimeoutError(f"the test never opened {key}")
        self.real.get_file(key, path)


def _batches(ds, n):
    return [(x.numpy(), y.numpy()) for x, y in ds.take(n)]


def _same(a, b):
    assert len(a) == len(b) and a
    for (x1, y1), (x2, y2) in zip(a, b, strict=True):
        assert np.array_equal(x1, x2) and np.array_equal(y1, y2)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """16 files of 2000 records (a shuffle window reads 1250 of each of the first 8), and the staged reference stream's first batches.

    Written and read once for the module (about 1 s of CPU a test): each test stages its own copy.
    """
    root = tmp_path_factory.mktemp("staging-source")
    _write_records(root / "data", 16, 2000)
    files = data.stage(f"file://{root}/data", str(root / "reference"))
    batches_per_epoch = 32_000 // BATCH
    reference = _batches(data.from_tfrecords(files, PARSE, BATCH, seed=3, position=data.Position(0)),
                         batches_per_epoch + 10)
    for batch in reference:
        for array in batch:
            array.setflags(write=False)  # shared by the module's tests: none may change it for the next
    return SimpleNamespace(src=root / "data", reference=reference, per_epoch=batches_per_epoch)


@pytest.fixture
def dataset(source, tmp_path):
    """The module's records in this test's own bucket folder (a test may add, rename or damage files)."""
    src = tmp_path / "bucket" / "data"
    shutil.copytree(source.src, src)
    return SimpleNamespace(uri=f"file://{src}", src=src, run_uri=f"file://{tmp_path}/runs/r", tmp=tmp_path,
                           reference=source.reference, per_epoch=source.per_epoch)


def _staging(ds, name, **kw):
    kw.setdefault("wait_s", 60)
    return Staging(ds.uri, str(ds.tmp / name), run_uri=ds.run_uri, **kw)


def test_the_stream_starts_before_the_last_file_and_yields_the_staged_batches(dataset):
    st = _staging(dataset, "stream")
    gates = Gates(st)
    order = data.file_order(16, 3, 0)
    st.start(order)
    stream = iter(data.from_tfrecords(st.files, PARSE, BATCH, seed=3, position=data.Position(0), ready=st.ready))
    first: list = []
    got = threading.Event()

    def take_first():
        first.append(next(stream))
        got.set()

    threading.Thread(target=take_first, daemon=True).start()
    # Downloads go in the epoch's order: its first 8 files are the 8 downloads under way.
    assert sorted(gates.wait_asked(8)) == sorted(st.keys[i] for i in order[:8])
    # The first shuffle window (10,000 records) reads the epoch's first 8 files (the interleave's cycle): only those.
    for i in order[:8]:
        gates.open[st.keys[i]].set()
    assert got.wait(GATE_WAIT_S), "no first batch with the epoch's first 8 files on disk"
    on_disk = st.on_disk()
    assert on_disk["files"] == 8 and on_disk["files_total"] == 16 and on_disk["bytes"] < on_disk["bytes_total"]
    assert [i for i, p in enumerate(st.files) if os.path.exists(p)] == sorted(order[:8])
    for g in gates.open.values():
        g.set()
    rest = [next(stream) for _ in range(len(dataset.reference) - 1)]
    _same([(x.numpy(), y.numpy()) for x, y in first + rest], dataset.reference)
    assert st.complete and st.records() == 32_000


def _spec_cfg(ds, name, **cfg):
    spec = SimpleNamespace(make_dataset=None, parse_tfrecord=PARSE)
    values = {"synthetic": False, "data_uri": ds.uri, "data_dir": str(ds.tmp / name), "run_uri": ds.run_uri,
              "data_wait_s": 60.0, "seed": 3, **cfg}
    return spec, SimpleNamespace(**values)


def _index(ds):
    return sorted(p for p in (ds.tmp / "cache" / "data").glob("*.json") if not p.name.startswith("."))


def test_a_resumed_stream_is_placed_by_the_index_or_by_counting_every_file(dataset):
    k = dataset.per_epoch + 3  # in the second epoch: its own file order
    # No index yet: the resume waits for every file and counts them, then writes the index.
    spec, cfg = _spec_cfg(dataset, "first")
    events = []
    ds, st = data.make_stream(spec, cfg, BATCH, data.Position(k), emit=lambda e, **f: events.append((e, f)))
    assert st.complete
    _same(_batches(ds, 7), dataset.reference[k:k + 7])
    (index,) = _index(dataset)
    assert index.name == layout.data_index_key(index.stem).rsplit("/", 1)[1]
    assert st.index_state == "written" and st.counted_here == 16
    staged = [f for e, f in events if e == layout.DATA_STAGED]
    assert staged == [{**staged[0], "files": 16, "downloaded": 16, "records": 32_000, "counted": 16,
                       "index": "written"}]
    # A later machine: the index places it at once; downloads start with that epoch's files.
    spec, cfg = _spec_cfg(dataset, "later")
    st2 = Staging(cfg.data_uri, cfg.data_dir, run_uri=cfg.run_uri, wait_s=60)
    assert st2.records() == 32_000 and st2.index_state == "used"
    ds, st = data.make_stream(spec, cfg, BATCH, data.Position(k))
    _same(_batches(ds, 7), dataset.reference[k:k + 7])
    order = data.file_order(16, 3, 1)
    assert order != data.file_order(16, 3, 0)
    assert st.index_state == "used" and st.counted_here == 0
    st.wait_all()
    assert st.counted_here == 0
    # The same machine again (a reboot): every file on disk, nothing downloaded, nothing waited for in the stream.
    ds, st = data.make_stream(spec, cfg, BATCH, data.Position(k))
    assert st.complete and st.downloaded == 0
    _same(_batches(ds, 7), dataset.reference[k:k + 7])


def test_an_index_that_does_not_match_is_counted_again_and_a_new_data_set_gets_its_own(dataset):
    first = _staging(dataset, "a").start(list(range(16)))
    first.wait_all()
    (index,) = _index(dataset)
    doc = json.loads(index.read_text())
    assert [(f["name"], f["records"]) for f in doc["files"]] == [(f"part-{i:02d}.tfrecord", 2000) for i in range(16)]
    bad = {**doc, "files": [{**f, "records": 5} if i == 3 else f for i, f in enumerate(doc["files"])]}
    for tampered, why in (({**doc, "files": doc["files"][1:]}, "not in it"),
                          ({**doc, "files": [{**doc["files"][0], "size": 1}, *doc["files"][1:]]}, "in the listing"),
                          ({**doc, "version": 99}, "not a version-1 index")):
        index.write_text(json.dumps(tampered))
        st = _staging(dataset, "b")
        assert st.index_state.startswith("ignored") and why in st.index_state and st.records() is None
        st.start(list(range(16))).wait_all()
        # Counted again, never trusted, and written over the version it read.
        assert st.records() == 32_000 and st.counted_here == 16 and st.index_state == "written"
        assert json.loads(index.read_text()) == doc
    # Counts that fit the listing's names and sizes are used as they are (the digest names the listing).
    index.write_text(json.dumps(bad))
    assert _staging(dataset, "c").records() == 30_005
    # Another file: another listing, another index; the first one is left alone.
    _write_records(dataset.src, 1, 10, seed=9)
    (dataset.src / "part-00.tfrecord").rename(dataset.src / "part-99.tfrecord")
    st = _staging(dataset, "d")
    assert st.index_state == "absent" and len(st.keys) == 16
    st.start(list(range(16))).wait_all()
    assert st.records() == 30_010 and len(_index(dataset)) == 2 and json.loads(index.read_text()) == bad


def test_two_machines_counting_at_once_write_the_index_once(dataset):
    a, b = _staging(dataset, "a"), _staging(dataset, "b")
    assert a.index_state == b.index_state == "absent"
    a.start(list(range(16))).wait_all()
    b.start(list(range(16))).wait_all()
    assert (a.index_state, b.index_state) == ("written", "written by another machine")
    (index,) = _index(dataset)
    assert staging.check_index(json.loads(index.read_text()), a.sizes)[0] == a.counts


def test_a_failed_download_fails_the_stream_with_the_files_name(dataset):
    st = _staging(dataset, "x")
    gates = Gates(st, fail={"part-05.tfrecord"})
    for g in gates.open.values():
        g.set()
    st.start(list(range(16)))
    with pytest.raises(StagingError, match=r"part-05\.tfrecord could not be staged: PermissionError: AccessDenied"):
        st.wait_all()
    with pytest.raises(StagingError, match="part-05"):
        st.check()
    # The stream's own wait says the same, whichever file it waited for.
    stream = data.from_tfrecords(st.files, PARSE, BATCH, seed=3, position=data.Position(0), ready=st.ready)
    with pytest.raises(tf.errors.OpError, match=r"part-05\.tfrecord could not be staged"):
        next(iter(stream))


def test_a_file_not_on_disk_within_the_bound_fails_with_its_name(dataset):
    st = _staging(dataset, "slow", wait_s=1)
    Gates(st)  # no gate is opened
    st.start(list(range(16)))
    with pytest.raises(StagingError, match=r"part-00\.tfrecord was not on disk within --data-wait-s 1 s "
                                           r"\(0 of 16 files there\)"):
        st.ready(st.files[0])


def test_files_are_counted_by_one_traced_function_and_a_damaged_file_fails(tmp_path):
    # More records than a counting batch, and not a multiple of it.
    _write_records(tmp_path / "d", 3, staging.COUNT_BATCH * 2 + 44)
    files = sorted(str(p) for p in (tmp_path / "d").glob("*.tfrecord"))
    assert [staging.count_file(f) for f in files] == [staging.COUNT_BATCH * 2 + 44] * 3
    assert staging._record_counter().experimental_get_tracing_count() == 1
    damaged = tmp_path / "damaged.tfrecord"
    with open(files[0], "rb") as fh:
        damaged.write_bytes(fh.read()[:-5])
    with pytest.raises(tf.errors.DataLossError):
        staging.count_file(str(damaged))


def test_a_data_set_smaller_than_a_batch_fails_once_counted_instead_of_looping(tmp_path):
    _write_records(tmp_path / "d", 2, 10)
    st = Staging(f"file://{tmp_path}/d", str(tmp_path / "s"), run_uri=f"file://{tmp_path}/run", wait_s=60,
                 min_records=BATCH)
    st.start([0, 1])
    stream = data.from_tfrecords(st.files, PARSE, BATCH, seed=0, position=data.Position(0), ready=st.ready)
    with pytest.raises(tf.errors.OpError, match="holds 20 records, less than one global batch"):
        next(iter(stream))


@pytest.mark.parametrize(("run_uri", "root"), [
    ("s3://b/runs/r1", "s3://b"),
    ("gs://b/x/runs/r1", "gs://b"),
    ("file:///tmp/a/runs/r1", "file:///tmp/a"),
    ("file:///tmp/a/myrun", "file:///tmp/a"),
])
def test_the_index_lives_in_the_runs_bucket(run_uri, root):
    assert staging.index_root(run_uri) == root


@pytest.mark.parametrize(("doc", "why"), [
    ([], "not a version-1 index"),
    ({"version": 1, "files": [{"name": "a", "size": 3, "records": 1}, {"name": "a", "size": 3, "records": 1}]},
     "repeated name"),
    ({"version": 1, "files": [{"name": "a", "size": 3, "records": -1}, {"name": "b", "size": 4, "records": 1}]},
     "integers >= 0"),
    ({"version": 1, "files": [{"name": "a", "size": 3, "records": True}, {"name": "b", "size": 4, "records": 1}]},
     "integers >= 0"),
    ({"version": 1, "files": [{"name": "a", "size": 3, "records": 1}, {"name": "c", "size": 4, "records": 1}]},
     "c: 4 bytes in the index, None in the listing"),
    ({"version": 1, "files": [{"name": "a", "size": 3, "records": 1}]}, "1 listed files are not in it (e.g. b)"),
    ({"version": 1, "files": ["a"]}, "not an object"),
])
def test_an_index_is_trusted_only_when_it_names_every_listed_file_with_its_size(doc, why):
    sizes = {"a": 3, "b": 4}
    assert staging.check_index({"version": 1, "files": [{"name": "a", "size": 3, "records": 2},
                                                        {"name": "b", "size": 4, "records": 0}]}, sizes) == \
        ({"a": 2, "b": 0}, "")
    counts, reason = staging.check_index(doc, sizes)
    assert counts is None and why in reason
