"""The input pipeline's position in process: what `DataState.save` writes into a checkpoint folder
and records, when it gives up (and says so once), and that a restored iterator goes on where the
saved one was.

tests/trainer/test_data_state.py proves the same through whole trainer runs (seconds each);
these call `trainer.data_state` directly on small `tf.data` pipelines.
"""

from __future__ import annotations

import os

import pytest

tf = pytest.importorskip("tensorflow")

from runfolder import layout  # noqa: E402
from trainer import data_state  # noqa: E402
from trainer.data_state import DataState  # noqa: E402

SUFFIX = ": a resume will skip the batches already consumed"


def _pipeline(shuffle: int = 16):
    return tf.data.Dataset.range(1000).shuffle(shuffle, seed=7).batch(4)


def _events():
    said = []
    return said, lambda kind, **fields: said.append((kind, fields))


def _files(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_a_saved_position_is_where_a_fresh_iterator_of_the_same_pipeline_goes_on(tmp_path):
    it = iter(_pipeline())
    for _ in range(3):
        next(it)
    said, emit = _events()
    state = DataState(it, skip=5, max_mb=1, emit=emit)
    recorded = state.save(str(tmp_path), step=3)
    assert recorded == {"skip": 5, "bytes": data_state.state_bytes(str(tmp_path))}
    assert recorded["bytes"] > 0 and said == []
    assert _files(tmp_path) == ["data.data-00000-of-00001", "data.index"]
    expected = [next(it).numpy().tolist() for _ in range(3)]

    fresh = iter(_pipeline())
    prefix, skip = data_state.saved_state_prefix(str(tmp_path), {"data_state": recorded})
    assert (prefix, skip) == (str(tmp_path / data_state.DATA_PREFIX), 5)
    data_state.restore_iterator(fresh, prefix)
    assert [next(fresh).numpy().tolist() for _ in range(3)] == expected
    assert [next(iter(_pipeline())).numpy().tolist()] != expected[:1]  # not the stream's start


def test_restoring_a_state_of_another_pipeline_fails_loudly(tmp_path):
    it = iter(_pipeline())
    next(it)
    DataState(it, skip=0, max_mb=1, emit=lambda *a, **k: None).save(str(tmp_path), step=1)
    other = iter(tf.data.Dataset.range(10).map(lambda x: x * 2).batch(2))
    with pytest.raises((AssertionError, tf.errors.OpError, ValueError)):
        data_state.restore_iterator(other, str(tmp_path / "data"))


@pytest.mark.parametrize(("size", "kept"), [(2**20, True), (2**20 + 1, False)])
def test_a_state_of_exactly_the_bound_is_kept_and_one_byte_over_is_not(tmp_path, monkeypatch, size, kept):
    # The files' size varies by a few bytes from save to save (TF's object names), so it is set here.
    monkeypatch.setattr(data_state, "state_bytes", lambda folder: size)
    it = iter(_pipeline())
    said, emit = _events()
    state = DataState(it, skip=0, max_mb=1, emit=emit)
    recorded = state.save(str(tmp_path), 1)
    if kept:
        assert recorded == {"skip": 0, "bytes": size}
        assert state.iterator is it and state.reason is None and said == []
    else:
        assert recorded == {"reason": "the input pipeline's state is 1 MiB, over --data-state-max-mb 1 (a large "
                                      "shuffle buffer?)"}
        assert state.iterator is None and len(said) == 1


def test_a_state_over_the_bound_is_dropped_said_once_and_not_tried_again(tmp_path, monkeypatch):
    it = iter(_pipeline(shuffle=500))  # a shuffle buffer of 500 int64s: a few KiB
    next(it)
    sizes = []
    measure = data_state.state_bytes
    monkeypatch.setattr(data_state, "state_bytes", lambda folder: sizes.append(measure(folder)) or sizes[-1])
    said, emit = _events()
    state = DataState(it, skip=2, max_mb=0.001, emit=emit)
    (tmp_path / "ckpt.index").write_bytes(b"variables")  # the checkpoint's own files stay
    first = state.save(str(tmp_path), step=10)
    assert _files(tmp_path) == ["ckpt.index"]
    assert state.iterator is None
    reason = state.reason
    [size] = sizes
    assert reason == (f"the input pipeline's state is {size / 2**20:.3g} MiB, over --data-state-max-mb 0.001 "
                      "(a large shuffle buffer?)")
    assert 0.001 < size / 2**20 < 1
    assert first == {"reason": reason}
    assert said == [(layout.DATA_STATE_UNSAVED, {"step": 10, "reason": reason + SUFFIX})]
    # The next checkpoints record the same reason, write nothing and say nothing more.
    (tmp_path / "next").mkdir()
    assert state.save(str(tmp_path / "next"), step=20) == {"reason": reason}
    assert _files(tmp_path / "next") == [] and len(said) == 1


def test_a_pipeline_built_from_python_cannot_be_saved_and_says_why_once(tmp_path):
    gen = tf.data.Dataset.from_generator(lambda: iter(range(10)), output_signature=tf.TensorSpec((), tf.int64))
    it = iter(gen)
    next(it)
    said, emit = _events()
    state = DataState(it, skip=0, max_mb=64, emit=emit)
    recorded = state.save(str(tmp_path), step=4)
    assert _files(tmp_path) == [] and state.iterator is None
    assert recorded == {"reason": "TensorFlow cannot save this input pipeline (PyFunc is stateful.); a pipeline "
                                  "built from Python (from_generator, py_function, numpy_function) has state only "
                                  "Python holds"}
    assert said == [(layout.DATA_STATE_UNSAVED, {"step": 4, "reason": recorded["reason"] + SUFFIX})]
    assert state.save(str(tmp_path), step=8) == recorded and len(said) == 1


@pytest.mark.parametrize("error", [ValueError("not trackable"), TypeError("not trackable")])
def test_a_failed_save_leaves_no_iterator_files_behind(tmp_path, monkeypatch, error):
    class _Failing:
        def __init__(self, **_):
            pass

        def write(self, prefix):
            with open(prefix + ".data-00000-of-00001", "wb") as f:
                f.write(b"half")  # a partial write before the failure
            raise error

    monkeypatch.setattr(data_state.tf.train, "Checkpoint", _Failing)
    (tmp_path / "ckpt.index").write_bytes(b"variables")
    said, emit = _events()
    state = DataState(object(), skip=0, max_mb=64, emit=emit)
    recorded = state.save(str(tmp_path), step=1)
    assert _files(tmp_path) == ["ckpt.index"]
    assert recorded == {"reason": "TensorFlow cannot save this input pipeline (not trackable); a pipeline built "
                                  "from Python (from_generator, py_function, numpy_function) has state only "
                                  "Python holds"}
    assert len(said) == 1


@pytest.mark.parametrize("max_mb", [0, -1])
def test_a_bound_of_zero_saves_nothing_and_says_so_once(tmp_path, max_mb):
    said, emit = _events()
    state = DataState(iter(_pipeline()), skip=0, max_mb=max_mb, emit=emit)
    assert state.iterator is None and state.reason == "--data-state-max-mb is 0"
    assert state.save(str(tmp_path), step=7) == {"reason": "--data-state-max-mb is 0"}
    assert state.save(str(tmp_path), step=9) == {"reason": "--data-state-max-mb is 0"}
    assert _files(tmp_path) == []
    assert said == [(layout.DATA_STATE_UNSAVED, {"step": 7, "reason": "--data-state-max-mb is 0" + SUFFIX})]


@pytest.mark.parametrize("max_mb", [0, 64])
def test_a_reason_given_at_the_start_is_the_one_recorded(tmp_path, max_mb):
    said, emit = _events()
    state = DataState(iter(_pipeline()), skip=3, max_mb=max_mb, emit=emit, reason=data_state.DISTRIBUTED)
    assert state.iterator is None and state.reason == data_state.DISTRIBUTED
    assert state.save(str(tmp_path), step=2) == {"reason": data_state.DISTRIBUTED}
    assert _files(tmp_path) == [] and said[0][1]["reason"] == data_state.DISTRIBUTED + SUFFIX


def test_the_skip_is_recorded_as_a_whole_number(tmp_path):
    state = DataState(iter(_pipeline()), skip=6.0, max_mb=1, emit=lambda *a, **k: None)
    assert state.skip == 6 and isinstance(state.skip, int)
    assert state.max_mb == 1
    recorded = state.save(str(tmp_path), step=1)
    assert recorded["skip"] == 6 and isinstance(recorded["skip"], int)


def test_state_bytes_counts_only_the_iterator_files(tmp_path):
    (tmp_path / "data.index").write_bytes(b"x" * 10)
    (tmp_path / "data.data-00000-of-00001").write_bytes(b"x" * 100)
    (tmp_path / "ckpt.index").write_bytes(b"x" * 1000)
    (tmp_path / "database").write_bytes(b"x" * 10000)
    assert data_state.state_bytes(str(tmp_path)) == 110
    assert data_state.state_bytes(str(tmp_path / "missing")) == 0


@pytest.mark.parametrize(("saved", "found"), [
    ({"data_state": {"skip": 0, "bytes": 10}}, True),
    ({"data_state": {"skip": "7", "bytes": 10}}, False),  # not a number: not ours
    ({"data_state": {"bytes": 10}}, False),
    ({"data_state": [7]}, False),
    ({}, False),
])
def test_only_a_recorded_whole_skip_with_files_is_a_state(tmp_path, saved, found):
    (tmp_path / "data.index").write_bytes(b"x")
    got = data_state.saved_state_prefix(str(tmp_path), saved)
    assert got == ((str(tmp_path / "data"), 0) if found else None)


@pytest.mark.parametrize(("message", "words"), [
    ("{{function_node __wrapped__SerializeIterator_device_/job:localhost}} PyFunc is stateful. "
     "[Op:SerializeIterator] name: ", "PyFunc is stateful."),
    ("a\n  b {{node x}}\tc [Op:Save]\nmore\nlines", "a b c"),
    ("{{a}} kept {{b}} too", "kept too"),
    ("z" * 300, "z" * 200),
])
def test_tensorflows_words_lose_its_decorations(message, words):
    assert data_state._tf_words(message) == words
