"""The training loop in process, over a stand-in step: which steps each call runs, which it logs with
their own loss, when it checkpoints (steps that do not line up with the calls, a new best at once,
the seconds clock), how a signal or the run folder's STOP ends it, and what a resume restores.

`TrainLoop._loop` is driven with a Python stand-in for the compiled step (it returns a loss per step
and the request it was given) and stand-ins for the checkpointer and summaries; the trainer tests
run the real step in whole processes.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from types import SimpleNamespace

import pytest

tf = pytest.importorskip("tensorflow")

from runfolder import layout  # noqa: E402
from runfolder.events import read_events  # noqa: E402
from runfolder.storage import open_store  # noqa: E402
from trainer.checkpoint_store import CheckpointStore  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.events import EventLog  # noqa: E402
from trainer.loop import RunState, TrainLoop, loop_speed, training_scalars  # noqa: E402
from trainer.signals import StopKeyPoller, StopRequest  # noqa: E402
from trainer.step import CANCEL, CHECKPOINT, GO, STOP  # noqa: E402

BATCH = 4


class _Step:
    """The compiled step's stand-in: `count` steps, a loss of step/100 each, the request agreed as given."""

    def __init__(self, loop, *, on_call=None, states=False):
        self.loop, self.on_call, self.states = loop, on_call, states
        self.calls: list[tuple[int, tuple]] = []
        self.traced = []
        self.iterators = []

    def __call__(self, iterator, count, request):
        # The compiled step's signature: an int64 count and a float32 request (another dtype retraces it).
        assert count.dtype == tf.int64 and request.dtype == tf.float32, (count.dtype, request.dtype)
        self.iterators.append(iterator)
        n = int(count.numpy())
        first = self.loop.state.step + 1
        self.calls.append((n, tuple(float(v) for v in request.numpy())))
        self.loop.examples.assign_add(n * BATCH)
        if self.on_call:
            self.on_call(len(self.calls))
        loss = tf.constant([s / 100 for s in range(first, first + n)], tf.float32)
        if self.states:  # one metric-state row per step: the row's first value is its step
            return loss, request, tf.constant([[float(s), 0.0] for s in range(first, first + n)])
        return loss, request

    def get_concrete_function(self, iterator, count, request):
        self.traced.append((iterator, int(count.numpy()), tuple(request.numpy().tolist())))


class _Checkpointer:
    def __init__(self):
        self.saved: list[tuple[int, dict, bool]] = []
        self.async_step = None
        self.last_committed = None
        self.upload_error = None
        self.found = None
        self.read: list[int] = []
        self.committed_steps: list[int] = []

    def save(self, step, doc, sync):
        self.saved.append((step, doc, sync))
        self.last_committed = step if sync else self.last_committed
        return True

    def wait_uploads(self):
        return self.upload_error

    def restore(self):
        return self.found

    def read_step(self, step):
        self.read.append(step)
        return True

    def committed(self, step):
        self.committed_steps.append(step)


class _Summaries:
    enabled = True

    def __init__(self):
        self.points: dict[int, dict] = {}
        self.synced = 0

    def scalars(self, step, values):
        self.points.setdefault(step, {}).update(values)

    def series(self, points):
        for step, values in points:
            self.scalars(step, values)

    def sync(self):
        self.synced += 1


@pytest.fixture
def make(file_run):
    made = []

    def build(*, chief=True, multi_worker=False, **options):
        cfg = TrainConfig(run_uri=file_run.uri, **{"steps": 10, "log_every": 2, "checkpoint_every_steps": 4,
                                                   "steps_per_call": 3, **options})
        store = open_store(file_run.uri)
        events = EventLog(store, attempt=2, stream=io.StringIO())
        ckstore = CheckpointStore(store)
        stop = StopRequest()
        loop = TrainLoop(cfg, store=store, ckstore=ckstore, events=events, emit=events.emit, stop=stop,
                         stop_key=StopKeyPoller(store, every=3600), chief=chief, multi_worker=multi_worker,
                         work=str(file_run.uri).removeprefix("file://") + "-work")
        loop.examples = tf.Variable(0, dtype=tf.int64)
        loop.global_batch = BATCH
        loop.checkpointer = _Checkpointer()
        loop.summaries = _Summaries()
        loop.spec = SimpleNamespace(optimizer=SimpleNamespace(learning_rate=0.01))
        made.append(loop)
        return loop

    yield build
    for loop in made:
        loop.events.close()


def _events(loop):
    loop.events.close()
    return read_events(loop.store)


def test_calls_stop_at_each_checkpoint_and_log_every_log_step_with_its_own_loss(make):
    loop = make()
    step = _Step(loop)
    assert loop._loop(step, iter(()), loop.examples) is False
    assert [n for n, _ in step.calls] == [3, 1, 3, 1, 2]  # never past a checkpoint step or the end
    assert all(r == GO for _, r in step.calls)
    assert [(s, sync) for s, _, sync in loop.checkpointer.saved] == [(4, False), (8, False)]  # the end is the ending's
    points = loop.summaries.points
    assert sorted(points) == [2, 4, 6, 8, 10]
    assert {s: points[s]["train/loss"] for s in points} == pytest.approx({s: s / 100 for s in points})
    assert points[4]["learning_rate"] == pytest.approx(0.01) and points[4]["checkpoint_save_s"] >= 0
    st = loop.state
    assert (st.step, st.batches_seen, st.examples_seen) == (10, 10, 10 * BATCH)
    assert st.loss == pytest.approx(0.10) and st.train_seconds > 0
    # Each checkpoint records the state as of its step, and whose attempt and model it is.
    step4 = loop.checkpointer.saved[0][1]
    assert step4["step"] == 4 and step4["examples_seen"] == 4 * BATCH and step4["attempt"] == 2
    assert step4["seed"] == loop.cfg.seed and step4["model"] == loop.cfg.model
    assert loop.first_call[1] == 3 * BATCH and loop.rate is not None


def test_a_call_that_spans_no_log_step_logs_nothing(make):
    loop = make(steps=5, log_every=10, checkpoint_every_steps=None, steps_per_call=2)
    step = _Step(loop)
    loop._loop(step, iter(()), loop.examples)
    assert [n for n, _ in step.calls] == [2, 2, 1]
    assert sorted(loop.summaries.points) == [5]  # only the run's last step
    assert loop.checkpointer.saved == []


def test_a_new_best_is_checkpointed_at_once_between_checkpoint_steps(make):
    loop = make(steps=12, checkpoint_every_steps=5, steps_per_call=3, eval_every_steps=3)
    loop.cadence.evaluates = True
    evaluated = []

    def evaluate():
        evaluated.append(loop.state.step)
        return loop.state.step == 6  # the best so far at step 6 only

    loop.evaluate = evaluate
    loop._loop(_Step(loop), iter(()), loop.examples)
    assert evaluated == [3, 6, 9]  # the evaluation steps before the end (the end's is the attempt's)
    # Calls of 3 cut at each checkpoint and evaluation step: 3, 5, 6, 9, 10, 12. The best at 6 is
    # checkpointed at once, between the checkpoint steps 5 and 10.
    assert [s for s, _, _ in loop.checkpointer.saved] == [5, 6, 10]


def test_a_signal_ends_the_loop_after_its_call_and_logs_that_step(make):
    loop = make()
    step = _Step(loop, on_call=lambda n: n == 2 and loop.stop.event.set())
    assert loop._loop(step, iter(()), loop.examples) is True
    assert loop.cancelled is False
    assert [n for n, _ in step.calls] == [3, 1]
    assert loop.state.step == 4 and loop.state.examples_seen == 4 * BATCH
    assert 4 in loop.summaries.points  # the step it stopped at is logged
    assert loop.checkpointer.saved == []  # the ending commits it, not the loop


def test_a_signal_before_a_call_is_asked_of_every_worker_in_the_step(make):
    loop = make()
    loop.stop.event.set()
    step = _Step(loop)
    assert loop._loop(step, iter(()), loop.examples) is True
    assert step.calls == [(3, STOP)] and loop.cancelled is False


def test_the_run_folders_stop_cancels(make):
    loop = make()
    step = _Step(loop, on_call=lambda n: n == 3 and loop.stop_key.event.set())
    assert loop._loop(step, iter(()), loop.examples) is True
    assert loop.cancelled is True and loop.state.step == 7


def test_the_stop_key_is_polled_by_the_chief_only_and_closed_after(make, monkeypatch):
    for chief in (True, False):
        loop = make(chief=chief, steps=2)
        started = []
        monkeypatch.setattr(loop.stop_key, "start", lambda started=started: started.append(1))
        loop._loop(_Step(loop), iter(()), loop.examples)
        assert started == ([1] if chief else []) and loop.stop_key._done.is_set()


def test_several_workers_act_on_the_request_they_agreed_on(make):
    loop = make(multi_worker=True)
    step = _Step(loop)

    def agreed(iterator, count, request):
        loss, _ = _Step.__call__(step, iterator, count, request)
        # Another worker saw STOP in the run folder: all of them cancel at this call.
        return loss, tf.constant(CANCEL if len(step.calls) == 2 else GO, tf.float32)

    assert loop._loop(agreed, iter(()), loop.examples) is True
    assert loop.cancelled is True and loop.state.step == 4


def test_the_seconds_clock_asks_for_a_checkpoint_off_the_step_grid(make, monkeypatch):
    loop = make(steps=6, checkpoint_every_steps=None, checkpoint_every_seconds=60.0, steps_per_call=2)
    clock = iter(range(0, 10_000, 25))  # every reading 25 s after the previous
    monkeypatch.setattr("trainer.loop.time.monotonic", lambda: float(next(clock)))
    step = _Step(loop)
    loop._loop(step, iter(()), loop.examples)
    checkpointed_on = [s for s, _, _ in loop.checkpointer.saved]
    asked = [i for i, (_, r) in enumerate(step.calls) if r == CHECKPOINT]
    assert asked and checkpointed_on == [2 * (i + 1) for i in asked if 2 * (i + 1) < 6]


def test_a_skipped_pipeline_traces_first_and_says_how_long_the_skip_took(make):
    loop = make(steps=3, steps_per_call=3)
    step = _Step(loop)
    made = __import__("time").monotonic()
    loop._loop(step, feed := iter(()), loop.examples, skipped=(40, "the pipeline cannot be saved", made))
    assert step.iterators == [feed]
    assert step.traced == [(step.iterators[0], 3, GO)]
    [skipped] = [e for e in _events(loop) if e["event"] == layout.DATA_SKIPPED]
    assert skipped["batches"] == 40 and skipped["steps"] == 3 and skipped["reason"] == "the pipeline cannot be saved"
    assert 0 <= skipped["seconds"] < 60


def test_the_first_call_is_not_a_measure_and_later_ones_pace_the_calls(make):
    loop = make(steps_per_call=None, checkpoint_every_steps=None, steps=1000)
    loop._called(1, 1, 5.0, None, 0.0)
    assert loop.first_call == (5.0, BATCH) and loop.cadence.auto_steps == 1
    assert loop.validation.since_eval == 5.0
    loop._called(2, 1, 0.001, None, 0.0)
    assert loop.cadence.auto_steps == 2 and loop.first_call == (5.0, BATCH)
    assert loop.validation.since_eval == pytest.approx(5.001)


def test_a_commit_reports_the_checkpoint_and_lets_the_previous_best_go(make):
    loop = make()
    committed = []
    loop.validation.committed = committed.append
    loop._on_commit({"step": 8, "seconds": 1.5, "bytes": 1234})
    assert loop.checkpointer.committed_steps == [8] and committed == [8]
    assert loop.commit_seconds == [(8, 1.5)]
    [ev] = _events(loop)
    assert (ev["event"], ev["step"], ev["seconds"], ev["bytes"]) == (layout.CHECKPOINT, 8, 1.5, 1234)
    # The next logged step writes the commit's time to TensorBoard, at the checkpoint's step.
    loop._summaries([(10, training_scalars(loop.spec, loop.state, 0.5, 100.0, 0.01))])
    assert loop.summaries.points[8] == {"checkpoint_s": 1.5} and loop.commit_seconds == []
    assert loop.summaries.points[10]["train/loss"] == 0.5


def test_commit_current_commits_the_step_once_and_reports_a_failed_upload(make):
    loop = make()
    loop.state.step = 7
    loop.commit_current()
    assert [(s, sync) for s, _, sync in loop.checkpointer.saved] == [(7, True)]
    assert loop.summaries.synced == 0  # in the background
    loop.commit_current()  # already committed: nothing more
    assert len(loop.checkpointer.saved) == 1
    loop.state.step = 9
    loop.checkpointer.async_step = 9
    loop.checkpointer.upload_error = OSError("connection reset")
    loop.checkpointer.last_committed = 9  # the async upload finished as it was waited for
    loop.commit_current()
    assert len(loop.checkpointer.saved) == 1
    failed = [e for e in _events(loop) if e["event"] == layout.CHECKPOINT_FAILED]
    assert [e["reason"] for e in failed] == ["OSError: connection reset"]


def test_a_resume_restores_the_state_and_protects_the_best(make):
    loop = make()
    best = {"metric": "val_loss", "mode": "min", "step": 6, "value": 0.1, "metrics": {}}
    saved = {**asdict(RunState(step=8, batches_seen=8, examples_seen=32, best=best)), "attempt": 1, "seed": 3}
    loop.checkpointer.found = (8, saved)
    loop.restore()
    assert loop.state == RunState(step=8, batches_seen=8, examples_seen=32, best=best)
    assert int(loop.examples.numpy()) == 32 and loop.ckstore.protect == {6}
    [resumed] = _events(loop)
    assert (resumed["event"], resumed["step"], resumed["examples_seen"], resumed["batches_seen"]) == (
        layout.RESUMED, 8, 32, 8)


def test_a_fresh_start_restores_nothing(make):
    loop = make()
    loop.examples.assign(99)
    loop.restore()
    assert loop.state == RunState() and int(loop.examples.numpy()) == 0 and _events(loop) == []


@pytest.mark.parametrize(("best", "step", "loaded", "read"), [
    (None, 10, False, []),
    ({"step": 10}, 10, True, []),  # the final weights are the best's
    ({"step": "6"}, 10, True, [6]),
])
def test_the_best_is_loaded_for_the_export_from_its_checkpoint(make, best, step, loaded, read):
    loop = make()
    loop.state.best, loop.state.step = best, step
    assert loop.load_best() is loaded and loop.checkpointer.read == read


def test_the_loops_speed_leaves_out_the_first_call():
    assert loop_speed(0.0, 100, None) == {}
    assert loop_speed(10.0, 1000, None) == {"loop_seconds": 10.0, "examples_per_sec": 100.0}
    assert loop_speed(10.0, 1000, (2.0, 40)) == {"loop_seconds": 10.0, "examples_per_sec": 100.0,
                                                 "steady_examples_per_sec": 120.0}
    assert loop_speed(2.0, 40, (2.0, 40)) == {"loop_seconds": 2.0, "examples_per_sec": 20.0}
    assert loop_speed(3.12345, 40, (2.0, 40)) == {"loop_seconds": 3.123, "examples_per_sec": 12.8}


def test_the_state_reports_its_newest_metrics_and_evaluation():
    st = RunState()
    assert st.latest_metrics() == {} and st.progress_extra() == {}
    st.train_metrics = {"accuracy": 0.5}
    assert st.progress_extra() == {"metrics": {"accuracy": 0.5}}
    st.evaluated, st.eval_seconds = {"step": 20, "metrics": {"val_loss": 0.3}}, 1.23456
    assert st.latest_metrics() == {"accuracy": 0.5, "val_loss": 0.3}
    assert st.progress_extra() == {"metrics": {"accuracy": 0.5, "val_loss": 0.3}, "evaluated_step": 20,
                                   "eval_seconds": 1.235}


def test_training_scalars_name_the_loss_metrics_rate_and_speed():
    spec = SimpleNamespace(optimizer=SimpleNamespace(learning_rate=tf.Variable(0.5)))
    st = RunState(train_metrics={"accuracy": 0.75})
    assert training_scalars(spec, st, 0.25, 1000.0, 0.01) == {
        "train/loss": 0.25, "train/accuracy": 0.75, "learning_rate": 0.5, "examples_per_sec": 1000.0,
        "step_time_s": 0.01}
    plain = SimpleNamespace(optimizer=SimpleNamespace(learning_rate=0.1))
    assert training_scalars(plain, RunState(), 1.0, 1.0, 1.0)["learning_rate"] == 0.1


def test_progress_is_written_on_its_clock(make, monkeypatch):
    loop = make(steps=4, steps_per_call=2, log_every=2, checkpoint_every_steps=None, progress_every_seconds=10.0)
    clock = iter(range(0, 10_000, 6))
    monkeypatch.setattr("trainer.loop.time.monotonic", lambda: float(next(clock)))
    loop._loop(_Step(loop), iter(()), loop.examples)
    loop.events.close()
    progress = json.loads(open_store(loop.cfg.run_uri).get_bytes(layout.PROGRESS_KEY))
    assert progress["step"] in (2, 4) and progress["total"] == 4 and progress["attempt"] == 2
    assert progress["loss"] == pytest.approx(progress["step"] / 100) and progress["examples_per_sec"] > 0


class _Clock:
    """time.monotonic for the loop: stands still except while a call runs (2 s each)."""

    def __init__(self, start=100.0):
        self.now = start

    def __call__(self):
        return self.now


def test_each_log_step_gets_its_calls_speed_and_metrics(make, monkeypatch):
    loop = make()
    clock = _Clock()
    monkeypatch.setattr("trainer.loop.time.monotonic", clock)

    def call(n):
        clock.now += 0.5

    class _Metrics:
        def results(self, row):
            return {"seen_step": float(row[0])}

    loop.validation.metrics = _Metrics()
    bar = []
    monkeypatch.setattr(loop.events, "start_bar", lambda total, done: bar.append(("start", total, done)))
    monkeypatch.setattr(loop.events, "update_bar", lambda step, loss, rate: bar.append((step, loss, rate)))
    loop._loop(_Step(loop, on_call=call, states=True), iter(()), loop.examples)
    p = loop.summaries.points
    # Calls of 3, 1, 3, 1, 2 steps, 0.5 s each: the first's log step 2 saw 12 examples in 0.5 s over 3 steps.
    assert (p[2]["examples_per_sec"], p[2]["step_time_s"]) == (24.0, pytest.approx(0.5 / 3))
    assert (p[4]["examples_per_sec"], p[4]["step_time_s"]) == (8.0, 0.5)
    assert (p[6]["examples_per_sec"], p[6]["step_time_s"]) == (24.0, pytest.approx(0.5 / 3))
    assert (p[10]["examples_per_sec"], p[10]["step_time_s"]) == (16.0, 0.25)
    assert {s: p[s]["train/seen_step"] for s in p} == {2: 2.0, 4: 4.0, 6: 6.0, 8: 8.0, 10: 10.0}
    assert loop.state.train_metrics == {"seen_step": 10.0}
    assert loop.state.train_seconds == 2.5 and loop.rate == 16.0
    assert loop.first_call == (0.5, 3 * BATCH) and loop.validation.since_eval == 2.5
    assert bar[0] == ("start", 10, 0) and bar[1] == (3, pytest.approx(0.03), 24.0) and bar[-1][0] == 10
    assert loop.checkpointer.saved[0][1]["train_seconds"] == 1.0  # two calls of 0.5 s before step 4's checkpoint
    assert loop.summaries.points[4]["checkpoint_save_s"] == 0.0


def test_the_speed_said_is_the_loops_so_far_with_its_checkpoints_as_finished_says_it(make, monkeypatch):
    loop = make()
    clock = _Clock()
    monkeypatch.setattr("trainer.loop.time.monotonic", clock)
    started = clock.now
    saved = loop.checkpointer.save

    def slow_save(step, doc, sync):
        clock.now += 1.0  # a checkpoint of 1 s: the loop's speed counts it, a log's does not
        return saved(step, doc, sync)

    monkeypatch.setattr(loop.checkpointer, "save", slow_save)
    bar = []
    monkeypatch.setattr(loop.events, "update_bar", lambda step, loss, rate: bar.append(rate))

    def call(n):
        clock.now += 0.5

    loop._loop(_Step(loop, on_call=call), iter(()), loop.examples)
    elapsed = clock.now - started
    assert len(loop.checkpointer.saved) >= 2 and elapsed > 5 * 0.5  # the checkpoints took time
    assert loop.rate == loop_speed(elapsed, 10 * BATCH, None)["examples_per_sec"] == round(40 / elapsed, 1)
    assert loop.summaries.points[2]["examples_per_sec"] == 24.0  # TensorBoard's: that log's calls only
    assert bar[0] == 24.0  # the first call, before any checkpoint: the loop so far is that call
    assert bar[-1] == loop.rate
    loop._progress()
    loop.events.close()
    progress = json.loads(open_store(loop.cfg.run_uri).get_bytes(layout.PROGRESS_KEY))
    assert progress["examples_per_sec"] == loop.rate


def test_a_loop_with_nothing_left_to_train_calls_nothing(make):
    loop = make()
    loop.state.step, loop.state.loss = 10, 0.5
    step = _Step(loop)
    assert loop._loop(step, iter(()), loop.examples) is False
    assert step.calls == [] and loop.state.loss == 0.5


def test_a_step_that_fails_fails_the_loop_in_the_stagings_words(make):
    loop = make()

    def failing(iterator, count, request):
        raise tf.errors.InternalError(None, None, "read error")

    with pytest.raises(tf.errors.InternalError):
        loop._loop(failing, iter(()), loop.examples)

    class _Staging:
        def check(self):
            raise OSError("data/part-3.tfrecord could not be staged: 403")

        def close(self):
            pass

    loop.staging = _Staging()
    with pytest.raises(OSError, match="could not be staged"):
        loop._loop(failing, iter(()), loop.examples)


def test_the_first_call_says_what_the_staging_has_on_disk(make, monkeypatch):
    loop = make(steps=3, steps_per_call=3)
    clock = _Clock(50.0)
    monkeypatch.setattr("trainer.loop.time.monotonic", clock)
    checked = []

    class _Staging:
        def check(self):
            checked.append(1)

        def on_disk(self):
            return {"files": 2, "bytes": 2048}

    loop.staging = _Staging()
    step = _Step(loop, on_call=lambda n: setattr(clock, "now", clock.now + 1.5))
    traced = step.get_concrete_function

    def tracing(*args):
        clock.now += 1.0  # tracing the step takes a second: not the skip's
        traced(*args)

    step.get_concrete_function = tracing
    loop._loop(step, iter(()), loop.examples, skipped=(7, "why", 40.0004))
    events = _events(loop)
    [first] = [e for e in events if e["event"] == layout.DATA_FIRST_STEP]
    assert (first["step"], first["files"], first["bytes"]) == (3, 2, 2048)
    [skipped] = [e for e in events if e["event"] == layout.DATA_SKIPPED]
    # From the pipeline's making to the first call's end (52.5 - 40.0004), less the tracing's second.
    assert skipped["seconds"] == 11.5
    assert checked == [1]


def test_a_fresh_loop_holds_nothing_yet(file_run):
    store = open_store(file_run.uri)
    events = EventLog(store, stream=io.StringIO())
    ckstore = CheckpointStore(store)
    cfg = TrainConfig(run_uri=file_run.uri)
    loop = TrainLoop(cfg, store=store, ckstore=ckstore, events=events, emit=events.emit, stop=StopRequest(),
                     stop_key=StopKeyPoller(store), chief=True, multi_worker=True, work="/tmp/w")
    assert (loop.workers, loop.worker) == (1, 0)
    assert loop.strategy is None and loop.spec is None and loop.examples is None and loop.checkpointer is None
    assert loop.pipeline is None and loop.staging is None and loop.cancelled is False and loop.rate is None
    assert (loop.global_micro, loop.global_batch, loop.loop_seconds, loop.loop_examples) == (0, 0, 0.0, 0)
    assert loop.first_call is None and loop.commit_seconds == [] and loop.state == RunState()
    assert ckstore.on_commit == loop._on_commit
    assert loop.cadence.multi_worker is True and loop.cadence.chief is True and loop.cadence.cfg is cfg
    assert loop.summaries.enabled is False and loop.summaries.store is store  # on once training starts
    assert loop.validation.ckstore is ckstore and loop.validation.emit == events.emit
    assert loop.speed() == {}
    events.close()


def test_the_global_batch_follows_the_replicas_and_accumulation(make):
    loop = make(batch_size=8, grad_accum=3)
    strategy = SimpleNamespace(num_replicas_in_sync=2)
    loop.use(strategy)
    assert loop.strategy is strategy and (loop.global_micro, loop.global_batch) == (16, 48)
    loop.loop_seconds, loop.loop_examples, loop.first_call = 10.0, 1000, (2.0, 40)
    assert loop.speed() == loop_speed(10.0, 1000, (2.0, 40))


def test_an_evaluation_writes_progress_and_the_end_evaluates_once(make):
    loop = make()
    asked = []

    class _Validation:
        evaluator = object()

        def setup(self, spec, strategy, global_batch, y_spec, *, workers, worker):
            assert spec is loop.spec and strategy is loop.strategy
            asked.append(("setup", y_spec, global_batch, workers, worker))

        def evaluate(self, st, scalars):
            assert scalars == loop.summaries.scalars  # the validation scalars go to TensorBoard
            asked.append(("evaluate", st.step))
            st.evaluated = {"step": st.step, "metrics": {"val_loss": 0.5}}
            return True

        def due_at_end(self, st):
            return st.evaluated is None or st.evaluated["step"] != st.step

    loop.validation = _Validation()
    loop.strategy = SimpleNamespace(num_replicas_in_sync=1)
    loop.state.step = 10
    assert loop.evaluate() is True
    loop.final_evaluation()
    assert asked == [("evaluate", 10), ("setup", None, BATCH, 1, 0)]
    loop._setup_metrics("the labels' spec")  # the training data's, when training starts
    assert asked[-1] == ("setup", "the labels' spec", BATCH, 1, 0)
    assert loop.cadence.evaluates is True
    loop.events.close()
    progress = json.loads(open_store(loop.cfg.run_uri).get_bytes(layout.PROGRESS_KEY))
    assert progress["evaluated_step"] == 10 and progress["metrics"] == {"val_loss": 0.5}


def test_progress_names_the_best(make):
    loop = make()
    loop.state.best = {"metric": "val_loss", "step": 4, "value": 0.2}
    loop.state.train_metrics = {"accuracy": 0.5}
    loop._progress()
    loop.events.close()
    progress = json.loads(open_store(loop.cfg.run_uri).get_bytes(layout.PROGRESS_KEY))
    assert progress["best"] == loop.state.best and progress["metrics"] == {"accuracy": 0.5}


def test_a_checkpoint_that_commits_nothing_reports_nothing(make):
    loop = make()
    loop.checkpointer.save = lambda step, doc, sync: False
    loop._checkpoint(sync=True)
    loop.events.close()
    assert not open_store(loop.cfg.run_uri).exists(layout.PROGRESS_KEY) and loop.summaries.synced == 0


def test_a_committed_checkpoint_syncs_tensorboard_in_the_background(make):
    loop = make()
    loop._checkpoint(sync=False)
    loop.events.close()
    assert loop.summaries.synced == 1 and open_store(loop.cfg.run_uri).exists(layout.PROGRESS_KEY)


def test_a_commit_without_its_seconds_counts_zero(make):
    loop = make()
    loop._on_commit({"step": 3})
    assert loop.commit_seconds == [(3, 0.0)]


@pytest.mark.parametrize(("args", "steady"), [
    ((2.0, 50, (2.0, 40)), None),  # nothing after the first call: no steady speed
    ((5.0, 1040, (2.0, 40)), 333.3),
])
def test_the_steady_speed_is_given_to_a_tenth(args, steady):
    assert loop_speed(*args).get("steady_examples_per_sec") == steady


def test_a_calls_log_points_read_the_learning_rate_once(make):
    """The learning rate is an eager read (a variable, a schedule): once a call, not once a point; every
    point of the call carries the value read after it."""

    class Rate:
        reads = 0

        def numpy(self):
            Rate.reads += 1
            return 0.5 / Rate.reads

    loop = make(steps=12, steps_per_call=6, log_every=2, checkpoint_every_steps=None)
    loop.spec = SimpleNamespace(optimizer=SimpleNamespace(learning_rate=Rate()))
    assert loop._loop(_Step(loop), iter(()), loop.examples) is False
    points = loop.summaries.points
    assert sorted(points) == [2, 4, 6, 8, 10, 12]  # six points in two calls of six steps
    assert Rate.reads == 2
    assert [points[s]["learning_rate"] for s in sorted(points)] == [0.5] * 3 + [0.25] * 3
