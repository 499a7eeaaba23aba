"""TensorBoard scalars of a run (`trainer.summaries`): the event files hold what `tf.summary.scalar`
writes, event for event, and TensorBoard's own reader reads them; no TensorFlow op runs for a point."""

from __future__ import annotations

import math

import pytest

tf = pytest.importorskip("tensorflow")

from trainer import summaries as summaries_mod  # noqa: E402


def _events(folder) -> list:
    """Every event in the event files under `folder`, in file order (files sorted by name)."""
    return [event for path in sorted(folder.rglob("events.out.tfevents.*"))
            for event in tf.compat.v1.train.summary_iterator(str(path))]


def _scalars(folder) -> list[tuple[int, str, float, str]]:
    """(step, tag, value, dtype) of every scalar in the event files under `folder`, in file order."""
    out = []
    for event in _events(folder):
        for value in event.summary.value:
            t = tf.make_ndarray(value.tensor)
            out.append((event.step, value.tag, float(t), str(t.dtype)))
    return out


def _values(folder) -> list[tuple[int, bytes]]:
    """(step, the Summary.Value's bytes) of every value: tag, tensor and metadata, as written."""
    return [(e.step, v.SerializeToString(deterministic=True)) for e in _events(folder) for v in e.summary.value]


POINTS = [(50, {"train/loss": 0.5, "examples_per_sec": 40000.0}),
          (100, {"train/loss": 0.25, "examples_per_sec": 41000.5}),
          (80, {"checkpoint_s": 1.5}),
          (150, {"train/loss": 0.1, "examples_per_sec": 3e38, "lr": float("nan")})]


def test_the_event_files_hold_what_tf_summary_scalar_writes_value_for_value(tmp_path):
    s = summaries_mod.Summaries(str(tmp_path / "written"), store=None)
    s.series(POINTS[:3])
    s.scalars(*POINTS[3])
    s._writer.flush()
    eager = tf.summary.create_file_writer(str(tmp_path / "eager"))
    for step, values in POINTS:
        with eager.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(name, value)
    eager.flush()
    written, expected = _values(tmp_path / "written"), _values(tmp_path / "eager")
    assert len(expected) == 8
    assert written == expected  # the same order, tags, float32 tensors and plugin metadata
    scalars = _scalars(tmp_path / "written")
    assert scalars[:2] == [(50, "train/loss", 0.5, "float32"), (50, "examples_per_sec", 40000.0, "float32")]
    assert scalars[-2][2] == pytest.approx(3e38) and math.isnan(scalars[-1][2])
    first = _events(tmp_path / "written")[0]
    assert first.file_version == "brain.Event:2" and not first.HasField("summary")
    # Past float32's range a value is written as infinity (tf.summary refuses the Python float).
    s.scalars(200, {"examples_per_sec": 1e39})
    s._writer.flush()
    assert _scalars(tmp_path / "written")[-1] == (200, "examples_per_sec", math.inf, "float32")


def test_tensorboards_reader_reads_the_scalars(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    s = summaries_mod.Summaries(str(tmp_path), store=None)
    s.series([(i, {"train/loss": 1.0 / i, "learning_rate": 0.5}) for i in range(1, 31)])
    s._writer.flush()
    acc = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    assert sorted(acc.Tags()["tensors"]) == ["learning_rate", "train/loss"]
    loss = acc.Tensors("train/loss")
    assert [e.step for e in loss] == list(range(1, 31))
    assert [float(tf.make_ndarray(e.tensor_proto)) for e in loss] == pytest.approx([1.0 / i for i in range(1, 31)])
    assert acc.SummaryMetadata("train/loss").plugin_data.plugin_name == "scalars"


def test_points_run_no_tensorflow_op_and_two_writers_get_two_files(tmp_path, monkeypatch):
    def no_op(*_a, **_k):
        raise AssertionError("a TensorFlow summary op ran")

    monkeypatch.setattr(tf.summary, "scalar", no_op)
    monkeypatch.setattr(tf.summary, "write", no_op)
    a = summaries_mod.Summaries(str(tmp_path), store=None)
    b = summaries_mod.Summaries(str(tmp_path), store=None)
    a.series([(i, {"x": float(i)}) for i in range(100)])
    b.scalars(7, {"y": 2.0})
    a._writer.flush()
    b._writer.flush()
    files = sorted(tmp_path.glob("events.out.tfevents.*"))
    assert len(files) == 2 and all(f.name.endswith(".v2") for f in files)
    assert sorted(_scalars(tmp_path)) == sorted([(i, "x", float(i), "float32") for i in range(100)]
                                                + [(7, "y", 2.0, "float32")])


def test_points_reach_the_local_file_at_once_and_sync_uploads(tmp_path):
    """A run that ends without sync() (a failure's exit) keeps every point written in its local file."""
    uploads = []
    store = type("Store", (), {"upload_dir": lambda self, *a, **k: uploads.append((a, k))})()
    s = summaries_mod.Summaries(str(tmp_path), store=store)
    s.scalars(1, {"a": 1.0})
    assert [p[0] for p in _scalars(tmp_path)] == [1]  # no flush asked: on disk already
    s.series([(2, {"a": 2.0}), (3, {"a": 3.0})])
    assert [p[0] for p in _scalars(tmp_path)] == [1, 2, 3]
    assert uploads == []
    s.sync()
    assert uploads == [((str(tmp_path), "tensorboard/"), {"changed_only": True})]


def test_a_value_that_is_no_number_is_refused_by_name(tmp_path):
    s = summaries_mod.Summaries(str(tmp_path), store=None)
    with pytest.raises(ValueError, match=r"'train/loss': got a value of shape \(2,\), not a number"):
        s.series([(1, {"lr": 0.5}), (2, {"train/loss": [0.5, 0.25]})])
    assert _scalars(tmp_path) == []  # nothing of the refused call is written


def test_a_disabled_writer_writes_nothing(tmp_path):
    s = summaries_mod.Summaries(str(tmp_path), store=None, enabled=False)
    s.series([(1, {"a": 1.0})])
    s.scalars(2, {"a": 2.0})
    s.sync()
    assert not s.enabled and not list(tmp_path.iterdir())
