"""The training run: restore, one custom training loop, signals, the run's endings.

`train(cfg)` runs a whole attempt and returns the process exit code: 0 finished
(COMPLETE written) or cancelled (the run folder's STOP found: a checkpoint committed,
CANCELLED written), 143 stopped by SIGTERM/SIGINT after a committed checkpoint, 1 failed,
78 this machine cannot run the run (the GPUs asked for are not seen: `trainer.devices`),
77 another machine's trainer holds the run's lease (`trainer.lease`: one writer per run).

One loop serves one machine (MirroredStrategy) and several (MultiWorkerMirroredStrategy):
`strategy.run` inside a `tf.function`, fed by `strategy.experimental_distribute_dataset`
(one replica on the CPU: by the data set's own iterator). A call runs many steps (about a
second's worth by default) and returns every step's loss, so TensorBoard keeps a point per
--log-every step while the host waits on the device once per call.
A checkpoint is the model's and optimizer's variables (dropout RNG state included) written
with `tf.train.Checkpoint`, plus `state.json` (step, batches and examples consumed), so a
resumed run continues with the very next batch. Each checkpoint is saved to its own local
folder and uploaded in the background; SIGTERM makes the loop finish its step, save, wait
for uploads, commit synchronously and exit 143. With several workers a stop request is
all-reduced inside every step, so all workers stop after the same step.

The pieces the loop drives live beside it: saving and restoring checkpoints in
`trainer.checkpointer` (`Checkpointer`), committing them to the bucket in
`trainer.checkpoints` (`CheckpointStore`), TensorBoard scalars in `trainer.summaries`,
events and what they add up to in `trainer.events`, the run folder's names and exit codes
in `trainer.layout`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import keras
import tensorflow as tf

from trainer import cluster as cluster_mod
from trainer import data as data_mod
from trainer import export as export_mod
from trainer import layout
from trainer import summaries as summaries_mod
from trainer.checkpointer import Checkpointer, ResumeMismatch
from trainer.config import TrainConfig, as_dict
from trainer.devices import DeviceMismatch, check_gpus
from trainer.events import EventLog, read_events, utc_now
from trainer.lease import LeaseHeld, LeaseLost, RunLease
from trainer.models import ModelSpec, build_model
from trainer.signals import StopKeyPoller, StopRequest
from trainer.strategy import Cluster, make_strategy, read_cluster

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
                    examples: tf.Variable):
    """A `tf.function(iterator, count, request)` running `count` optimizer steps on every replica.

    Returns (each step's loss, a vector of `count`; the request agreed by all workers). Every
    step's loss comes back so that one call may span several --log-every steps: the
    TensorBoard points stay where they were while the host syncs once per call.
    """
    model, opt = spec.model, spec.optimizer
    accum = cfg.grad_accum
    scaled = isinstance(opt, keras.optimizers.LossScaleOptimizer)
    denom = global_micro_batch * accum  # the mean over the whole step's examples

    def grads_of(x, y):
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            loss = tf.nn.compute_average_loss(per_example_loss(spec, y, pred), global_batch_size=denom)
            target = opt.scale_loss(loss) if scaled else loss
        return loss, tape.gradient(target, model.trainable_variables)

    if cfg.xla:
        grads_of = tf.function(grads_of, jit_compile=True)

    def replica_step(x, y):
        if accum == 1:
            loss, grads = grads_of(x, y)
        else:
            xs = tf.reshape(x, tf.concat([[accum, -1], tf.shape(x)[1:]], 0))
            ys = tf.reshape(y, tf.concat([[accum, -1], tf.shape(y)[1:]], 0))
            loss = tf.constant(0.0)
            grads = [tf.zeros_like(v) for v in model.trainable_variables]
            for i in tf.range(accum):
                micro_loss, micro_grads = grads_of(xs[i], ys[i])
                loss += micro_loss
                grads = [g + mg for g, mg in zip(grads, micro_grads, strict=True)]
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss, tf.shape(x, out_type=tf.int64)[0]

    # Replicas of this worker: the first of them carries the worker's sums into the all-reduce.
    local_replicas = len(strategy.extended.worker_devices)

    @tf.function
    def train_steps(iterator, count, request):
        # `count` steps per call: one Python round trip for many steps, which is what makes
        # a small model fast. Inside the loop only this worker's replicas are summed (no
        # collective); the sums cross workers once per call, not per step.
        losses = tf.TensorArray(tf.float32, size=tf.cast(count, tf.int32))
        n = tf.constant(0, tf.int64)
        for i in tf.range(count):
            x, y = next(iterator)
            step_loss, step_n = strategy.run(replica_step, args=(x, y))
            losses = losses.write(tf.cast(i, tf.int32),
                                  tf.add_n([tf.cast(v, tf.float32) for v in strategy.experimental_local_results(step_loss)]))
            n += tf.add_n(strategy.experimental_local_results(step_n))
        losses = losses.stack()
        if not multi_worker:
            examples.assign_add(n)
            return losses, request

        def first_replica_only(value):
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            return tf.where(tf.equal(replica % local_replicas, 0), value, tf.zeros_like(value))

        # Every worker learns each step's loss and the examples, and whether any worker wants a
        # checkpoint or a stop, after the same step, so they all save and stop together. The
        # sum of the requests is non-zero where any worker's is.
        packed = tf.concat([losses, request], 0)
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(first_replica_only, args=(packed,)), axis=None)
        examples.assign_add(strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(first_replica_only, args=(n,)),
                                            axis=None))
        return total[:-3], total[-3:]

    return train_steps


class Run:
    """One attempt of a run: owns the store, the events, the model and the loop's state."""

    def __init__(self, cfg: TrainConfig, *, stream=None, stop: StopRequest | None = None):
        from trainer.checkpoints import CheckpointStore
        from trainer.storage import open_store

        self.cfg = cfg
        self.cluster: Cluster = read_cluster()
        self.chief = self.cluster.is_chief
        self.store = open_store(cfg.run_uri)
        self.history = read_events(self.store)
        attempt = 1 + layout.attempts(self.history)
        self.events = EventLog(self.store if self.chief else None, attempt=attempt, stream=stream)
        self.own_events: list[dict] = []
        self.ckstore = CheckpointStore(self.store, keep=cfg.keep_checkpoints, emit=self._store_event,
                                       on_commit=self._on_commit)
        self.checkpointer = None  # made once the model exists (_train)
        self.pipeline = None  # (iterator, train step) once training starts: see _train
        self.commit_seconds: list[tuple[int, float]] = []
        self._own_work = cfg.work_dir is None
        self.work = cfg.work_dir or tempfile.mkdtemp(prefix="trainstack-")
        os.makedirs(self.work, exist_ok=True)
        self.stop = stop or StopRequest()
        # The run folder's STOP (ops stop): the chief polls it; a cancel reaches the other
        # workers through the step's all-reduced request.
        self.stop_key = StopKeyPoller(self.store)
        self.cancelled = False
        self.state = RunState()
        self.rate: float | None = None
        self.loop_seconds = 0.0
        self.loop_examples = 0
        # The loop's first call traces the step: its seconds and examples, to report the steady speed.
        self.first_call: tuple[float, int] | None = None
        self.auto_steps = 1  # --steps-per-call auto: grows from the calls' measured durations
        self.summaries = summaries_mod.Summaries(summaries_mod.local_dir(self.work), self.store, enabled=False)
        self.startup: cluster_mod.StartupWatchdog | None = None
        # The chief writes the run's objects, so it alone takes the run's lease.
        self.lease = RunLease(self.store, ttl_s=cfg.lease_ttl_s, wait_s=cfg.lease_wait_s, on_lost=self._lease_lost,
                              emit=self._lease_event) if self.chief else None

    def _lease_event(self, kind: str, fields: dict) -> None:
        # Printed only: until it holds the lease this trainer writes nothing to the run.
        self.events.emit(kind, local_only=True, **fields)

    def _lease_lost(self, reason: str) -> None:
        # Another machine took the run: stop after this step; the final commit's fence refuses.
        self.stop.signal_name = layout.LEASE_LOST
        self.stop.event.set()

    def emit(self, event: str, **fields) -> dict:
        ev = self.events.emit(event, **fields)
        self.own_events.append(ev)
        if event == layout.FAILED_EVENT and not self.chief:
            # Not the chief's: events.jsonl is not this worker's to write (see trainer.cluster).
            cluster_mod.record_worker_event(self.store, self.cluster.address, ev)
        return ev

    def _store_event(self, kind: str, fields: dict) -> None:
        # A retry of the log's own writes is printed, not appended to the log it failed to
        # write (that would queue one more write per retry while the store is down).
        own = fields.get("key") in (layout.EVENTS_KEY, layout.PROGRESS_KEY)
        if own:
            self.events.emit(kind, local_only=True, **fields)
        else:
            self.emit(kind, **fields)

    # -- phases --

    def run(self) -> int:
        """The whole attempt; returns the exit code."""
        self.stop.install()
        try:
            if self._already_complete():
                return layout.EXIT_OK
            if self.lease is not None:
                self.lease.acquire()
                self.lease.start()
                self.ckstore.lease = self.lease
            return self._train()
        except (LeaseHeld, LeaseLost) as e:
            # Another machine trains this run: say so here, write nothing there.
            self.events.emit(layout.FAILED_EVENT, local_only=True, reason=str(e), step=self.state.step)
            return layout.EXIT_LEASE_HELD
        except DeviceMismatch as e:
            # This machine can never run this run: say why once, and let the supervisor end it.
            self.emit(layout.FAILED_EVENT, reason=str(e), step=self.state.step, **e.details)
            return layout.EXIT_UNUSABLE
        except ResumeMismatch as e:
            # Another model's checkpoints: no retry can help, and nothing was written to the run.
            self.emit(layout.FAILED_EVENT, reason=str(e), step=self.state.step)
            return layout.EXIT_UNUSABLE
        except Exception as e:  # noqa: BLE001 - any failure ends the attempt the same way
            if self.cluster.multi_worker and cluster_mod.peer_loss(e):
                return self._peer_lost(e)
            self.emit(layout.FAILED_EVENT, reason=f"{type(e).__name__}: {e}", step=self.state.step)
            return layout.EXIT_FAILED
        finally:
            if self.startup is not None:
                self.startup.disarm()
            if self.lease is not None:
                self.lease.release()
            self.stop.restore()
            self.stop_key.close()
            self.events.close()
            if self._own_work:
                shutil.rmtree(self.work, ignore_errors=True)

    def _already_complete(self) -> bool:
        """True (and says so) when the run already ended as COMPLETE or CANCELLED: nothing to do."""
        from trainer.storage import read_json

        for marker, kind, when in ((layout.COMPLETE, layout.ALREADY_COMPLETE, "finished_at"),
                                   (layout.CANCELLED, layout.ALREADY_CANCELLED, "cancelled_at")):
            done = read_json(self.store, marker)
            if done is None:
                continue
            # Printed, not appended: the run's log ended with its `finished` or `cancelled` event.
            message = self._complete_message(done) if marker == layout.COMPLETE else f"run already {marker}; nothing to do"
            line = {layout.EVENT: kind, layout.TIME: done.get(when), layout.ATTEMPT: self.events.attempt,
                    "step": done.get(layout.MARKER_STEP), "message": message}
            self.events.stream.write(json.dumps(line) + "\n")
            self.events.stream.flush()
            return True
        return False

    def _complete_message(self, done: dict) -> str:
        step = done.get(layout.MARKER_STEP)
        if isinstance(step, int) and self.cfg.steps > step:
            # A COMPLETE run is never extended in place: its model and COMPLETE record stay what they are.
            return (f"run already COMPLETE at {step} steps; --steps {self.cfg.steps} does not extend it. To train "
                    f"further, start a new run id (another --run-uri, or run.id in the stack)")
        return "run already COMPLETE; nothing to do"

    def _train(self) -> int:
        cfg = self.cfg
        check_gpus(cfg.gpus_per_node)
        if self.cluster.multi_worker:
            # A little later than the peers' wait below, so the two never race to report the same
            # wait; the native deadline later still, after the watchdog's time to record.
            self.startup = cluster_mod.StartupWatchdog(
                cfg.startup_timeout + 5, self._no_cluster_exit,
                native_grace=5 + cluster_mod.RECORD_TIMEOUT_S + 5).start()
            missing = cluster_mod.wait_for_peers(self.cluster.address, self.cluster.peers,
                                                 self.startup.started_at + cfg.startup_timeout,
                                                 stop=lambda: self.stop.requested)
            if self.stop.requested:
                # A notice while waiting for the peers: nothing trained in this attempt, so the
                # newest committed checkpoint is where the run stands; stop now, not at the timeout.
                self.startup.disarm()
                steps = self.ckstore.committed_steps()
                self.emit(layout.PREEMPTED, step=steps[-1] if steps else 0, signal=self.stop.signal_name,
                          seconds=0.0, examples_seen=None)
                return layout.EXIT_PREEMPTED
            if missing:
                self.startup.disarm()
                self._no_cluster(missing)
                return layout.EXIT_NO_CLUSTER
        strategy = make_strategy(self.cluster)
        self.stop.reclaim()
        precision = resolve_precision(cfg)
        replicas = strategy.num_replicas_in_sync
        global_micro = cfg.batch_size * replicas
        global_step_batch = global_micro * cfg.grad_accum
        self.global_batch = global_step_batch
        self.emit(layout.STARTED, config=as_dict(cfg), workers=self.cluster.workers, worker=self.cluster.index,
                  replicas=replicas, global_batch=global_step_batch, precision=precision)
        # The `started` write (and its retries) must be over before the generators are
        # seeded: see seeded_model.
        self.events.flush()
        spec = seeded_model(cfg, strategy)
        if self.startup is not None:
            # Every worker has passed the strategy's barrier and the variables' broadcast: the
            # cluster formed. From here a lost peer shows as a collective error (_peer_lost).
            self.startup.disarm()
        self.spec = spec
        examples = tf.Variable(0, dtype=tf.int64, trainable=False)
        # Lists of the variables themselves: Keras 3 models are not tracked by attribute.
        ckpt = tf.train.Checkpoint(model=list(spec.model.variables), optimizer=list(spec.optimizer.variables))
        self.checkpointer = Checkpointer(self.ckstore, ckpt, work=self.work, chief=self.chief,
                                         variables=[*spec.model.variables, *spec.optimizer.variables],
                                         model=cfg.model)

        self._restore()
        examples.assign(self.state.examples_seen)
        if self.state.step >= cfg.steps:
            return self._finish(examples)

        ds = data_mod.make_dataset(spec, cfg, global_step_batch, data_mod.Position(self.state.batches_seen))
        if self.cluster.multi_worker:
            # DATA sharding of a stream batched by the global batch: every worker builds the same
            # stream and takes its own slice of each global batch, so N workers train on exactly
            # the examples one worker would (tests/trainer/test_cluster.py compares the weights).
            opts = tf.data.Options()
            opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
            ds = ds.with_options(opts)
        if replicas == 1 and "CPU" in strategy.extended.worker_devices[0].upper():
            # One replica on the CPU: the distributed iterator only adds per-step bookkeeping
            # (measured: bench/RESULTS.md); the plain one feeds the same batches in the same order.
            iterator = iter(ds)
        else:
            iterator = iter(strategy.experimental_distribute_dataset(ds))
        train_step = make_train_step(strategy, spec, cfg, global_micro, self.cluster.multi_worker, examples)
        self.summaries = summaries_mod.Summaries(summaries_mod.local_dir(self.work), self.store, enabled=self.chief)

        # Kept past this method: freeing the input pipeline waits for tf.data's autotuning thread
        # to wake, which took 7-22 s after a long run (see trainer/__main__.py). Held here, it is
        # freed with the Run, after the lease and the event log are closed, or never (the CLI
        # keeps the Run and ends with os._exit).
        self.pipeline = (iterator, train_step)
        loop_started, examples_before = time.monotonic(), self.state.examples_seen
        stopped = self._loop(train_step, iterator, examples)
        self.loop_seconds = time.monotonic() - loop_started
        self.loop_examples = self.state.examples_seen - examples_before
        if stopped:
            return self._cancel(examples) if self.cancelled else self._preempt(examples)
        return self._finish(examples)

    def _restore(self) -> None:
        found = self.checkpointer.restore()
        if found is None:
            return
        step, saved = found
        self.state = RunState(**{k: saved[k] for k in asdict(RunState()) if k in saved})
        self.emit(layout.RESUMED, step=step, examples_seen=self.state.examples_seen, batches_seen=self.state.batches_seen)

    def _loop(self, train_step, iterator, examples: tf.Variable) -> bool:
        """Train until the last step or a stop request; returns True when stopped by a signal."""
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
                loss_t, agreed = train_step(iterator, counts(count), requests[request])
                call_seconds = time.monotonic() - step_started
                if self.first_call is None:
                    self.first_call = (call_seconds, count * self.global_batch)  # traced the step: not a measure
                else:
                    self._adapt_steps(count, call_seconds)
                st.step += count
                st.batches_seen += count
                st.train_seconds += time.monotonic() - step_started
                if self.cluster.multi_worker:
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
                    for s in logged:  # one call's points share its speed: it was measured once
                        self._summaries(s, float(losses[s - call_first]), rate, step_time)
                    self.events.update_bar(st.step, st.loss, rate)
                    self.rate = rate
                    if now - last_progress >= cfg.progress_every_seconds:
                        self.events.progress(st.step, cfg.steps, st.loss, rate)
                        last_progress = now
                    last_log_time, last_log_step, last_examples = now, st.step, seen
                if wants_stop:
                    self.cancelled = wants_cancel
                    return True
                steps_due = cfg.checkpoint_every_steps and st.step % cfg.checkpoint_every_steps == 0
                if (steps_due or wants_ckpt) and st.step < cfg.steps:
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
        elif self.cluster.multi_worker:
            want = MULTI_WORKER_STEPS_PER_CALL
        else:
            want = self.auto_steps
        n = min(want, cfg.steps - step)
        if cfg.checkpoint_every_steps:
            n = min(n, cfg.checkpoint_every_steps - step % cfg.checkpoint_every_steps)
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
            "loss": loss,
            "learning_rate": float(lr.numpy() if hasattr(lr, "numpy") else lr),
            "examples_per_sec": rate,
            "step_time_s": step_time,
        })

    # -- several workers --

    def _no_cluster(self, missing: list[str]) -> None:
        """The cluster did not form in time: the `failed` event naming the workers waited for."""
        cl = self.cluster
        reason = (f"the {cl.workers} workers did not form a cluster within --startup-timeout "
                  f"{self.cfg.startup_timeout:g} s; waited for {', '.join(cl.peers)}"
                  + (f" (no trainer listening at {', '.join(missing)})" if missing else "")
                  + ". Not this machine's failure: the machines form a new cluster and the run resumes "
                  "from its newest committed checkpoint")
        self.emit(layout.FAILED_EVENT, reason=reason, step=self.state.step, exit_code=layout.EXIT_NO_CLUSTER,
                  waited_for=cl.peers, unreachable=missing, worker=cl.index, address=cl.address)

    def _no_cluster_exit(self) -> None:
        """The start-up watchdog fired (its own thread; the main one is stuck in TensorFlow): record, exit 75."""
        self._no_cluster(cluster_mod.unreachable(self.cluster.peers))
        self.events.flush(timeout=cluster_mod.RECORD_TIMEOUT_S)
        if self._own_work:
            shutil.rmtree(self.work, ignore_errors=True)
        cluster_mod.hard_exit(layout.EXIT_NO_CLUSTER)

    def _peer_lost(self, error: BaseException) -> int:
        """A collective failed because a peer went away: say which, exit 76 (75 before the cluster formed)."""
        cl = self.cluster
        forming = self.startup is not None and self.startup.armed
        code = layout.EXIT_NO_CLUSTER if forming else layout.EXIT_PEER_LOST
        lost = cluster_mod.lost_peers(error, cl.addresses, cl.index)
        committed = self.checkpointer.last_committed if self.checkpointer is not None else None
        what = "while the cluster formed" if forming else f"after step {self.state.step}"
        reason = (f"a peer was lost {what} ({', '.join(lost) or 'a worker'}): {cluster_mod.brief_error(error)}. "
                  "Not this machine's failure: the run resumes from its newest committed checkpoint")
        self.emit(layout.FAILED_EVENT, reason=reason, step=self.state.step, exit_code=code, lost=lost,
                  committed_step=committed, worker=cl.index, address=cl.address)
        return code

    # -- checkpoints --

    def _checkpoint(self, *, sync: bool) -> None:
        """Save the current step, then commit it to the run (in the background unless `sync`)."""
        started = time.monotonic()
        st = self.state
        doc = {**asdict(st), "attempt": self.events.attempt, "seed": self.cfg.seed, "model": self.cfg.model}
        folder = self.checkpointer.save_local(st.step, doc)
        self.summaries.scalars(st.step, {"checkpoint_save_s": time.monotonic() - started})
        if not self.checkpointer.commit(st.step, folder, sync=sync):
            return
        if sync:
            self._wait_uploads()
        self.events.progress(st.step, self.cfg.steps, st.loss, self.rate)
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
        self.commit_seconds.append((int(info["step"]), float(info.get("seconds", 0.0))))
        self.emit(layout.CHECKPOINT, step=int(info["step"]), seconds=info.get("seconds"), bytes=info.get("bytes"))

    # -- endings --

    def _commit_current(self) -> None:
        """Make sure the current step is committed, synchronously."""
        if self.checkpointer.async_step == self.state.step:
            self._wait_uploads()  # its upload is already under way: let it finish
        if self.checkpointer.last_committed != self.state.step:
            self._checkpoint(sync=True)

    def _preempt(self, examples: tf.Variable) -> int:
        """Stopped by a signal: commit the current step synchronously, emit `preempted`."""
        started = time.monotonic()
        self._commit_current()
        self.events.flush()
        self.emit(layout.PREEMPTED, step=self.state.step, signal=self.stop.signal_name,
                  seconds=round(time.monotonic() - started, 3), examples_seen=self.state.examples_seen)
        return layout.EXIT_PREEMPTED

    def _cancel(self, examples: tf.Variable) -> int:
        """Asked to end early (STOP): commit the current step, emit `cancelled`, write CANCELLED, exit 0."""
        self._commit_current()
        self.events.flush()
        reason = self.stop_key.reason or "stop requested by the chief (STOP in the run folder)"
        st = self.state
        self.emit(layout.CANCELLED_EVENT, step=st.step, reason=reason, examples_seen=st.examples_seen)
        if not self.chief:
            return layout.EXIT_OK
        self.events.flush()
        doc = {
            layout.MARKER_STEP: st.step,
            layout.MARKER_ATTEMPTS: layout.attempts(self.history + self.own_events) or 1,
            layout.MARKER_REASON: reason,
            "examples_seen": st.examples_seen,
            "cancelled_at": utc_now(),
        }
        # Written last, after the checkpoint it names is committed: one atomic object.
        self.store.put_bytes(layout.CANCELLED, json.dumps(doc, indent=2).encode())
        return layout.EXIT_OK

    def _finish(self, examples: tf.Variable) -> int:
        """All steps done: final checkpoint, SavedModel, TensorBoard, then COMPLETE."""
        st = self.state
        st.examples_seen = int(examples.numpy())
        self._commit_current()
        if not self.chief:
            return layout.EXIT_OK
        self.events.flush()
        model_dir = os.path.join(self.work, "model")
        export_mod.export_model(self.spec.model, model_dir, self.store)
        signature = export_mod.saved_model_signature(model_dir)
        self.summaries.sync()
        metrics = {"loss": st.loss}
        speed = {}
        if self.loop_seconds:
            # This attempt's training loop only (checkpoints included; start-up and export not).
            speed = {"loop_seconds": round(self.loop_seconds, 3),
                     "examples_per_sec": round(self.loop_examples / self.loop_seconds, 1)}
            if self.first_call and self.loop_seconds > self.first_call[0] and self.loop_examples > self.first_call[1]:
                # Without the first call, which traces the step: what the loop does once running.
                first_s, first_n = self.first_call
                speed["steady_examples_per_sec"] = round((self.loop_examples - first_n) / (self.loop_seconds - first_s), 1)
        self.emit(layout.FINISHED, step=st.step, metrics=metrics, examples_seen=st.examples_seen, **speed)
        self.events.flush()
        export_mod.write_complete(
            self.store,
            step=st.step,
            metrics=metrics,
            examples_seen=st.examples_seen,
            events=self.history + self.own_events,
            finished_at=time.time(),
            signature=signature,
        )
        return layout.EXIT_OK


def train(cfg: TrainConfig, *, stream=None, stop: StopRequest | None = None, keep: list | None = None) -> int:
    """Run one attempt of the run `cfg` describes; returns the exit code.

    `stop` is the signal flag, when the caller installed it early (see `trainer.signals`).
    `keep`, when given, receives the attempt's `Run`, so that its TensorFlow objects outlive
    the call: `python -m trainer` then ends without freeing them (see trainer/__main__.py).
    """
    try:
        run = Run(cfg, stream=stream, stop=stop)
    except Exception as e:  # noqa: BLE001 - e.g. the run's store cannot be reached at all
        line = {layout.EVENT: layout.FAILED_EVENT, layout.TIME: utc_now(), layout.ATTEMPT: None,
                "reason": f"{type(e).__name__}: {e}"}
        out = stream or sys.stdout
        out.write(json.dumps(line) + "\n")
        out.flush()
        return layout.EXIT_FAILED
    if keep is not None:
        keep.append(run)
    return run.run()
