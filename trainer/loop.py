"""The training step and the loop that drives it: one custom training loop for one machine or several.

One loop serves one machine (MirroredStrategy) and several (MultiWorkerMirroredStrategy):
`strategy.run` inside a `tf.function`, fed by `strategy.experimental_distribute_dataset`
(one replica on the CPU: by the data set's own iterator). A call runs many steps (about a
second's worth by default) and returns every step's loss, so TensorBoard keeps a point per
--log-every step while the host waits on the device once per call.
A checkpoint is the model's and optimizer's variables (dropout RNG state included) written
with `tf.train.Checkpoint`, plus `state.json` (step, batches and examples consumed), so a
resumed run continues with the very next batch. Each checkpoint is a snapshot of the
variables taken between two calls, written to its own local folder and uploaded in the
background (one worker; several write in the loop); a stop request (SIGTERM, the run folder's STOP)
makes the loop end after its current call, and the ending commits that step synchronously.
With several workers a stop request is all-reduced inside every step, so all workers stop
after the same step.

`TrainLoop` owns the model, the step, the loop's cadence (log, progress, checkpoints) and
pacing (steps per call). The attempt around it (lease, cluster, exit code, the run's
endings) is `trainer.attempt`'s. The pieces the loop drives live beside it: saving and
restoring checkpoints in `trainer.checkpointer` (`Checkpointer`), committing them to the
bucket in `trainer.checkpoints` (`CheckpointStore`), TensorBoard scalars in
`trainer.summaries`, events in `trainer.events`, the run folder's names in `trainer.layout`,
the model's metrics and the validation pass in `trainer.metrics` (the loop decides when to
evaluate: every --eval-every-steps and at the end; a new best by --keep-best is checkpointed
at once and kept out of the pruning).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import keras
import tensorflow as tf

from trainer import data as data_mod
from trainer import data_state, layout
from trainer import summaries as summaries_mod
from trainer.checkpointer import STATE_FILE, Checkpointer
from trainer.checkpoints import CheckpointStore
from trainer.config import TrainConfig
from trainer.events import EventLog
from trainer.metrics import EVAL_WARN_SHARE, Evaluator, KeepBest, MetricError, MetricSet, validation_names
from trainer.models import ModelSpec, build_model
from trainer.signals import StopKeyPoller, StopRequest

# A step's request, all-reduced (SUM) across workers: [checkpoint now, stop, cancel the run];
# any worker's non-zero entry is every worker's decision. (ReduceOp has no MAX.)
_GO, _CHECKPOINT, _STOP, _CANCEL = (0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 1.0, 1.0)

# --steps-per-call auto: a call lasts about this long (a stop request waits for the call to end)...
CALL_SECONDS = 1.0
# ...with several workers, a fixed count instead: every worker must run the same steps per call,
# and their clocks would choose differently.
MULTI_WORKER_STEPS_PER_CALL = 10


@dataclass
class RunState:
    """Counters saved beside each checkpoint; what a resume needs besides the variables."""

    step: int = 0
    batches_seen: int = 0
    examples_seen: int = 0
    train_seconds: float = 0.0
    loss: float | None = None
    # The newest evaluation ({step, metrics, examples, seconds}) and the best so far by
    # --keep-best ({metric, mode, step, value, metrics}): saved in each checkpoint, so the
    # best's identity survives preemption with the commit that made it count.
    evaluated: dict | None = None
    best: dict | None = None
    train_metrics: dict | None = None  # the newest --log-every step's training metrics
    eval_seconds: float = 0.0  # the whole run's validation passes


def resolve_precision(cfg: TrainConfig) -> str:
    """The Keras precision policy this run uses (`--precision`, else by model and device)."""
    if cfg.precision is not None:
        return cfg.precision
    on_gpu = bool(tf.config.list_physical_devices("GPU"))
    return "mixed_bfloat16" if cfg.model == "transformer-lm" and on_gpu else "float32"


def configure_runtime(cfg: TrainConfig) -> str:
    """Seeds, op determinism and the Keras precision policy; returns the policy name."""
    keras.utils.set_random_seed(cfg.seed)
    if cfg.deterministic:
        tf.config.experimental.enable_op_determinism()
    precision = resolve_precision(cfg)
    keras.mixed_precision.set_global_policy(precision)
    return precision


def seeded_model(cfg: TrainConfig, strategy) -> ModelSpec:
    """Seed every generator, then build the model and its optimizer: the run's initial state.

    Keras draws the seed of every initializer (and random layer) given none from Python's
    global `random`, which `configure_runtime` has just seeded. Nothing else may draw from
    it until the model is built: the object-store clients do on every retry (botocore's and
    google-api-core's backoff jitter), so the caller must have no store transfer in flight
    (`EventLog.flush`). Otherwise a retried write during the build changes the initial
    weights, and the run trains to a different result (issue 14).
    """
    configure_runtime(cfg)
    with strategy.scope():
        spec = build_model(cfg)
        spec.optimizer.build(spec.model.trainable_variables)
    return spec


def per_example_loss(spec: ModelSpec, y, pred) -> tf.Tensor:
    """One float32 loss per example (extra axes, e.g. sequence positions, averaged)."""
    loss_fn = spec.loss
    per = loss_fn.call(y, pred) if isinstance(loss_fn, keras.losses.Loss) else loss_fn(y, pred)
    per = tf.cast(per, tf.float32)
    if per.shape.rank and per.shape.rank > 1:
        per = tf.reduce_mean(per, axis=list(range(1, per.shape.rank)))
    return per


def make_train_step(strategy, spec: ModelSpec, cfg: TrainConfig, global_micro_batch: int, multi_worker: bool,
                    examples: tf.Variable, metrics: MetricSet | None = None):
    """A `tf.function(iterator, count, request)` running `count` optimizer steps on every replica.

    Returns (each step's loss, a vector of `count`; the request agreed by all workers). Every
    step's loss comes back so that one call may span several --log-every steps: the
    TensorBoard points stay where they were while the host syncs once per call. With
    `metrics`, a third value: each step's metric state over its global batch (`count` rows
    of `metrics.size`, see `trainer.metrics`).
    """
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

    # Replicas of this worker: the first of them carries the worker's sums into the all-reduce.
    local_replicas = len(strategy.extended.worker_devices)

    @tf.function
    def train_steps(iterator, count, request):
        # `count` steps per call: one Python round trip for many steps, which is what makes
        # a small model fast. Inside the loop only this worker's replicas are summed (no
        # collective); the sums cross workers once per call, not per step.
        losses = tf.TensorArray(tf.float32, size=tf.cast(count, tf.int32))
        states = tf.TensorArray(tf.float32, size=tf.cast(count, tf.int32), element_shape=[size])
        n = tf.constant(0, tf.int64)
        for i in tf.range(count):
            x, y = next(iterator)
            step_loss, step_n, step_state = strategy.run(replica_step, args=(x, y))
            losses = losses.write(tf.cast(i, tf.int32),
                                  tf.add_n([tf.cast(v, tf.float32) for v in strategy.experimental_local_results(step_loss)]))
            n += tf.add_n(strategy.experimental_local_results(step_n))
            if size:
                states = states.write(tf.cast(i, tf.int32), tf.add_n(strategy.experimental_local_results(step_state)))
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


class TrainLoop:
    """The training of one attempt: the model and its checkpoints, the step, and the loop that drives it.

    The loop decides when to checkpoint (every --checkpoint-every-steps or -seconds), how many
    steps each call runs (--steps-per-call, or about CALL_SECONDS' worth) and when to stop (a
    signal, the run folder's STOP, the last step). What the attempt does around it (the
    lease, the cluster, the exit code, the run's endings) is `trainer.attempt`'s.
    """

    def __init__(self, cfg: TrainConfig, *, store, ckstore: CheckpointStore, events: EventLog,
                 emit: Callable[..., dict], stop: StopRequest, stop_key: StopKeyPoller, chief: bool,
                 multi_worker: bool, work: str, workers: int = 1, worker: int = 0):
        self.cfg = cfg
        self.store = store
        self.ckstore = ckstore
        ckstore.on_commit = self._on_commit
        self.events = events
        self.emit = emit  # the attempt's: records the event as its own
        self.stop = stop
        self.stop_key = stop_key
        self.chief = chief
        self.multi_worker = multi_worker
        self.workers, self.worker = workers, worker
        self.work = work
        self.strategy = None
        self.global_micro = self.global_batch = 0
        self.spec: ModelSpec | None = None
        self.examples: tf.Variable | None = None
        self.checkpointer: Checkpointer | None = None  # made once the model exists (build)
        self.pipeline = None  # (iterator, train step) once training starts: see train
        self.staging = None  # the --data-uri files downloading while the stream runs (trainer.staging)
        self._element_spec = None  # the training stream's (x, y) specs, once it is made
        self.commit_seconds: list[tuple[int, float]] = []
        self.cancelled = False
        self.state = RunState()
        self.rate: float | None = None
        self.loop_seconds = 0.0
        self.loop_examples = 0
        # The loop's first call traces the step: its seconds and examples, to report the steady speed.
        self.first_call: tuple[float, int] | None = None
        self.auto_steps = 1  # --steps-per-call auto: grows from the calls' measured durations
        self.summaries = summaries_mod.Summaries(summaries_mod.local_dir(self.work), self.store, enabled=False)
        # Metrics and evaluation (trainer.metrics), set up with the data: see _setup_metrics.
        self.metrics: MetricSet | None = None
        self.evaluator: Evaluator | None = None
        self.keep_best = KeepBest(cfg.keep_best) if cfg.keep_best else None
        self.since_eval = 0.0  # training seconds since the last evaluation (or the attempt's start)
        self.pending_best: int | None = None  # a best's step whose checkpoint is not committed yet

    def use(self, strategy) -> None:
        """Train under `strategy`: the global batch follows its replicas."""
        self.strategy = strategy
        self.global_micro = self.cfg.batch_size * strategy.num_replicas_in_sync
        self.global_batch = self.global_micro * self.cfg.grad_accum

    def build(self) -> None:
        """The seeded model and optimizer, the examples counter and the checkpointer."""
        spec = seeded_model(self.cfg, self.strategy)
        self.spec = spec
        self.examples = tf.Variable(0, dtype=tf.int64, trainable=False)
        # Lists of the variables themselves: Keras 3 models are not tracked by attribute.
        n = len(spec.model.variables)

        def checkpoint_of(values: list) -> tf.train.Checkpoint:
            return tf.train.Checkpoint(model=list(values[:n]), optimizer=list(values[n:]))

        # One worker writes its checkpoints from a snapshot on a thread; several write theirs
        # together in the loop, as MultiWorkerMirroredStrategy's variables require.
        self.checkpointer = Checkpointer(self.ckstore, work=self.work, chief=self.chief,
                                         variables=[*spec.model.variables, *spec.optimizer.variables],
                                         model=self.cfg.model, checkpoint_of=checkpoint_of,
                                         background=not self.multi_worker)

    def restore(self) -> None:
        """Continue from the newest committed checkpoint, if there is one."""
        found = self.checkpointer.restore()
        if found is not None:
            step, saved = found
            self.state = RunState(**{k: saved[k] for k in asdict(RunState()) if k in saved})
            self.emit(layout.RESUMED, step=step, examples_seen=self.state.examples_seen,
                      batches_seen=self.state.batches_seen)
            if self.state.best is not None:
                # The best's checkpoint stays out of the pruning in this attempt too.
                self.ckstore.protect = {int(self.state.best["step"])}
        self.examples.assign(self.state.examples_seen)

    # -- metrics and evaluation --

    def _setup_metrics(self, y_spec) -> None:
        """The model's metrics and, when there is a validation set, the evaluator (once per attempt)."""
        if self.metrics is not None:
            return
        spec, cfg = self.spec, self.cfg
        try:
            validation = data_mod.make_validation(spec, cfg, self.global_batch)
        except ValueError as e:
            raise MetricError(str(e)) from None
        if y_spec is None and validation is not None:
            y_spec = validation.element_spec[1]
        outputs = getattr(spec.model, "outputs", None)
        out_shape = tuple(outputs[0].shape) if outputs else None
        self.metrics = MetricSet(spec.metrics, y_spec, out_shape)
        if validation is not None:
            self.evaluator = Evaluator(self.strategy, spec.model, lambda y, pred: per_example_loss(spec, y, pred),
                                       self.metrics, validation, workers=self.workers, worker=self.worker)
        if self.keep_best is not None:
            if self.evaluator is None:
                raise MetricError(f"--keep-best {cfg.keep_best} (run.keepBest) needs a validation set: give "
                                  "--validation-data-uri (run.validationDataUri) or ModelSpec.make_validation")
            self.keep_best.check([f"val_{n}" for n in ("loss", *self.metrics.names)])
        elif cfg.eval_every_steps and self.evaluator is None:
            raise MetricError(f"--eval-every-steps {cfg.eval_every_steps} (run.evalEverySteps) needs a validation "
                              "set: give --validation-data-uri (run.validationDataUri) or ModelSpec.make_validation")

    def _eval_due(self, step: int) -> bool:
        every = self.cfg.eval_every_steps
        return self.evaluator is not None and bool(every) and step % every == 0 and step < self.cfg.steps

    def evaluate(self) -> bool:
        """One validation pass at the current step: TensorBoard, the `evaluated` event, the best; True for a new best."""
        st = self.state
        results, examples, seconds = self.evaluator.run()
        st.eval_seconds += seconds
        named = validation_names(results)
        st.evaluated = {"step": st.step, "metrics": named, "examples": examples, "seconds": round(seconds, 3)}
        new_best = False
        if self.keep_best is not None and self.keep_best.better(named[self.keep_best.metric], st.best):
            kb = self.keep_best
            st.best = {"metric": kb.metric, "mode": kb.mode, "step": st.step, "value": named[kb.metric],
                       "metrics": named}
            new_best = True
            # Kept out of the pruning from its commit on; the previous best stays until then.
            self.ckstore.protect = set(self.ckstore.protect) | {st.step}
            self.pending_best = st.step
        self.summaries.scalars(st.step, {**{f"validation/{k}": v for k, v in results.items()},
                                         "eval_s": seconds})
        trained = self.since_eval
        share = seconds / trained if trained > 0 else None
        self.emit(layout.EVALUATED, step=st.step, metrics=named, examples=examples, seconds=round(seconds, 3),
                  train_seconds=round(trained, 3), share=None if share is None else round(share, 4),
                  eval_seconds_total=round(st.eval_seconds, 3), **({"best": st.best} if st.best else {}))
        if share is not None and share > EVAL_WARN_SHARE:
            self.emit(layout.EVAL_SLOW, step=st.step, seconds=round(seconds, 3), train_seconds=round(trained, 3),
                      share=round(share, 4),
                      message=f"the validation pass took {share:.0%} of the training time since the last one "
                              f"(over {EVAL_WARN_SHARE:.0%}): evaluate less often (--eval-every-steps, "
                              "run.evalEverySteps) or on a smaller validation set")
        self.since_eval = 0.0
        self._progress()
        return new_best

    def final_evaluation(self) -> None:
        """The end of the run's evaluation, on every worker, unless this step was already evaluated."""
        self._setup_metrics(None)
        st = self.state
        if self.evaluator is not None and (st.evaluated is None or st.evaluated.get("step") != st.step):
            self.evaluate()

    def latest_metrics(self) -> dict[str, float]:
        """The newest training metrics and validation results (val_…), for progress, status and COMPLETE."""
        found = dict(self.state.train_metrics or {})
        if self.state.evaluated:
            found.update(self.state.evaluated["metrics"])
        return found

    def _progress(self) -> None:
        st = self.state
        extra = {}
        if st.evaluated or st.train_metrics:
            extra["metrics"] = self.latest_metrics()
        if st.evaluated:
            extra["evaluated_step"] = st.evaluated["step"]
            extra["eval_seconds"] = round(st.eval_seconds, 3)
        self.events.progress(st.step, self.cfg.steps, st.loss, self.rate, best=st.best, **extra)

    def load_best(self) -> bool:
        """Read the best checkpoint's variables into the model (for the export); False when it cannot be read."""
        best = self.state.best
        if best is None or int(best["step"]) == self.state.step:
            return best is not None
        return self.checkpointer.read_step(int(best["step"]))

    def train(self) -> bool:
        """The input pipeline and the step, then the loop; returns True when stopped by a request."""
        cfg, spec, strategy = self.cfg, self.spec, self.strategy
        # One replica on the CPU: the distributed iterator only adds per-step bookkeeping
        # (measured: bench/RESULTS.md); the plain one feeds the same batches in the same order.
        plain = strategy.num_replicas_in_sync == 1 and "CPU" in strategy.extended.worker_devices[0].upper()
        iterator, skipped = self._input(plain)
        self._setup_metrics(self._element_spec[1])
        train_step = make_train_step(strategy, spec, cfg, self.global_micro, self.multi_worker, self.examples,
                                     self.metrics)
        self.summaries = summaries_mod.Summaries(summaries_mod.local_dir(self.work), self.store, enabled=self.chief)

        # Kept past this method: freeing the input pipeline waits for tf.data's autotuning thread
        # to wake, which took 7-22 s after a long run (see trainer/__main__.py). Held here, it is
        # freed with the attempt, after the lease and the event log are closed, or never (the CLI
        # keeps the attempt and ends with os._exit).
        self.pipeline = (iterator, train_step)
        loop_started, examples_before = time.monotonic(), self.state.examples_seen
        try:
            stopped = self._loop(train_step, iterator, self.examples, skipped)
        finally:
            if self.staging is not None:
                self.staging.close()
        self.loop_seconds = time.monotonic() - loop_started
        self.loop_examples = self.state.examples_seen - examples_before
        return stopped

    def _pipeline(self, skip: int):
        ds, self.staging = data_mod.make_stream(self.spec, self.cfg, self.global_batch, data_mod.Position(skip),
                                                emit=self.emit)
        if self.multi_worker:
            # DATA sharding of a stream batched by the global batch: every worker builds the same
            # stream and takes its own slice of each global batch, so N workers train on exactly
            # the examples one worker would (tests/trainer/test_cluster.py compares the weights).
            opts = tf.data.Options()
            opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
            ds = ds.with_options(opts)
        self._element_spec = ds.element_spec
        return ds

    def _input(self, plain: bool):
        """The input iterator at the run's position, and the skip the loop reports once its first call ran.

        A model's own `make_dataset` continues from the iterator state saved in the checkpoint
        where there is one (`trainer.data_state`), else its pipeline skips the consumed batches.
        Returns (iterator, None or (batches skipped, why, when the pipeline was made)).
        """
        st, strategy = self.state, self.strategy
        user = self.spec.make_dataset is not None
        saved, why = None, "the checkpoint holds no input pipeline state"
        if self.cfg.data_state_max_mb <= 0:
            why = "--data-state-max-mb is 0"  # neither saved nor used
        elif user and st.batches_seen and self.checkpointer.restored_dir:
            with open(os.path.join(self.checkpointer.restored_dir, STATE_FILE)) as fh:
                entry = json.load(fh)
            saved = data_state.saved_state_prefix(self.checkpointer.restored_dir, entry)
            why = (entry.get("data_state") or {}).get("reason") or why
        skipped = None
        if saved is not None and plain:
            prefix, skip = saved
            started = time.monotonic()
            iterator = iter(self._pipeline(skip))
            try:
                data_state.restore_iterator(iterator, prefix)
            except (tf.errors.OpError, ValueError, AssertionError) as e:
                # The pipeline changed since (another make_dataset): its old state cannot place it.
                detail = " ".join(str(e).split())[:200]
                skipped = (st.batches_seen, f"the saved input pipeline state does not fit this make_dataset ({detail})")
            else:
                self.emit(layout.DATA_RESTORED, batches_seen=st.batches_seen, skip=skip,
                          seconds=round(time.monotonic() - started, 3), bytes=data_state.state_bytes(
                              self.checkpointer.restored_dir))
        elif user and st.batches_seen:
            skipped = (st.batches_seen, why if plain else data_state.DISTRIBUTED)
        skip = saved[1] if saved is not None and skipped is None else st.batches_seen
        if saved is None or skipped is not None:
            ds = self._pipeline(st.batches_seen)
            iterator = iter(ds) if plain else iter(strategy.experimental_distribute_dataset(ds))
            if skipped is not None:
                skipped = (*skipped, time.monotonic())  # the skip runs from here, in tf.data's threads
        if user:
            self.checkpointer.data = data_state.DataState(iterator if plain else None, skip=skip,
                                                          max_mb=self.cfg.data_state_max_mb, emit=self.emit,
                                                          reason=None if plain else data_state.DISTRIBUTED)
        return iterator, skipped

    def speed(self) -> dict:
        """This attempt's training loop only (checkpoints included; start-up and export not)."""
        if not self.loop_seconds:
            return {}
        speed = {"loop_seconds": round(self.loop_seconds, 3),
                 "examples_per_sec": round(self.loop_examples / self.loop_seconds, 1)}
        if self.first_call and self.loop_seconds > self.first_call[0] and self.loop_examples > self.first_call[1]:
            # Without the first call, which traces the step: what the loop does once running.
            first_s, first_n = self.first_call
            speed["steady_examples_per_sec"] = round((self.loop_examples - first_n) / (self.loop_seconds - first_s), 1)
        return speed

    def _loop(self, train_step, iterator, examples: tf.Variable, skipped: tuple | None = None) -> bool:
        """Train until the last step or a stop request; returns True when stopped by a signal.

        `skipped` (batches, why, when the pipeline was made): the pipeline skips the consumed
        batches before its first, and a `data_skipped` event says how long the first call
        waited for them (the tracing of the step excluded).
        """
        cfg, st = self.cfg, self.state
        self.events.start_bar(cfg.steps, st.step)
        last_ckpt_time = last_log_time = last_progress = time.monotonic()
        last_log_step, last_examples = st.step, int(examples.numpy())
        requests = {r: tf.constant(r, tf.float32) for r in (_GO, _CHECKPOINT, _STOP, _CANCEL)}
        if self.chief:
            self.stop_key.start()
        count_tensors: dict[int, tf.Tensor] = {}

        def counts(n: int) -> tf.Tensor:
            if n not in count_tensors:
                count_tensors[n] = tf.constant(n, tf.int64)
            return count_tensors[n]

        loss_t = None
        trace_seconds = 0.0
        if skipped is not None:
            # Traced first, so that the first call's wait is the skip's (and its own steps'), not the tracing.
            started = time.monotonic()
            train_step.get_concrete_function(iterator, counts(self._steps_this_call(st.step)), requests[_GO])
            trace_seconds = time.monotonic() - started
        try:
            while st.step < cfg.steps:
                step_started = time.monotonic()
                if self.stop_key.requested:
                    request = _CANCEL
                elif self.stop.requested:
                    request = _STOP
                elif self._seconds_due(last_ckpt_time):
                    request = _CHECKPOINT
                else:
                    request = _GO
                count = self._steps_this_call(st.step)
                call_first = st.step + 1
                try:
                    loss_t, agreed, *states = train_step(iterator, counts(count), requests[request])
                except tf.errors.OpError:
                    if self.staging is not None:
                        self.staging.check()  # a file that could not be staged: its own words, not TF's
                    raise
                call_seconds = time.monotonic() - step_started
                self.since_eval += call_seconds
                if self.staging is not None:
                    self.staging.check()  # a download failed: the run fails now, not when it needs the file
                if self.first_call is None:
                    self.first_call = (call_seconds, count * self.global_batch)  # traced the step: not a measure
                    if self.staging is not None:
                        self.emit(layout.DATA_FIRST_STEP, step=st.step + count, **self.staging.on_disk())
                    if skipped is not None:
                        batches, why, made = skipped
                        self.emit(layout.DATA_SKIPPED, batches=batches, steps=count, reason=why,
                                  seconds=round(time.monotonic() - made - trace_seconds, 3))
                else:
                    self._adapt_steps(count, call_seconds)
                st.step += count
                st.batches_seen += count
                st.train_seconds += time.monotonic() - step_started
                if self.multi_worker:
                    request = tuple(float(v) for v in agreed.numpy())
                elif self.stop_key.requested:
                    request = _CANCEL  # one machine needs no agreement: stop after this very step
                elif self.stop.requested:
                    request = _STOP
                wants_ckpt, wants_stop, wants_cancel = (v > 0 for v in request)
                now = time.monotonic()
                # The --log-every steps this call ran, and its last step when it ends the run.
                logged = [s for s in range(call_first, st.step + 1) if s % cfg.log_every == 0]
                if (st.step == cfg.steps or wants_stop) and st.step not in logged:
                    logged.append(st.step)
                if logged:
                    losses = loss_t.numpy()
                    st.loss = float(losses[-1])
                    seen = int(examples.numpy())
                    rate = (seen - last_examples) / max(now - last_log_time, 1e-9)
                    step_time = (now - last_log_time) / max(st.step - last_log_step, 1)
                    rows = states[0].numpy() if states else None
                    for s in logged:  # one call's points share its speed: it was measured once
                        if rows is not None:
                            st.train_metrics = self.metrics.results(rows[s - call_first])
                        self._summaries(s, float(losses[s - call_first]), rate, step_time)
                    self.events.update_bar(st.step, st.loss, rate)
                    self.rate = rate
                    if now - last_progress >= cfg.progress_every_seconds:
                        self._progress()
                        last_progress = now
                    last_log_time, last_log_step, last_examples = now, st.step, seen
                if wants_stop:
                    self.cancelled = wants_cancel
                    return True
                # A new best is checkpointed at once: the checkpoint is what keepBest keeps.
                new_best = self._eval_due(st.step) and self.evaluate()
                steps_due = cfg.checkpoint_every_steps and st.step % cfg.checkpoint_every_steps == 0
                if (steps_due or wants_ckpt or new_best) and st.step < cfg.steps:
                    st.examples_seen = int(examples.numpy())
                    self._checkpoint(sync=False)
                    last_ckpt_time = time.monotonic()
            return False
        finally:
            self.stop_key.close()
            st.examples_seen = int(examples.numpy())
            if loss_t is not None and int(tf.size(loss_t)):
                st.loss = float(loss_t[-1])
            self.events.stop_bar()

    def _steps_this_call(self, step: int) -> int:
        """Steps for the next call: up to --steps-per-call (or auto), never past a step checkpoint or the end."""
        cfg = self.cfg
        if cfg.steps_per_call is not None:
            want = cfg.steps_per_call
        elif self.multi_worker:
            want = MULTI_WORKER_STEPS_PER_CALL
        else:
            want = self.auto_steps
        n = min(want, cfg.steps - step)
        if cfg.checkpoint_every_steps:
            n = min(n, cfg.checkpoint_every_steps - step % cfg.checkpoint_every_steps)
        if cfg.eval_every_steps and self.evaluator is not None:
            n = min(n, cfg.eval_every_steps - step % cfg.eval_every_steps)
        return max(1, n)

    def _adapt_steps(self, count: int, seconds: float) -> None:
        """--steps-per-call auto: as many steps as take about CALL_SECONDS, at most doubling per call."""
        per_step = max(seconds / max(count, 1), 1e-6)
        self.auto_steps = max(1, min(2 * max(self.auto_steps, count), int(CALL_SECONDS / per_step)))

    def _seconds_due(self, last: float) -> bool:
        every = self.cfg.checkpoint_every_seconds
        return bool(every) and self.chief and time.monotonic() - last >= every

    def _summaries(self, step: int, loss: float, rate: float, step_time: float) -> None:
        if not self.summaries.enabled:
            return
        while self.commit_seconds:
            ckpt_step, seconds = self.commit_seconds.pop(0)
            self.summaries.scalars(ckpt_step, {"checkpoint_s": seconds})
        lr = self.spec.optimizer.learning_rate
        self.summaries.scalars(step, {
            "train/loss": loss,
            **{f"train/{k}": v for k, v in (self.state.train_metrics or {}).items()},
            "learning_rate": float(lr.numpy() if hasattr(lr, "numpy") else lr),
            "examples_per_sec": rate,
            "step_time_s": step_time,
        })

    # -- checkpoints --

    def _checkpoint(self, *, sync: bool) -> None:
        """Save the current step, then commit it to the run (in the background unless `sync`)."""
        started = time.monotonic()
        st = self.state
        doc = {**asdict(st), "attempt": self.events.attempt, "seed": self.cfg.seed, "model": self.cfg.model}
        # In the background the loop waits for the snapshot only (trainer.checkpointer): that is what this measures.
        committing = self.checkpointer.save(st.step, doc, sync=sync)
        self.summaries.scalars(st.step, {"checkpoint_save_s": time.monotonic() - started})
        if not committing:
            return
        if sync:
            self._wait_uploads()
        self._progress()
        self.events.background(self.summaries.sync)

    def _wait_uploads(self) -> None:
        """Wait for a background upload; one that failed is reported, not fatal (a newer commit follows)."""
        e = self.checkpointer.wait_uploads()
        if e is not None:
            self.emit(layout.CHECKPOINT_FAILED, reason=f"{type(e).__name__}: {e}")

    def _on_commit(self, info: dict) -> None:
        # Called from the upload thread too: only record, the loop writes the summaries.
        if self.checkpointer is not None:
            self.checkpointer.committed(int(info["step"]))
        if self.pending_best is not None and int(info["step"]) == self.pending_best:
            # The new best is committed: the previous one may be pruned from now on.
            self.ckstore.protect = {self.pending_best}
            self.pending_best = None
        self.commit_seconds.append((int(info["step"]), float(info.get("seconds", 0.0))))
        self.emit(layout.CHECKPOINT, step=int(info["step"]), seconds=info.get("seconds"), bytes=info.get("bytes"))

    def commit_current(self) -> None:
        """Make sure the current step is committed, synchronously (every ending does, before it is written)."""
        if self.checkpointer.async_step == self.state.step:
            self._wait_uploads()  # its upload is already under way: let it finish
        if self.checkpointer.last_committed != self.state.step:
            self._checkpoint(sync=True)
