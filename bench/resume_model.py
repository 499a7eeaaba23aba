"""The user model of the bench's resume figures: its own `make_dataset`, shuffle + map + batch.

MNIST-shaped synthetic images (`trainer.data.synthetic_mnist`) held in memory, shuffled
through a 10,000-image buffer, converted to float one image at a time and batched: a
pipeline many users write. The model is small (one Dense layer) so that training to 100k
steps, which the figure needs, takes minutes; what is measured is the start-up, not the steps.

    python -m trainer --code-dir bench --model resume_model:build ...
"""

from __future__ import annotations

import keras
import tensorflow as tf

from trainer.data import synthetic_mnist
from trainer.models import ModelSpec

SHUFFLE_BUFFER = 10_000


def build(config) -> ModelSpec:
    """A ModelSpec whose `make_dataset` is shuffle + map + batch over synthetic MNIST."""
    def make_dataset(batch_size: int, seed: int) -> tf.data.Dataset:
        x, y = synthetic_mnist(seed=seed)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SHUFFLE_BUFFER, seed=seed)
        ds = ds.map(lambda a, b: (tf.cast(a, tf.float32) / 255.0, b), num_parallel_calls=tf.data.AUTOTUNE)
        return ds.batch(batch_size, drop_remainder=True)

    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])
    return ModelSpec(model=model, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
                     make_dataset=make_dataset, optimizer=keras.optimizers.SGD(0.1))
