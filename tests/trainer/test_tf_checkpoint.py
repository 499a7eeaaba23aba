"""Tests for trainer.tf_checkpoint's background save: a snapshot of one step, written while training goes on."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from runfolder.storage import open_store
from trainer.checkpoint_store import CheckpointStore


@pytest.fixture(scope="module")
def tf():
    import tensorflow

    return tensorflow


class Trainer:
    """A small Keras model with dropout (a random stream), its optimizer and a compiled training step."""

    def __init__(self, tf, seed: int = 0):
        import keras

        keras.utils.set_random_seed(seed)
        self.model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dropout(0.3),
                                       keras.layers.Dense(2)])
        self.opt = keras.optimizers.Adam(0.05)
        self.opt.build(self.model.trainable_variables)
        self.variables = [*self.model.variables, *self.opt.variables]
        n = len(self.model.variables)
        self.checkpoint_of = lambda values: tf.train.Checkpoint(model=list(values[:n]), optimizer=list(values[n:]))
        x, y = tf.random.normal([16, 4], seed=1), tf.random.normal([16, 2], seed=2)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((self.model(x, training=True) - y) ** 2)
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.opt.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))

        self.step = step

    def values(self) -> list[np.ndarray]:
        return [np.array(v.numpy(), copy=True) for v in self.variables]


def _held(checkpoint_of, gate: threading.Event, entered: threading.Event):
    """`checkpoint_of` that, called from the writer thread, waits for `gate` before the write."""

    def build(values):
        if threading.current_thread().name == "checkpoint-write":
            entered.set()
            assert gate.wait(60), "the test never released the write"
        return checkpoint_of(values)

    return build


def _checkpointer(tr: Trainer, store, work, checkpoint_of=None, **kw):
    from trainer.tf_checkpoint import Checkpointer

    committed: list[dict] = []
    ckstore = CheckpointStore(store, on_commit=committed.append)
    cp = Checkpointer(ckstore, work=str(work), chief=True, variables=tr.variables, model="t",
                      checkpoint_of=checkpoint_of or tr.checkpoint_of, background=True, **kw)
    return cp, committed


def test_a_background_save_commits_the_step_it_snapshotted_while_training_goes_on(tf, tmp_path):
    """The write is held until three more training steps (and three more batches) have run:
    what is committed, variables, random stream and input position, is still the saved step's."""
    from trainer import data_state

    store = open_store(f"file://{tmp_path}/run")
    tr = Trainer(tf)
    gate, entered = threading.Event(), threading.Event()
    cp, committed = _checkpointer(tr, store, tmp_path / "a", _held(tr.checkpoint_of, gate, entered))
    assert cp.rng_variables, "the model has no random stream: the test would not cover it"
    iterator = iter(tf.data.Dataset.range(100).shuffle(10, seed=3))
    cp.data = data_state.DataState(iterator, skip=0, max_mb=64, emit=lambda *a, **k: None)
    for _ in range(2):
        tr.step()
        next(iterator)
    at_save = tr.values()

    assert cp.save(2, {"step": 2, "batches_seen": 2, "examples_seen": 32}, sync=False)
    assert entered.wait(60), "the background write never started"
    for _ in range(3):  # training goes on while the write waits
        tr.step()
    after = [int(next(iterator)) for _ in range(3)]
    assert any(not np.array_equal(a, b) for a, b in zip(at_save, tr.values(), strict=True))
    gate.set()
    assert cp.wait_uploads() is None
    assert [c["step"] for c in committed] == [2]

    fresh = Trainer(tf, seed=1)  # other initial values: the restore must bring the saved ones
    reader, _ = _checkpointer(fresh, store, tmp_path / "b")
    step, saved = reader.restore()  # checks the fingerprint recorded beside the values, too
    assert step == 2 and saved["batches_seen"] == 2
    for saved_value, restored in zip(at_save, fresh.values(), strict=True):
        np.testing.assert_array_equal(saved_value, restored)
    prefix, skip = data_state.saved_state_prefix(reader.restored_dir, saved)
    resumed = iter(tf.data.Dataset.range(100).shuffle(10, seed=3).skip(skip))
    data_state.restore_iterator(resumed, prefix)
    assert [int(next(resumed)) for _ in range(3)] == after


def test_a_stop_during_a_background_write_commits_its_own_step_and_not_the_older(tf, tmp_path):
    """SIGTERM while step 2 is being written: the synchronous save of step 5 waits for that
    write, which then ends without an upload; only step 5 is committed."""
    store = open_store(f"file://{tmp_path}/run")
    tr = Trainer(tf)
    gate, entered = threading.Event(), threading.Event()
    cp, committed = _checkpointer(tr, store, tmp_path / "a", _held(tr.checkpoint_of, gate, entered))
    assert cp.save(2, {"step": 2, "batches_seen": 2, "examples_seen": 32}, sync=False)
    assert entered.wait(60)
    job = cp._write
    stop = threading.Thread(target=cp.save, args=(5, {"step": 5, "batches_seen": 5, "examples_seen": 80}),
                            kwargs={"sync": True})
    stop.start()
    assert job.superseded.wait(60), "the synchronous save did not take over from the older write"
    gate.set()
    stop.join(60)
    assert not stop.is_alive()
    assert cp.wait_uploads() is None
    assert [c["step"] for c in committed] == [5]
    assert CheckpointStore(store).committed_steps() == [5]
    assert not store.list("checkpoints/ckpt-2/")


def test_a_stuck_background_write_does_not_hold_the_stop_past_its_bound(tf, tmp_path):
    """A write that never ends (a hung disk) is waited for `write_wait_s`, then the stop's save
    goes on without it, and the failure is reported; the stuck write is never uploaded."""
    store = open_store(f"file://{tmp_path}/run")
    tr = Trainer(tf)
    gate, entered = threading.Event(), threading.Event()
    cp, committed = _checkpointer(tr, store, tmp_path / "a", _held(tr.checkpoint_of, gate, entered), write_wait_s=0.2)
    assert cp.save(2, {"step": 2, "batches_seen": 2, "examples_seen": 32}, sync=False)
    assert entered.wait(60)
    stuck = cp._write
    assert cp.save(3, {"step": 3, "batches_seen": 3, "examples_seen": 48}, sync=True)
    assert [c["step"] for c in committed] == [3]
    error = cp.wait_uploads()
    assert isinstance(error, TimeoutError) and "checkpoint 2" in str(error)
    gate.set()
    stuck.thread.join(60)
    assert not stuck.thread.is_alive()
    assert cp.wait_uploads() is None
    assert CheckpointStore(store).committed_steps() == [3]


def test_a_failed_background_write_fails_the_next_save(tf, tmp_path):
    """As a write in the loop would: the run does not train on without checkpoints."""
    store = open_store(f"file://{tmp_path}/run")
    tr = Trainer(tf)

    def broken(values):
        if threading.current_thread().name == "checkpoint-write":
            raise OSError("No space left on device")
        return tr.checkpoint_of(values)

    cp, committed = _checkpointer(tr, store, tmp_path / "a", broken)
    assert cp.save(2, {"step": 2, "batches_seen": 2, "examples_seen": 32}, sync=False)
    with pytest.raises(OSError, match="No space left"):
        cp.save(4, {"step": 4, "batches_seen": 4, "examples_seen": 64}, sync=False)
    assert committed == [] and CheckpointStore(store).committed_steps() == []


def test_the_input_position_is_serialized_at_the_step_and_its_file_written_off_the_loop(tf, tmp_path, monkeypatch):
    """The loop serializes the iterator's state at the saved step and goes on; the file is written
    on the write's thread after the iterator has moved on, and still restores the saved step's position."""
    from trainer import data_state

    writers, gate, entered = [], threading.Event(), threading.Event()
    write = data_state.DataState.write

    def held(self, folder, captured, step):
        writers.append(threading.current_thread().name)
        if writers[-1] == "checkpoint-write":
            entered.set()
            assert gate.wait(60), "the test never released the write"
        return write(self, folder, captured, step)

    monkeypatch.setattr(data_state.DataState, "write", held)
    store = open_store(f"file://{tmp_path}/run")
    tr = Trainer(tf)
    cp, committed = _checkpointer(tr, store, tmp_path / "a")
    pipeline = tf.data.Dataset.range(1000).shuffle(50, seed=5).batch(4)
    iterator = iter(pipeline)
    cp.data = data_state.DataState(iterator, skip=0, max_mb=64, emit=lambda *a, **k: None)
    for _ in range(3):
        next(iterator)
    assert cp.save(3, {"step": 3, "batches_seen": 3, "examples_seen": 12}, sync=False)
    assert entered.wait(60), "the input state's file was not written on the write's thread"
    after = [next(iterator).numpy().tolist() for _ in range(3)]  # the loop goes on while the file waits
    gate.set()
    assert cp.wait_uploads() is None
    assert writers == ["checkpoint-write"] and [c["step"] for c in committed] == [3]

    reader, _ = _checkpointer(Trainer(tf, seed=1), store, tmp_path / "b")
    step, saved = reader.restore()
    assert step == 3 and saved["data_state"]["skip"] == 0 and saved["data_state"]["bytes"] > 0
    prefix, skip = data_state.saved_state_prefix(reader.restored_dir, saved)
    resumed = iter(pipeline.skip(skip))
    data_state.restore_iterator(resumed, prefix)
    assert [next(resumed).numpy().tolist() for _ in range(3)] == after
