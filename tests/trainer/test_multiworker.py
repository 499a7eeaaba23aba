"""Two worker processes on 127.0.0.1 (TF_CONFIG): MultiWorkerMirroredStrategy trains and stops together."""

from __future__ import annotations

import json
import signal

import pytest

from devtools.servers import free_ports
from tests.trainer.helpers import Trainer, trainer_env, waiting_model

pytestmark = pytest.mark.slow



def test_two_workers_train_and_stop_at_the_same_step_when_one_is_signalled(file_run, tmp_path):
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    # Checkpoints by time only: the chief's clock decides, the all-reduced request makes every worker save.
    # Each batch 25 ms late: the workers train on through two checkpoints' seconds at a small part of a core.
    args = [*waiting_model(tmp_path / "code"), "--steps", "100000", "--batch-size", "16", "--checkpoint-every-steps",
            "0", "--checkpoint-every-seconds", "1", "--log-every", "10"]
    procs = []
    for i in range(2):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
        procs.append(Trainer(file_run.uri, *args, env=trainer_env(file_run.env, TF_CONFIG=tf_config)))
    chief, other = procs
    try:
        started = chief.wait_event("started", timeout=240)
        assert started["workers"] == 2 and started["replicas"] == 2 and started["global_batch"] == 32
        first = chief.wait_event("checkpoint", timeout=240)["step"]
        chief.wait_event("checkpoint", timeout=60, pred=lambda e: e["step"] > first)
        # Only the non-chief gets the signal: the all-reduced request stops both after one step.
        other.signal(signal.SIGTERM)
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.proc.poll() is None:
                p.proc.kill()
    assert codes == [143, 143], [p.stderr[-2000:] for p in procs]
    stops = [[e for e in p.events if e["event"] == "preempted"] for p in procs]
    assert all(len(s) == 1 for s in stops), stops
    assert stops[0][0]["step"] == stops[1][0]["step"]
    step = stops[0][0]["step"]
    assert stops[0][0]["examples_seen"] == step * 32  # both workers' batches counted
    from runfolder.storage import open_store
    from trainer.checkpoint_store import CheckpointStore

    store = open_store(file_run.uri)
    assert CheckpointStore(store).committed_steps()[-1] == step
    # Only the chief writes to the run: its checkpoint events, nobody else's.
    assert not any(e["event"] == "checkpoint" for e in other.events)
    stored = [json.loads(line) for line in store.get_bytes("events.jsonl").decode().splitlines()]
    assert [e["event"] for e in stored].count("started") == 1


def test_two_workers_evaluate_the_whole_validation_set_once_with_the_results_reduced(tmp_path):
    """Each worker evaluates half the validation batches; the results, reduced once, are the whole set's."""
    from trainer.data import MNIST_VALIDATION

    common = ["--synthetic", "--deterministic", "--steps", "20", "--checkpoint-every-steps", "20",
              "--eval-every-steps", "10", "--log-every", "10", "--batch-size", "16"]
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    uri = f"file://{tmp_path}/runs/two"
    procs = []
    for i in range(2):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
        procs.append(Trainer(uri, *common, env=trainer_env(TF_CONFIG=tf_config)))
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.proc.poll() is None:
                p.proc.kill()
    # A failure's own `failed` event names the error; TensorFlow's log tail alone may not.
    assert codes == [0, 0], [([e for e in p.events if e["event"] == "failed"], p.stderr[-1500:]) for p in procs]
    evals = [[e for e in p.events if e["event"] == "evaluated"] for p in procs]
    assert [[e["step"] for e in ev] for ev in evals] == [[10, 20], [10, 20]]
    assert all(e["examples"] == MNIST_VALIDATION for ev in evals for e in ev)
    assert [e["metrics"] for e in evals[0]] == [e["metrics"] for e in evals[1]]

    # The reduced result at the end is the loss of the exported (final) model over the whole set.
    import numpy as np
    import tensorflow as tf

    from trainer.data import preprocess, synthetic_mnist_validation

    x, y = synthetic_mnist_validation()
    serve = tf.saved_model.load(f"{tmp_path}/runs/two/model").signatures["serving_default"]
    pred = next(iter(serve(x=preprocess(tf.constant(x))).values())).numpy()
    assert evals[0][-1]["metrics"] == pytest.approx({"val_loss": float(np.mean(-np.log(pred[np.arange(len(y)), y]))),
                                                     "val_accuracy": float(np.mean(pred.argmax(1) == y))}, rel=1e-4)
