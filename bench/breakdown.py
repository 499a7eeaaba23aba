"""Where the trainer's step goes beyond the limit's, in one process: the step graph's extra ops and the input.

Each variant runs the same `mlp` model and batch for `--trial` seconds, round after round
(`--rounds`), interleaved, so the load of the moment falls on every variant alike; each
round's examples/s is divided by the limit's of the same round, and the median of those
ratios is printed, with each variant's CPU µs per example (the process's, every thread's,
over its rounds: tf.data's threads included). From the limit to the trainer's own step, one
thing added at a time:

* limit — one batch in memory, 100 steps per call (as `bench.limit`), and the same at the
  trainer's call size (`--steps-per-call`, about the second `trainer.cadence` aims at);
* trainer step, one batch repeated — `trainer.step.make_train_step` under the trainer's
  strategy, fed by a `tf.data` iterator of one batch in memory repeated: the limit plus the
  iterator's `get_next`, the per-step loss array and the examples counter, no input work;
* + metrics — the same with the model's metric state per step (`trainer.metrics`, `accuracy`);
* synthetic stream — the `tf.data` stream of the `--synthetic` arrays (`trainer.data.from_arrays`:
  each batch gathered by the epoch's order and converted on tf.data's threads) into that step:
  what several replicas run, and what one replica ran before the in-graph source;
* synthetic in-graph source — the same batches taken inside the step's graph
  (`trainer.data.ArraySource`), as loop state: what `python -m trainer --synthetic` runs on one
  replica; and "a batch at a time", the same source through `next()` (its variables read and
  written in every step, so each step's gather waits for the step before);
* in-memory MNIST — `bench.mnist_memory`'s `make_dataset` as the trainer feeds it
  (`trainer.data.from_user`): the data path a user's own pipeline takes; and the limit's own loop
  fed by the same pipeline (`next()` each step, nothing of the trainer's): what the step reaches
  when the process also runs that pipeline, the bound the trainer's figure on this path is under.

What is left between these and the paired bench's trainer run (`bench.paired`) is the host
loop between calls (summaries, progress, cadence, checkpoints) and start-up.

Usage: python -m bench.breakdown [--batch-size 64] [--steps-per-call 1000] [--trial 1] [--rounds 6]
Prints one JSON line per variant: {"variant", "median_of_limit", "best_examples_per_sec", "cpu_us_per_example"}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench.variants import LIMIT, limit_call  # noqa: E402 - after the log level TensorFlow reads at import


def build(batch: int, per_call: int) -> dict:
    """The variants: name → (call, examples per call)."""
    import tensorflow as tf

    from bench import mnist_memory
    from trainer import data as D
    from trainer import step as S
    from trainer.config import TrainConfig
    from trainer.metrics import MetricSet
    from trainer.models import seeded_model

    cfg = TrainConfig(run_uri="file:///nowhere", synthetic=True, batch_size=batch)
    out: dict = {}
    limit, xb, yb = limit_call(cfg, batch)
    out[LIMIT] = (lambda: limit(tf.constant(100, tf.int64)), 100 * batch)
    out[f"limit ({per_call}/call)"] = (lambda: limit(tf.constant(per_call, tf.int64)), per_call * batch)
    request = tf.constant((0.0, 0.0, 0.0))
    count = tf.constant(per_call, tf.int64)
    # The trainer's strategy on one CPU (trainer.strategy), and its plain iterator (trainer.loop).
    strategy = tf.distribute.MirroredStrategy()

    def step_of(metrics: bool):
        model = seeded_model(cfg, strategy)
        ms = MetricSet(model.metrics, tf.TensorSpec([batch], tf.int32), (None, 10)) if metrics else None
        return model, S.make_train_step(strategy, model, cfg, batch, False, tf.Variable(0, dtype=tf.int64), ms)

    one = tf.data.Dataset.from_tensors((xb, tf.cast(yb, tf.int32))).repeat()
    for label, metrics in (("trainer step, one batch repeated", False), ("trainer step, one batch repeated + metrics", True)):
        _, step = step_of(metrics)
        repeated = iter(one)
        out[label] = (lambda s=step, i=repeated: s(i, count, request), per_call * batch)
    model, step = step_of(True)
    stream = iter(D.make_dataset(model, cfg, batch, D.Position(0)))
    out["trainer step + metrics, synthetic stream"] = (lambda s=step, i=stream: s(i, count, request), per_call * batch)
    model, step = step_of(True)
    source = D.ArraySource(*model.synthetic(cfg.seed), batch, cfg.seed, D.Position(0),
                           device=strategy.extended.worker_devices[0])
    out["trainer step + metrics, synthetic in-graph source"] = (lambda s=step, i=source: s(i, count, request),
                                                                per_call * batch)
    model, step = step_of(True)
    one = OneAtATime(D.ArraySource(*model.synthetic(cfg.seed), batch, cfg.seed, D.Position(0),
                                   device=strategy.extended.worker_devices[0]))
    out["trainer step + metrics, synthetic in-graph source, a batch at a time"] = (
        lambda s=step, i=one: s(i, count, request), per_call * batch)
    piped = limit_fed(cfg, batch, iter(mnist_memory.make_dataset(batch, 0).repeat()))
    out["limit fed by the in-memory MNIST pipeline (make_dataset)"] = (lambda: piped(count), per_call * batch)
    model, step = step_of(True)
    memory = iter(D.from_user(mnist_memory.make_dataset, batch, 0, D.Position(0)))
    out["trainer step + metrics, in-memory MNIST (make_dataset)"] = (lambda s=step, i=memory: s(i, count, request),
                                                                     per_call * batch)
    for label, options in _options(tf).items():
        model, step = step_of(True)
        tuned = iter(D.make_dataset(model, cfg, batch, D.Position(0)).with_options(options))
        out[f"trainer step + metrics, synthetic stream, {label}"] = (lambda s=step, i=tuned: s(i, count, request),
                                                                     per_call * batch)
    return out


def limit_fed(cfg, batch: int, iterator):
    """The limit's loop (`bench.limit.fed_steps`) with each step's batch taken from `iterator`, traced."""
    import tensorflow as tf

    from bench.limit import fed_steps
    from trainer.models import seeded_model

    return tf.function(fed_steps(tf, seeded_model(cfg, tf.distribute.get_strategy()), iterator, batch))


class OneAtATime:
    """A source or iterator taken through `next()` only: the step's loop takes one batch a step, nothing ahead.
    For an in-graph source each step then reads and writes its variables (the position, the order's cache),
    as the loop took it before its batches became loop state."""

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.source)


def _options(tf) -> dict:
    """tf.data's thread settings tried on the synthetic stream (--options)."""
    one_op = tf.data.Options()
    one_op.threading.max_intra_op_parallelism = 1
    pool = tf.data.Options()
    pool.threading.private_threadpool_size = 2
    slack = tf.data.Options()
    slack.experimental_slack = True
    no_autotune = tf.data.Options()
    no_autotune.autotune.enabled = False
    return {"intra-op 1": one_op, "private pool of 2": pool, "slack": slack, "no autotune": no_autotune}


def main() -> None:
    """CLI: each variant's median share of the limit, best examples/s and CPU per example."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps-per-call", type=int, default=1000)
    p.add_argument("--trial", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=6)
    a = p.parse_args()
    variants = build(a.batch_size, a.steps_per_call)
    for fn, _ in variants.values():
        fn()  # trace
    best = dict.fromkeys(variants, 0.0)
    cpu = dict.fromkeys(variants, 0.0)
    examples = dict.fromkeys(variants, 0)
    ratios: dict = {name: [] for name in variants}
    for r in range(a.rounds):
        rates = {}
        names = list(variants) if r % 2 == 0 else list(variants)[::-1]  # each order as often
        for name in names:
            fn, per_call = variants[name]
            calls, t0, c0 = 0, time.perf_counter(), time.process_time()
            while time.perf_counter() - t0 < a.trial:
                out = fn()
                (out[0] if isinstance(out, tuple) else out).numpy()  # a host sync per call, as the trainer's
                calls += 1
            rates[name] = calls * per_call / (time.perf_counter() - t0)
            cpu[name] += time.process_time() - c0
            examples[name] += calls * per_call
            best[name] = max(best[name], rates[name])
        for name, rate in rates.items():
            ratios[name].append(rate / rates[LIMIT])
    for name in variants:
        print(json.dumps({"variant": name, "median_of_limit": round(statistics.median(ratios[name]), 3),
                          "best_examples_per_sec": round(best[name]),
                          "cpu_us_per_example": round(cpu[name] / examples[name] * 1e6, 2)}), flush=True)


if __name__ == "__main__":
    main()
