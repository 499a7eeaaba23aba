"""`bench.breakdown`'s limit fed by a pipeline takes one batch a step from it and trains on that batch."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from bench.breakdown import limit_fed
from trainer.config import TrainConfig


def test_the_fed_limit_takes_a_batch_a_step_and_trains_on_it():
    batch, steps = 8, 3
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 784), dtype=np.float32), rng.integers(0, 10, 64).astype(np.int64)
    it = iter(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch))
    cfg = TrainConfig(run_uri="file:///nowhere", synthetic=True, batch_size=batch)
    fed = limit_fed(cfg, batch, it)
    loss = float(fed(tf.constant(steps, tf.int64)))
    # The next batch is the fourth: the call took exactly one a step.
    np.testing.assert_array_equal(next(it)[0].numpy(), x[steps * batch:(steps + 1) * batch])
    assert np.isfinite(loss) and loss > 0
    # The loss is the batch's: a fresh (seeded) limit on the same first batch repeats the figure, one on
    # other labels does not (a loop that ignored its iterator would give the same figure both times).
    def first_loss(labels):
        one = iter(tf.data.Dataset.from_tensors((x[:batch], labels)).repeat())
        return float(limit_fed(cfg, batch, one)(tf.constant(1, tf.int64)))

    same, other = first_loss(y[:batch]), first_loss((y[:batch] + 1) % 10)
    assert first_loss(y[:batch]) == same and other != same
