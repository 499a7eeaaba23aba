"""The training step: one `tf.function` call that runs many optimizer steps on every replica.

`make_train_step` builds it: `strategy.run` inside a `tf.function`, a call runs `count` steps
(gradient accumulation and XLA inside) and returns every step's loss (and metric states), so
TensorBoard keeps a point per --log-every step while the host waits on the device once per
call. With several workers the call also all-reduces the loop's request (checkpoint, stop,
cancel), so every worker acts on the same decision after the same step. What to do with a
call's results, and when, is `trainer.loop`'s and `trainer.cadence`'s.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from trainer.config import TrainConfig
from trainer.data import ArraySource
from trainer.metrics import MetricSet
from trainer.models import ModelSpec

# A step's request, all-reduced (SUM) across workers: [checkpoint now, stop, cancel the run];
# any worker's non-zero entry is every worker's decision. (ReduceOp has no MAX.)
GO, CHECKPOINT, STOP, CANCEL = (0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 1.0, 1.0)


def per_example_loss(spec: ModelSpec, y, pred) -> tf.Tensor:
    """One float32 loss per example (extra axes, e.g. sequence positions, averaged)."""
    loss_fn = spec.loss
    per = loss_fn.call(y, pred) if isinstance(loss_fn, keras.losses.Loss) else loss_fn(y, pred)
    per = tf.cast(per, tf.float32)
    if per.shape.rank and per.shape.rank > 1:
        per = tf.reduce_mean(per, axis=list(range(1, per.shape.rank)))
    return per


def make_replica_step(spec: ModelSpec, cfg: TrainConfig, global_micro_batch: int, metrics: MetricSet | None):
    """One optimizer step on one replica's batch, `(x, y) -> (loss, examples, metric state)`: the
    gradients of --grad-accum micro-batches summed (each under XLA with --xla), then applied once."""
    model, opt = spec.model, spec.optimizer
    size = metrics.size if metrics else 0
    accum = cfg.grad_accum
    scaled = isinstance(opt, keras.optimizers.LossScaleOptimizer)
    denom = global_micro_batch * accum  # the mean over the whole step's examples

    def grads_of(x, y):
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            loss = tf.nn.compute_average_loss(per_example_loss(spec, y, pred), global_batch_size=denom)
            target = opt.scale_loss(loss) if scaled else loss
        state = metrics.state(y, pred) if size else tf.zeros([0], tf.float32)
        return loss, tape.gradient(target, model.trainable_variables), state

    if cfg.xla:
        grads_of = tf.function(grads_of, jit_compile=True)

    def replica_step(x, y):
        if accum == 1:
            loss, grads, state = grads_of(x, y)
        else:
            xs = tf.reshape(x, tf.concat([[accum, -1], tf.shape(x)[1:]], 0))
            ys = tf.reshape(y, tf.concat([[accum, -1], tf.shape(y)[1:]], 0))
            loss = tf.constant(0.0)
            grads = [tf.zeros_like(v) for v in model.trainable_variables]
            state = tf.zeros([size], tf.float32)
            for i in tf.range(accum):
                micro_loss, micro_grads, micro_state = grads_of(xs[i], ys[i])
                loss += micro_loss
                grads = [g + mg for g, mg in zip(grads, micro_grads, strict=True)]
                state += micro_state
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss, tf.shape(x, out_type=tf.int64)[0], state

    return replica_step


def make_train_step(strategy, spec: ModelSpec, cfg: TrainConfig, global_micro_batch: int, multi_worker: bool,
                    examples: tf.Variable, metrics: MetricSet | None = None):
    """A `tf.function(iterator, count, request)` running `count` (at least 1) optimizer steps on every replica.

    `iterator`: the input stream's (plain or distributed) iterator, or a `trainer.data.ArraySource`
    (one replica), whose batches are gathered inside the call as the loop's state: each step takes
    the next batch while it trains on its own (`ArraySource.open_call`).

    Returns (each step's loss, a vector of `count`; the request agreed by all workers). Every
    step's loss comes back so that one call may span several --log-every steps: the
    TensorBoard points stay where they were while the host syncs once per call. With
    `metrics`, a third value: each step's metric state over its global batch (`count` rows
    of `metrics.size`, see `trainer.metrics`).
    """
    size = metrics.size if metrics else 0
    replica_step = make_replica_step(spec, cfg, global_micro_batch, metrics)

    # Replicas of this worker: the first of them carries the worker's sums into the all-reduce.
    local_replicas = len(strategy.extended.worker_devices)

    def one_step(i, x, y, losses, states, n):
        step_loss, step_n, step_state = strategy.run(replica_step, args=(x, y))
        losses = losses.write(tf.cast(i, tf.int32),
                              tf.add_n([tf.cast(v, tf.float32) for v in strategy.experimental_local_results(step_loss)]))
        n += tf.add_n(strategy.experimental_local_results(step_n))
        if size:
            states = states.write(tf.cast(i, tf.int32), tf.add_n(strategy.experimental_local_results(step_state)))
        return losses, states, n

    @tf.function
    def train_steps(iterator, count, request):
        # `count` steps per call: one Python round trip for many steps, which is what makes
        # a small model fast. Inside the loop only this worker's replicas are summed (no
        # collective); the sums cross workers once per call, not per step.
        losses = tf.TensorArray(tf.float32, size=tf.cast(count, tf.int32))
        states = tf.TensorArray(tf.float32, size=tf.cast(count, tf.int32), element_shape=[size])
        n = tf.constant(0, tf.int64)
        losses, states, n = _run_steps(iterator, count, one_step, (losses, states, n))
        losses = losses.stack()
        if not multi_worker:
            examples.assign_add(n)
            if size:
                return losses, request, states.stack()
            return losses, request

        def first_replica_only(value):
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            return tf.where(tf.equal(replica % local_replicas, 0), value, tf.zeros_like(value))

        # Every worker learns each step's loss and the examples, and whether any worker wants a
        # checkpoint or a stop, after the same step, so they all save and stop together. The
        # sum of the requests is non-zero where any worker's is.
        packed = tf.concat([losses, tf.reshape(states.stack(), [-1]) if size else losses[:0], request], 0)
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(first_replica_only, args=(packed,)), axis=None)
        examples.assign_add(strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(first_replica_only, args=(n,)),
                                            axis=None))
        steps = tf.shape(losses)[0]
        if size:
            return total[:steps], total[-3:], tf.reshape(total[steps:-3], [steps, size])
        return total[:-3], total[-3:]

    return train_steps


def _run_steps(iterator, count, one_step, carry):
    """`count` steps (at least 1) of `carry = one_step(i, x, y, *carry)` on `iterator`'s batches, inside the
    call's graph; returns the last carry. Each step is given its next batch while it trains where the
    iterator allows it."""
    if isinstance(iterator, ArraySource):
        # The batches are loop state: each step takes the next one while it trains (ArraySource.open_call).
        batch, following = iterator.open_call()
        for i in tf.range(count):
            x, y = batch
            batch, following = iterator.following(following)
            carry = one_step(i, x, y, *carry)
        iterator.close_call(count, following)
    elif isinstance(iterator, tf.data.Iterator):
        # One replica's plain iterator: the next batch is taken from it while a step trains, as the source's
        # is, and the call takes exactly `count` (the last step takes none), so the iterator's state at the
        # call's end is that of its `count` steps (what a checkpoint saves).
        batch = next(iterator)
        for i in tf.range(count):
            x, y = batch
            batch = tf.cond(i + 1 < count, lambda: next(iterator), lambda b=batch: b)  # the element's own structure
            carry = one_step(i, x, y, *carry)
    else:
        for i in tf.range(count):
            x, y = next(iterator)
            carry = one_step(i, x, y, *carry)
    return carry
