"""The fit helper (`from trainer import fit`) in this process: where things go, who is chief,
and `RunCheckpoint` on a tiny Keras model (commits, progress, a stop, a resume inside an epoch).

A stop ends the script with `os._exit`; here `os._exit` raises instead, so the test reads what
the callback left. The end-to-end twins (the helper inside a user's script under the trainer)
are in test_fit.py and examples/keras-fit.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from runfolder import environment
from runfolder.storage import open_store
from trainer.checkpoint_store import CheckpointStore

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
from trainer import fit  # noqa: E402 - after TensorFlow is known to be there

# A planted bug that never ends the training fails here instead of hanging the run.
pytestmark = pytest.mark.timeout(60)

STEPS = 4  # batches an epoch


class Exited(Exception):
    """`os._exit(code)`, caught."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith("TRAINSTACK_") or k == "TF_CONFIG":
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)

    def exit_(code):
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", exit_)
    fit.STOP.event.clear()
    fit.STOP.signal_name = None
    yield
    fit.STOP.event.clear()
    fit.STOP.signal_name = None


@pytest.fixture
def run_env(monkeypatch, tmp_path):
    """The variables script mode gives the command."""
    monkeypatch.setenv(environment.RUN_URI, f"file://{tmp_path}/run")
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path / "local"))
    monkeypatch.setenv(environment.MESSAGES_FILE, str(tmp_path / "messages.jsonl"))
    monkeypatch.setenv(environment.TENSORBOARD_DIR, str(tmp_path / "tb"))
    return tmp_path


def messages(tmp_path) -> list[dict]:
    path = tmp_path / "messages.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def tiny(units: int = 3, momentum: float = 0.0, steps_per_execution: int = 1):
    # The variables' names as a fresh script process gives them (Keras numbers layers per process).
    keras.backend.clear_session()
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(units), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=momentum), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=steps_per_execution)
    return model


def data():
    x = np.arange(8 * STEPS * 4, dtype=np.float32).reshape(8 * STEPS, 4) / 100.0
    y = (np.arange(8 * STEPS) % 2).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)


class StopAt(keras.callbacks.Callback):
    """A stop signal after the given (0-based) batch of the given epoch: before RunCheckpoint sees that batch end."""

    def __init__(self, epoch: int, batch: int):
        super().__init__()
        self.at, self.epoch = (epoch, batch), 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            fit.STOP.signal_name = "SIGTERM"
            fit.STOP.event.set()


def weights(model) -> list:
    return [v.numpy() for v in model.variables]


# -- where things go, who is chief --


@pytest.mark.parametrize(("tf_config", "workers", "chief"), [
    (None, 0, True),
    ({"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}}, 1, True),
    ({"cluster": {"chief": ["c"], "worker": ["a", "b"]}, "task": {"type": "chief", "index": 0}}, 3, True),
    ({"cluster": {"chief": ["c"], "worker": ["a", "b"]}, "task": {"type": "worker", "index": 0}}, 3, False),
    ({"cluster": {"worker": ["a", "b"], "ps": ["p"]}, "task": {"type": "worker", "index": 0}}, 2, True),
    ({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker", "index": "0"}}, 2, True),
    ({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker"}}, 2, True),
    ({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker", "index": 1}}, 2, False),
    ({"cluster": {"worker": ["a", "b"]}, "task": {"type": "ps", "index": 0}}, 2, False),
    ({"cluster": {"worker": ["a", "b"]}}, 2, False),
    ({"cluster": {"worker": ["a"]}}, 1, True),  # one machine is its own chief, whatever its task says
])
def test_the_chief_writes_the_checkpoints(monkeypatch, tf_config, workers, chief):
    if tf_config is not None:
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert fit._workers() == workers
    assert fit.is_chief() is chief


def test_several_workers_under_keras_3_are_refused_with_what_to_do(monkeypatch):
    monkeypatch.setattr(fit, "KERAS2", False)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                                "task": {"type": "worker", "index": 0}}))
    with pytest.raises(RuntimeError) as e:
        fit.strategy()
    assert str(e.value) == (
        "several workers need Keras 2: Keras 3's fit fails under MultiWorkerMirroredStrategy "
        "(keras-team/keras#20585); set TF_USE_LEGACY_KERAS=1 and build the model with tf.keras "
        "(docs/your-fit-script.md)")


def test_a_fresh_stop_flag_names_no_signal():
    stop = fit._Stop()
    assert stop.signal_name is None and not stop.event.is_set()


def test_outside_the_trainer_things_go_beside_the_script(tmp_path):
    assert fit.model_dir() == str(tmp_path / "model")
    assert fit.output_dir() == str(tmp_path / "outputs") and (tmp_path / "outputs").is_dir()
    assert fit.tensorboard_dir() == str(tmp_path / "logs")
    (board,) = fit.callbacks(histogram_freq=2)
    assert isinstance(board, keras.callbacks.TensorBoard)
    assert board.log_dir == str(tmp_path / "logs") and board.histogram_freq == 2
    assert fit.callbacks()[0].histogram_freq == 0  # no histograms unless asked: they cost time each epoch
    assert board.write_graph is True  # Keras 3: the graph is written as usual


def test_under_the_trainer_things_go_where_it_says(run_env, monkeypatch):
    tmp_path = run_env
    monkeypatch.setenv(environment.MODEL_DIR, str(tmp_path / "deep" / "m" / "model"))
    monkeypatch.setenv(environment.OUTPUT_DIR, str(tmp_path / "kept" / "out"))
    assert fit.model_dir() == str(tmp_path / "deep" / "m" / "model")
    assert (tmp_path / "deep" / "m").is_dir()  # its parent is made: model.save can write there at once
    assert fit.output_dir() == str(tmp_path / "kept" / "out") and (tmp_path / "kept" / "out").is_dir()
    assert fit.tensorboard_dir() == str(tmp_path / "tb")
    monkeypatch.setenv(environment.MODEL_DIR, str(tmp_path / "slash") + "/")
    assert fit.model_dir() == str(tmp_path / "slash") + "/"
    assert not (tmp_path / "slash").exists()  # a trailing slash names the same folder: its parent is made


@pytest.mark.parametrize(("arg", "env", "every"), [
    (None, None, None), (None, "30", 30.0), (None, "0", None), (None, "2.5", 2.5), (7.0, "30", 7.0), (7.0, None, 7.0)])
def test_the_run_checkpoint_comes_first_at_the_runs_cadence(run_env, monkeypatch, arg, env, every):
    if env is not None:
        monkeypatch.setenv(environment.CHECKPOINT_EVERY_SECONDS, env)
    cbs = fit.callbacks(checkpoint_every_seconds=arg, histogram_freq=1)
    assert [type(c) for c in cbs] == [fit.RunCheckpoint, keras.callbacks.TensorBoard]
    assert cbs[0].every_seconds == every and cbs[0].board is cbs[1]
    assert cbs[1].log_dir == str(run_env / "tb") and cbs[1].histogram_freq == 1


def test_the_checkpoint_keeps_what_the_run_says(run_env, monkeypatch):
    assert fit.RunCheckpoint().store.keep == 3
    monkeypatch.setenv(environment.KEEP_CHECKPOINTS, "5")
    cb = fit.RunCheckpoint()
    assert cb.store.keep == 5 and cb.local == str(run_env / "local")
    assert cb.store.store.uri == f"file://{run_env}/run"
    assert (cb.workers, cb.chief, cb.epoch, cb.batch, cb.step) == (1, True, 0, 0, 0)
    monkeypatch.delenv(environment.CHECKPOINT_DIR)
    assert fit.RunCheckpoint().local == str(run_env / "checkpoints")


def test_no_messages_file_sends_nothing(run_env, monkeypatch):
    monkeypatch.delenv(environment.MESSAGES_FILE)
    cb = fit.RunCheckpoint()
    cb._send("progress", step=1)
    assert messages(run_env) == []


def test_a_stop_signal_sets_the_flag_and_names_itself():
    stop = fit._Stop()
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop.install()
        for s in old:
            assert signal.getsignal(s) == stop._handle
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    stop._handle(signal.SIGINT, None)
    assert stop.event.is_set() and stop.signal_name == "SIGINT"


def test_a_lost_peer_ends_the_script_with_76_and_anything_else_is_reported(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(sys, "__excepthook__", lambda *a: seen.append(a))
    lost = tf.errors.UnavailableError(None, None, "peer gone")
    with pytest.raises(Exited) as e:
        fit._peer_lost_hook(type(lost), lost, None)
    assert e.value.code == fit.EXIT_PEER_LOST == 76
    assert capsys.readouterr().err == ("trainstack: a worker of the cluster was lost (UnavailableError); "
                                       "exiting 76\n")
    try:
        raise ValueError("mine")
    except ValueError as e:
        other, tb = e, e.__traceback__
    fit._peer_lost_hook(ValueError, other, tb)
    assert seen == [(ValueError, other, tb)]  # Python's own report, with where it happened
    fit._peer_lost_hook(KeyboardInterrupt, KeyboardInterrupt(), None)
    assert len(seen) == 2


def test_values_keras_logs_become_plain_numbers():
    assert fit._plain(np.float32(0.5)) == 0.5 and fit._plain("x") is None and fit._plain(None) is None
    assert fit._plain(tf.constant(2.0)) == 2.0


# -- RunCheckpoint on a tiny model --


def test_each_epoch_is_committed_and_said(run_env):
    model = tiny()
    cb = fit.RunCheckpoint()
    model.fit(data(), epochs=2, callbacks=[cb], verbose=0, shuffle=False)
    store = CheckpointStore(open_store(f"file://{run_env}/run"))
    assert store.committed_steps() == [STEPS, 2 * STEPS]
    said = messages(run_env)
    epochs = [m for m in said if m["kind"] == "epoch"]
    assert [(m["step"], m["total"], m["epoch"]) for m in epochs] == [(STEPS, 2 * STEPS, 1), (2 * STEPS, 2 * STEPS, 2)]
    assert set(epochs[0]["metrics"]) == {"loss", "accuracy"} and all(
        isinstance(v, float) for v in epochs[0]["metrics"].values())
    assert 0 <= epochs[0]["epoch_seconds"] < 60
    commits = [m for m in said if m["kind"] == "checkpoint"]
    assert [m["step"] for m in commits] == [STEPS, 2 * STEPS]
    assert all(m["bytes"] > 0 and m["seconds"] >= 0 for m in commits)
    # What a resume needs, saved with the variables.
    dest = run_env / "restored"
    assert store.restore_latest(str(dest)) == 2 * STEPS
    state = json.loads((dest / fit.STATE_FILE).read_text())
    assert (state["step"], state["epoch"], state["batch"]) == (2 * STEPS, 2, 0)
    assert state["epoch_logs"] == epochs[-1]["metrics"]
    assert state["structure"] == cb._structure() and len(state["structure"]) == len(model.variables) + len(
        model.optimizer.variables)
    assert all(":" in s and s.endswith("]") for s in state["structure"])
    assert set(state["metrics"]) == {fit._name(v) for v in fit._metric_variables(model)}
    # Only the newest local snapshot folder is left (the upload has its own copy).
    assert sorted(os.listdir(run_env / "local")) == [f"{fit.CKPT_PREFIX}-{2 * STEPS}"]
    assert len(cb.save_seconds) == 2


def test_a_rerun_resumes_after_the_last_epoch_and_trains_only_what_is_left(run_env):
    model = tiny()
    model.fit(data(), epochs=2, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    first = messages(run_env)
    (run_env / "messages.jsonl").unlink()
    again = tiny()
    history = again.fit(data(), epochs=3, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    said = messages(run_env)
    resumed = [m for m in said if m["kind"] == "resumed"]
    last = [m for m in first if m["kind"] == "epoch"][-1]
    assert resumed == [{"kind": "resumed", "step": 2 * STEPS, "epoch": 2, "batch": 0, "total": 3 * STEPS,
                        "metrics": last["metrics"]}]
    assert len(history.history["loss"]) == 1  # the third epoch only
    assert [m["epoch"] for m in said if m["kind"] == "epoch"] == [3]
    assert int(again.optimizer.iterations.numpy()) == 3 * STEPS


# Two batches a call: the resume skips the stopped epoch's first two in one call of the step.
@pytest.mark.parametrize("per_call", [1, 2])
def test_a_stop_inside_an_epoch_commits_that_step_and_the_resume_ends_as_if_never_stopped(run_env, monkeypatch,
                                                                                        per_call):
    straight = tiny(steps_per_execution=per_call)
    straight.fit(data(), epochs=2, verbose=0, shuffle=False)
    model = tiny(steps_per_execution=per_call)
    cb = fit.RunCheckpoint()
    with pytest.raises(Exited) as e:
        model.fit(data(), epochs=2, callbacks=[StopAt(1, 1), cb], verbose=0, shuffle=False)
    assert e.value.code == 143
    store = CheckpointStore(open_store(f"file://{run_env}/run"))
    assert store.committed_steps()[-1] == STEPS + 2  # synchronously, over the epoch end's if still queued
    stopped = [m for m in messages(run_env) if m["kind"] == "stopped"]
    assert stopped == [{"kind": "stopped", "step": STEPS + 2, "signal": "SIGTERM"}]
    dest = run_env / "restored"
    store.restore_latest(str(dest))
    state = json.loads((dest / fit.STATE_FILE).read_text())
    assert (state["step"], state["epoch"], state["batch"]) == (STEPS + 2, 1, 2)
    assert any(v != 0 for v in np.ravel(next(iter(state["metrics"].values()))))  # the epoch's sums so far
    fit.STOP.event.clear()
    (run_env / "messages.jsonl").unlink()
    monkeypatch.setattr(fit, "PROGRESS_EVERY_S", 0.0)  # progress at each call's end: none for the skipped ones
    (run_env / "local" / "kept.txt").write_text("the script's own")  # the restore replaces only its own folder
    resumed = tiny(steps_per_execution=per_call)
    history = resumed.fit(data(), epochs=2, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    said = messages(run_env)
    assert [m for m in said if m["kind"] == "resumed"][0] == {
        "kind": "resumed", "step": STEPS + 2, "epoch": 1, "batch": 2, "total": 2 * STEPS,
        "metrics": state["epoch_logs"]}
    for a, b in zip(weights(straight), weights(resumed), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # The epoch's accuracy covers the batches before the stop too.
    straight_acc = straight.get_metrics_result()["accuracy"]
    assert history.history["accuracy"][-1] == pytest.approx(float(straight_acc), abs=1e-6)
    assert store.committed_steps()[-1] == 2 * STEPS
    assert [m["step"] for m in said if m["kind"] == "epoch"] == [2 * STEPS]
    assert not (run_env / "restore").exists()  # restored under the checkpoint folder, not where the script runs
    assert (run_env / "local" / "kept.txt").read_text() == "the script's own"
    assert [m["step"] for m in said if m["kind"] == "progress"] == list(range(STEPS + 2 + per_call, 2 * STEPS + 1, per_call))
    # The first call trained after the skip reports the sums added back too (at two a call, the epoch's last).
    progress = [m for m in said if m["kind"] == "progress"]
    assert progress[-1]["metrics"]["accuracy"] == pytest.approx(float(straight_acc), abs=1e-6)


def test_a_stop_before_training_begins_commits_and_exits(run_env):
    fit.STOP.event.set()
    fit.STOP.signal_name = "SIGINT"
    model = tiny()
    with pytest.raises(Exited) as e:
        model.fit(data(), epochs=1, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    assert e.value.code == 143
    assert CheckpointStore(open_store(f"file://{run_env}/run")).committed_steps() == [0]
    assert [m for m in messages(run_env) if m["kind"] == "stopped"] == [
        {"kind": "stopped", "step": 0, "signal": "SIGINT"}]


def test_a_stop_exits_143_even_when_the_uploads_tensorboard_or_output_fail_at_the_end(run_env, monkeypatch):
    class Broken:
        def write(self, text):
            return len(text)

        def flush(self):
            raise OSError("the pipe is gone")

    def fail():
        raise RuntimeError("an upload failed")

    fit.STOP.event.set()
    board = keras.callbacks.TensorBoard(str(run_env / "tb"))
    cb = fit.RunCheckpoint(board=board)
    monkeypatch.setattr(board, "_close_writers", fail)
    monkeypatch.setattr(cb.store, "wait", fail)
    monkeypatch.setattr(sys, "stdout", Broken())
    with pytest.raises(Exited) as e:
        tiny().fit(data(), epochs=1, callbacks=[cb], verbose=0, shuffle=False)
    assert e.value.code == 143
    assert [m["step"] for m in messages(run_env) if m["kind"] == "stopped"] == [0]


def test_a_stop_before_a_resume_has_skipped_its_batches_commits_nothing_again(run_env):
    with pytest.raises(Exited):
        tiny().fit(data(), epochs=1, callbacks=[StopAt(0, 0), fit.RunCheckpoint()], verbose=0, shuffle=False)
    (run_env / "messages.jsonl").unlink()  # the stop's commit of step 1, batch 1; the signal still set
    with pytest.raises(Exited) as e:
        tiny().fit(data(), epochs=1, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    assert e.value.code == 143
    said = messages(run_env)
    # The step restored is committed already; saved again before its batch is skipped, its metric sums would be lost.
    assert [m["kind"] for m in said if m["kind"] != "event"] == ["resumed", "stopped"]
    # No epoch had ended: the resume names no metrics.
    assert said[0] == {"kind": "resumed", "step": 1, "epoch": 0, "batch": 1, "total": STEPS}
    assert said[-1] == {"kind": "stopped", "step": 1, "signal": "SIGTERM"}


def test_a_stop_at_an_epochs_end_commits_once_more_and_exits(run_env):
    model = tiny()

    class StopAtEnd(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            fit.STOP.event.set()

    with pytest.raises(Exited):
        model.fit(data(), epochs=3, callbacks=[StopAtEnd(), fit.RunCheckpoint()], verbose=0, shuffle=False)
    assert CheckpointStore(open_store(f"file://{run_env}/run")).committed_steps() == [STEPS]


def test_another_models_checkpoint_is_refused_with_exit_78(run_env, capsys):
    tiny(3).fit(data(), epochs=1, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    before = sorted(p.name for p in (run_env / "run" / "checkpoints").iterdir())
    with pytest.raises(Exited) as e:
        tiny(5).fit(data(), epochs=2, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    assert e.value.code == 78
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("trainstack:")]
    assert len(lines) == 1
    assert lines[0].startswith(f"trainstack: checkpoint {STEPS} in file://{run_env}/run was written by another model "
                               "(variables differ: ")
    assert ":[4, 5] here, " in lines[0] and ":[4, 3] saved)" in lines[0]
    assert lines[0].endswith("; start a new run id for this model")
    assert sorted(p.name for p in (run_env / "run" / "checkpoints").iterdir()) == before


def test_a_model_with_more_variables_than_saved_is_refused(run_env, capsys):
    tiny(3).fit(data(), epochs=1, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    with pytest.raises(Exited) as e:  # the same layers, an optimizer with momentum slots
        tiny(3, momentum=0.9).fit(data(), epochs=2, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    assert e.value.code == 78
    assert " here, nothing saved)" in capsys.readouterr().err


def test_a_model_with_fewer_variables_than_saved_is_refused(run_env, capsys):
    tiny(3, momentum=0.9).fit(data(), epochs=1, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    with pytest.raises(Exited) as e:  # the momentum slots saved, none here
        tiny(3).fit(data(), epochs=2, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    assert e.value.code == 78
    assert "(variables differ: nothing here, " in capsys.readouterr().err


def test_time_based_commits_between_epoch_ends_and_progress(run_env, monkeypatch):
    monkeypatch.setattr(fit, "PROGRESS_EVERY_S", 0.0)
    model = tiny()
    model.fit(data(), epochs=1, callbacks=[fit.RunCheckpoint(every_seconds=1e-9)], verbose=0, shuffle=False)
    assert CheckpointStore(open_store(f"file://{run_env}/run")).committed_steps()[-1] == STEPS
    said = messages(run_env)
    progress = [m for m in said if m["kind"] == "progress"]
    assert [(m["step"], m["total"], m["epoch"]) for m in progress] == [(s, STEPS, 0) for s in range(1, STEPS + 1)]
    assert set(progress[0]["metrics"]) >= {"loss", "accuracy"}
    # A commit after each batch (a queued one may give way to a newer): more than the epoch end's.
    assert len({m["step"] for m in said if m["kind"] == "checkpoint"}) >= 2


class Clock(keras.callbacks.Callback):
    """The helper's clock, moved 10 s before each batch of the first epoch and still otherwise."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.now = 0.0
        monkeypatch.setattr(fit, "time", type("Time", (), {"monotonic": staticmethod(lambda: self.now)}))

    def on_epoch_begin(self, epoch, logs=None):
        self.now = 0.0123  # before the helper reads the epoch's start

    def on_train_batch_begin(self, batch, logs=None):
        self.now = 10.0 * (batch + 1)


def test_a_commit_and_progress_are_due_once_their_seconds_have_passed_in_full(run_env, monkeypatch):
    monkeypatch.setattr(fit, "PROGRESS_EVERY_S", 20.0)
    clock = Clock(monkeypatch)
    cb = fit.RunCheckpoint(every_seconds=20.0)

    def waits(step, folder):
        raise AssertionError(f"the training waited for checkpoint {step}'s upload")

    monkeypatch.setattr(cb.store, "commit", waits)  # only a stop waits for its commit
    tiny().fit(data(), epochs=1, callbacks=[clock, cb], verbose=0, shuffle=False)
    # Batches end at 10, 20, 30, 40 s: due at 20 and 40 (exactly 20 s after the last), then the epoch's end.
    assert len(cb.save_seconds) == 3
    said = messages(run_env)
    assert [m["step"] for m in said if m["kind"] == "progress"] == [2, 4]
    assert [m["epoch_seconds"] for m in said if m["kind"] == "epoch"] == [39.988]  # to the millisecond


def test_without_a_cadence_only_epoch_ends_commit_and_progress_waits(run_env):
    model = tiny()
    model.fit(data(), epochs=1, callbacks=[fit.RunCheckpoint(every_seconds=None)], verbose=0, shuffle=False)
    said = messages(run_env)
    assert [m["step"] for m in said if m["kind"] == "checkpoint"] == [STEPS]
    assert [m for m in said if m["kind"] == "progress"] == []


def test_several_workers_commit_at_epoch_ends_only_and_save_no_metric_sums(run_env, monkeypatch):
    model = tiny()
    cb = fit.RunCheckpoint(every_seconds=1e-9)
    cb.workers = 2
    model.fit(data(), epochs=1, callbacks=[cb], verbose=0, shuffle=False)
    store = CheckpointStore(open_store(f"file://{run_env}/run"))
    assert store.committed_steps() == [STEPS]
    dest = run_env / "restored"
    store.restore_latest(str(dest))
    assert json.loads((dest / fit.STATE_FILE).read_text())["metrics"] == {}


def test_a_worker_that_is_not_chief_commits_nothing(run_env):
    model = tiny()
    cb = fit.RunCheckpoint()
    cb.chief = False
    model.fit(data(), epochs=1, callbacks=[cb], verbose=0, shuffle=False)
    assert CheckpointStore(open_store(f"file://{run_env}/run")).committed_steps() == []
    assert not (run_env / "local" / f"{fit.CKPT_PREFIX}-{STEPS}").exists()


def test_several_workers_take_the_stop_signals_back_after_the_strategy_starts(monkeypatch):
    made = object()
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", lambda: made)
    monkeypatch.setattr(fit, "KERAS2", True)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                                "task": {"type": "worker", "index": 0}}))
    installed = []
    monkeypatch.setattr(fit.STOP, "install", lambda: installed.append(True))
    assert fit.strategy() is made and installed == []  # outside the trainer: its own handlers stay
    monkeypatch.setenv(environment.RUN_URI, "file:///tmp/run")
    assert fit.strategy() is made and installed == [True]


class _Var:
    def __init__(self, name, path=None):
        self.name = name
        if path is not None:  # Keras 2's variables have no `path` at all
            self.path = path


def test_keras_2s_variables_go_by_name_and_its_dropout_state_is_saved(monkeypatch):
    assert fit._name(_Var("dense/kernel:0", "seq/dense/kernel")) == "seq/dense/kernel"
    assert fit._name(_Var("dense/kernel:0")) == "dense/kernel:0"
    assert fit._name(_Var("dense/kernel:0", "")) == "dense/kernel:0"

    class Metric:
        variables = ["total", "count"]

    class Keras2Model:
        metrics = [Metric(), Metric()]

        def _flatten_layers(self, include_self=True):
            assert include_self is False
            return layers

    class Layer:
        def __init__(self, generator):
            self._random_generator = type("G", (), {"_generator": generator})()

    generator = tf.random.Generator.from_seed(1)
    layers = [Layer(generator), Layer(None), object()]
    assert fit._metric_variables(Keras2Model()) == ["total", "count", "total", "count"]
    assert fit._random_states(Keras2Model()) == []  # Keras 3 keeps them among the variables
    monkeypatch.setattr(fit, "KERAS2", True)
    assert fit._random_states(Keras2Model()) == [generator.state]


def test_a_keras_2_resume_asks_fit_to_start_at_the_saved_epoch(run_env, monkeypatch):
    tiny().fit(data(), epochs=1, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    model = tiny()
    cb = fit.RunCheckpoint()
    cb.set_model(model)
    cb.set_params({"steps": STEPS, "epochs": 3})
    monkeypatch.setattr(fit, "KERAS2", True)
    monkeypatch.setattr(fit, "_random_states", lambda m: [])
    cb.on_train_begin()
    assert model._initial_epoch == 1
    assert model._maybe_load_initial_counters_from_ckpt(STEPS, 0) == (1, 0)


def test_a_stop_closes_tensorboards_files_before_it_exits(run_env):
    closed = []

    class Board:
        def _close_writers(self):
            closed.append(True)

    fit.STOP.event.set()
    with pytest.raises(Exited):
        tiny().fit(data(), epochs=1, callbacks=[fit.RunCheckpoint(board=Board())], verbose=0, shuffle=False)
    assert closed == [True]


def test_relative_folders_are_made_where_the_script_runs_and_again_without_error(tmp_path, monkeypatch):
    monkeypatch.setenv(environment.MODEL_DIR, "m")
    monkeypatch.setenv(environment.OUTPUT_DIR, "o")
    for _ in range(2):
        assert fit.model_dir() == "m" and fit.output_dir() == "o"
    assert sorted(os.listdir(tmp_path)) == ["o"]  # the model folder itself is the save's to make
    monkeypatch.setenv(environment.MODEL_DIR, str(tmp_path / "a" / "model"))
    for _ in range(2):
        fit.model_dir()
    assert sorted(os.listdir(tmp_path)) == ["a", "o"] and not (tmp_path / "a" / "model").exists()
    monkeypatch.setenv(environment.MODEL_DIR, str(tmp_path / "b" / "X"))  # any name, any letters
    fit.model_dir()
    assert (tmp_path / "b").is_dir() and not (tmp_path / "b" / "X").exists()


def test_stage_keeps_each_data_set_in_a_folder_of_its_own(tmp_path, monkeypatch):
    import hashlib

    data = tmp_path / "bucket" / "shards"
    data.mkdir(parents=True)
    (data / "a.tfrecord").write_bytes(b"a")
    local = fit.stage(f"file://{data}")  # no TRAINSTACK_DATA_DIR: ./data
    assert local == str(tmp_path / "data" / hashlib.sha256(f"file://{data}".encode()).hexdigest()[:16])
    assert Path(local, "a.tfrecord").read_bytes() == b"a"


def test_keras_2_writes_no_graph_to_tensorboard(monkeypatch):
    monkeypatch.setattr(fit, "KERAS2", True)
    (board,) = fit.callbacks()
    assert board.write_graph is False


def test_the_signals_are_only_taken_on_the_main_thread():
    import threading

    stop = fit._Stop()
    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=stop.install)
    t.start()
    t.join()
    assert signal.getsignal(signal.SIGTERM) == before


def test_messages_carry_any_value_and_the_total_only_when_known(run_env):
    cb = fit.RunCheckpoint()
    cb._send("event", event="note", at=object)
    assert messages(run_env)[0]["at"] == str(object)
    for params, total in (({"steps": 4, "epochs": 3}, 12), ({"steps": None, "epochs": 3}, None),
                          ({"steps": 4, "epochs": None}, None), ({}, None)):
        cb.set_params(params)
        assert cb._total() == total


def test_the_stores_own_events_reach_the_parent(run_env):
    tiny().fit(data(), epochs=1, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    torn = run_env / "run" / "checkpoints" / "ckpt-99"  # files, no COMMITTED marker
    torn.mkdir(parents=True)
    (torn / "state.json").write_text("{}")
    (run_env / "messages.jsonl").unlink()
    tiny().fit(data(), epochs=2, callbacks=[fit.RunCheckpoint()], verbose=0, shuffle=False)
    said = messages(run_env)
    skipped = [m for m in said if m["kind"] == "event" and m["event"] == "checkpoint_skipped"]
    assert len(skipped) == 1 and skipped[0]["step"] == 99
    assert [m["step"] for m in said if m["kind"] == "resumed"] == [STEPS]
