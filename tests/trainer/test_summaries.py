"""TensorBoard scalars of a run (`trainer.summaries`): what the event files hold, and that a call's
points go out in one traced graph call per set of names, the same scalars eager writes would hold."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from trainer import summaries as summaries_mod  # noqa: E402


def _scalars(folder) -> list[tuple[int, str, float, str]]:
    """(step, tag, value, dtype) of every scalar in the event files under `folder`, in file order."""
    out = []
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                t = tf.make_ndarray(value.tensor)
                out.append((event.step, value.tag, float(t), str(t.dtype)))
    return out


def test_series_writes_the_scalars_eager_summary_ops_would(tmp_path):
    points = [(50, {"train/loss": 0.5, "examples_per_sec": 40000.0}),
              (100, {"train/loss": 0.25, "examples_per_sec": 41000.5}),
              (80, {"checkpoint_s": 1.5})]
    s = summaries_mod.Summaries(str(tmp_path / "graph"), store=None)
    s.series(points)
    s.scalars(150, {"train/loss": 0.125, "examples_per_sec": 39000.0})
    s._writer.flush()
    eager = tf.summary.create_file_writer(str(tmp_path / "eager"))
    for step, values in [*points, (150, {"train/loss": 0.125, "examples_per_sec": 39000.0})]:
        with eager.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(name, value)
    eager.flush()
    written, expected = _scalars(tmp_path / "graph"), _scalars(tmp_path / "eager")
    assert len(expected) == 7
    assert sorted(written) == sorted(expected)


def test_a_set_of_names_is_traced_once_whatever_the_number_of_points(tmp_path):
    s = summaries_mod.Summaries(str(tmp_path), store=None)
    for n in (1, 3, 7):
        s.series([(i, {"a": float(i), "b": 2.0}) for i in range(n)])
    [write] = s._writes.values()
    assert write.experimental_get_tracing_count() == 1
    s._writer.flush()
    assert len(_scalars(tmp_path)) == 2 * (1 + 3 + 7)


def test_a_single_point_is_written_without_a_trace_until_its_names_come_as_a_series(tmp_path):
    s = summaries_mod.Summaries(str(tmp_path), store=None)
    s.scalars(10, {"validation/loss": 0.5, "eval_s": 0.25})
    s.scalars(20, {"checkpoint_save_s": 0.125})
    assert s._writes == {}  # two points, no writer traced
    s.series([(30, {"validation/loss": 0.25, "eval_s": 0.5}), (40, {"validation/loss": 0.125, "eval_s": 0.5})])
    s.scalars(50, {"validation/loss": 0.0625, "eval_s": 0.5})
    [write] = s._writes.values()  # traced for the series, then used for the names' next point
    assert write.experimental_get_tracing_count() == 1
    s._writer.flush()
    assert sorted(_scalars(tmp_path)) == sorted([
        (10, "validation/loss", 0.5, "float32"), (10, "eval_s", 0.25, "float32"), (20, "checkpoint_save_s", 0.125, "float32"),
        (30, "validation/loss", 0.25, "float32"), (30, "eval_s", 0.5, "float32"),
        (40, "validation/loss", 0.125, "float32"), (40, "eval_s", 0.5, "float32"),
        (50, "validation/loss", 0.0625, "float32"), (50, "eval_s", 0.5, "float32")])


def test_a_disabled_writer_writes_nothing(tmp_path):
    s = summaries_mod.Summaries(str(tmp_path), store=None, enabled=False)
    s.series([(1, {"a": 1.0})])
    s.scalars(2, {"a": 2.0})
    assert not s.enabled and not list(tmp_path.iterdir())
