"""The seed article's Keras script, changed as docs/your-fit-script.md says (examples/keras-fit/train.py),
trained through `python -m trainer ... -- python train.py` on an S3 bucket (moto_server).

Stopped by SIGTERM twice inside the second epoch (once after its 31st batch, then again after
the attempt resumed there), it ends COMPLETE with the very weights and metrics of a run that
never stopped (the guide's --deterministic recipe), its SavedModel loads and predicts, and
`ops status` shows its accuracy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runfolder import exits, layout
from tests.trainer.helpers import REPO, Trainer, kinds, run_trainer, script_command, store_events, trainer_env

EXAMPLE = REPO / "examples" / "keras-fit"
# 100 steps an epoch at batch 64. The stopped attempts run the same script held at a known step
# until the signal lands (tests/trainer/held_fit.py), so an epoch need not outlast the signal's
# way through the parent on a loaded machine. Any resume that re-runs an epoch, starts the
# stopped epoch over, skips one batch too many or too few, or loses the epoch's metric sums
# changes the final weights (compared to max |Δ| = 0) or the epoch's accuracy, at this size as at any.
STEPS_PER_EPOCH = 100
ARGS = ["train.py", "--epochs", "3", "--examples", str(64 * STEPS_PER_EPOCH), "--deterministic"]
SCRIPT = ["--code-dir", str(EXAMPLE), "--", "python", *ARGS]


def _held_script(at: int, flag) -> list[str]:
    return ["--code-dir", str(EXAMPLE), "--", "python", "-m", "tests.trainer.held_fit", "--hold-at", str(at),
            "--flag", str(flag), *ARGS]


def _wait_held(t: Trainer, flag, timeout: float = 300) -> None:
    """Until the script is held at its step (it wrote the flag): a short poll of a local file."""
    deadline = time.monotonic() + timeout
    while not flag.exists():
        assert t.proc.poll() is None, f"the trainer exited {t.proc.returncode} before its hold: {t.events}"
        assert time.monotonic() < deadline, f"not held within {timeout} s: {t.events}"
        time.sleep(0.05)


def _model_variables(uri: str, dest) -> dict:
    import tensorflow as tf

    from runfolder.storage import open_store

    store = open_store(uri)
    for key in store.list(layout.MODEL_PREFIX):
        path = dest / key[len(layout.MODEL_PREFIX):]
        path.parent.mkdir(parents=True, exist_ok=True)
        store.get_file(key, str(path))
    model = tf.saved_model.load(str(dest))
    return model, {v.name: v.numpy() for v in model.variables}


@pytest.mark.slow
def test_fit_script_survives_two_sigterms_and_ends_as_if_never_stopped(s3_run, tmp_path):
    import numpy as np

    env = trainer_env(s3_run.env)
    reference = f"file://{tmp_path}/reference"
    rc, _, err = run_trainer(reference, *SCRIPT, env=env, timeout=400)
    assert rc == 0, err[-3000:]

    uri = s3_run.uri
    # Held after the second epoch's 30th batch: the callback stops after the 31st.
    t = Trainer(uri, *_held_script(STEPS_PER_EPOCH + 30, tmp_path / "held-1"), env=env)
    _wait_held(t, tmp_path / "held-1")
    t.signal()
    assert t.wait(timeout=120) == exits.PREEMPTED, t.stderr[-3000:]
    first = t.wait_event(layout.PREEMPTED)
    assert first["step"] == STEPS_PER_EPOCH + 31, first

    # Resumed inside that epoch, held 30 batches on: stopped again inside it.
    t = Trainer(uri, *_held_script(STEPS_PER_EPOCH + 60, tmp_path / "held-2"), env=env)
    resumed = t.wait_event(layout.RESUMED, timeout=300)
    _wait_held(t, tmp_path / "held-2")
    signalled = time.monotonic()
    t.signal()
    assert t.wait(timeout=120) == exits.PREEMPTED, t.stderr[-3000:]
    stop_seconds = time.monotonic() - signalled
    second = t.wait_event(layout.PREEMPTED)

    rc, events, err = run_trainer(uri, *SCRIPT, env=env, timeout=400)
    assert rc == 0, err[-3000:]
    stored = store_events(uri)
    resumes = [e for e in stored if e["event"] == layout.RESUMED]
    # Each attempt continued where the last committed: inside an epoch, never from its start.
    assert [r["step"] for r in resumes] == [first["step"], second["step"]], resumes
    assert resumes[0] == {**resumes[0], "epoch": 1, "batch": 31}, resumes
    assert second["step"] == STEPS_PER_EPOCH + 61 and first["step"] == resumed["step"], (first, second, resumed)
    assert resumes[1] == {**resumes[1], "epoch": 1, "batch": 61}, resumes
    assert kinds(stored).count(layout.PREEMPTED) == 2 and kinds(stored)[-1] == layout.FINISHED
    assert stop_seconds < 30, stop_seconds

    # The same weights and the same epoch metrics as the run that never stopped.
    ref_model, ref = _model_variables(reference, tmp_path / "ref-model")
    model, got = _model_variables(uri, tmp_path / "model")
    assert sorted(ref) == sorted(got) and ref
    assert max(float(np.max(np.abs(ref[k] - got[k]))) for k in ref) == 0.0
    x = np.random.default_rng(1).random((4, 784), dtype=np.float32)
    assert model.serve(x).numpy().shape == (4, 10)
    np.testing.assert_array_equal(model.serve(x).numpy(), ref_model.serve(x).numpy())

    from runfolder.storage import open_store

    done = json.loads(open_store(uri).get_bytes(layout.COMPLETE))
    ref_done = json.loads(open_store(reference).get_bytes(layout.COMPLETE))
    assert done["step"] == ref_done["step"] == 3 * STEPS_PER_EPOCH
    assert done["metrics"] == ref_done["metrics"] and "accuracy" in done["metrics"], (done, ref_done)
    assert done["attempts"] == 3 and done["signature"]["endpoint"] == "serve"
    assert open_store(uri).list(layout.TENSORBOARD_PREFIX + "train/"), "no TensorBoard files uploaded"

    p = subprocess.run([sys.executable, "-m", "ops", "status", "--run-uri", uri], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "COMPLETE" in p.stdout and f"accuracy {done['metrics']['accuracy']:.4g}" in p.stdout, p.stdout


MWMS_WORKER = '''
import json, os, sys
import numpy as np
import keras
import tensorflow as tf
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": sys.argv[2].split(",")},
                                      "task": {"type": "worker", "index": int(sys.argv[1])}})
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input(shape=(784,)), keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
x, y = np.random.rand(512, 784).astype("float32"), np.random.randint(0, 10, 512)
try:
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(64), epochs=1, verbose=0)
    print("FIT OK", flush=True)
except ValueError as e:
    print("FIT FAILED", str(e)[-200:].replace(chr(10), " "), flush=True)
os._exit(0)
'''


@pytest.mark.slow
def test_keras_fit_under_multiworker_still_fails_so_script_mode_stays_on_one_machine(tmp_path):
    # keras-team/keras#20585 in the Keras we pin: the reason fit.strategy() refuses several workers
    # under Keras 3 (Keras 2, TF_USE_LEGACY_KERAS=1, trains: test_fit_multiworker.py) and run.command
    # refuses compute.nodes > 1. When this fails because fit works, lift both refusals.
    from devtools.servers import free_ports

    (tmp_path / "worker.py").write_text(MWMS_WORKER)
    peers = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    commands = [script_command([str(tmp_path / "worker.py"), str(i), peers], trainer_env()) for i in range(2)]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for argv, env in commands]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for out in outs:
        assert "FIT FAILED" in out and "PerReplica" in out, out[-2000:]


def test_outside_trainstack_the_helper_is_plain_keras(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name in ("TRAINSTACK_RUN_URI", "TRAINSTACK_MODEL_DIR", "TRAINSTACK_TENSORBOARD_DIR", "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    import keras
    import tensorflow as tf

    from trainer import fit

    cbs = fit.callbacks()
    assert [type(c) for c in cbs] == [keras.callbacks.TensorBoard] and cbs[0].log_dir == str(tmp_path / "logs")
    assert fit.model_dir() == str(tmp_path / "model")
    assert fit.strategy() is tf.distribute.get_strategy()  # no GPU, no cluster: the default
    monkeypatch.setenv("TRAINSTACK_RUN_URI", f"file://{tmp_path}/run")
    monkeypatch.setenv("TRAINSTACK_CHECKPOINT_EVERY_SECONDS", "30")
    cbs = fit.callbacks(histogram_freq=1)
    assert [type(c) for c in cbs] == [fit.RunCheckpoint, keras.callbacks.TensorBoard]
    assert cbs[0].every_seconds == 30.0 and cbs[1].histogram_freq == 1
    monkeypatch.setenv("TRAINSTACK_CHECKPOINT_EVERY_SECONDS", "0")  # the run's cadence switched off
    assert fit.callbacks()[0].every_seconds is None
    monkeypatch.setenv("TRAINSTACK_OUTPUT_DIR", str(tmp_path / "kept"))
    assert fit.output_dir() == str(tmp_path / "kept") and (tmp_path / "kept").is_dir()


def test_stage_copies_a_data_folder_once_and_tensorflow_reads_gs_but_not_s3(monkeypatch, tmp_path):
    import tensorflow as tf

    from trainer import fit

    data = tmp_path / "bucket" / "shards"
    (data / "part").mkdir(parents=True)
    (data / "a.tfrecord").write_bytes(b"a" * 10)
    (data / "part" / "b.tfrecord").write_bytes(b"b" * 20)
    monkeypatch.setenv("TRAINSTACK_DATA_DIR", str(tmp_path / "stage"))
    local = fit.stage(f"file://{data}")
    assert local.startswith(str(tmp_path / "stage"))
    assert Path(local, "part", "b.tfrecord").read_bytes() == b"b" * 20
    before = os.stat(os.path.join(local, "a.tfrecord")).st_mtime_ns
    assert fit.stage(f"file://{data}") == local  # again (a resumed attempt): nothing downloaded
    assert os.stat(os.path.join(local, "a.tfrecord")).st_mtime_ns == before
    with pytest.raises(FileNotFoundError, match="no files to stage"):
        fit.stage(f"file://{tmp_path / 'empty'}")
    # What the guide says of the pinned TensorFlow: gs:// is built in, s3:// is not.
    assert "gs" in tf.io.gfile.get_registered_schemes()
    with pytest.raises(tf.errors.UnimplementedError, match="s3"):
        tf.io.gfile.exists("s3://trainstack-data/shards")


@pytest.mark.parametrize(("tf_config", "gpus", "expected"), [
    ({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}, [], "multi-worker"),
    ({"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": 0}}, ["GPU:0"],
     "multi-worker"),
    ({"cluster": {"worker": ["a:1"], "ps": ["b:1"]}, "task": {"type": "worker", "index": 0}}, [], "default"),
    (None, ["GPU:0", "GPU:1"], "mirrored"),
    (None, [], "default"),
])
def test_the_helper_strategy_follows_the_cluster_then_the_gpus(monkeypatch, tf_config, gpus, expected):
    import tensorflow as tf

    from trainer import fit

    made = {"multi-worker": object(), "mirrored": object()}
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", lambda: made["multi-worker"])
    monkeypatch.setattr(tf.distribute, "MirroredStrategy", lambda: made["mirrored"])
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: list(gpus) if kind == "GPU" else [])
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    monkeypatch.setattr(fit, "KERAS2", True)  # several workers: Keras 2 alone (below, Keras 3)
    got = fit.strategy()
    assert got is made.get(expected, tf.distribute.get_strategy()), (expected, got)
    monkeypatch.setattr(fit, "KERAS2", False)
    if expected == "multi-worker":
        with pytest.raises(RuntimeError, match=r"keras-team/keras#20585.*TF_USE_LEGACY_KERAS=1"):
            fit.strategy()
    else:
        assert fit.strategy() is made.get(expected, tf.distribute.get_strategy())


TINY = '''
import sys
import keras
import numpy as np
import tensorflow as tf
from trainer import fit
units, epochs, then = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(units), keras.layers.Dense(2)])
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
data = tf.data.Dataset.from_tensor_slices((np.ones((32, 4), np.float32), np.zeros(32, np.int64))).batch(8)
model.fit(data, epochs=epochs, callbacks=fit.callbacks(), verbose=0)
sys.exit(then)
'''


@pytest.mark.slow
def test_the_helper_restores_the_newest_complete_checkpoint_and_refuses_another_models(tmp_path):
    # The whole-commit protocol through fit.callbacks(): a checkpoint without its COMMITTED marker
    # is skipped on restore; a committed one whose variables are another model's is refused, in
    # one line, with exit 78 (no retry), and nothing of the run is touched.
    from runfolder.storage import open_store
    from trainer.checkpoint_store import CheckpointStore

    code = tmp_path / "code"
    code.mkdir()
    (code / "tiny.py").write_text(TINY)
    uri = f"file://{tmp_path}/run"

    def attempt(units: int, epochs: int):
        return run_trainer(uri, "--code-dir", str(code), "--", "python", "tiny.py", str(units), str(epochs), "3",
                           timeout=180)

    rc, _, err = attempt(3, 2)  # 4 steps an epoch, a commit at each epoch's end; the script then fails
    assert rc == 1, err[-3000:]
    store = CheckpointStore(open_store(uri))
    assert store.committed_steps() == [4, 8]
    torn = tmp_path / "run" / layout.checkpoint_dir(999)  # an upload that never finished: files, no marker
    torn.mkdir()
    (torn / "state.json").write_text('{"step": 999, "epoch": 9, "batch": 0}')

    rc, events, err = attempt(3, 3)
    assert rc == 1, err[-3000:]
    skipped = [e for e in events if e["event"] == layout.CHECKPOINT_SKIPPED]
    assert [e["step"] for e in skipped] == [999] and "no COMMITTED marker" in skipped[0]["reason"], events
    assert [(e["step"], e["epoch"], e["batch"]) for e in events if e["event"] == layout.RESUMED] == [(8, 2, 0)]
    assert store.committed_steps()[-1] == 12  # the third epoch trained on from step 8

    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "run" / "checkpoints").rglob("*"))
    rc, events, err = attempt(5, 3)  # another model (a layer of 5 units) on the same run
    assert rc == exits.UNUSABLE, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("trainstack: checkpoint")]
    assert len(lines) == 1 and "written by another model" in lines[0] and "start a new run id" in lines[0], err[-3000:]
    assert "here" in lines[0] and "saved" in lines[0]  # which variable differs
    last_epoch = [e for e in store_events(uri) if e["event"] == "epoch"][-1]
    assert layout.RESUMED not in kinds(events) and events[-1]["event"] == layout.FAILED_EVENT, kinds(events)
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "run" / "checkpoints").rglob("*")) == before

    # The script fixed (it no longer fails after fit) and run again: past its last epoch it trains
    # nothing, and COMPLETE carries the last epoch's metrics from the newest committed checkpoint.
    rc, events, err = run_trainer(uri, "--code-dir", str(code), "--", "python", "tiny.py", "3", "3", "0", timeout=180)
    assert rc == 0, err[-3000:]
    assert "epoch" not in kinds(events)
    done = json.loads((tmp_path / "run" / layout.COMPLETE).read_text())
    assert done["metrics"] == last_epoch["metrics"] and "loss" in done["metrics"], (done, last_epoch)
