"""Steps per call: calls that span several --log-every steps keep TensorBoard's points (auto sizing: test_cadence)."""

from __future__ import annotations

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

