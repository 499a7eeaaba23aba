"""The loop that drives the training step, for one machine or several.

`TrainLoop` owns the model and its run state (`RunState`, saved beside each checkpoint so a
resume continues with the very next batch), and the loop: it calls the step
(`trainer.step`: many steps per call, every step's loss back, a stop or checkpoint request
all-reduced across workers so all act after the same step), and does what `trainer.cadence`
says is due between two calls: TensorBoard points and progress, a validation pass
(`trainer.evaluation`; a new best by --keep-best is checkpointed at once and kept out of the
pruning), a checkpoint (a snapshot written and uploaded in the background with one worker,
in the loop with several: `trainer.tf_checkpoint`, committed by `trainer.checkpoint_store`), the end.
A stop request (SIGTERM, the run folder's STOP) ends the loop after its current call; the
ending commits that step synchronously. The input at the run's position is `trainer.feed`'s;
the attempt around the loop (lease, cluster, exit code, the run's endings) is `trainer.loop_attempt`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import tensorflow as tf

from runfolder import layout
from trainer import summaries as summaries_mod
from trainer.cadence import Cadence
from trainer.checkpoint_store import CheckpointStore
from trainer.config import TrainConfig
from trainer.evaluation import Validation
from trainer.events import EventLog
from trainer.feed import open_feed
from trainer.input_threads import InputThreads
from trainer.models import ModelSpec, seeded_model
from trainer.signals import StopKeyPoller, StopRequest
from trainer.step import CANCEL, CHECKPOINT, GO, STOP, make_train_step
from trainer.tf_checkpoint import Checkpointer


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

    def latest_metrics(self) -> dict[str, float]:
        """The newest training metrics and validation results (val_…), for progress, status and COMPLETE."""
        return {**(self.train_metrics or {}), **(self.evaluated["metrics"] if self.evaluated else {})}

    def progress_extra(self) -> dict:
        """What the progress file says besides step and loss: the metrics and the newest evaluation."""
        extra = {}
        if self.evaluated or self.train_metrics:
            extra["metrics"] = self.latest_metrics()
        if self.evaluated:
            extra["evaluated_step"] = self.evaluated["step"]
            extra["eval_seconds"] = round(self.eval_seconds, 3)
        return extra


def learning_rate(spec: ModelSpec) -> float:
    """The optimizer's learning rate now (a variable, a schedule's value at its step, or a number)."""
    lr = spec.optimizer.learning_rate
    return float(lr.numpy() if hasattr(lr, "numpy") else lr)


def training_scalars(spec: ModelSpec, st: RunState, loss: float, rate: float, step_time: float,
                     lr: float | None = None) -> dict:
    """A --log-every step's TensorBoard scalars: its loss and metrics, the learning rate (`lr`, read
    from the optimizer when not given), the speed."""
    return {"train/loss": loss, **{f"train/{k}": v for k, v in (st.train_metrics or {}).items()},
            "learning_rate": learning_rate(spec) if lr is None else lr,
            "examples_per_sec": rate, "step_time_s": step_time}


def loop_speed(seconds: float, examples: int, first_call: tuple[float, int] | None) -> dict:
    """A training loop's speed (checkpoints included; start-up and export not), and its steady speed
    without the first call, which traces the step."""
    if not seconds:
        return {}
    speed = {"loop_seconds": round(seconds, 3), "examples_per_sec": round(examples / seconds, 1)}
    if first_call and seconds > first_call[0] and examples > first_call[1]:
        first_s, first_n = first_call
        speed["steady_examples_per_sec"] = round((examples - first_n) / (seconds - first_s), 1)
    return speed


class TrainLoop:
    """The training of one attempt: the model and its checkpoints, and the loop that drives the step.

    The loop trains, checkpoints and stops when its `Cadence` says (`trainer.cadence`), or on a
    signal or the run folder's STOP. What the attempt does around it (the lease, the cluster,
    the exit code, the run's endings) is `trainer.loop_attempt`'s.
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
        self.stop, self.stop_key = stop, stop_key
        self.chief, self.multi_worker = chief, multi_worker
        self.workers, self.worker = workers, worker
        self.work = work
        self.strategy = None
        self.global_micro = self.global_batch = 0
        self.spec: ModelSpec | None = None
        self.examples: tf.Variable | None = None
        self.checkpointer: Checkpointer | None = None  # made once the model exists (build)
        self.pipeline = None  # (iterator, train step) once training starts: see train
        self.staging = None  # the --data-uri files downloading while the stream runs (trainer.staging)
        self.input_threads = InputThreads(enabled=False)  # the pipeline's threads, once there is one (train)
        self.commit_seconds: list[tuple[int, float]] = []
        self.cancelled = False
        self.state = RunState()
        self.rate: float | None = None
        self.loop_seconds, self.loop_examples = 0.0, 0
        self.loop_from = (time.monotonic(), 0)  # when this attempt's loop started, and the examples seen then
        # The loop's first call traces the step: its seconds and examples, to report the steady speed.
        self.first_call: tuple[float, int] | None = None
        self.cadence = Cadence(cfg, chief=chief, multi_worker=multi_worker)  # when: trainer.cadence
        self.summaries = summaries_mod.Summaries(summaries_mod.local_dir(self.work), self.store, enabled=False)
        # Metrics, validation passes and the best (trainer.evaluation), set up with the data.
        self.validation = Validation(cfg, ckstore=ckstore, emit=emit)

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

    def _setup_metrics(self, y_spec) -> None:
        self.validation.setup(self.spec, self.strategy, self.global_batch, y_spec, workers=self.workers,
                              worker=self.worker)
        self.cadence.evaluates = self.validation.evaluator is not None

    def evaluate(self) -> bool:
        """One validation pass at the current step (`trainer.evaluation`); True for a new best."""
        new_best = self.validation.evaluate(self.state, self.summaries.scalars)
        self._progress()
        return new_best

    def final_evaluation(self) -> None:
        """The end of the run's evaluation, on every worker, unless this step was already evaluated."""
        self._setup_metrics(None)
        if self.validation.due_at_end(self.state):
            self.evaluate()

    def _progress(self) -> None:
        st = self.state
        self.events.progress(st.step, self.cfg.steps, st.loss, self.rate, best=st.best, **st.progress_extra())

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
        # In-memory arrays on one replica need neither: open_feed gives the step an ArraySource.
        plain = strategy.num_replicas_in_sync == 1 and "CPU" in strategy.extended.worker_devices[0].upper()
        # With --input-priority idle, the threads a make_dataset pipeline starts from here on yield the
        # cores to the step (trainer/input_threads.py). One replica on the CPU only: where it was measured.
        self.input_threads = InputThreads(enabled=plain and cfg.input_priority == "idle")
        feed = open_feed(spec, cfg, strategy, global_batch=self.global_batch, multi_worker=self.multi_worker,
                         plain=plain, batches_seen=self.state.batches_seen,
                         restored_dir=self.checkpointer.restored_dir, emit=self.emit)
        iterator, skipped, self.staging = feed.iterator, feed.skipped, feed.staging
        if feed.data is not None:
            self.checkpointer.data = feed.data
        self._setup_metrics(feed.element_spec[1])
        train_step = make_train_step(strategy, spec, cfg, self.global_micro, self.multi_worker, self.examples,
                                     self.validation.metrics)
        self.summaries = summaries_mod.Summaries(summaries_mod.local_dir(self.work), self.store, enabled=self.chief)

        # Kept past this method: freeing the input pipeline waits for tf.data's autotuning thread
        # to wake, which took 7-22 s after a long run (see trainer/__main__.py). Held here, it is
        # freed with the attempt, after the lease and the event log are closed, or never (the CLI
        # keeps the attempt and ends with os._exit).
        self.pipeline = (iterator, train_step)
        try:
            stopped = self._loop(train_step, iterator, self.examples, skipped)
        finally:
            if self.staging is not None:
                self.staging.close()
        loop_started, examples_before = self.loop_from
        self.loop_seconds = time.monotonic() - loop_started
        self.loop_examples = self.state.examples_seen - examples_before
        # What progress.json says from here on (the ending's evaluation and commit write it) is the
        # `finished` event's figure.
        self.rate = self.speed().get("examples_per_sec", self.rate)
        return stopped

    def speed(self) -> dict:
        """This attempt's training loop only (checkpoints included; start-up and export not)."""
        return loop_speed(self.loop_seconds, self.loop_examples, self.first_call)

    def _loop(self, train_step, iterator, examples: tf.Variable, skipped: tuple | None = None) -> bool:
        """Train until the last step or a stop request; returns True when stopped by a signal.

        What each call does is the step's (`trainer.step`); when to log, report, evaluate,
        checkpoint and end is the cadence's (`trainer.cadence`). `skipped` (batches, why,
        when the pipeline was made): the pipeline skips the consumed batches before its
        first, and a `data_skipped` event says how long the first call waited for them (the
        tracing of the step excluded).
        """
        cfg, st, cadence = self.cfg, self.state, self.cadence
        self.events.start_bar(cfg.steps, st.step)
        last_log = (time.monotonic(), st.step, int(examples.numpy()))  # when, at which step, examples seen
        self.loop_from = (last_log[0], last_log[2])
        cadence.start(last_log[0])
        requests = {r: tf.constant(r, tf.float32) for r in (GO, CHECKPOINT, STOP, CANCEL)}
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
            train_step.get_concrete_function(iterator, counts(cadence.steps_this_call(st.step)), requests[GO])
            trace_seconds = time.monotonic() - started
        try:
            while not cadence.finished(st.step):
                step_started = time.monotonic()
                request = self._request(CHECKPOINT if cadence.checkpoint_seconds_due(step_started) else GO)
                count = cadence.steps_this_call(st.step)
                call_first = st.step + 1
                try:
                    loss_t, agreed, *states = train_step(iterator, counts(count), requests[request])
                except tf.errors.OpError:
                    if self.staging is not None:
                        self.staging.check()  # a file that could not be staged: its own words, not TF's
                    raise
                call_seconds = time.monotonic() - step_started
                self._called(st.step + count, count, call_seconds, skipped, trace_seconds)
                st.step += count
                st.batches_seen += count
                st.train_seconds += time.monotonic() - step_started
                # Several workers act on the request they agreed on; one acts on its own at once.
                request = tuple(float(v) for v in agreed.numpy()) if self.multi_worker else self._request(request)
                wants_ckpt, wants_stop, wants_cancel = (v > 0 for v in request)
                now = time.monotonic()
                logged = cadence.logged_steps(call_first, st.step, ending=cadence.finished(st.step) or wants_stop)
                if logged:
                    last_log = self._log(logged, call_first, loss_t, states, now, last_log)
                if wants_stop:
                    self.cancelled = wants_cancel
                    return True
                # A new best is checkpointed at once: the checkpoint is what keepBest keeps.
                new_best = cadence.evaluation_due(st.step) and self.evaluate()
                if cadence.checkpoint_due(st.step, requested=wants_ckpt, new_best=new_best):
                    st.examples_seen = int(examples.numpy())
                    self._checkpoint(sync=False)
                    cadence.checkpointed(time.monotonic())
            return False
        finally:
            self.stop_key.close()
            st.examples_seen = int(examples.numpy())
            if loss_t is not None and int(tf.size(loss_t)):
                st.loss = float(loss_t[-1])
            self.events.stop_bar()

    def _log(self, logged: list[int], call_first: int, loss_t, states: list, now: float,
             last_log: tuple[float, int, int]) -> tuple[float, int, int]:
        """A call's --log-every points (TensorBoard), the bar and progress; returns this log's (when, step, examples)."""
        st = self.state
        last_time, last_step, last_examples = last_log
        losses = loss_t.numpy()
        st.loss = float(losses[-1])
        seen = int(self.examples.numpy())
        rate = (seen - last_examples) / max(now - last_time, 1e-9)
        step_time = (now - last_time) / max(st.step - last_step, 1)
        rows = states[0].numpy() if states else None
        points = []
        # One call's points share its speed, measured once, and the learning rate, read after the call
        # (an eager read of the optimizer's variable or schedule: once, not once a point).
        lr = learning_rate(self.spec)
        for s in logged:
            if rows is not None:
                st.train_metrics = self.validation.metrics.results(rows[s - call_first])
            points.append((s, training_scalars(self.spec, st, float(losses[s - call_first]), rate, step_time, lr)))
        self._summaries(points)
        # The speed said (the bar, progress.json: ops status and its ETA) is the attempt's loop so far,
        # checkpoints and evaluations included, as the `finished` event's; TensorBoard's curve is this log's.
        self.rate = loop_speed(now - self.loop_from[0], seen - self.loop_from[1], None).get("examples_per_sec")
        self.events.update_bar(st.step, st.loss, self.rate)
        if self.cadence.progress_due(now):
            self._progress()
        return now, st.step, seen

    def _request(self, otherwise: tuple) -> tuple:
        """This worker's request: cancel (the run folder's STOP), stop (a signal), else `otherwise`."""
        if self.stop_key.requested:
            return CANCEL
        if self.stop.requested:
            return STOP
        return otherwise

    def _called(self, step: int, count: int, seconds: float, skipped: tuple | None, trace_seconds: float) -> None:
        """After a call of `count` steps up to `step`: the staging's health, the first call's events, pacing."""
        if self.staging is not None:
            self.staging.check()  # a download failed: the run fails now, not when it needs the file
        self.validation.since_eval += seconds
        self.input_threads.settle()
        if self.first_call is not None:
            self.cadence.adapt(count, seconds)
            return
        self.first_call = (seconds, count * self.global_batch)  # traced the step: not a measure
        if self.staging is not None:
            self.emit(layout.DATA_FIRST_STEP, step=step, **self.staging.on_disk())
        if skipped is not None:
            batches, why, made = skipped
            self.emit(layout.DATA_SKIPPED, batches=batches, steps=count, reason=why,
                      seconds=round(time.monotonic() - made - trace_seconds, 3))

    def _summaries(self, points: list[tuple[int, dict]]) -> None:
        """A call's training points, and the commits' durations recorded since, to TensorBoard in one write."""
        if self.summaries.enabled:
            commits = []
            while self.commit_seconds:  # recorded by the upload thread, written here
                ckpt_step, seconds = self.commit_seconds.pop(0)
                commits.append((ckpt_step, {"checkpoint_s": seconds}))
            self.summaries.series(commits + points)

    def _checkpoint(self, *, sync: bool) -> None:
        """Save the current step, then commit it to the run (in the background unless `sync`)."""
        started = time.monotonic()
        st = self.state
        doc = {**asdict(st), "attempt": self.events.attempt, "seed": self.cfg.seed, "model": self.cfg.model}
        # In the background the loop waits for the snapshot only (trainer.tf_checkpoint): that is what this measures.
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
        self.validation.committed(int(info["step"]))
        self.commit_seconds.append((int(info["step"]), float(info.get("seconds", 0.0))))
        self.emit(layout.CHECKPOINT, step=int(info["step"]), seconds=info.get("seconds"), bytes=info.get("bytes"))

    def commit_current(self) -> None:
        """Make sure the current step is committed, synchronously (every ending does, before it is written)."""
        if self.checkpointer.async_step == self.state.step:
            self._wait_uploads()  # its upload is already under way: let it finish
        if self.checkpointer.last_committed != self.state.step:
            self._checkpoint(sync=True)
