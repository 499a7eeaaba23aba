"""A fit script on two workers (Keras 2, `TF_USE_LEGACY_KERAS=1`, MultiWorkerMirroredStrategy on 127.0.0.1).

The script is what docs/your-fit-script.md's multi-worker recipe says: `tf.keras` with
`fit.strategy()` and `fit.callbacks()`. Each worker runs it as script mode's parent would (the
run's variables, its own local folders). The chief, stopped by a signal inside the second epoch,
commits that step and exits 143; the other worker loses its peer (exit 76). Started again, both restore the
chief's commit (the same step) and end with the very weights of a two-worker run that never
stopped (max |Δ| = 0). Only the chief commits. The model has a Dropout layer: its random
generator's state travels in the checkpoint, so the resumed run draws the same masks; one worker
alone, stopped and resumed inside an epoch, shows the same.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import numpy as np
import pytest

from devtools.servers import free_ports
from tests.trainer.helpers import script_command, trainer_env

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH = 8  # a global batch of 16 over 128 examples
SCRIPT = '''
import json, os, sys, time
import numpy as np
import tensorflow as tf
from trainer import fit

out, hold_at = sys.argv[1], int(sys.argv[2])
tf.keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
assert tf.keras.__name__.startswith("tf_keras"), tf.keras.__name__  # the recipe's Keras 2
strategy = fit.strategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dropout(0.2), tf.keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
rng = np.random.default_rng(0)
x, y = rng.random((128, 8), dtype=np.float32), rng.integers(0, 4, 128)
data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(128, seed=0, reshuffle_each_iteration=False).batch(16)


class Hold(tf.keras.callbacks.Callback):
    """After the chief's batch `hold_at`, wait for the stop signal: it lands at a known step."""

    def on_train_batch_end(self, batch, logs=None):
        if fit.is_chief() and int(self.model.optimizer.iterations.numpy()) == hold_at:
            open(os.path.join(out, "held"), "w").close()
            while not fit.STOP.event.is_set():
                time.sleep(0.05)


model.fit(data, epochs=3, callbacks=[*fit.callbacks(), Hold()], verbose=0)
np.savez(os.path.join(out, f"weights-{fit.is_chief()}.npz"), *model.get_weights())
os._exit(0)
'''


def _start(code, run, out, hold_at: int, count: int = 2) -> list[subprocess.Popen]:
    workers = [f"127.0.0.1:{p}" for p in free_ports(count)]
    procs = []
    for i in range(count):
        local = out / f"worker-{i}"
        local.mkdir(parents=True, exist_ok=True)
        env = trainer_env(TF_USE_LEGACY_KERAS="1", TRAINSTACK_RUN_URI=f"file://{run}",
                          TRAINSTACK_CHECKPOINT_DIR=str(local / "checkpoints"),
                          TRAINSTACK_TENSORBOARD_DIR=str(local / "tensorboard"),
                          TRAINSTACK_MESSAGES_FILE=str(local / "messages.jsonl"),
                          TF_CONFIG=json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
                          if count > 1 else "")
        argv, env = script_command([str(code), str(out), str(hold_at)], env)
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def _finish(procs, timeout: float = 300) -> list[tuple[int, str]]:
    got = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=timeout)
            got.append((p.returncode, text))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return got


def _messages(out, worker: int) -> list[dict]:
    path = out / f"worker-{worker}" / "messages.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _hold_then_stop(procs, out) -> None:
    deadline = time.monotonic() + 240
    while not (out / "held").exists():
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, _finish(procs, 5)
        time.sleep(0.1)
    procs[0].send_signal(signal.SIGTERM)  # the chief's spot notice


def _max_diff(got, ref) -> float:
    assert len(got.files) == len(ref.files) == 4
    return max(float(np.max(np.abs(got[k] - ref[k]))) for k in ref.files)


def test_one_worker_with_dropout_resumed_mid_epoch_draws_the_same_masks(tmp_path):
    # Keras 2's Dropout: its random generator's state travels in the checkpoint, so the batches
    # after the resume drop the same units as the run that never stopped.
    code = tmp_path / "train.py"
    code.write_text(SCRIPT)
    reference = tmp_path / "reference"
    results = _finish(_start(code, tmp_path / "reference-run", reference, hold_at=-1, count=1))
    assert [rc for rc, _ in results] == [0], [text[-3000:] for _, text in results]

    run, out = tmp_path / "run", tmp_path / "out"
    held = STEPS_PER_EPOCH + 3
    procs = _start(code, run, out, hold_at=held, count=1)
    _hold_then_stop(procs, out)
    stopped = _finish(procs, timeout=120)
    assert stopped[0][0] == 143, stopped[0][1][-3000:]
    (out / "held").unlink()
    results = _finish(_start(code, run, out, hold_at=-1, count=1))
    assert [rc for rc, _ in results] == [0], [text[-3000:] for _, text in results]
    resumed = [m for m in _messages(out, 0) if m["kind"] == "resumed"]
    assert [(m["step"], m["epoch"], m["batch"]) for m in resumed] == [(held + 1, 1, 4)], resumed
    assert _max_diff(np.load(out / "weights-True.npz"), np.load(reference / "weights-True.npz")) == 0.0


def test_two_workers_resume_the_chiefs_commit_and_end_as_if_never_stopped(tmp_path):
    from runfolder.storage import open_store
    from trainer.checkpoint_store import CheckpointStore

    code = tmp_path / "train.py"
    code.write_text(SCRIPT)

    reference = tmp_path / "reference"
    results = _finish(_start(code, tmp_path / "reference-run", reference, hold_at=-1))
    assert [rc for rc, _ in results] == [0, 0], [text[-3000:] for _, text in results]

    run, out = tmp_path / "run", tmp_path / "out"
    held = STEPS_PER_EPOCH + 3  # inside the second epoch
    procs = _start(code, run, out, hold_at=held)
    _hold_then_stop(procs, out)
    stopped = _finish(procs, timeout=120)
    assert stopped[0][0] == 143, stopped[0][1][-3000:]
    assert stopped[1][0] == 76, stopped[1][1][-3000:]  # it lost its peer: the cluster's loss, not its failure
    store = CheckpointStore(open_store(f"file://{run}"))
    assert store.committed_steps()[-1] == held + 1  # the chief's step, after the batch in progress
    assert not [m for m in _messages(out, 1) if m["kind"] == "checkpoint"]  # only the chief commits

    (out / "held").unlink()
    results = _finish(_start(code, run, out, hold_at=-1))
    assert [rc for rc, _ in results] == [0, 0], [text[-3000:] for _, text in results]
    for worker in (0, 1):
        resumed = [m for m in _messages(out, worker) if m["kind"] == "resumed"]
        assert [(m["step"], m["epoch"], m["batch"]) for m in resumed] == [(held + 1, 1, 4)], resumed
    assert store.committed_steps()[-1] == 3 * STEPS_PER_EPOCH
    ref = np.load(reference / "weights-True.npz")
    for chief in (True, False):
        assert _max_diff(np.load(out / f"weights-{chief}.npz"), ref) == 0.0
