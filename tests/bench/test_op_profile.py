"""`python -m bench.op_profile` reads TensorFlow's own trace: the kernels a traced loop ran, each by name, per step.

The trace format (`XSpace` protos under the profiler's folder) belongs to TensorFlow and moves with it; this
fails where a TensorFlow upgrade moves the kernels' events, not in the lead's next by-hand profile.
"""

from __future__ import annotations

import tensorflow as tf

from bench import op_profile


def test_a_loops_kernels_are_found_by_name_per_step():
    x = tf.Variable(tf.ones([64, 64]))

    @tf.function
    def steps(n):
        for _ in tf.range(n):
            x.assign(tf.math.tanh(tf.matmul(x, x)))
        return x[0, 0]

    per_call = 50
    steps(tf.constant(per_call))  # traced outside the profile, as the bench's warm call
    wall, ops = op_profile.profile(tf, lambda: steps(tf.constant(per_call)).numpy(), calls=2, per_call=per_call)
    kernels = {name.rsplit(":", 1)[-1] for name in ops}
    assert wall > 0 and "Tanh" in kernels, sorted(ops)
    assert not any("::" in name for name in ops)  # the executor's own spans are not kernels
    tanh = [us for name, us in ops.items() if name.endswith(":Tanh")]
    assert len(tanh) == 1 and 0 < tanh[0] < wall * 2  # per step, on at most the two compute threads
