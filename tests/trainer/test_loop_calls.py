"""Steps per call: calls that span several --log-every steps keep TensorBoard's points; auto sizing."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from tests.trainer.helpers import run_trainer, trainer_env


@pytest.mark.slow
def test_a_call_spanning_log_steps_writes_each_log_steps_own_loss(file_run):
    # 25 steps per call, a point every 10: calls end at 25, 50, 60, the points fall inside them.
    rc, events, err = run_trainer(file_run.uri, "--synthetic", "--steps", "60", "--batch-size", "32",
                                  "--log-every", "10", "--steps-per-call", "25", "--checkpoint-every-steps", "0",
                                  "--checkpoint-every-seconds", "3600", env=trainer_env(file_run.env))
    assert rc == 0, err[-3000:]
    from bench.run_all import tensorboard_scalars

    board = Path(file_run.uri.removeprefix("file://")) / "tensorboard"
    losses = tensorboard_scalars(str(board), "train/loss")
    assert [step for step, _ in losses] == [10, 20, 30, 40, 50, 60]
    assert len({value for _, value in losses}) == 6  # each step's own loss, not the call's last one
    assert [s for s, _ in tensorboard_scalars(str(board), "examples_per_sec")] == [10, 20, 30, 40, 50, 60]
    finished = events[-1]
    assert finished["event"] == "finished" and finished["step"] == 60
    assert finished["metrics"]["loss"] == pytest.approx(losses[-1][1], rel=1e-6)
    assert finished["steady_examples_per_sec"] > 0


def _adapt(auto_steps: int, count: int, seconds: float) -> int:
    from trainer.loop import TrainLoop

    training = types.SimpleNamespace(auto_steps=auto_steps)
    TrainLoop._adapt_steps(training, count, seconds)
    return training.auto_steps


def test_auto_steps_per_call_grows_at_most_twofold_towards_about_a_second():
    from trainer.loop import CALL_SECONDS

    assert CALL_SECONDS == 1.0
    assert _adapt(1, 1, 0.001) == 2  # a fast step: double, not jump (the next call may be slower)
    assert _adapt(64, 64, 0.064) == 128
    assert _adapt(512, 512, 0.4) == 1024 and _adapt(1024, 1024, 0.8) == 1280  # about a second's worth
    assert _adapt(100, 100, 4.0) == 25  # too long a call: a stop would wait for it, shrink at once
    assert _adapt(1, 1, 5.0) == 1  # a step longer than a second: one per call


def _train_in_process(batches_from: str, position: int, calls: list[int]):
    """The mlp's weights after `calls` (steps per call) from batch `position`, fed by the stream or in-memory batches."""
    import numpy as np
    import tensorflow as tf

    from trainer import data
    from trainer.config import TrainConfig
    from trainer.loop import make_train_step, seeded_model

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])  # what the trainer uses on one machine
    cfg = TrainConfig(run_uri="file:///nowhere", synthetic=True, batch_size=16, seed=5)
    spec = seeded_model(cfg, strategy)
    x, y = data.synthetic_mnist(n=100, seed=0)  # 6 batches an epoch
    if batches_from == "in memory":
        source = data.InMemoryBatches(x, y, 16, cfg.seed, data.Position(position), "/cpu:0")
    else:
        source = iter(data.from_arrays(x, y, 16, cfg.seed, data.Position(position)))
    examples = tf.Variable(0, dtype=tf.int64)
    step = make_train_step(strategy, spec, cfg, 16, False, examples)
    go = tf.constant((0.0, 0.0, 0.0))
    losses = [step(source, tf.constant(n, tf.int64), go)[0].numpy() for n in calls]
    graph = step.get_concrete_function(source, tf.constant(1, tf.int64), go).graph.as_graph_def()
    # The loop's body is a function of the graph's library: its ops are there.
    ops = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
    return [v.numpy() for v in spec.model.variables], np.concatenate(losses), int(examples.numpy()), ops


@pytest.mark.parametrize("position", [0, 4])
def test_in_memory_batches_are_taken_inside_the_step_and_train_as_the_stream_did(position):
    # 13 steps in three calls cross epoch boundaries (one call spans two); the same weights to the last bit.
    stream_w, stream_losses, stream_n, stream_ops = _train_in_process("stream", position, [5, 7, 1])
    device_w, device_losses, device_n, device_ops = _train_in_process("in memory", position, [5, 7, 1])
    assert "IteratorGetNext" in stream_ops and "IteratorGetNext" not in device_ops  # no tf.data in the step
    assert "GatherV2" in device_ops
    assert stream_n == device_n == 13 * 16
    assert len(stream_losses) == 13 and (stream_losses == device_losses).all()
    assert max(float(abs(a - b).max()) for a, b in zip(stream_w, device_w, strict=True)) == 0.0


def _loop_input(*, multi_worker: bool, batches_seen: int = 0):
    import tensorflow as tf

    from trainer import data
    from trainer.config import TrainConfig
    from trainer.loop import RunState, TrainLoop

    x, y = data.synthetic_mnist(n=64, seed=0)
    training = TrainLoop.__new__(TrainLoop)  # only what choosing the input reads
    training.cfg = TrainConfig(run_uri="file:///nowhere", synthetic=True, batch_size=16)
    training.strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    training.multi_worker, training.global_batch, training._element_spec = multi_worker, 16, None
    training.state = RunState(batches_seen=batches_seen)
    training.spec = types.SimpleNamespace(make_dataset=None, synthetic=lambda seed: (x, y))
    training.emit = lambda event, **fields: None
    iterator, skipped = training._input(plain=not multi_worker)
    assert skipped is None
    return iterator, training._element_spec


def test_the_loop_batches_in_memory_data_on_its_one_replica_and_keeps_the_stream_for_several_workers():
    from trainer import data

    batches, spec = _loop_input(multi_worker=False, batches_seen=7)
    assert isinstance(batches, data.InMemoryBatches) and int(batches.cursor.numpy()) == 7  # the run's position
    assert spec == batches.element_spec and "CPU" in batches.x.device.upper()
    # Several workers (one replica each) split each global batch: the stream's distributed iterator does.
    stream, _ = _loop_input(multi_worker=True, batches_seen=7)
    assert not isinstance(stream, data.InMemoryBatches) and hasattr(stream, "get_next")


@pytest.mark.slow
def test_a_run_stopped_and_resumed_from_a_background_snapshot_takes_the_same_in_memory_batches(file_run, tmp_path):
    """Checkpoints at 20, 40 and 60 are background snapshots (training goes on while each is
    written); the run resumed from the one at 60 ends with the weights of a run never stopped,
    to the last bit: every batch after the resume is the one the unstopped run took."""
    import shutil

    from tests.trainer.helpers import committed_weights, max_abs_diff
    from trainer.checkpoints import CheckpointStore
    from trainer.storage import open_store

    args = ["--synthetic", "--deterministic", "--seed", "7", "--batch-size", "32", "--log-every", "10",
            "--checkpoint-every-steps", "20"]
    env = trainer_env(file_run.env)
    ref = f"file://{tmp_path}/ref"
    rc, _, err = run_trainer(ref, *args, "--steps", "100", env=env)
    assert rc == 0, err[-3000:]
    rc, _, err = run_trainer(file_run.uri, *args, "--steps", "80", env=env)
    assert rc == 0, err[-3000:]
    # Made a stopped run again: the end's synchronous checkpoint and COMPLETE go, the newest
    # committed checkpoint is the background snapshot of step 60.
    root = Path(file_run.uri.removeprefix("file://"))
    assert CheckpointStore(open_store(file_run.uri)).committed_steps()[-2:] == [60, 80]
    shutil.rmtree(root / "checkpoints" / "ckpt-80")
    (root / "COMPLETE").unlink()
    rc, events, err = run_trainer(file_run.uri, *args, "--steps", "100", env=env)
    assert rc == 0, err[-3000:]
    resumed = [e for e in events if e["event"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["step"] == 60 and resumed[0]["batches_seen"] == 60
    assert events[-1]["event"] == "finished" and events[-1]["step"] == 100
    assert max_abs_diff(committed_weights(file_run.uri, 100, tmp_path / "w1"),
                        committed_weights(ref, 100, tmp_path / "w2")) == 0.0
