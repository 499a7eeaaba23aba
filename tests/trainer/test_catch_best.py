"""A new best is checkpointed when it is found, whatever the checkpoint cadence.

`--keep-best` promises that `model/` holds the best evaluation's weights. The trainer's other
tests evaluate on steps that are regular checkpoints too, so a best that was never checkpointed
by itself still had one. Here the cadences do not line up: evaluations every 10 steps,
checkpoints every 7, and only the newest checkpoint kept, so the best (step 10, as in
test_metrics.py the synthetic validation loss's highest value, `:max`, is the first one's) has a
checkpoint only if the loop made one for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.trainer.helpers import run_trainer

pytestmark = pytest.mark.slow

STEPS = 30
BEST_STEP = 10
ARGS = ["--synthetic", "--deterministic", "--steps", str(STEPS), "--batch-size", "32", "--seed", "3",
        "--checkpoint-every-steps", "7", "--keep-checkpoints", "1", "--log-every", "5",
        "--eval-every-steps", "10", "--keep-best", "val_loss:max"]


def test_a_best_between_checkpoints_is_checkpointed_kept_and_exported(tmp_path):
    uri = f"file://{tmp_path}/runs/best"
    rc, events, err = run_trainer(uri, *ARGS)
    assert rc == 0, err[-3000:]
    root = Path(tmp_path / "runs" / "best")
    done = json.loads((root / "COMPLETE").read_text())
    assert [e["step"] for e in events if e["event"] == "evaluated"] == [10, 20, 30]
    assert (done["best"]["step"], done["best"]["exported"]) == (BEST_STEP, True), done["best"]

    # The best's checkpoint was made at its own step, off the regular cadence (7, 14, 21, 28).
    checkpoints = [e["step"] for e in events if e["event"] == "checkpoint"]
    assert BEST_STEP in checkpoints and BEST_STEP % 7 != 0
    from runfolder.storage import open_store
    from trainer.checkpoint_store import CheckpointStore

    assert CheckpointStore(open_store(uri)).committed_steps() == [BEST_STEP, STEPS]

    import tensorflow as tf

    from trainer.data import preprocess, synthetic_mnist_validation

    x, y = synthetic_mnist_validation(seed=3)
    serve = tf.saved_model.load(str(root / "model")).signatures["serving_default"]
    pred = next(iter(serve(x=preprocess(tf.constant(x))).values())).numpy()
    loss = float(np.mean(-np.log(pred[np.arange(len(y)), y])))
    # model/ predicts as the best evaluation did, not as the final weights do.
    assert loss == pytest.approx(done["best"]["value"], rel=1e-4)
    assert loss != pytest.approx(done["metrics"]["val_loss"], rel=1e-3)
