"""Metrics and evaluation in the trainer's own loop: TensorBoard, events, COMPLETE, the best checkpoint, exact resume."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest

from tests.trainer.helpers import Trainer, committed_weights, max_abs_diff, run_trainer, trainer_env

pytestmark = pytest.mark.slow

STEPS = 60
BASE = ["--synthetic", "--deterministic", "--steps", str(STEPS), "--batch-size", "32", "--seed", "3",
        "--checkpoint-every-steps", "10", "--keep-checkpoints", "1", "--log-every", "10"]
# The synthetic validation loss falls at every evaluation, so its *highest* value (`:max`) is
# reliably the first evaluation's (step 20): a best that is neither the newest checkpoint nor
# one the pruning would keep.
EVAL = ["--eval-every-steps", "20", "--keep-best", "val_loss:max"]
BEST_STEP = 20


def _path(uri: str) -> Path:
    return Path(uri[len("file://"):])


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """One run, evaluated every 20 steps, never interrupted: its events, COMPLETE and folder."""
    root = tmp_path_factory.mktemp("evaluated")
    uri = f"file://{root}/runs/eval"
    rc, events, err = run_trainer(uri, *BASE, *EVAL)
    assert rc == 0, err[-3000:]
    done = json.loads((_path(uri) / "COMPLETE").read_text())
    return uri, events, done


def _evaluated(events):
    return [e for e in events if e["event"] == "evaluated"]


def test_every_eval_step_and_the_end_evaluate_the_whole_validation_set(evaluated):
    _, events, _ = evaluated
    evals = _evaluated(events)
    assert [e["step"] for e in evals] == [20, 40, 60]
    from trainer.data import MNIST_VALIDATION

    assert all(e["examples"] == MNIST_VALIDATION for e in evals)
    assert all(set(e["metrics"]) == {"val_loss", "val_accuracy"} for e in evals)
    assert all(0.0 <= e["metrics"]["val_accuracy"] <= 1.0 for e in evals)
    # Evaluation time is counted, per pass and in total.
    assert all(e["seconds"] > 0 and e["train_seconds"] > 0 for e in evals)
    totals = [e["eval_seconds_total"] for e in evals]
    assert totals == sorted(totals) and totals[-1] == pytest.approx(sum(e["seconds"] for e in evals), abs=0.01)
    # A pass over a tenth of the training time since the previous one is flagged, from the second
    # on. 20 tiny steps between passes over 2,000 examples: some are, every time.
    slow = [e for e in events if e["event"] == "eval_slow"]
    assert slow and [e["step"] for e in slow] == [e["step"] for e in evals[1:] if e["share"] > 0.10]
    # The first pass of the attempt traces the pass: that one-off is left out of its share.
    assert evals[0]["trace_seconds"] > 0 and all(e["trace_seconds"] == 0 for e in evals[1:])
    assert all(e["share"] == pytest.approx((e["seconds"] - e["trace_seconds"]) / e["train_seconds"], rel=0.05, abs=2e-4)
               for e in evals)
    assert all("evaluate less often (--eval-every-steps, run.evalEverySteps)" in e["message"] for e in slow)


def test_metrics_reach_tensorboard_as_train_and_validation_scalars(evaluated):
    from bench.run_all import tensorboard_scalars

    uri, events, _ = evaluated
    board = str(_path(uri) / "tensorboard")
    assert [s for s, _ in tensorboard_scalars(board, "train/loss")] == [10, 20, 30, 40, 50, 60]
    train_acc = tensorboard_scalars(board, "train/accuracy")
    assert [s for s, _ in train_acc] == [10, 20, 30, 40, 50, 60] and all(0 <= v <= 1 for _, v in train_acc)
    val = dict(tensorboard_scalars(board, "validation/accuracy"))
    assert val == pytest.approx({e["step"]: e["metrics"]["val_accuracy"] for e in _evaluated(events)})
    assert [s for s, _ in tensorboard_scalars(board, "validation/loss")] == [20, 40, 60]


def test_complete_holds_the_final_and_the_best_evaluation(evaluated):
    _, events, done = evaluated
    last = _evaluated(events)[-1]
    assert {k: done["metrics"][k] for k in ("val_loss", "val_accuracy")} == last["metrics"]
    assert 0.0 <= done["metrics"]["accuracy"] <= 1.0  # the training metric, at the last step
    best = done["best"]
    assert (best["metric"], best["mode"], best["step"], best["exported"]) == ("val_loss", "max", BEST_STEP, True)
    first = _evaluated(events)[0]["metrics"]
    assert best["value"] == first["val_loss"] and best["metrics"] == first
    assert done["eval_seconds"] == pytest.approx(last["eval_seconds_total"], abs=0.01)
    progress = json.loads((_path(evaluated[0]) / "progress.json").read_text())
    assert progress["best"]["step"] == BEST_STEP and progress["metrics"]["val_loss"] == last["metrics"]["val_loss"]


def test_the_best_checkpoint_outlives_the_pruning_and_is_the_exported_model(evaluated):
    uri, events, done = evaluated
    from runfolder.storage import open_store
    from trainer.checkpoint_store import CheckpointStore

    # --keep-checkpoints 1 keeps the newest; the best is kept besides it.
    assert CheckpointStore(open_store(uri)).committed_steps() == [BEST_STEP, STEPS]
    import tensorflow as tf

    from trainer.data import preprocess, synthetic_mnist_validation

    x, y = synthetic_mnist_validation(seed=3)
    serve = tf.saved_model.load(str(_path(uri) / "model")).signatures["serving_default"]
    pred = next(iter(serve(x=preprocess(tf.constant(x))).values())).numpy()
    loss = float(np.mean(-np.log(pred[np.arange(len(y)), y])))
    # model/ predicts as the best checkpoint did, not as the final weights do.
    assert loss == pytest.approx(done["best"]["value"], rel=1e-4)
    assert loss != pytest.approx(done["metrics"]["val_loss"], rel=1e-3)


def test_evaluation_does_not_move_the_training_and_the_best_survives_a_preemption(evaluated, tmp_path):
    # The same run without evaluation during training: the weights every evaluating run must reach.
    plain = f"file://{tmp_path}/runs/plain"
    rc, _, err = run_trainer(plain, *BASE)
    assert rc == 0, err[-3000:]
    reference = committed_weights(plain, STEPS, tmp_path / "plain")

    # Stopped after the best (step 20) was evaluated and checkpointed, then resumed.
    uri = f"file://{tmp_path}/runs/stopped"
    t = Trainer(uri, *BASE, *EVAL, env=trainer_env())
    t.wait_event("checkpoint", pred=lambda e: e["step"] >= 30)
    t.signal(signal.SIGTERM)
    assert t.wait() == 143, t.stderr[-3000:]
    stopped = t.events[-1]["step"]
    assert BEST_STEP < stopped < STEPS
    rc, events, err = run_trainer(uri, *BASE, *EVAL)
    assert rc == 0, err[-3000:]
    assert [e["step"] for e in events if e["event"] == "resumed"] == [stopped]

    assert max_abs_diff(committed_weights(uri, STEPS, tmp_path / "stopped"), reference) == 0.0
    assert max_abs_diff(committed_weights(evaluated[0], STEPS, tmp_path / "evaluated"), reference) == 0.0
    # The resumed attempt never evaluated step 20: the best came back from the checkpoint.
    done = json.loads((_path(uri) / "COMPLETE").read_text())
    assert done["best"]["step"] == BEST_STEP and done["best"] == evaluated[2]["best"]
    assert done["metrics"] == evaluated[2]["metrics"]
    from runfolder.storage import open_store
    from trainer.checkpoint_store import CheckpointStore

    assert CheckpointStore(open_store(uri)).committed_steps() == [BEST_STEP, STEPS]


def test_ops_status_shows_the_latest_and_the_best_evaluation(evaluated, tmp_path):
    import io

    from rich.console import Console

    from ops import status

    uri, events, done = evaluated

    def shown(st) -> str:
        out = io.StringIO()
        Console(file=out, width=160).print(status.render(st))
        return out.getvalue()

    st = status.read_status(uri)
    assert st.state == "COMPLETE" and st.metrics["val_loss"] == done["metrics"]["val_loss"]
    assert st.best == {"metric": "val_loss", "mode": "max", "step": BEST_STEP, "value": done["best"]["value"],
                       "exported": True}
    text = shown(st)
    assert f"val_loss {done['best']['value']:.4g} at step {BEST_STEP} (max); exported as model/" in text
    assert f"val_accuracy {done['metrics']['val_accuracy']:.4g}" in text
    # What the evaluations cost, from COMPLETE once the run ended.
    assert st.eval_seconds == done["eval_seconds"] > 0
    assert f"(evaluated at step {STEPS}; evaluation {done['eval_seconds']:.1f}s in all)" in text, text

    # While a run trains: the newest evaluation and the best so far, from progress.json.
    running = tmp_path / "running"
    running.mkdir()
    progress = {"step": 40, "total": 60, "loss": 0.5, "examples_per_sec": 100.0, "attempt": 1,
                "updated": events[-1]["time"], "metrics": {"accuracy": 0.9, "val_loss": 0.25, "val_accuracy": 0.91},
                "evaluated_step": 40, "eval_seconds": 1.25,
                "best": {"metric": "val_accuracy", "mode": "max", "step": 20, "value": 0.93, "metrics": {}}}
    (running / "progress.json").write_text(json.dumps(progress))
    st = status.read_status(f"file://{running}")
    assert (st.evaluated_step, st.eval_seconds, st.best["step"]) == (40, 1.25, 20)
    text = shown(st)
    assert "val_accuracy 0.91" in text and "(evaluated at step 40; evaluation 1.2s in all)" in text
    assert "val_accuracy 0.93 at step 20 (max)" in text


PLAIN = """
import keras
import numpy as np
from trainer.models import ModelSpec

def build(config=None):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    return ModelSpec(model=model, loss=keras.losses.MeanSquaredError(reduction=None),
                     synthetic=lambda seed: (np.ones((64, 4), "float32"), np.ones((64, 1), "float32")))
"""


@pytest.mark.parametrize(("args", "words"), [
    (["--keep-best", "val_precision"], "--keep-best val_precision (run.keepBest): the evaluation records val_loss, "
                                       "val_accuracy; name one of them"),
    (["--code-dir", "{code}", "--model", "plain:build", "--eval-every-steps", "2"],
     "--eval-every-steps 2 (run.evalEverySteps) needs a validation set"),
])
def test_a_metric_or_validation_set_that_cannot_work_fails_at_once_with_one_line(tmp_path, args, words):
    code = tmp_path / "code"  # a model of one's own with no validation set
    code.mkdir()
    (code / "plain.py").write_text(PLAIN)
    rc, events, err = run_trainer(f"file://{tmp_path}/runs/bad", "--synthetic", "--steps", "4", "--batch-size", "8",
                                  *[a.format(code=code) for a in args])
    assert rc == 78, err[-2000:]
    failed = [e for e in events if e["event"] == "failed"]
    assert len(failed) == 1 and words in failed[0]["reason"] and "\n" not in failed[0]["reason"], failed
    assert not (tmp_path / "runs" / "bad" / "checkpoints").exists()
