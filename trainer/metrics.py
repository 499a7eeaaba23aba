"""Metrics and evaluation in the trainer's own loop: a ModelSpec's Keras metrics, the validation pass, the best.

A `ModelSpec` names Keras metrics (`metrics=["accuracy"]`, or metric objects). The trainer
uses them without their variables: each metric's state for a batch comes from Keras's
stateless API (`stateless_update_state` from zeros), flattened into one float32 vector, so
states add up across replicas, workers, steps and validation batches, and one all-reduce
gives the state of the whole global batch or validation set. Metrics whose state adds up
this way are the ones Keras ships for classification and regression (accuracy, AUC,
precision, recall, the mean errors); a metric keeping a maximum or a last value does not.

`MetricSet` owns the metrics and their state vectors; `Evaluator` runs the validation pass
(every worker its share of the batches, the sums reduced once); `KeepBest` decides whether
an evaluation is the run's best (`--keep-best val_accuracy`). The loop (`trainer.loop`)
decides when to evaluate and what to do with a best.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from trainer.config import keep_best_mode

# A run whose validation pass (its tracing left out; the attempt's first pass not judged) takes more
# than this share of the training time between two evaluations gets an `eval_slow` warning event.
EVAL_WARN_SHARE = 0.10

# How the string "accuracy" (or "acc") is spelled out, as Keras `compile` does: by the
# shapes of the labels and of the model's output.
ACCURACY_NAMES = ("accuracy", "acc")


class MetricError(ValueError):
    """The run names a metric the model does not record, or a validation set that cannot work (exit 78)."""


def resolve(metric, y_spec: tf.TensorSpec | None, out_shape) -> keras.metrics.Metric:
    """A Keras metric object for a `ModelSpec.metrics` entry (an object, or a name Keras knows)."""
    if isinstance(metric, keras.metrics.Metric):
        return metric
    if isinstance(metric, str) and metric in ACCURACY_NAMES:
        last = out_shape[-1] if out_shape is not None and len(out_shape) else None
        if last == 1:
            return keras.metrics.BinaryAccuracy(name="accuracy")
        if (y_spec is not None and out_shape is not None and y_spec.shape.rank == len(out_shape)
                and y_spec.dtype.is_floating):
            return keras.metrics.CategoricalAccuracy(name="accuracy")
        return keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    try:
        found = keras.metrics.get(metric)
    except (ValueError, TypeError) as e:
        raise MetricError(f"ModelSpec.metrics: {metric!r} is not a Keras metric ({e})") from None
    if isinstance(found, type) and issubclass(found, keras.metrics.Metric):
        found = found()
    if not isinstance(found, keras.metrics.Metric):
        # A plain function (e.g. keras.metrics.mean_squared_error): its mean over the examples.
        found = keras.metrics.MeanMetricWrapper(found, name=getattr(found, "__name__", str(metric)))
    return found


# Metrics that read only the argmax of the model's output over its last axis: given the logits under a
# softmax output, they count the same (softmax keeps the order; where two probabilities round to one value,
# the larger logit wins). So the softmax a loss already reads through (Keras's cross-entropies take its
# logits) need not run for them: on a small model its oneDNN kernel was a tenth of the step's kernel time
# (bench/RESULTS.md).
ARGMAX_ONLY = (keras.metrics.SparseCategoricalAccuracy, keras.metrics.CategoricalAccuracy)


def _under_softmax(pred):
    """The logits of a graph tensor made by a softmax over its last axis (as Keras's losses find them), else `pred`."""
    op = getattr(pred, "op", None)  # an eager tensor has none
    if op is not None and op.type == "Softmax":
        return op.inputs[0]
    return pred


class MetricSet:
    """The model's metrics as one additive float32 state vector (see the module docstring)."""

    def __init__(self, metrics: list, y_spec: tf.TensorSpec | None = None, out_shape=None):
        self.metrics = [resolve(m, y_spec, out_shape) for m in metrics or []]
        names = [m.name for m in self.metrics]
        if len(set(names)) != len(names) or "loss" in names:
            raise MetricError(f"ModelSpec.metrics: names must differ from each other and from 'loss', got {names}")
        self._layout: list[tuple[int, list[tf.Variable]]] = []
        size = 0
        for m in self.metrics:
            self._layout.append((size, list(m.variables)))
            size += sum(int(np.prod(v.shape)) for v in m.variables)
        self.size = size
        self._plain = [_plain_result(m) for m in self.metrics]

    @property
    def names(self) -> list[str]:
        """The metrics' names, as they appear in TensorBoard, events and COMPLETE."""
        return [m.name for m in self.metrics]

    def __bool__(self) -> bool:
        return bool(self.metrics)

    def state(self, y, pred) -> tf.Tensor:
        """The metrics' state for one batch, as a float32 vector of `size` (in a `tf.function`)."""
        logits = tf.cast(_under_softmax(pred), tf.float32)
        pred = tf.cast(pred, tf.float32)
        parts = []
        for m, (_, variables) in zip(self.metrics, self._layout, strict=True):
            zeros = [tf.zeros(v.shape, v.dtype) for v in variables]
            given = logits if isinstance(m, ARGMAX_ONLY) else pred
            parts += [tf.reshape(tf.cast(t, tf.float32), [-1]) for t in m.stateless_update_state(zeros, y, given)]
        return tf.concat(parts, 0) if parts else tf.zeros([0], tf.float32)

    def results(self, state) -> dict[str, float]:
        """Each metric's value for a summed state vector.

        The loop asks this for every --log-every point of a call (tens a call): Keras's stateless
        result is several eager ops a metric, about half a millisecond a point, so the metrics that
        Keras computes as `total / count` or `total` are computed here, by the same float operations.
        """
        state = np.asarray(state, np.float32)
        out = {}
        for m, (offset, variables), plain in zip(self.metrics, self._layout, self._plain, strict=True):
            if plain is not None:
                out[m.name] = plain(state[offset:offset + len(variables)])
                continue
            values, at = [], offset
            for v in variables:
                n = int(np.prod(v.shape))
                values.append(tf.cast(tf.reshape(state[at:at + n], v.shape), v.dtype))
                at += n
            out[m.name] = float(tf.reduce_mean(tf.cast(m.stateless_result(values), tf.float32)))
        return out


def _plain_result(metric):
    """For a metric whose result is Keras's `Mean`'s (the accuracies, the mean errors, a function's mean) or
    `Sum`'s, not overridden: its result from its state slots `[total, count]` or `[total]`, in numpy, with
    Keras's casts and its divide_no_nan. None for any other metric (Keras's stateless result computes it)."""
    dtype = np.dtype(metric.dtype) if metric.dtype in ("float32", "float64") else None
    names = [v.name for v in metric.variables]
    if dtype is None or any(tuple(v.shape) for v in metric.variables):
        return None
    if type(metric).result is keras.metrics.Mean.result and names == ["total", "count"]:
        count_dtype = np.dtype(metric.variables[1].dtype)

        def mean(slots) -> float:
            total = slots[0].astype(dtype)
            count = slots[1].astype(count_dtype).astype(dtype)
            return float(np.float32(total / count if count != 0 else dtype.type(0)))

        return mean
    if type(metric).result is keras.metrics.Sum.result and names == ["total"]:
        return lambda slots: float(np.float32(slots[0].astype(dtype)))
    return None


def first_replica_only(local_replicas: int):
    """A replica function passing a worker's value on its first replica only, zeros elsewhere:
    summed over all replicas, it gives the sum over the workers."""

    def fn(value):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.where(tf.equal(replica % local_replicas, 0), value, tf.zeros_like(value))

    return fn


class Evaluator:
    """The validation pass: the model over the whole validation set, loss and metrics.

    Every worker evaluates its share of the validation batches (batch i goes to worker
    i mod workers) on its own copy of the model, then the workers' sums are all-reduced
    once. The model is called with `training=False`: no random stream is drawn (dropout
    is off) and no training variable changes, so evaluating never moves the training.
    """

    def __init__(self, strategy, model, loss: Callable, metrics: MetricSet, dataset: tf.data.Dataset, *,
                 workers: int = 1, worker: int = 0):
        self.strategy = strategy
        self.model = model
        self.loss = loss
        self.metrics = metrics
        self.workers = workers
        if workers > 1:
            dataset = dataset.shard(workers, worker)
        opts = tf.data.Options()
        # The workers' shares are taken above; tf.data must not shard again.
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        self.dataset = dataset.with_options(opts)
        self._pass = tf.function(self._sums)
        self._traced = False
        # Seconds the latest pass spent tracing the pass (its first of the attempt; 0 after): a one-off
        # cost, not the pass's, which the `eval_slow` share leaves out.
        self.trace_seconds = 0.0
        self._reduce = None
        if workers > 1:
            local = len(strategy.extended.worker_devices)
            keep = first_replica_only(local)

            @tf.function
            def reduce(total):
                return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(keep, args=(total,)), axis=None)

            self._reduce = reduce

    def _sums(self, dataset):
        total = tf.zeros([2 + self.metrics.size], tf.float32)  # [loss sum, examples, metric states]
        for x, y in dataset:
            pred = self.model(x, training=False)
            per = self.loss(y, pred)
            n = tf.cast(tf.shape(per)[0], tf.float32)
            total += tf.concat([[tf.reduce_sum(per), n], self.metrics.state(y, pred)], 0)
        return total

    def run(self) -> tuple[dict[str, float], int, float]:
        """Evaluate now: (`{"loss": …, metric: …}`, examples evaluated, seconds)."""
        started = time.monotonic()
        self.trace_seconds = 0.0
        if not self._traced and not tf.config.functions_run_eagerly():
            self._pass.get_concrete_function(self.dataset)
            self._traced = True
            self.trace_seconds = time.monotonic() - started
        total = self._pass(self.dataset)
        if self._reduce is not None:
            total = self._reduce(total)
        total = total.numpy()
        examples = int(round(float(total[1])))
        if examples == 0:
            raise MetricError("the validation set is empty (no batch came from it)")
        results = {"loss": float(total[0] / total[1]), **self.metrics.results(total[2:])}
        return results, examples, time.monotonic() - started


class KeepBest:
    """`--keep-best val_METRIC[:min|:max]`: which evaluation is the run's best so far."""

    def __init__(self, text: str):
        self.metric, self.mode = keep_best_mode(text)

    def check(self, recorded: list[str]) -> None:
        """Refuse a metric the evaluation does not record (one line naming --keep-best)."""
        if self.metric not in recorded:
            raise MetricError(f"--keep-best {self.metric} (run.keepBest): the evaluation records "
                              f"{', '.join(recorded)}; name one of them")

    def better(self, value: float, best: dict | None) -> bool:
        """Whether `value` beats the best so far (a NaN never does; the first value always does)."""
        if not np.isfinite(value):
            return False
        if best is None:
            return True
        return value > best["value"] if self.mode == "max" else value < best["value"]


def validation_names(results: dict[str, float]) -> dict[str, float]:
    """`{"loss": …, "accuracy": …}` → `{"val_loss": …, "val_accuracy": …}`, as Keras names them."""
    return {f"val_{k}": v for k, v in results.items()}
