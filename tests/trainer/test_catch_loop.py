"""The step loop (`trainer.loop.TrainLoop`) in this process, on the synthetic MLP: what it trains,
when it logs, evaluates and checkpoints when the cadences do not line up, a new best
checkpointed at once, a stop and a cancel after the call in progress, and a resume that
continues where the commit left off.

The attempt around the loop (lease, exit codes, COMPLETE and the SavedModel) is left out:
`trainer.loop_attempt` and test_catch_endings.py / the trainer process tests have it.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import asdict

import pytest

from runfolder import layout
from runfolder.storage import open_store
from trainer.checkpoint_store import CheckpointStore
from trainer.config import load_config
from trainer.events import EventLog
from trainer.signals import StopRequest

tf = pytest.importorskip("tensorflow")
from trainer.loop import RunState, TrainLoop, loop_speed, training_scalars  # noqa: E402 - after TensorFlow
from trainer.strategy import Cluster, make_strategy  # noqa: E402

# A planted bug that never ends the training fails here instead of hanging the run.
pytestmark = pytest.mark.timeout(90)

BATCH = 32
# Checkpoints every 7 steps, evaluations every 10, calls of 4 steps, points every 5: nothing lines up.
ARGS = ["--synthetic", "--deterministic", "--steps", "30", "--batch-size", str(BATCH), "--seed", "3",
        "--checkpoint-every-steps", "7", "--checkpoint-every-seconds", "0", "--keep-checkpoints", "1",
        "--log-every", "5", "--steps-per-call", "4", "--eval-every-steps", "10", "--keep-best", "val_loss:max",
        "--progress-every-seconds", "0.000001"]


class Key:
    """The run folder's STOP, found after `after` looks."""

    def __init__(self, after: int | None = None):
        self.after, self.looks = after, 0
        self.reason = "enough"
        self.started = self.closed = False

    def start(self):
        self.started = True
        return self

    def close(self):
        self.closed = True

    @property
    def requested(self) -> bool:
        self.looks += 1
        return self.after is not None and self.looks > self.after


class SignalAfter(StopRequest):
    """SIGTERM once the loop has asked `after` times."""

    def __init__(self, after: int):
        super().__init__()
        self.after, self.looks = after, 0

    @property
    def requested(self) -> bool:
        self.looks += 1
        if self.looks > self.after:
            self.signal_name = "SIGTERM"
            self.event.set()
        return self.event.is_set()


class Run:
    """A TrainLoop as trainer.loop_attempt makes one (one machine), and what it said."""

    def __init__(self, tmp_path, *args: str, stop=None, key=None, name="run"):
        self.uri = f"file://{tmp_path}/{name}"
        self.cfg = load_config(["--run-uri", self.uri, *args], env={})
        self.store = open_store(self.uri)
        self.stream = io.StringIO()
        self.events = EventLog(self.store, stream=self.stream)
        self.ckstore = CheckpointStore(self.store, keep=self.cfg.keep_checkpoints)
        self.emitted: list[dict] = []
        self.key = key or Key()
        self.work = str(tmp_path / f"{name}-work")
        os.makedirs(self.work, exist_ok=True)
        self.loop = TrainLoop(self.cfg, store=self.store, ckstore=self.ckstore, events=self.events, emit=self.emit,
                              stop=stop or StopRequest(), stop_key=self.key, chief=True, multi_worker=False,
                              work=self.work)
        self.loop.use(make_strategy(Cluster()))
        self.loop.build()
        self.loop.restore()

    def emit(self, event: str, **fields) -> dict:
        ev = self.events.emit(event, **fields)
        self.emitted.append(ev)
        return ev

    def steps_of(self, kind: str) -> list[int]:
        return [e["step"] for e in self.emitted if e["event"] == kind]

    def progress(self) -> dict:
        self.events.flush()
        return json.loads(self.store.get_bytes(layout.PROGRESS_KEY))

    def scalars(self) -> dict[str, list[int]]:
        """TensorBoard tag → the steps it has points at."""
        self.loop.summaries.sync()
        found: dict[str, list[int]] = {}
        for root, _, names in os.walk(os.path.join(self.work, "tensorboard")):
            for name in names:
                for ev in tf.compat.v1.train.summary_iterator(os.path.join(root, name)):
                    for v in ev.summary.value:
                        found.setdefault(v.tag, []).append(ev.step)
        return found


# -- the loop's pure parts --


def test_the_speed_leaves_out_the_first_call_that_traced_the_step():
    assert loop_speed(0.0, 100, None) == {}
    assert loop_speed(2.0, 100, None) == {"loop_seconds": 2.0, "examples_per_sec": 50.0}
    assert loop_speed(10.0, 1000, (2.0, 200)) == {"loop_seconds": 10.0, "examples_per_sec": 100.0,
                                                  "steady_examples_per_sec": 100.0}
    assert loop_speed(10.0, 1000, (6.0, 200)) == {"loop_seconds": 10.0, "examples_per_sec": 100.0,
                                                  "steady_examples_per_sec": 200.0}
    # The first call was all of it: no steady speed to tell.
    assert "steady_examples_per_sec" not in loop_speed(2.0, 200, (2.0, 100))
    assert "steady_examples_per_sec" not in loop_speed(3.0, 200, (2.0, 200))
    assert loop_speed(3.0, 1000, (1.0, 100))["steady_examples_per_sec"] == 450.0
    assert loop_speed(1.23456, 10, None) == {"loop_seconds": 1.235, "examples_per_sec": 8.1}
    assert loop_speed(3.0, 1000, (0.9, 100)) == {"loop_seconds": 3.0, "examples_per_sec": 333.3,
                                                 "steady_examples_per_sec": 428.6}  # one decimal each


def test_a_log_points_scalars_name_the_loss_metrics_rate_and_speed():
    class Spec:
        class optimizer:  # noqa: N801 - stands in for an attribute
            learning_rate = tf.Variable(0.25)

    st = RunState(train_metrics={"accuracy": 0.5})
    assert training_scalars(Spec, st, 1.5, 100.0, 0.1) == {
        "train/loss": 1.5, "train/accuracy": 0.5, "learning_rate": 0.25, "examples_per_sec": 100.0,
        "step_time_s": 0.1}
    Spec.optimizer.learning_rate = 0.5  # a plain number
    assert training_scalars(Spec, RunState(), 1.0, 1.0, 1.0)["learning_rate"] == 0.5
    assert set(training_scalars(Spec, RunState(), 1.0, 1.0, 1.0)) == {
        "train/loss", "learning_rate", "examples_per_sec", "step_time_s"}


def test_the_run_state_says_its_newest_metrics():
    assert RunState().latest_metrics() == {} and RunState().progress_extra() == {}
    st = RunState(train_metrics={"accuracy": 0.5, "val_x": 1.0}, eval_seconds=1.23456,
                  evaluated={"step": 10, "metrics": {"val_loss": 0.3, "val_x": 2.0}})
    assert st.latest_metrics() == {"accuracy": 0.5, "val_loss": 0.3, "val_x": 2.0}
    assert st.progress_extra() == {"metrics": st.latest_metrics(), "evaluated_step": 10, "eval_seconds": 1.235}
    trained = RunState(train_metrics={"accuracy": 0.5})
    assert trained.progress_extra() == {"metrics": {"accuracy": 0.5}}
    evaluated = RunState(evaluated={"step": 4, "metrics": {"val_loss": 1.0}})
    assert evaluated.progress_extra() == {"metrics": {"val_loss": 1.0}, "evaluated_step": 4, "eval_seconds": 0.0}


# -- the loop --


def test_cadences_that_do_not_line_up_each_keep_their_steps_and_a_new_best_is_checkpointed_at_once(tmp_path):
    run = Run(tmp_path, *ARGS)
    assert run.loop.global_micro == BATCH and run.loop.global_batch == BATCH
    assert run.loop.train() is False
    loop, st = run.loop, run.loop.state
    assert (st.step, st.batches_seen, st.examples_seen) == (30, 30, 30 * BATCH)
    assert isinstance(st.loss, float) and st.train_seconds > 0
    assert run.steps_of("evaluated") == [10, 20]  # the 30th is the attempt's, at the end
    assert st.best["step"] == 10  # val_loss:max: the first evaluation's is the highest
    # Saved every 7th step, and the best at once (10), never the last (the ending commits it);
    # a queued upload may give way to a newer one, the best's is kept.
    assert run.scalars()["checkpoint_save_s"] == [7, 10, 14, 21, 28]
    loop.commit_current()
    assert run.steps_of(layout.CHECKPOINT)[-1] == 30 and 10 in run.steps_of(layout.CHECKPOINT)
    # Keep 1, and the best: an older background upload that the commit cancelled pruned when it ended
    # (its marker may land after the commit's prune), and the ending waited for the uploads.
    assert run.ckstore.committed_steps() == [10, 30]
    loop.commit_current()  # already committed: nothing more
    assert run.steps_of(layout.CHECKPOINT).count(30) == 1
    # TensorBoard: a point every 5th step and at the end, each checkpoint's save time, the evaluations.
    tags = run.scalars()
    assert tags["train/loss"] == [5, 10, 15, 20, 25, 30]
    for tag in ("learning_rate", "examples_per_sec", "step_time_s"):
        assert tags[tag] == [5, 10, 15, 20, 25, 30], tag
    assert any(t.startswith("train/") and t != "train/loss" for t in tags)
    assert tags["checkpoint_save_s"] == [7, 10, 14, 21, 28, 30]
    # Each commit's upload time, written at the next point after it (a slow upload's may come later).
    assert tags["checkpoint_s"][0] == 7 and set(tags["checkpoint_s"]) <= {7, 10, 14, 21, 28}
    assert tags["validation/loss"] == [10, 20] and tags["eval_s"] == [10, 20]
    progress = run.progress()
    assert (progress["step"], progress["total"], progress["loss"]) == (30, 30, st.loss)
    assert progress["evaluated_step"] == 20 and progress["best"]["step"] == 10
    assert progress["examples_per_sec"] > 0 and "val_loss" in progress["metrics"]
    speed = loop.speed()
    # The ending's commit wrote progress.json with the loop's speed: what `finished` says, one figure.
    assert progress["examples_per_sec"] == speed["examples_per_sec"]
    assert speed["loop_seconds"] > 0 and speed["examples_per_sec"] > 0 and "steady_examples_per_sec" in speed
    assert loop.loop_examples == 30 * BATCH
    assert loop.first_call[1] == 4 * BATCH  # the first call: 4 steps
    assert run.key.started and run.key.closed
    # The export reads the best's weights (step 10), not the final ones.
    final = [v.numpy().copy() for v in loop.spec.model.variables]
    assert loop.load_best() is True
    assert any((a != v.numpy()).any() for a, v in zip(final, loop.spec.model.variables, strict=True))


def test_the_newest_checkpoint_holds_the_runs_state(tmp_path):
    run = Run(tmp_path, *ARGS)
    run.loop.train()
    run.loop.commit_current()
    dest = tmp_path / "restored"
    assert run.ckstore.restore_latest(str(dest)) == 30
    docs = [json.loads(p.read_text()) for p in dest.rglob("*.json")]
    doc = next(d for d in docs if d.get("step") == 30 and "batches_seen" in d)
    st = run.loop.state
    assert {k: doc[k] for k in asdict(RunState())} == json.loads(json.dumps(asdict(st)))
    assert (doc["attempt"], doc["seed"], doc["model"]) == (1, 3, "mlp")


def test_a_stop_ends_the_loop_after_its_call_and_a_resume_continues_from_that_commit(tmp_path):
    # The signal is looked for before and after each call: seen after the 4th call.
    first = Run(tmp_path, *ARGS, stop=SignalAfter(7))
    assert first.loop.train() is True and first.loop.cancelled is False
    st = first.loop.state
    assert st.step == 14  # calls of 4, 3 (to the 7th step's checkpoint), 3 (to the 10th's evaluation), 4
    assert st.examples_seen == 14 * BATCH and st.batches_seen == 14
    assert isinstance(st.loss, float)
    first.loop.commit_current()
    assert first.ckstore.committed_steps()[-1] == 14
    assert first.scalars()["train/loss"] == [5, 10, 14]  # the stopped call's last step has its point
    second = Run(tmp_path, *ARGS)
    resumed = [e for e in second.emitted if e["event"] == layout.RESUMED]
    assert len(resumed) == 1 and (resumed[0]["step"], resumed[0]["examples_seen"], resumed[0]["batches_seen"]) == (
        14, 14 * BATCH, 14)
    assert second.loop.state.best["step"] == 10 and second.ckstore.protect == {10}
    assert int(second.loop.examples.numpy()) == 14 * BATCH
    assert second.loop.train() is False
    assert second.loop.state.step == 30 and second.loop.state.examples_seen == 30 * BATCH
    assert second.steps_of("evaluated") == [20]


def test_the_run_folders_stop_cancels_after_the_call_in_progress(tmp_path):
    run = Run(tmp_path, *ARGS, key=Key(after=3))  # found after the second call
    assert run.loop.train() is True and run.loop.cancelled is True
    assert run.loop.state.step == 7  # two calls: 4, then 3 to the checkpoint step


def test_a_checkpoint_every_few_seconds_falls_between_the_step_checkpoints(tmp_path):
    args = list(ARGS)
    args[args.index("--checkpoint-every-seconds") + 1] = "0.000001"
    args[args.index("--checkpoint-every-steps") + 1] = "0"
    run = Run(tmp_path, *args[:args.index("--eval-every-steps")], "--progress-every-seconds", "1000")
    run.loop.train()
    # Every call is due by the clock: a checkpoint after each (the last step's is the ending's).
    assert run.scalars()["checkpoint_save_s"] == list(range(4, 30, 4))


def test_the_final_evaluation_is_made_once(tmp_path):
    run = Run(tmp_path, *ARGS)
    run.loop.train()
    run.loop.final_evaluation()
    assert run.steps_of("evaluated") == [10, 20, 30]
    run.loop.final_evaluation()
    assert run.steps_of("evaluated") == [10, 20, 30]


def test_a_failed_upload_is_reported_and_the_next_commit_follows(tmp_path, monkeypatch):
    run = Run(tmp_path, *ARGS)
    monkeypatch.setattr(run.loop.checkpointer, "wait_uploads", lambda: OSError("the bucket said no"))
    run.loop._wait_uploads()
    failed = [e for e in run.emitted if e["event"] == layout.CHECKPOINT_FAILED]
    assert len(failed) == 1 and failed[0]["reason"] == "OSError: the bucket said no"
    monkeypatch.setattr(run.loop.checkpointer, "wait_uploads", lambda: None)
    run.loop._wait_uploads()
    assert len([e for e in run.emitted if e["event"] == layout.CHECKPOINT_FAILED]) == 1
