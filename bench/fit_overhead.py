"""What `trainer.fit.callbacks()` costs a Keras `fit` script: epoch time with and without it.

    python -m bench.fit_overhead [--epochs 3] [--rounds 2]

The seed article's model and data (examples/keras-fit/train.py) in one process, fit run in
rounds that alternate [TensorBoard] and [trainstack RunCheckpoint, TensorBoard] (the helper's list),
checkpoints committed to a file:// run folder (an object store adds its upload, which runs
in the background). Prints one JSON line: median seconds per epoch of each, the overhead in
percent, and the median time the training waited for a checkpoint's local save.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--examples", type=int, default=60_000)
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="fit_overhead_")
    os.environ["TRAINSTACK_TENSORBOARD_DIR"] = os.path.join(work, "tb")
    import keras
    import tensorflow as tf

    from bench.seed_train import synthetic_mnist
    from trainer import fit

    x, y = synthetic_mnist(a.examples)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y))
    ds = ds.shuffle(1000).batch(64)

    class EpochTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.t)

    times = {"plain": [], "trainstack": []}
    saves = []
    for r in range(a.rounds):
        for kind in ("plain", "trainstack"):
            model = keras.Sequential([keras.Input(shape=(784,)), keras.layers.Dense(128, activation="relu"),
                                      keras.layers.Dropout(0.2), keras.layers.Dense(10, activation="softmax")])
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
            timer = EpochTimes()
            if kind == "plain":
                cbs = [keras.callbacks.TensorBoard(log_dir=os.path.join(work, "tb-plain"))]
            else:
                os.environ["TRAINSTACK_RUN_URI"] = f"file://{work}/run-{r}"
                os.environ["TRAINSTACK_CHECKPOINT_DIR"] = os.path.join(work, f"ck-{r}")
                cbs = fit.callbacks()
                del os.environ["TRAINSTACK_RUN_URI"]
            model.fit(ds, epochs=a.epochs, callbacks=[timer, *cbs], verbose=0)
            times[kind] += timer.seconds[1:]  # the first epoch traces the step
            if kind == "trainstack":
                saves += cbs[0].save_seconds
    plain, ours = statistics.median(times["plain"]), statistics.median(times["trainstack"])
    print(json.dumps({"epoch_s_plain": round(plain, 3), "epoch_s_trainstack": round(ours, 3),
                      "overhead_pct": round(100 * (ours - plain) / plain, 1),
                      "save_wait_s_median": round(statistics.median(saves), 4), "epochs_timed": len(times["plain"]),
                      "loadavg": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
