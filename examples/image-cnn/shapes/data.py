"""The shapes data set: its TFRecord feature spec, the parser, and a generator of labelled images.

No trainstack import here: `write_tfrecords.py` uses it on any machine with TensorFlow.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

SIZE = 32
CLASSES = ("square", "disc", "cross", "ring")

# One tf.train.Example per image: raw uint8 pixels and an int64 label.
FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


def parse(serialized: tf.Tensor):
    """A batch of serialized examples → (uint8 images [B, 32, 32, 1], labels [B]).

    uint8 pixels are scaled to [0, 1] by the trainer after parsing.
    """
    f = tf.io.parse_example(serialized, FEATURES)
    images = tf.io.decode_raw(f["image"], tf.uint8)
    return tf.reshape(images, [-1, SIZE, SIZE, 1]), f["label"]


def make_images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` noisy images of the four shapes at random places and sizes, with their labels."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    images = np.empty((n, SIZE, SIZE, 1), np.uint8)
    labels = rng.integers(0, len(CLASSES), n).astype(np.int64)
    for i, label in enumerate(labels):
        r = rng.uniform(5, 10)
        cy, cx = rng.uniform(r + 1, SIZE - r - 1, 2)
        dy, dx = np.abs(yy - cy), np.abs(xx - cx)
        dist = np.hypot(yy - cy, xx - cx)
        if label == 0:
            mask = (dy <= r) & (dx <= r)
        elif label == 1:
            mask = dist <= r
        elif label == 2:
            mask = ((dy <= r / 3) & (dx <= r)) | ((dx <= r / 3) & (dy <= r))
        else:
            mask = (dist <= r) & (dist >= r * 0.6)
        img = rng.normal(30, 20, (SIZE, SIZE)) + mask * 180
        images[i, :, :, 0] = np.clip(img, 0, 255).astype(np.uint8)
    return images, labels
