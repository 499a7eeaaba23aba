"""`shapes.model:build` — a small Keras CNN over 32×32 grey images of 4 kinds of shapes.

trainstack calls `build(config)` inside its distribution strategy's scope and trains the
`ModelSpec` it returns (see docs/your-model.md). The records are written by
`write_tfrecords.py` with the feature spec in `shapes/data.py`.
"""

from __future__ import annotations

import keras

from shapes.data import CLASSES, SIZE, make_images, parse
from trainer.models import ModelSpec


def build(config=None) -> ModelSpec:
    """The model, its per-example loss, the record parser and a synthetic stand-in."""
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
    )
