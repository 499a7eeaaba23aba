"""The validation pass and its metrics in process: the loss and metrics over the whole validation
set (uneven batches weighted by their examples), a worker's share, dropout off, an empty set
refused, and how each kind of metric name is resolved.

tests/trainer/test_metrics.py proves the same through whole trainer runs (seconds each); these call
`trainer.metrics` directly with a tiny Keras model on the default strategy.
"""

from __future__ import annotations

import re

import pytest

tf = pytest.importorskip("tensorflow")
import keras  # noqa: E402
import numpy as np  # noqa: E402

from trainer import metrics as metrics_mod  # noqa: E402
from trainer.metrics import Evaluator, KeepBest, MetricError, MetricSet, resolve, validation_names  # noqa: E402

EXAMPLES, BATCH, CLASSES = 10, 4, 3


@pytest.fixture(autouse=True)
def _eager():
    """The validation pass's `tf.function` run as plain Python: a graph function hangs in a process
    forked after TensorFlow ran one (as mutmut's workers are: tests/mutation/plugin.py), and the sums
    are the same either way (the slow trainer runs of tests/trainer/test_metrics.py run it as a graph)."""
    tf.config.run_functions_eagerly(True)
    yield
    tf.config.run_functions_eagerly(False)


def _data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(EXAMPLES, 4)).astype("float32")
    y = rng.integers(0, CLASSES, EXAMPLES).astype("int64")
    return x, y


def _model(dropout: float = 0.0):
    keras.utils.set_random_seed(5)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dropout(dropout)(inputs) if dropout else inputs
    model = keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(hidden))
    return model


def _loss(y, pred):
    return keras.losses.sparse_categorical_crossentropy(y, pred)


def _expected(model, x, y):
    """The whole set's mean loss and accuracy, computed in one go."""
    pred = model(x, training=False)
    acc = keras.metrics.SparseCategoricalAccuracy()
    acc.update_state(y, pred)
    return float(np.mean(_loss(y, pred).numpy())), float(acc.result())


def _evaluator(model, x, y, **kw):
    metrics = MetricSet(["accuracy"], tf.TensorSpec([None], tf.int64), (None, CLASSES))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    return Evaluator(tf.distribute.get_strategy(), model, _loss, metrics, dataset, **kw)


def test_the_pass_weighs_every_example_once_over_uneven_batches():
    x, y = _data()
    model = _model()
    results, examples, seconds = _evaluator(model, x, y).run()
    loss, acc = _expected(model, x, y)
    assert examples == EXAMPLES  # batches of 4, 4 and 2
    assert results == pytest.approx({"loss": loss, "accuracy": acc}, rel=1e-5)
    assert list(results) == ["loss", "accuracy"]
    assert 0 <= seconds < 60
    # The mean of the batches' means would weigh the last two examples twice as much.
    pred = model(x, training=False).numpy()
    by_batch = np.mean([np.mean(_loss(y[i:i + BATCH], pred[i:i + BATCH]).numpy()) for i in range(0, EXAMPLES, BATCH)])
    assert abs(by_batch - loss) > 1e-4


def test_the_pass_runs_with_dropout_off_and_moves_no_weight():
    x, y = _data()
    model = _model(dropout=0.5)
    before = [w.copy() for w in model.get_weights()]
    evaluator = _evaluator(model, x, y)
    first, _, _ = evaluator.run()
    second, _, _ = evaluator.run()
    assert first == second == pytest.approx(dict(zip(("loss", "accuracy"), _expected(model, x, y), strict=True)),
                                            rel=1e-5)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))


@pytest.mark.parametrize("worker", [0, 1])
def test_a_worker_evaluates_every_other_batch_and_sums_once(worker):
    x, y = _data()
    model = _model()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    metrics = MetricSet(["accuracy"], tf.TensorSpec([None], tf.int64), (None, CLASSES))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    evaluator = Evaluator(strategy, model, _loss, metrics, dataset, workers=2, worker=worker)
    assert evaluator.workers == 2 and evaluator._reduce is not None
    assert (evaluator.dataset.options().experimental_distribute.auto_shard_policy
            == tf.data.experimental.AutoShardPolicy.OFF)
    results, examples, _ = evaluator.run()
    rows = np.concatenate([np.arange(i, min(i + BATCH, EXAMPLES)) for i in range(worker * BATCH, EXAMPLES, 2 * BATCH)])
    assert examples == len(rows) == (6 if worker == 0 else 4)
    loss, acc = _expected(model, x[rows], y[rows])
    assert results == pytest.approx({"loss": loss, "accuracy": acc}, rel=1e-5)


def test_one_worker_evaluates_everything_and_reduces_nothing():
    x, y = _data()
    evaluator = _evaluator(_model(), x, y)
    assert evaluator.workers == 1 and evaluator._reduce is None
    assert (evaluator.dataset.options().experimental_distribute.auto_shard_policy
            == tf.data.experimental.AutoShardPolicy.OFF)


def test_an_empty_validation_set_is_refused_in_one_line():
    x, y = _data()
    with pytest.raises(MetricError, match=r"^the validation set is empty \(no batch came from it\)$"):
        _evaluator(_model(), x[:0], y[:0]).run()


def test_first_replica_only_keeps_each_workers_first_replica(monkeypatch):
    class _Context:
        replica_id_in_sync_group = 0

    context = _Context()
    monkeypatch.setattr(metrics_mod.tf.distribute, "get_replica_context", lambda: context)
    keep = metrics_mod.first_replica_only(2)
    value = tf.constant([1.5, 2.0])
    kept = []
    for replica in range(5):
        context.replica_id_in_sync_group = replica
        kept.append(keep(value).numpy().tolist())
    assert kept == [[1.5, 2.0], [0, 0], [1.5, 2.0], [0, 0], [1.5, 2.0]]
    one = metrics_mod.first_replica_only(1)
    context.replica_id_in_sync_group = 3
    assert one(value).numpy().tolist() == [1.5, 2.0]


def test_the_metric_set_lays_its_states_end_to_end():
    metrics = MetricSet(["accuracy", keras.metrics.AUC(num_thresholds=5, name="auc")],
                        tf.TensorSpec([None, 1], tf.float32), (None, 1))
    sizes = [sum(int(np.prod(v.shape)) for v in m.variables) for m in metrics.metrics]
    assert sizes == [2, 20]  # accuracy: total and count; AUC: four confusion counts per threshold
    assert metrics.size == 22 and [offset for offset, _ in metrics._layout] == [0, 2]
    assert metrics.names == ["accuracy", "auc"] and bool(metrics)
    y = tf.constant([[1.0], [0.0], [1.0], [1.0]])
    pred = tf.constant([[0.9], [0.2], [0.4], [0.8]], tf.float16)  # not float32: cast first
    state = metrics.state(y, pred)
    assert state.dtype == tf.float32 and state.shape == (22,)
    got = metrics.results(state.numpy() + metrics.state(y[:2], pred[:2]).numpy())
    acc, auc = keras.metrics.BinaryAccuracy(), keras.metrics.AUC(num_thresholds=5)
    for m in (acc, auc):
        m.update_state(tf.concat([y, y[:2]], 0), tf.cast(tf.concat([pred, pred[:2]], 0), tf.float32))
    assert got == pytest.approx({"accuracy": float(acc.result()), "auc": float(auc.result())})
    assert list(got) == ["accuracy", "auc"] and all(type(v) is float for v in got.values())


@pytest.mark.parametrize("given", [[], None])
def test_no_metrics_is_an_empty_state(given):
    metrics = MetricSet(given)
    assert not metrics and metrics.names == [] and metrics.size == 0
    state = metrics.state(tf.constant([1, 0]), tf.constant([[0.1, 0.9], [0.8, 0.2]]))
    assert state.dtype == tf.float32 and state.shape == (0,)
    assert metrics.results(state) == {}


@pytest.mark.parametrize(("metric", "kind", "name"), [
    ("mae", keras.metrics.MeanAbsoluteError, "mean_absolute_error"),
    (keras.metrics.AUC, keras.metrics.AUC, "auc"),  # a class: an instance of it
    (keras.metrics.mean_squared_error, keras.metrics.MeanMetricWrapper, "mean_squared_error"),
    ("acc", keras.metrics.SparseCategoricalAccuracy, "accuracy"),
])
def test_a_metric_is_named_as_keras_names_it(metric, kind, name):
    found = resolve(metric, tf.TensorSpec([None], tf.int64), (None, 5))
    assert type(found) is kind and re.fullmatch(rf"{name}(_\d+)?", found.name), found.name  # Keras numbers a repeat


def test_a_callable_without_a_name_is_named_by_its_text():
    class Scaled:
        """A user's callable metric object: no `__name__`, its repr names it."""

        def __call__(self, y, pred):
            return tf.reduce_mean(tf.cast(pred, tf.float32), axis=-1)

        def __repr__(self):
            return "scaled_mean"

    metrics = MetricSet([Scaled()])
    assert metrics.names == ["scaled_mean"]
    state = metrics.state(tf.constant([[0.0], [0.0]]), tf.constant([[1.0], [3.0]]))
    assert metrics.results(state) == {"scaled_mean": pytest.approx(2.0)}


def test_a_plain_function_is_averaged_over_the_examples():
    def doubled(y, pred):
        return 2.0 * tf.reduce_mean(tf.cast(pred, tf.float32), axis=-1)

    metrics = MetricSet([doubled])
    assert metrics.names == ["doubled"]
    state = metrics.state(tf.constant([[0.0], [0.0]]), tf.constant([[1.0], [3.0]]))
    assert metrics.results(state) == {"doubled": pytest.approx(4.0)}


@pytest.mark.parametrize(("y_spec", "out_shape", "kind"), [
    (None, None, keras.metrics.SparseCategoricalAccuracy),  # nothing known: labels are class ids
    (tf.TensorSpec([None, 10], tf.float32), None, keras.metrics.SparseCategoricalAccuracy),
    (None, (None, 10), keras.metrics.SparseCategoricalAccuracy),
    (None, (None, 1), keras.metrics.BinaryAccuracy),
    (None, (None, 7, 1), keras.metrics.BinaryAccuracy),  # one output per position: by the last axis
    (tf.TensorSpec([None], tf.int64), (None, 1), keras.metrics.BinaryAccuracy),
    (tf.TensorSpec([None, 10], tf.int64), (None, 10), keras.metrics.SparseCategoricalAccuracy),  # int one-hot
    (tf.TensorSpec([None], tf.float32), (None, 10), keras.metrics.SparseCategoricalAccuracy),  # float class ids
])
def test_accuracy_without_full_shapes_is_keras_own_default(y_spec, out_shape, kind):
    found = resolve("accuracy", y_spec, out_shape)
    assert type(found) is kind and found.name == "accuracy"


def test_a_metric_object_is_used_as_given():
    given = keras.metrics.Precision(name="p")
    assert resolve(given, None, None) is given


@pytest.mark.parametrize("metric", ["no_such_metric", 42])
def test_an_unknown_metric_is_refused_with_keras_words(metric):
    with pytest.raises(MetricError) as e:
        resolve(metric, None, None)
    text = str(e.value)
    assert text.startswith(f"ModelSpec.metrics: {metric!r} is not a Keras metric (") and text.endswith(")")
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_keep_best_refuses_a_metric_the_evaluation_does_not_record():
    best = KeepBest("val_auc")
    best.check(["val_loss", "val_auc"])
    with pytest.raises(MetricError) as e:
        best.check(["val_loss", "val_accuracy"])
    assert str(e.value) == ("--keep-best val_auc (run.keepBest): the evaluation records val_loss, val_accuracy; "
                            "name one of them")


@pytest.mark.parametrize(("text", "value", "best", "better"), [
    ("val_loss", 0.5, {"value": 0.5}, False),  # a tie is not a new best
    ("val_loss", 0.49, {"value": 0.5}, True),
    ("val_accuracy", 0.51, {"value": 0.5}, True),
    ("val_accuracy", 0.49, {"value": 0.5}, False),
    ("val_accuracy:min", 0.49, {"value": 0.5}, True),
    ("val_loss:max", 0.49, {"value": 0.5}, False),
    ("val_loss", float("-inf"), None, False),
    ("val_loss", float("nan"), {"value": 0.5}, False),
    ("val_loss", 3.0, None, True),
])
def test_keep_best_tracks_the_best_by_its_mode(text, value, best, better):
    assert KeepBest(text).better(value, best) is better


def test_validation_names_are_keras_own():
    assert validation_names({"loss": 0.5, "accuracy": 0.9}) == {"val_loss": 0.5, "val_accuracy": 0.9}
    assert validation_names({}) == {}


class _Pass:
    """An evaluator that took `seconds`, `traced` of them tracing the pass."""

    def __init__(self, seconds: float, traced: float):
        self.seconds, self.trace_seconds = seconds, traced

    def run(self):
        return {"loss": 0.5}, 360, self.seconds


@pytest.mark.parametrize(("seconds", "traced", "slow"), [(0.407, 0.38, False), (0.407, 0.0, True), (0.3, 0.1, True)])
@pytest.mark.parametrize("first", [True, False])
def test_eval_slow_leaves_the_passs_tracing_out_and_never_judges_the_first_pass(seconds, traced, slow, first):
    from types import SimpleNamespace

    from trainer.config import load_config
    from trainer.evaluation import Validation

    events = []
    validation = Validation(load_config(["--run-uri", "file:///unused", "--synthetic"], env={}), ckstore=None,
                            emit=lambda name, **f: events.append({"event": name, **f}))
    validation.evaluator = _Pass(seconds, traced)
    validation.passes = 0 if first else 1
    validation.since_eval = 1.946
    st = SimpleNamespace(step=1000, eval_seconds=0.0, evaluated=None, best=None)
    validation.evaluate(st, lambda step, scalars: None)
    evaluated = events[0]
    assert evaluated["event"] == "evaluated" and evaluated["trace_seconds"] == round(traced, 3)
    assert evaluated["share"] == round((seconds - traced) / 1.946, 4)
    assert evaluated["seconds"] == seconds  # the pass's whole time is still said
    assert [e["event"] for e in events[1:]] == (["eval_slow"] if slow and not first else [])
    assert validation.passes == (1 if first else 2)


class _Doubled(keras.metrics.Mean):
    """A Mean whose result is its own: Keras's stateless result must compute it."""

    def result(self):
        return super().result() * 2.0


def _keras_results(metrics: MetricSet, state) -> dict[str, float]:
    """What Keras's stateless result says for `state`, metric by metric (the path every metric can take)."""
    out = {}
    for m, (offset, variables) in zip(metrics.metrics, metrics._layout, strict=True):
        values = [tf.cast(tf.reshape(state[offset + i], v.shape), v.dtype) for i, v in enumerate(variables)]
        out[m.name] = float(tf.reduce_mean(tf.cast(m.stateless_result(values), tf.float32)))
    return out


def test_the_log_points_results_are_keras_own_bit_for_bit():
    """The loop's per-point results (`MetricSet.results`) skip Keras's eager ops for Mean and Sum metrics;
    they must say exactly what Keras says, empty counts, NaN and huge totals included."""
    metrics = MetricSet(["accuracy", "mae", keras.metrics.Sum(name="seen"), _Doubled(name="doubled"),
                         keras.metrics.Mean(name="m64", dtype="float64")],
                        tf.TensorSpec([None], tf.int32), (None, 10))
    plain = [p is not None for p in metrics._plain]
    assert plain == [True, True, True, False, True]
    rng = np.random.default_rng(0)
    states = [rng.uniform(0, 1e4, metrics.size).astype(np.float32) for _ in range(200)]
    states += [np.zeros(metrics.size, np.float32), np.full(metrics.size, np.nan, np.float32),
               np.full(metrics.size, 3.4e38, np.float32), np.array([7, 3, 1e-3, 0, 5.5, 2, 1, 9, 0], np.float32)]
    checked = 0
    for state in states:
        got, want = metrics.results(state), _keras_results(metrics, state)
        assert list(got) == list(want) and all(type(v) is float for v in got.values())
        assert np.array_equal(np.array(list(got.values())), np.array(list(want.values())), equal_nan=True), (state, got, want)
        checked += 1
    assert checked == 204
