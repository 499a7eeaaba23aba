"""trainer.metrics without a run: metric states add up to Keras's own result, "accuracy" is spelled out by shapes."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.metrics import KeepBest, MetricError, MetricSet


@pytest.mark.parametrize(("y_spec", "out_shape", "kind"), [
    (tf.TensorSpec([None], tf.int64), (None, 10), keras.metrics.SparseCategoricalAccuracy),
    (tf.TensorSpec([None, 10], tf.float32), (None, 10), keras.metrics.CategoricalAccuracy),
    (tf.TensorSpec([None, 1], tf.float32), (None, 1), keras.metrics.BinaryAccuracy),
])
def test_accuracy_is_spelled_out_by_the_shapes_as_keras_compile_does(y_spec, out_shape, kind):
    (metric,) = MetricSet(["accuracy"], y_spec, out_shape).metrics
    assert type(metric) is kind and metric.name == "accuracy"


def test_summed_batch_states_give_keras_own_result_over_all_the_batches():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 100)
    pred = rng.random((100, 5)).astype(np.float32)
    metrics = MetricSet(["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")],
                        tf.TensorSpec([None], tf.int64), (None, 5))
    total = sum(metrics.state(tf.constant(y[i:i + 32]), tf.constant(pred[i:i + 32])).numpy() for i in range(0, 100, 32))
    expected = {}
    for m in (keras.metrics.SparseCategoricalAccuracy(), keras.metrics.SparseTopKCategoricalAccuracy(k=2)):
        m.update_state(y, pred)
        expected[len(expected)] = float(m.result())
    got = metrics.results(total)
    assert got == pytest.approx({"accuracy": expected[0], "top2": expected[1]})
    assert 0 < got["accuracy"] < got["top2"] < 1


def test_argmax_metrics_read_the_logits_under_a_softmax_output_and_the_others_its_probabilities():
    # Logits 1e-8 apart tie once softmaxed (0.5 and 0.5): the probabilities' argmax is the first class,
    # the logits' the second. Accuracy counts the logits' (the softmax need not run: a loss reads its
    # logits too); top-2 accuracy and the cross-entropy read the probabilities as before.
    logits = tf.constant([[0.0, 1e-8, -30.0], [2.0, 0.0, -1.0]])
    y = tf.constant([1, 0], tf.int64)
    metrics = MetricSet(["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2"),
                         keras.metrics.SparseCategoricalCrossentropy(name="xent")], tf.TensorSpec([None], tf.int64),
                        (None, 3))

    @tf.function
    def from_model(z):
        return metrics.state(y, tf.nn.softmax(z))

    got = metrics.results(from_model(logits).numpy())
    eager = metrics.results(metrics.state(y, tf.nn.softmax(logits)).numpy())  # no graph: the probabilities
    xent = keras.metrics.SparseCategoricalCrossentropy()
    xent.update_state(y, tf.nn.softmax(logits))
    assert got["accuracy"] == 1.0 and eager["accuracy"] == 0.5
    assert got["top2"] == eager["top2"] == 1.0
    assert got["xent"] == pytest.approx(float(xent.result())) == eager["xent"]


@pytest.mark.parametrize(("metrics", "words"), [
    (["accuracy", "accuracy"], "names must differ"),
    ([keras.metrics.Mean(name="loss")], "from 'loss'"),
    (["no_such_metric"], "'no_such_metric' is not a Keras metric"),
])
def test_bad_metrics_are_refused_in_one_line(metrics, words):
    with pytest.raises(MetricError) as e:
        MetricSet(metrics, tf.TensorSpec([None], tf.int64), (None, 3))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_keep_best_compares_by_its_direction_and_never_takes_a_nan():
    up, down = KeepBest("val_accuracy"), KeepBest("val_loss")
    assert up.better(0.5, None) and up.better(0.6, {"value": 0.5}) and not up.better(0.5, {"value": 0.5})
    assert down.better(0.4, {"value": 0.5}) and not down.better(0.6, {"value": 0.5})
    assert not up.better(float("nan"), None) and not down.better(float("inf"), {"value": 1.0})
