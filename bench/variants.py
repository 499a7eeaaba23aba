"""The loop's step function, variant against variant, in one process: what each change to it bought.

Runs each variant for `--trial` seconds, round after round (`--rounds`), interleaved, and
keeps each one's best round: another user's load only ever slows a round down, so the best
rounds are the ones to compare on a shared machine. Each round's ratio to that round's limit
is kept too, and their median printed: the load of the moment cancels within a round.
`--reverse` runs each round's variants in the opposite order. Variants (mlp, synthetic data):

* limit — one batch in memory, 100 steps per call (as `bench.limit`);
* old — `make_train_step` of an older `trainer/loop.py` (`--old-loop FILE`, e.g.
  `git show 6701bf9:trainer/loop.py > /tmp/old_loop.py`), distributed iterator, 10 steps per call;
* new — this tree's `make_train_step`, with the distributed or the plain iterator, at
  10, 50 (a call per --log-every step) and 500 steps per call;
* in memory — where the tree's `trainer.data` has `InMemoryBatches` (a loop-carried batch:
  each batch gathered inside the step, beside the previous step; tried for in-memory data on
  one replica and not kept, bench/RESULTS.md), the same step fed by it, at 50 and 500 steps
  per call.

Only the step function and the input pipeline are compared: the host loop around them
(summaries, progress, checkpoints) is in the full bench (`python -m bench`).

Usage: python -m bench.variants --old-loop /tmp/old_loop.py [--batch-size 64] [--trial 1] [--rounds 6] [--reverse]
Prints one JSON line per variant: {"variant", "best_examples_per_sec", "of_limit" (best ÷ the limit's best),
"median_of_limit" (the median of the rounds' ratios to the limit in the same round)}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
LIMIT = "limit (in memory, 100/call)"


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def limit_call(cfg, batch: int):
    """The limit: one batch held in memory, `n` steps a call (a `tf.function` of the int64 tensor `n`), and that batch."""
    import tensorflow as tf

    from bench.limit import one_step
    from trainer import data as D
    from trainer.models import seeded_model

    spec = seeded_model(cfg, tf.distribute.get_strategy())
    x, y = spec.synthetic(0)
    xb, yb = D.preprocess(tf.constant(x[:batch])), tf.constant(y[:batch])

    @tf.function
    def limit(n):
        loss = tf.constant(0.0)
        for _ in tf.range(n):
            loss = one_step(tf, spec, xb, yb, batch)
        return loss

    return limit, xb, yb


def build(old_loop: str | None, batch: int) -> dict:
    """The variants: name → (call, examples per call)."""
    import tensorflow as tf

    from trainer import data as D
    from trainer import step as S
    from trainer.config import TrainConfig
    from trainer.models import seeded_model

    cfg = TrainConfig(run_uri="file:///nowhere", synthetic=True, batch_size=batch)
    out: dict = {}

    limit, xb, yb = limit_call(cfg, batch)
    out[LIMIT] = (lambda: limit(tf.constant(100, tf.int64)), 100 * batch)
    request = tf.constant((0.0, 0.0, 0.0))
    modules = [("new", S)] + ([("old", _load(old_loop, "old_loop"))] if old_loop else [])
    for label, module in modules:
        strategy = tf.distribute.MirroredStrategy()
        model = seeded_model(cfg, strategy)
        examples = tf.Variable(0, dtype=tf.int64)
        step = module.make_train_step(strategy, model, cfg, batch, False, examples)
        ds = D.make_dataset(model, cfg, batch, D.Position(0))
        dist = iter(strategy.experimental_distribute_dataset(ds))
        plain = iter(D.make_dataset(model, cfg, batch, D.Position(0)))
        if label == "old":
            out["old: distributed iterator, 10/call"] = (lambda s=step, i=dist: s(i, tf.constant(10, tf.int64), request),
                                                         10 * batch)
            continue
        out["new: distributed iterator, 10/call"] = (lambda s=step, i=dist: s(i, tf.constant(10, tf.int64), request),
                                                     10 * batch)
        for k in (10, 50, 500):
            out[f"new: plain iterator, {k}/call"] = (lambda s=step, i=plain, k=k: s(i, tf.constant(k, tf.int64), request),
                                                     k * batch)
        if hasattr(D, "InMemoryBatches"):
            model = seeded_model(cfg, strategy)
            step = module.make_train_step(strategy, model, cfg, batch, False, tf.Variable(0, dtype=tf.int64))
            x, y = model.synthetic(cfg.seed)
            batches = D.InMemoryBatches(x, y, batch, cfg.seed, D.Position(0), strategy.extended.worker_devices[0])
            for k in (50, 500):
                out[f"new: in memory, loop-carried batch, {k}/call"] = (
                    lambda s=step, i=batches, k=k: s(i, tf.constant(k, tf.int64), request), k * batch)
    return out


def main() -> None:
    """CLI: print each variant's best examples/s and its share of the limit."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old-loop", default=None, help="an older trainer/loop.py to compare with")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--trial", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--reverse", action="store_true", help="run each round's variants in the opposite order")
    a = p.parse_args()
    variants = build(a.old_loop, a.batch_size)
    for fn, _ in variants.values():
        fn()  # trace
    best = dict.fromkeys(variants, 0.0)
    ratios: dict = {name: [] for name in variants}
    names = list(variants)[::-1] if a.reverse else list(variants)
    for _ in range(a.rounds):
        rates = {}
        for name in names:
            fn, per_call = variants[name]
            calls, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < a.trial:
                out = fn()
                calls += 1
            (out[0] if isinstance(out, tuple) else out).numpy()
            rates[name] = calls * per_call / (time.perf_counter() - t0)
            best[name] = max(best[name], rates[name])
        for name, rate in rates.items():
            ratios[name].append(rate / rates[LIMIT])
    limit = best[LIMIT]
    for name, rate in best.items():
        print(json.dumps({"variant": name, "best_examples_per_sec": round(rate), "of_limit": round(rate / limit, 3),
                          "median_of_limit": round(statistics.median(ratios[name]), 3)}))


if __name__ == "__main__":
    main()
