"""The loop's cadence: call sizes, log points, when a checkpoint, an evaluation, progress and the end are due.

Plain numbers stand in for the clock; no TensorFlow.
"""

from __future__ import annotations

import pytest

from trainer.cadence import CALL_SECONDS, MULTI_WORKER_STEPS_PER_CALL, Cadence
from trainer.config import TrainConfig


def _cadence(chief: bool = True, multi_worker: bool = False, evaluates: bool = False, **options) -> Cadence:
    cadence = Cadence(TrainConfig(run_uri="file:///nowhere", **options), chief=chief, multi_worker=multi_worker)
    cadence.evaluates = evaluates
    return cadence


def _adapt(auto_steps: int, count: int, seconds: float) -> int:
    cadence = _cadence()
    cadence.auto_steps = auto_steps
    cadence.adapt(count, seconds)
    return cadence.auto_steps


def test_auto_steps_per_call_grows_at_most_twofold_towards_about_a_second():
    assert CALL_SECONDS == 1.0
    assert _adapt(1, 1, 0.001) == 2  # a fast step: double, not jump (the next call may be slower)
    assert _adapt(64, 64, 0.064) == 128
    assert _adapt(512, 512, 0.4) == 1024 and _adapt(1024, 1024, 0.8) == 1280  # about a second's worth
    assert _adapt(100, 100, 4.0) == 25  # too long a call: a stop would wait for it, shrink at once
    assert _adapt(1, 1, 5.0) == 1  # a step longer than a second: one per call
    assert _adapt(1, 1, 0.8) == 1  # one step of 0.8 s: two would pass the second
    assert _adapt(1, 0, 0.0) == 2  # an empty call measures nothing: it still grows, twofold at most


@pytest.mark.parametrize(("options", "extra", "step", "expected"), [
    ({"steps_per_call": 40, "checkpoint_every_steps": None}, {}, 0, 40),
    ({"steps_per_call": 40, "checkpoint_every_steps": 25}, {}, 0, 25),  # never past a step checkpoint
    ({"steps_per_call": 40, "checkpoint_every_steps": 25}, {}, 10, 15),
    ({"steps_per_call": 40, "checkpoint_every_steps": None, "steps": 100}, {}, 90, 10),  # never past the end
    ({"steps_per_call": 40, "checkpoint_every_steps": None, "eval_every_steps": 30}, {"evaluates": True}, 0, 30),
    ({"steps_per_call": 40, "checkpoint_every_steps": None, "eval_every_steps": 30}, {"evaluates": True}, 10, 20),
    ({"steps_per_call": 40, "checkpoint_every_steps": None, "eval_every_steps": 30}, {"evaluates": True}, 35, 25),
    # No validation set: --eval-every-steps does not cut the calls (the run fails on it elsewhere).
    ({"steps_per_call": 40, "checkpoint_every_steps": None, "eval_every_steps": 30}, {}, 0, 40),
    ({"checkpoint_every_steps": None}, {"multi_worker": True}, 0, MULTI_WORKER_STEPS_PER_CALL),
    ({"checkpoint_every_steps": None}, {}, 0, 1),  # auto starts at one step and grows (adapt)
    ({"steps_per_call": 40, "checkpoint_every_steps": 25}, {}, 25, 25),
])
def test_a_call_runs_its_steps_up_to_the_next_checkpoint_evaluation_or_end(options, extra, step, expected):
    assert _cadence(**extra, **options).steps_this_call(step) == expected


def test_seconds_checkpoints_are_due_on_the_chiefs_clock_from_the_last_checkpoint():
    cadence = _cadence(checkpoint_every_seconds=60.0)
    cadence.start(1000.0)
    assert not cadence.checkpoint_seconds_due(1059.0)
    assert cadence.checkpoint_seconds_due(1060.0)
    cadence.checkpointed(1070.0)
    assert not cadence.checkpoint_seconds_due(1100.0) and cadence.checkpoint_seconds_due(1130.0)
    other = _cadence(chief=False, checkpoint_every_seconds=60.0)
    other.start(1000.0)
    assert not other.checkpoint_seconds_due(5000.0)  # a worker follows the chief's request
    never = _cadence(checkpoint_every_seconds=None)
    never.start(1000.0)
    assert not never.checkpoint_seconds_due(1e9)


@pytest.mark.parametrize(("step", "requested", "new_best", "due"), [
    (50, False, False, True),  # a --checkpoint-every-steps step
    (30, False, False, False),
    (30, True, False, True),  # the workers asked (seconds)
    (30, False, True, True),  # a new best is checkpointed at once
    (100, True, True, False),  # the last step: the ending commits it
])
def test_a_checkpoint_is_due_by_steps_by_request_or_for_a_new_best_but_not_at_the_end(step, requested, new_best,
                                                                                        due):
    cadence = _cadence(steps=100, checkpoint_every_steps=50)
    assert cadence.checkpoint_due(step, requested=requested, new_best=new_best) is due


def test_evaluations_fall_on_their_steps_before_the_end_and_only_with_a_validation_set():
    cadence = _cadence(evaluates=True, steps=100, eval_every_steps=20)
    assert [s for s in range(1, 101) if cadence.evaluation_due(s)] == [20, 40, 60, 80]
    assert not any(_cadence(steps=100, eval_every_steps=20).evaluation_due(s) for s in range(1, 101))
    assert not any(_cadence(evaluates=True, steps=100).evaluation_due(s) for s in range(1, 101))


def test_a_call_logs_its_log_every_steps_and_its_last_when_it_ends_the_run():
    cadence = _cadence(log_every=10)
    assert cadence.logged_steps(1, 25, ending=False) == [10, 20]
    assert cadence.logged_steps(26, 29, ending=False) == []
    assert cadence.logged_steps(26, 33, ending=True) == [30, 33]
    assert cadence.logged_steps(31, 40, ending=True) == [40]  # not twice
    assert cadence.logged_steps(11, 20, ending=False) == [20]  # the call's last step is one of them
    assert cadence.logged_steps(20, 20, ending=False) == [20]


def test_progress_is_due_every_progress_seconds_and_restarts_its_clock():
    cadence = _cadence(progress_every_seconds=10.0)
    cadence.start(0.0)
    assert [t for t in (5.0, 10.0, 15.0, 19.0, 20.0) if cadence.progress_due(t)] == [10.0, 20.0]


def test_the_run_is_finished_at_its_last_step():
    cadence = _cadence(steps=100)
    assert not cadence.finished(99) and cadence.finished(100)


def test_a_new_cadence_evaluates_nothing_until_the_loop_has_a_validation_set():
    cadence = Cadence(TrainConfig(run_uri="file:///nowhere", steps=100, eval_every_steps=20, steps_per_call=40,
                                  checkpoint_every_steps=None), chief=True, multi_worker=False)
    assert cadence.evaluates is False
    assert cadence.evaluation_due(20) is False
    assert cadence.steps_this_call(0) == 40


def test_the_seconds_clocks_count_from_zero_until_the_loop_starts():
    cadence = _cadence(checkpoint_every_seconds=60.0, progress_every_seconds=10.0)
    assert (cadence.last_checkpoint, cadence.last_progress) == (0.0, 0.0)
    assert not cadence.checkpoint_seconds_due(59.5) and cadence.checkpoint_seconds_due(60.0)
    assert not cadence.progress_due(9.5) and cadence.progress_due(10.0)


def test_by_default_checkpoints_follow_the_clock_and_calls_grow_to_about_a_second():
    # A step cadence on a fast model checkpointed several times a second and cut every call to
    # its steps (bench/RESULTS.md): by default only the clock asks for a checkpoint.
    cadence = _cadence(steps=100_000)
    assert (cadence.cfg.checkpoint_every_steps, cadence.cfg.checkpoint_every_seconds) == (None, 600.0)
    cadence.start(0.0)
    cadence.adapt(1000, 0.25)  # a small model's 1,000 steps in a quarter of a second
    assert cadence.steps_this_call(0) == 2000 and cadence.steps_this_call(250) == 2000
    assert not cadence.checkpoint_due(250, requested=False, new_best=False)
    assert not cadence.checkpoint_seconds_due(599.0) and cadence.checkpoint_seconds_due(600.0)
