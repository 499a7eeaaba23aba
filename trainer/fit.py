"""`from trainer import fit`: trainstack's guarantees for a Keras `model.fit` script.

Three calls (docs/your-fit-script.md shows the diff):

    strategy = fit.strategy()                      # instead of tf.distribute.MirroredStrategy()
    model.fit(..., callbacks=fit.callbacks())      # instead of TensorBoard + ModelCheckpoint
    model.export(fit.model_dir())                  # or model.save(...) into that folder
    open(os.path.join(fit.output_dir(), "report.txt"), "w")   # anything else to keep: outputs/

Run by `python -m trainer --run-uri URI -- python train.py` (trainer/script.py), the callback:

- restores the run's newest committed checkpoint at train begin (model, optimizer, metric
  and dropout-RNG variables) and continues at the saved step: the finished epochs are not run
  again (`initial_epoch`), and in the epoch it stopped in, the batches it had trained on are
  drawn from the data and skipped;
- commits a checkpoint at every epoch's end and every `TRAINSTACK_CHECKPOINT_EVERY_SECONDS`
  to `<run>/checkpoints/` with the trainer's own protocol (`CheckpointStore`: files, then
  the COMMITTED marker; the newest complete one wins on restore); each records the variables'
  names and shapes, and a checkpoint of another model is refused (exit 78);
- on SIGTERM or SIGINT (a spot notice, `ops stop`, Ctrl-C) commits the current step after the
  batch in progress and exits 143;
- writes TensorBoard files to `TRAINSTACK_TENSORBOARD_DIR` (the parent uploads them to
  `tensorboard/`) and tells the parent the step, the epoch and the logs' metrics (loss,
  accuracy, val_*) for `progress.json`, the events and COMPLETE.

Outside the trainer (no `TRAINSTACK_RUN_URI`) the script runs as it would without trainstack:
`callbacks()` is a TensorBoard callback to `./logs`, `model_dir()` is `./model`, `output_dir()`
is `./outputs`.

Needs Keras, TensorFlow (the checkpoint format and the strategies), the variables' names
(`runfolder.environment`) and the store code (`runfolder.storage`,
`trainer.checkpoint_store.CheckpointStore`); nothing else of the trainer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time

import numpy as np
import tensorflow as tf

from runfolder import environment
from runfolder.exits import PREEMPTED as EXIT_PREEMPTED
from runfolder.exits import UNUSABLE as EXIT_UNUSABLE

# `TF_USE_LEGACY_KERAS=1`: the script's `tf.keras` is Keras 2 (`tf_keras`), whose `fit` trains
# under MultiWorkerMirroredStrategy; the callbacks must be of the Keras the model is.
KERAS2 = os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")
if KERAS2:
    import tf_keras as keras
else:
    import keras

# Keras 3's fit fails under MultiWorkerMirroredStrategy (its PerReplica values reach the loss).
KERAS3_MULTIWORKER = "keras-team/keras#20585"


STATE_FILE = "state.json"
CKPT_PREFIX = "ckpt"
PROGRESS_EVERY_S = 10.0


def strategy() -> tf.distribute.Strategy:
    """The distribution strategy for this machine or cluster.

    `TF_CONFIG` naming several workers: `MultiWorkerMirroredStrategy`, with Keras 2 only
    (`TF_USE_LEGACY_KERAS=1`; under Keras 3 a `RuntimeError` names keras-team/keras#20585). One or
    more GPUs: `MirroredStrategy` over them. Otherwise TensorFlow's default strategy (one device).
    """
    if _workers() > 1:
        if not KERAS2:
            raise RuntimeError(f"several workers need Keras 2: Keras 3's fit fails under MultiWorkerMirroredStrategy "
                               f"({KERAS3_MULTIWORKER}); set TF_USE_LEGACY_KERAS=1 and build the model with tf.keras "
                               "(docs/your-fit-script.md)")
        made = tf.distribute.MultiWorkerMirroredStrategy()
        if os.environ.get(environment.RUN_URI):
            # Starting the cluster's server takes SIGTERM over below Python (the stop never reached
            # the callback): the handlers again, after it.
            STOP.install()
        return made
    if tf.config.list_physical_devices("GPU"):
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def _tf_config() -> dict:
    return json.loads(os.environ.get("TF_CONFIG") or "{}")


def _workers() -> int:
    cluster = _tf_config().get("cluster", {})
    return sum(len(v) for k, v in cluster.items() if k in ("chief", "worker"))


def is_chief() -> bool:
    """This process writes the run's checkpoints: one worker alone, or the cluster's chief (the
    `chief` task, else worker 0)."""
    config = _tf_config()
    task, cluster = config.get("task") or {}, config.get("cluster") or {}
    if _workers() <= 1:
        return True
    if cluster.get("chief"):
        return task.get("type") == "chief"
    return task.get("type") == "worker" and int(task.get("index", 0)) == 0


def model_dir() -> str:
    """Where to save the model: what the script leaves there becomes the run's `model/` when it exits 0."""
    path = os.environ.get(environment.MODEL_DIR) or os.path.abspath("model")
    os.makedirs(os.path.dirname(path.rstrip("/")) or ".", exist_ok=True)
    return path


def output_dir() -> str:
    """Where to write what else the run should keep (reports, plots, CSVs): uploaded to the run's
    `outputs/` at each committed checkpoint and at the end (`ops pull --outputs` fetches it). Outside
    the trainer, `./outputs`. The working folder itself is a scratch copy of the code: not kept."""
    path = os.environ.get(environment.OUTPUT_DIR) or os.path.abspath("outputs")
    os.makedirs(path, exist_ok=True)
    return path


def stage(uri: str) -> str:
    """Copy the files under `uri` (s3://, gs:// or file://; a data set's folder) to a local folder
    and return it: `TRAINSTACK_DATA_DIR` on the machines (the data disk), else `./data`. A file
    already there whole is kept, so a resumed attempt on the same machine downloads nothing again.
    (TensorFlow 2.21 reads gs:// itself but has no s3:// filesystem: stage S3 data.)"""
    import hashlib

    from runfolder.storage import download_many, open_store
    from trainer.config import normalize_uri

    uri = normalize_uri(uri)
    store = open_store(uri)
    base = os.environ.get(environment.DATA_DIR) or os.path.abspath("data")
    dest = os.path.join(base, hashlib.sha256(uri.encode()).hexdigest()[:16])
    keys = store.list("")
    if not keys:
        raise FileNotFoundError(f"{uri}: no files to stage (check the URI and the machine's read access)")
    download_many(store, {k: os.path.join(dest, k) for k in keys})
    return dest


def tensorboard_dir() -> str:
    """Where TensorBoard files go (uploaded to the run's `tensorboard/`)."""
    return os.environ.get(environment.TENSORBOARD_DIR) or os.path.abspath("logs")


def callbacks(*, histogram_freq: int = 0, checkpoint_every_seconds: float | None = None) -> list[keras.callbacks.Callback]:
    """The callbacks to pass to `model.fit`: trainstack's run checkpoint (`RunCheckpoint`), then TensorBoard.

    `checkpoint_every_seconds` (default: the run's `--checkpoint-every-seconds`) adds commits
    between epoch ends, for long epochs.
    """
    # Keras 2 writes the train step's graph after the first batch it runs, from a trace a resume
    # that skips batches has not made yet (an AttributeError): no graph there.
    board = keras.callbacks.TensorBoard(log_dir=tensorboard_dir(), histogram_freq=histogram_freq,
                                        **({"write_graph": False} if KERAS2 else {}))
    if not os.environ.get(environment.RUN_URI):
        return [board]
    every = checkpoint_every_seconds
    if every is None and os.environ.get(environment.CHECKPOINT_EVERY_SECONDS):
        # The run's cadence as the trainer resolved it; 0 is off (epoch ends only).
        every = float(os.environ[environment.CHECKPOINT_EVERY_SECONDS]) or None
    return [RunCheckpoint(every_seconds=every, board=board), board]


class _Stop:
    """SIGTERM/SIGINT set a flag the callback checks after each batch (installed at import)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal_name: str | None = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name
        self.event.set()


STOP = _Stop()
EXIT_PEER_LOST = 76


def _peer_lost_hook(kind, value, tb) -> None:
    """Several workers: a collective that failed because a peer was lost (a notice stopped it, its
    machine went) ends the script with exit 76, which the trainer reports as the cluster's loss,
    not this machine's failure; the cluster re-forms and resumes from the chief's commit."""
    from trainer.cluster import peer_loss

    if isinstance(value, Exception) and peer_loss(value):
        print(f"trainstack: a worker of the cluster was lost ({kind.__name__}); exiting {EXIT_PEER_LOST}",
              file=sys.stderr, flush=True)
        os._exit(EXIT_PEER_LOST)
    sys.__excepthook__(kind, value, tb)


if os.environ.get(environment.RUN_URI):
    # At import, so a notice during the script's start-up is not lost: the callback stops at train begin.
    STOP.install()
    if KERAS2:
        # Keras 2's default Dropout draws from TensorFlow's op seeds, a state no checkpoint holds:
        # a resumed run would draw other masks. Layers made after this own a tf.random.Generator
        # whose state variable the checkpoint carries (_random_states), as Keras 3's layers do.
        keras.backend.experimental.enable_tf_random_generator()
    if _workers() > 1:
        sys.excepthook = _peer_lost_hook


def _name(v) -> str:
    """A variable's unique name: its path in Keras 3, its name in Keras 2."""
    return getattr(v, "path", None) or v.name


def _random_states(model) -> list:
    """Keras 2: the state variables of the layers' random generators (Dropout's masks), in layer order.
    Keras 3 keeps them among the model's variables already (its layers' SeedGenerator)."""
    if not KERAS2:
        return []
    states = []
    for layer in model._flatten_layers(include_self=False):
        generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
        if isinstance(generator, tf.random.Generator):
            states.append(generator.state)
    return states


def _metric_variables(model) -> list:
    if hasattr(model, "metrics_variables"):
        return list(model.metrics_variables)
    return [v for m in model.metrics for v in m.variables]  # Keras 2


def _plain(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class RunCheckpoint(keras.callbacks.Callback):
    """Checkpoints to the run's bucket and restores from it, stops on a signal, reports progress (see the module docstring)."""

    def __init__(self, *, every_seconds: float | None = None, board: keras.callbacks.TensorBoard | None = None) -> None:
        super().__init__()
        from runfolder.storage import open_store
        from trainer.checkpoint_store import CheckpointStore

        self.every_seconds = every_seconds
        self.board = board
        self.local = os.environ.get(environment.CHECKPOINT_DIR) or os.path.abspath("checkpoints")
        self.messages = os.environ.get(environment.MESSAGES_FILE)
        self._lock = threading.Lock()
        keep = int(os.environ.get(environment.KEEP_CHECKPOINTS) or 3)
        self.store = CheckpointStore(open_store(os.environ[environment.RUN_URI]), keep=keep,
                                     emit=self._store_event, on_commit=self._committed)
        self.workers = max(1, _workers())
        self.chief = is_chief()
        self.epoch = 0
        self.batch = 0  # batches of the current epoch trained (or skipped on resume)
        self.step = 0
        self._ckpt = None
        self._skip = 0
        self._skipped = False
        self._restored_metrics: list | None = None
        self._epoch_logs: dict = {}  # the last finished epoch's metrics, saved with each checkpoint
        self._last_save = self._last_progress = time.monotonic()
        self._epoch_started = time.monotonic()
        self.save_seconds: list[float] = []  # time the training waited for each save (measured in tests)

    # -- messages to the parent --

    def _send(self, kind: str, **fields) -> None:
        if not self.messages:
            return
        line = json.dumps({"kind": kind, **fields}, default=str) + "\n"
        with self._lock, open(self.messages, "a") as f:
            f.write(line)

    def _store_event(self, kind: str, fields: dict) -> None:
        self._send("event", event=kind, **fields)

    def _committed(self, info: dict) -> None:
        self._send("checkpoint", step=int(info["step"]), seconds=info.get("seconds"), bytes=info.get("bytes"))

    # -- state --

    def _variables(self) -> dict:
        # The metrics' variables are not among them: Keras may build them only at the first
        # step; their sums travel in state.json (see _wrap_train_function).
        model = self.model
        found = {"model": list(model.variables), "optimizer": list(model.optimizer.variables)}
        random = _random_states(model)
        return {**found, "random": random} if random else found

    def _structure(self) -> list[str]:
        return [f"{_name(v)}:{list(v.shape)}" for group in self._variables().values() for v in group]

    def _total(self) -> int | None:
        steps, epochs = self.params.get("steps"), self.params.get("epochs")
        return steps * epochs if steps and epochs else None

    # -- Keras hooks --

    def on_train_begin(self, logs=None) -> None:
        STOP.install()  # again: whatever the script started since the import may have taken the signals over
        optimizer = self.model.optimizer
        if not getattr(optimizer, "built", getattr(optimizer, "_built", False)):
            # Keras builds it at the first step; a checkpoint restored before must find its slots.
            with self.model.distribute_strategy.scope():
                optimizer.build(self.model.trainable_variables)
        self._ckpt = tf.train.Checkpoint(**self._variables())
        os.makedirs(self.local, exist_ok=True)
        self._restore()
        self._last_save = self._last_progress = time.monotonic()
        if STOP.event.is_set():
            self._stop_now()

    def _restore(self) -> None:
        dest = os.path.join(self.local, "restore")
        step = self.store.restore_latest(dest)
        if step is None:
            return
        with open(os.path.join(dest, STATE_FILE)) as f:
            state = json.load(f)
        mine, saved = self._structure(), state.get("structure") or []
        if saved != mine:
            diff = next((f"{a} here, {b} saved" for a, b in zip(mine + ["nothing"], saved + ["nothing"], strict=False)
                         if a != b), "")
            print(f"trainstack: checkpoint {step} in {self.store.store.uri} was written by another model "
                  f"(variables differ: {diff}); start a new run id for this model", file=sys.stderr)
            sys.stderr.flush()
            os._exit(EXIT_UNUSABLE)
        self._ckpt.read(os.path.join(dest, CKPT_PREFIX)).assert_consumed()
        self.step, self.epoch, self.batch = state["step"], state["epoch"], state["batch"]
        self._epoch_logs = state.get("epoch_logs") or {}
        # Keras's own BackupAndRestore resumes the same way: fit's loop starts at the saved epoch
        # (Keras 3: _initial_epoch; Keras 2: the counters it asks for, the step left at 0: the
        # batches trained are drawn and skipped below, as Keras 2's own restore does not).
        self.model._initial_epoch = self.epoch
        if KERAS2:
            epoch = self.epoch
            self.model._maybe_load_initial_counters_from_ckpt = lambda steps_per_epoch, initial_epoch: (epoch, 0)
        if self.batch:
            self._restored_metrics = state.get("metrics") or {}
            self._skip = self.batch
            self._wrap_train_function()
        # With the last epoch's metrics: a run resumed past its last epoch trains nothing more, and
        # its COMPLETE carries them.
        self._send("resumed", step=self.step, epoch=self.epoch, batch=self.batch, total=self._total(),
                   **({"metrics": self._epoch_logs} if self._epoch_logs else {}))

    def _wrap_train_function(self) -> None:
        """Skip the batches the stopped epoch had trained on: draw them from the iterator, train nothing.

        At the first batch trained, the stopped epoch's metric sums (totals and counts, as
        Keras's metrics keep them) are added back, so the epoch's accuracy covers all of it.
        """
        original = self.model.train_function
        per_call = getattr(self.model, "steps_per_execution", 1) or 1
        per_call = int(per_call.numpy() if hasattr(per_call, "numpy") else per_call)  # a variable in Keras 2

        def skipping(iterator):
            if self._skip > 0:
                for _ in range(per_call):
                    next(iterator)
                self._skip -= per_call
                self._skipped = True
                return {}
            self.model.train_function = original
            logs = original(iterator)
            saved, self._restored_metrics = self._restored_metrics or {}, None
            for v in _metric_variables(self.model):
                if _name(v) in saved:
                    v.assign_add(np.asarray(saved[_name(v)], dtype=tf.as_dtype(v.dtype).as_numpy_dtype))
            return self.model.get_metrics_result() if saved else logs

        self.model.train_function = skipping

    def on_epoch_begin(self, epoch, logs=None) -> None:
        if self._skip <= 0:
            self.batch = 0
        self.epoch = epoch
        self._epoch_started = time.monotonic()

    def on_train_batch_end(self, batch, logs=None) -> None:
        # One call of the step trains `steps_per_execution` batches; `batch` is the call's last.
        trained, self.batch = batch + 1 - self.batch, batch + 1
        if self._skipped:
            self._skipped = False
            return  # a skipped batch: nothing trained
        self.step += trained
        if STOP.event.is_set():
            self._stop_now()
        now = time.monotonic()
        # Several workers save at epoch ends only: a time-based save would fall on different steps.
        if self.every_seconds and self.workers == 1 and now - self._last_save >= self.every_seconds:
            self._save(sync=False)
        if now - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = now
            self._send("progress", step=self.step, total=self._total(), epoch=self.epoch,
                       metrics={k: _plain(v) for k, v in (logs or {}).items()})

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.epoch, self.batch = epoch + 1, 0
        metrics = {k: _plain(v) for k, v in (logs or {}).items()}
        self._epoch_logs = metrics
        seconds = time.monotonic() - self._epoch_started
        self._send("epoch", step=self.step, total=self._total(), epoch=epoch + 1, metrics=metrics,
                   epoch_seconds=round(seconds, 3))
        self._save(sync=False)
        if STOP.event.is_set():
            self._stop_now()

    def on_train_end(self, logs=None) -> None:
        self.store.wait()

    # -- saving --

    def _save(self, *, sync: bool) -> None:
        if not self.chief:
            return  # the chief commits; every worker restores that commit (the same step)
        started = time.monotonic()
        self.step = int(self.model.optimizer.iterations.numpy())
        folder = os.path.join(self.local, f"{CKPT_PREFIX}-{self.step}")
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        self._ckpt.write(os.path.join(folder, CKPT_PREFIX))
        state = {"step": self.step, "epoch": self.epoch, "batch": self.batch, "structure": self._structure(),
                 "epoch_logs": self._epoch_logs,
                 "metrics": self._metric_sums()}
        with open(os.path.join(folder, STATE_FILE), "w") as f:
            json.dump(state, f)
        if sync:
            self.store.commit(self.step, folder)
        else:
            self.store.commit_async(self.step, folder)  # snapshotted: the folder may go at once
        for name in os.listdir(self.local):
            if name.startswith(CKPT_PREFIX + "-") and name != os.path.basename(folder):
                shutil.rmtree(os.path.join(self.local, name), ignore_errors=True)
        self._last_save = time.monotonic()
        self.save_seconds.append(self._last_save - started)

    def _metric_sums(self) -> dict:
        # Several workers: a metric's sum is read across them (a collective the other workers are
        # not in at a stop), so a resume inside an epoch starts its metrics from that step instead.
        if self.workers > 1:
            return {}
        return {_name(v): np.asarray(v.numpy()).tolist() for v in _metric_variables(self.model)}

    def _stop_now(self) -> None:
        """A stop signal: commit the current step synchronously, close TensorBoard's files, exit 143."""
        if self._skip <= 0:
            self._save(sync=True)
        with contextlib.suppress(Exception):
            self.store.wait()
        if self.board is not None:
            with contextlib.suppress(Exception):
                self.board._close_writers()  # Keras has no public flush; its files must be complete
        self._send("stopped", step=self.step, signal=STOP.signal_name)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # No interpreter teardown: freeing tf.data's iterator can take seconds (trainer/__main__.py).
        os._exit(EXIT_PREEMPTED)
