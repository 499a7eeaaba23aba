"""The machine's limit for a model: its train step on one batch already in memory, many steps per call.

No input pipeline, no distribution strategy, no checkpoints, no summaries: the same model,
optimizer and loss the trainer builds (`trainer.models.seeded_model`), stepping on one
preprocessed batch of its synthetic data inside a `tf.function` that runs `--steps-per-call`
steps per call. The trainer's loop can at best match this.

With `--fed-by MODULE:FUNCTION` (a `make_dataset(batch, seed)`, e.g. `bench.mnist_memory:make_dataset`)
the same loop takes each step's batch from that pipeline instead (`next()`): the bound that pipeline
puts on the step in this process, with nothing of the trainer's.

Usage: python -m bench.limit --model mlp --batch-size 64 --seconds 10 [--lm-* ...] [--fed-by MODULE:FUNCTION]
Prints one JSON line: {"examples_per_sec" (all calls), "best_examples_per_sec" (the fastest call), "calls", ...}.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def limit_steps(tf, spec, seed: int, batch_size: int):
    """The limit's loop, not yet traced: `steps(n)` runs `n` optimizer steps of `spec`'s model on the first
    batch of its synthetic data, converted once and held in memory; returns the last step's loss."""
    from trainer.data import preprocess

    x, y = spec.synthetic(seed)
    xb, yb = preprocess(tf.constant(x[:batch_size])), tf.constant(y[:batch_size])

    def steps(n):
        loss = tf.constant(0.0)
        for _ in tf.range(n):
            loss = one_step(tf, spec, xb, yb, batch_size)
        return loss

    return steps


def one_step(tf, spec, x, y, batch_size: int):
    """One optimizer step of `spec`'s model on the batch `(x, y)`; returns its loss."""
    from trainer.step import per_example_loss

    model = spec.model
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(per_example_loss(spec, y, model(x, training=True)),
                                          global_batch_size=batch_size)
    grads = tape.gradient(loss, model.trainable_variables)
    spec.optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


def fed_steps(tf, spec, iterator, batch_size: int):
    """The limit's loop, not yet traced, with each step's batch taken from `iterator` (`next()`, as a
    hand-written loop does): what the same step reaches when the process also runs that pipeline,
    with nothing of the trainer's."""

    def steps(n):
        loss = tf.constant(0.0)
        for _ in tf.range(n):
            x, y = next(iterator)
            loss = one_step(tf, spec, x, y, batch_size)
        return loss

    return steps


def pipeline(fed_by: str, batch_size: int, seed: int):
    """The endless iterator of a `make_dataset` named `module:function` (`bench.mnist_memory:make_dataset`)."""
    module, _, name = fed_by.partition(":")
    return iter(getattr(importlib.import_module(module), name)(batch_size, seed).repeat())


def measure(model: str, batch_size: int, seconds: float, steps_per_call: int = 100, extra: dict | None = None,
            fed_by: str | None = None) -> dict:
    """Run the in-memory step (or, `fed_by`, the step fed by that pipeline) for about `seconds` after one
    warm-up call; returns the figures."""
    import tensorflow as tf

    from trainer.config import TrainConfig
    from trainer.models import seeded_model

    cfg = TrainConfig(run_uri="file:///nowhere", model=model, synthetic=True, batch_size=batch_size, **(extra or {}))
    spec = seeded_model(cfg, tf.distribute.get_strategy())
    if fed_by:
        steps = tf.function(fed_steps(tf, spec, pipeline(fed_by, batch_size, cfg.seed), batch_size))
    else:
        steps = tf.function(limit_steps(tf, spec, cfg.seed, batch_size))
    n = tf.constant(steps_per_call, tf.int64)
    t0 = time.perf_counter()
    float(steps(n))  # traces
    warm = time.perf_counter() - t0
    calls, start, best, cpu = 0, time.perf_counter(), 0.0, time.process_time()
    while True:
        t = time.perf_counter()
        float(steps(n))  # a host sync per call, so each call's own time is measured
        calls += 1
        best = max(best, steps_per_call * batch_size / (time.perf_counter() - t))
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and calls >= 2:
            break
    cpu = time.process_time() - cpu
    return {"tf_version": tf.__version__, "gpus": len(tf.config.list_physical_devices("GPU")),
            "model": model, "fed_by": fed_by, "batch_size": batch_size, "steps_per_call": steps_per_call,
            "calls": calls,
            "seconds": round(elapsed, 3), "first_call_seconds": round(warm, 3),
            "examples_per_sec": round(calls * steps_per_call * batch_size / elapsed, 1),
            # The fastest call: on a shared machine, the closest to what a quiet one would do.
            "best_examples_per_sec": round(best, 1),
            # CPU per example, every thread's: what another user's load changes least.
            "cpu_us_per_example": round(cpu / (calls * steps_per_call * batch_size) * 1e6, 2)}


def main() -> None:
    """CLI: print the limit as one JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mlp")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--steps-per-call", type=int, default=100)
    p.add_argument("--lm-vocab", type=int)
    p.add_argument("--lm-dim", type=int)
    p.add_argument("--lm-layers", type=int)
    p.add_argument("--lm-seq-len", type=int)
    p.add_argument("--fed-by", help="module:function, a make_dataset(batch, seed) feeding each step (next())")
    a = p.parse_args()
    extra = {k: v for k, v in vars(a).items() if k.startswith("lm_") and v is not None}
    print(json.dumps(measure(a.model, a.batch_size, a.seconds, a.steps_per_call, extra, a.fed_by)), flush=True)


if __name__ == "__main__":
    main()
