"""The data stream: deterministic per seed, and a resumed stream continues exactly where it stopped."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from tests.trainer.helpers import mlp_example
from trainer import data


def _take(ds, n):
    return [(x.numpy(), y.numpy()) for x, y in ds.take(n)]


def test_synthetic_sets_are_deterministic_and_learnable_shapes():
    x1, y1 = data.synthetic_mnist(n=500, seed=1)
    x2, y2 = data.synthetic_mnist(n=500, seed=1)
    x3, _ = data.synthetic_mnist(n=500, seed=2)
    assert x1.shape == (500, 784) and x1.dtype == np.uint8 and set(np.unique(y1)) <= set(range(10))
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2) and not np.array_equal(x1, x3)
    tx, ty = data.synthetic_tokens(n=4, seq_len=8, vocab=16, seed=0)
    assert tx.shape == ty.shape == (4, 8)
    assert np.array_equal(tx[:, 1:], ty[:, :-1])  # y is x shifted by one token
    # The LM's held-out set: the same kind of sequences, drawn apart from the training ones, the same every time.
    vx, vy = data.synthetic_tokens_validation(n=4, seq_len=8, vocab=16, seed=0)
    assert vx.shape == (4, 8) and np.array_equal(vx[:, 1:], vy[:, :-1]) and not np.array_equal(vx, tx)
    assert np.array_equal(vx, data.synthetic_tokens_validation(n=4, seq_len=8, vocab=16, seed=0)[0])


def test_array_stream_resumes_exactly_across_epochs():
    x, y = data.synthetic_mnist(n=100, seed=0)
    full = _take(data.from_arrays(x, y, 16, seed=5, position=data.Position(0)), 14)  # 6 batches/epoch: 2+ epochs
    for k in (1, 5, 6, 7, 13):
        resumed = _take(data.from_arrays(x, y, 16, seed=5, position=data.Position(k)), 14 - k)
        assert len(resumed) == 14 - k
        for (a, b), (c, d) in zip(full[k:], resumed, strict=True):
            assert np.array_equal(a, c) and np.array_equal(b, d)
    # Each epoch is a permutation: within an epoch no example repeats; epochs differ in order.
    labels_epoch0 = np.concatenate([b for _, b in full[:6]])
    assert len(labels_epoch0) == 96
    first = np.concatenate([a for a, _ in full[:6]])
    second = np.concatenate([a for a, _ in full[6:12]])
    assert len({row.tobytes() for row in first}) == 96 and not np.array_equal(first, second)
    assert full[0][0].dtype == np.float32 and full[0][0].max() <= 1.0


@tf.function
def _drain(source, n):
    """`n` batches taken from an `ArraySource` inside one graph call, as the training step takes them."""
    xs = tf.TensorArray(source.element_spec[0].dtype, size=n)
    ys = tf.TensorArray(source.element_spec[1].dtype, size=n)
    for i in tf.range(n):
        x, y = next(source)
        xs, ys = xs.write(i, x), ys.write(i, y)
    return xs.stack(), ys.stack()


@tf.function
def _drain_carried(source, n):
    """`n` batches taken as the training step's loop takes them: as loop state (`open_call`, `following`)."""
    xs = tf.TensorArray(source.element_spec[0].dtype, size=n)
    ys = tf.TensorArray(source.element_spec[1].dtype, size=n)
    batch, following = source.open_call()
    for i in tf.range(n):
        x, y = batch
        batch, following = source.following(following)
        xs, ys = xs.write(i, x), ys.write(i, y)
    source.close_call(tf.cast(n, tf.int64), following)
    return xs.stack(), ys.stack()


@pytest.mark.parametrize("drain", [_drain, _drain_carried])
@pytest.mark.parametrize("device", ["/cpu:0", "/device:GPU:0"])  # a GPU's conversion: placed on the CPU without one
@pytest.mark.parametrize("arrays", ["images", "tokens"])
def test_the_in_graph_source_takes_the_array_streams_batches_across_epochs_and_resumes(device, arrays, drain):
    x, y = data.synthetic_mnist(n=100, seed=0) if arrays == "images" else data.synthetic_tokens(n=100, seq_len=4)
    full = _take(data.from_arrays(x, y, 16, seed=5, position=data.Position(0)), 20)  # 6 batches/epoch: 3+ epochs
    for k in (0, 3, 5, 6, 7, 13):
        source = data.ArraySource(x, y, 16, 5, data.Position(k), device=device)
        assert source.element_spec[0].dtype == full[0][0].dtype and source.element_spec[1].shape[0] == 16
        # Two calls, as a resumed run's: the first ends inside an epoch (at its end for k = 3), the second
        # crosses epochs.
        first, rest = drain(source, tf.constant(3)), drain(source, tf.constant(17 - k))
        xs, ys = np.concatenate([first[0], rest[0]]), np.concatenate([first[1], rest[1]])
        assert len(xs) == 20 - k and int(source.position.numpy()) == 20
        for i, (a, b) in enumerate(full[k:]):
            assert np.array_equal(xs[i], a) and np.array_equal(ys[i], b), (k, i)
    with pytest.raises(ValueError, match="less than one global batch"):
        data.ArraySource(x[:10], y[:10], 16, 5, data.Position(0))


def _write_records(folder, n_files=3, per_file=40):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    label = 0
    for f in range(n_files):
        with tf.io.TFRecordWriter(str(folder / f"part-{f}.tfrecord")) as w:
            for _ in range(per_file):
                w.write(mlp_example(rng.random(784), label % 10))
                label += 1
    (folder / "README.txt").write_text("not a record file")


def test_tfrecords_are_staged_once_and_stream_resumes_exactly(tmp_path):
    src = tmp_path / "bucket" / "data"
    _write_records(src)
    cache = tmp_path / "cache"
    files = data.stage(f"file://{src}", str(cache))
    assert [os.path.basename(f) for f in files] == ["part-0.tfrecord", "part-1.tfrecord", "part-2.tfrecord"]
    mtimes = [os.stat(f).st_mtime_ns for f in files]
    assert data.stage(f"file://{src}", str(cache)) == files
    assert [os.stat(f).st_mtime_ns for f in files] == mtimes  # already there: not downloaded again
    assert data.count_records(files) == 120

    full = _take(data.from_tfrecords(files, data.parse_mlp_records, 16, seed=3, position=data.Position(0)), 17)
    assert full[0][0].shape == (16, 784) and full[0][1].dtype == np.int64
    # 7 batches per epoch: every example of the epoch appears at most once.
    ep0 = np.concatenate([a for a, _ in full[:7]])
    assert len({row.tobytes() for row in ep0}) == 112
    for k in (3, 7, 10):
        resumed = _take(data.from_tfrecords(files, data.parse_mlp_records, 16, seed=3, position=data.Position(k)), 17 - k)
        for (a, b), (c, d) in zip(full[k:], resumed, strict=True):
            assert np.array_equal(a, c) and np.array_equal(b, d)


def test_empty_data_folder_and_tiny_data_set_are_clear_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.txt").write_text("x")
    with pytest.raises(ValueError, match="no \\*.tfrecord\\* files"):
        data.stage(f"file://{tmp_path}/empty", str(tmp_path / "c"))
    x, y = data.synthetic_mnist(n=10, seed=0)
    with pytest.raises(ValueError, match="less than one global batch"):
        data.from_arrays(x, y, 16, seed=0, position=data.Position(0))
