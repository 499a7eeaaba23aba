"""`shapes.model:build` — a small Keras CNN over 32×32 grey images of 4 kinds of shapes.

trainstack calls `build(config)` inside its distribution strategy's scope and trains the
`ModelSpec` it returns (see docs/your-model.md). The records are written by
`write_tfrecords.py` with the feature spec in `shapes/data.py`.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from shapes.data import CLASSES, SIZE, make_images, parse
from trainer.models import ModelSpec


def build(config=None) -> ModelSpec:
    """The model, its per-example loss and accuracy, the record parser and a synthetic stand-in.

    Validation: the held-back records (`--validation-data-uri`, written by `write_tfrecords.py`),
    or with `--synthetic` images generated apart from the training ones.
    """
    model = keras.Sequential(
        [
            keras.Input(shape=(SIZE, SIZE, 1), name="image"),
            keras.layers.Conv2D(16, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(len(CLASSES), activation="softmax", dtype="float32"),
        ],
        name="shapes_cnn",
    )
    return ModelSpec(
        model=model,
        loss=keras.losses.SparseCategoricalCrossentropy(reduction=None),
        parse_tfrecord=parse,
        synthetic=lambda seed: make_images(4096, seed),
        name="shapes-cnn",
        metrics=["accuracy"],
        make_validation=held_out if getattr(config, "synthetic", False) else None,
    )


def held_out(batch_size: int, seed: int) -> tf.data.Dataset:
    """512 synthetic images the training never sees (another seed), scaled to [0, 1], once."""
    images, labels = make_images(512, seed + 1_000_003)
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch_size)
    return ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y))
