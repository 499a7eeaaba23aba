"""The seed article's `train.py`, run by trainstack in script mode (docs/your-fit-script.md).

    python -m trainer --run-uri file://./runs/fit --code-dir examples/keras-fit -- python train.py --epochs 5

Changed from the article only where the guide says (each change is marked `trainstack:`),
plus the two changes every offline copy of it needs (see shared/bench/seed_train.py):
synthetic MNIST-shaped data, flattened to the 784 inputs the Dense layer declares.
`--deterministic` is the guide's recipe for an exact resume: seeded, the same batch order
in every epoch, deterministic ops.
It still runs on its own (`python train.py`): outside trainstack the helper only adds
TensorBoard to ./logs, the model goes to ./model and the report to ./outputs.
"""

import argparse
import os

import numpy as np
import tensorflow as tf

from trainer import fit  # trainstack: the helper


def synthetic_mnist(n=60_000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 784), dtype=np.uint8)
    y = rng.integers(0, 10, size=(n,), dtype=np.int64)
    return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--examples", type=int, default=60_000)
    p.add_argument("--deterministic", action="store_true", help="exact resume: seeded, one batch order, op determinism")
    a = p.parse_args()
    if a.deterministic:
        tf.keras.utils.set_random_seed(0)
        tf.config.experimental.enable_op_determinism()

    # The article's own ./logs folder, kept: the script runs in a writable copy of its folder.
    log_dir = "./logs"
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, "args.txt"), "w") as f:
        f.write(f"{vars(a)}\n")

    strategy = fit.strategy()  # trainstack: was tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input(shape=(784,)),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dropout(0.2),
            tf.keras.layers.Dense(10, activation="softmax"),
        ])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])

    x_train, y_train = synthetic_mnist(a.examples)
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    dataset = dataset.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y))
    if a.deterministic:
        dataset = dataset.shuffle(1000, seed=0, reshuffle_each_iteration=False)
    else:
        dataset = dataset.shuffle(1000)
    dataset = dataset.batch(64 * strategy.num_replicas_in_sync)

    # trainstack: TensorBoard + ModelCheckpoint are replaced by the helper's callbacks
    # (TensorBoard to the run's tensorboard/, checkpoints to the bucket, stop on SIGTERM).
    history = model.fit(dataset, epochs=a.epochs, callbacks=fit.callbacks(histogram_freq=1), verbose=2)
    # Its own CSV of the epochs, in its working folder as on a laptop (scratch: not kept after the run).
    with open("history.csv", "w") as f:
        f.write(",".join(["epoch", *history.history]) + "\n")
        for epoch, values in enumerate(zip(*history.history.values(), strict=True)):
            f.write(",".join(str(v) for v in (epoch, *values)) + "\n")
    model.export(fit.model_dir())  # trainstack: the run's model/ (was a local saved_model folder)
    # trainstack: what else the run keeps goes to fit.output_dir() (the run's outputs/, `ops pull --outputs`).
    with open(os.path.join(fit.output_dir(), "report.txt"), "w") as f:
        f.write(f"epochs: {a.epochs}\nevaluation: {model.evaluate(dataset, verbose=0, return_dict=True)}\n")


if __name__ == "__main__":
    main()
