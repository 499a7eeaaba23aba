"""Inside the call: TensorFlow's profiler on the limit's step and the trainer's, op by op, in one process.

The limit (`bench.limit`'s step on one batch in memory) and the trainer's step
(`trainer.step.make_train_step` under the trainer's strategy, with the model's metrics, fed by
`trainer.data.ArraySource` as `--synthetic` on one replica is) each run `--steps-per-call`
steps a call under `tf.profiler.experimental`, alternating, `--rounds` times. The trace's host
plane is summed per op (each op's time on TensorFlow's compute threads), divided by the steps:
the ops the trainer runs that the limit does not, and what each costs, are the gap inside the
call that `bench.breakdown` measures as a whole.

Usage: python -m bench.op_profile [--batch-size 64] [--steps-per-call 1000] [--calls 3] [--rounds 2] [--top 12]
Prints one JSON line per run: {"run", "us_per_step" (wall), "ops": {op: µs per step, the top ones}},
then the ops in the trainer's runs and not in the limit's (`"only_trainer"`).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _steps(tf, batch: int, per_call: int):
    """The two callables: the limit's call and the trainer's, each running `per_call` steps."""
    from bench.limit import limit_steps
    from trainer import data as D
    from trainer import step as S
    from trainer.config import TrainConfig
    from trainer.metrics import MetricSet
    from trainer.models import seeded_model

    cfg = TrainConfig(run_uri="file:///nowhere", model="mlp", synthetic=True, batch_size=batch)
    limit = tf.function(limit_steps(tf, seeded_model(cfg, tf.distribute.get_strategy()), cfg.seed, batch))

    strategy = tf.distribute.MirroredStrategy()  # the trainer's on one CPU (trainer.strategy)
    trained = seeded_model(cfg, strategy)
    metrics = MetricSet(trained.metrics, tf.TensorSpec([batch], tf.int32), (None, 10))
    step = S.make_train_step(strategy, trained, cfg, batch, False, tf.Variable(0, dtype=tf.int64), metrics)
    source = D.ArraySource(*trained.synthetic(cfg.seed), batch, cfg.seed, D.Position(0),
                           device=strategy.extended.worker_devices[0])
    n, request = tf.constant(per_call, tf.int64), tf.constant((0.0, 0.0, 0.0))
    return {"limit": lambda: limit(n).numpy(), "trainer": lambda: step(source, n, request)[0].numpy()}


def _per_op(tf, folder: str) -> dict[str, float]:
    """Each op's time (µs) on the host plane's compute threads of the trace in `folder`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0], "rb") as f:
        space.ParseFromString(f.read())
    out: collections.Counter = collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for ev in line.events:
                name = plane.event_metadata[ev.metadata_id].name
                if ":" in name and "::" not in name:  # "while/body/.../name:OpType": a kernel, not the executor
                    out[name.split("/", 3)[-1]] += ev.duration_ps / 1e6
    return out


def profile(tf, fn, calls: int, per_call: int) -> tuple[float, dict[str, float]]:
    """(wall µs per step, op -> µs per step) of `calls` calls of `fn` under the profiler."""
    with tempfile.TemporaryDirectory(prefix="trainstack-op-profile-") as folder:
        tf.profiler.experimental.start(folder)
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        wall = time.perf_counter() - started
        tf.profiler.experimental.stop()
        ops = _per_op(tf, folder)
    steps = calls * per_call
    return wall / steps * 1e6, {op: us / steps for op, us in ops.items()}


def main() -> None:
    """CLI: print each run's figures as JSON lines, then the trainer's own ops."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps-per-call", type=int, default=1000)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args()
    import tensorflow as tf

    fns = _steps(tf, a.batch_size, a.steps_per_call)
    for fn in fns.values():
        fn()  # traced and warm before any trace is taken
    seen: dict[str, collections.Counter] = {name: collections.Counter() for name in fns}
    for _ in range(a.rounds):
        for name, fn in fns.items():
            wall, ops = profile(tf, fn, a.calls, a.steps_per_call)
            seen[name].update(ops)
            top = dict(sorted(ops.items(), key=lambda kv: -kv[1])[: a.top])
            print(json.dumps({"run": name, "us_per_step": round(wall, 1),
                              "ops": {k: round(v, 2) for k, v in top.items()}}), flush=True)
    limit_ops = {op.split(":")[-1] for op in seen["limit"]}
    only = {op: us / a.rounds for op, us in seen["trainer"].items() if op.split(":")[-1] not in limit_ops}
    print(json.dumps({"only_trainer": {k: round(v, 2) for k, v in sorted(only.items(), key=lambda kv: -kv[1])}}))


if __name__ == "__main__":
    main()
