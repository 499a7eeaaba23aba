"""The seed article's model on an in-memory MNIST-shaped set through `tf.data`: the data path users have.

`--model bench.mnist_memory:model` trains `trainer.models.seed_mlp` (the `mlp` model) on
60,000 uint8 images held in memory, fed the way the Keras guides feed MNIST: the examples
cached, shuffled with the run's seed, batched, converted to float32 per batch, prefetched.
Nothing here is a shortcut the trainer's own `--synthetic` data takes: it is an ordinary
`ModelSpec.make_dataset`, so the trainer saves its iterator state in each checkpoint and
resumes from it, as it does for any user's pipeline.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from trainer import data as data_mod
from trainer.models import ModelSpec, seed_mlp

SHUFFLE_BUFFER = 10_000


def make_dataset(batch_size: int, seed: int) -> tf.data.Dataset:
    """MNIST-shaped examples in memory: cached, shuffled per epoch by `seed`, batched, float32, prefetched."""
    x, y = data_mod.synthetic_mnist(seed=seed)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).cache()
    ds = ds.shuffle(SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True).batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda a, b: (tf.cast(a, tf.float32) / 255.0, b), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def model(cfg) -> ModelSpec:
    """The `mlp` model and its metric, fed by `make_dataset`."""
    return ModelSpec(model=seed_mlp(784, cfg.seed, "mlp"), loss=keras.losses.SparseCategoricalCrossentropy(reduction=None),
                     make_dataset=make_dataset, name="mlp", metrics=["accuracy"])
