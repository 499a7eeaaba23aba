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
