"""`python -m trainer`, with each call of the step timed and the loop's host work between calls timed by function.

Runs exactly what `trainer/__main__.py` runs (as `bench.probe` does) with thin wrappers: around the
compiled call (each call's steps, wall and CPU seconds, and the wall gap before it) and around the
loop's host functions (the log points, TensorBoard's writes, the metrics' results, progress, the
evaluation, the checkpoint's save). What the paired ratio loses outside the calls is here, by name.
A renamed function in `trainer.loop` fails here at once (AttributeError).

Usage: python -m bench.host_work --run-uri file:///tmp/hw/run --work-dir /tmp/hw/work --synthetic --model mlp --steps 9000
Prints one JSON line: {"calls": [[steps, wall_s, cpu_s, gap_before_s], ...], "in_call_examples_per_sec"
(calls 2..N, their own wall), "span_examples_per_sec" (calls 2..N, gaps included), "host": {name: {"n",
"total_ms", "max_ms"}}, "speed" (the `finished` event's loop figures)}.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CALLS: list[tuple[float, float, int, float]] = []  # (start, end, steps, cpu seconds)
HOST: dict[str, list[float]] = collections.defaultdict(list)
SPEED: list[dict] = []


def _timed(owner, name: str) -> None:
    original = getattr(owner, name)  # AttributeError: trainer.loop changed, update this bench

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            HOST[name].append(time.perf_counter() - started)

    setattr(owner, name, wrapper)


def install() -> None:
    """Wrap the step's calls and the loop's host functions (after importing `trainer.loop`)."""
    from trainer import loop, metrics, summaries

    for name in ("_log", "_summaries", "_progress", "_called", "evaluate", "_checkpoint"):
        _timed(loop.TrainLoop, name)
    _timed(loop, "training_scalars")
    _timed(metrics.MetricSet, "results")
    _timed(summaries.Summaries, "series")
    make, speed = loop.make_train_step, loop.loop_speed

    def make_train_step(*args, **kwargs):
        fn = make(*args, **kwargs)

        def step(*a, **kw):
            started, cpu = time.perf_counter(), time.process_time()
            out = fn(*a, **kw)
            CALLS.append((started, time.perf_counter(), int(a[1]), time.process_time() - cpu))
            return out

        step.get_concrete_function = fn.get_concrete_function  # the loop traces first before a skip
        return step

    def loop_speed(*args, **kwargs):
        out = speed(*args, **kwargs)
        SPEED.append(out)
        return out

    loop.make_train_step, loop.loop_speed = make_train_step, loop_speed


def report(batch: int) -> dict:
    """The calls, their speeds and the host functions' times, as one document."""
    calls = [[n, round(end - start, 4), round(cpu, 4), round(start - CALLS[i - 1][1], 4) if i else 0.0]
             for i, (start, end, n, cpu) in enumerate(CALLS)]
    steady = CALLS[1:]
    out = {"calls": calls, "host": {k: {"n": len(v), "total_ms": round(sum(v) * 1e3, 1), "max_ms": round(max(v) * 1e3, 1)}
                                    for k, v in sorted(HOST.items())}, "speed": SPEED[-1] if SPEED else None}
    if steady:
        examples = sum(n for _, _, n, _ in steady) * batch
        out["in_call_examples_per_sec"] = round(examples / sum(end - start for start, end, _, _ in steady), 1)
        out["span_examples_per_sec"] = round(examples / (steady[-1][1] - steady[0][0]), 1)
    return out


def main() -> int:
    """Run the trainer as `python -m trainer` would, then print the report; returns its exit code."""
    from bench.probe import configured

    got = configured(sys.argv[1:])
    if isinstance(got, int):
        return got
    cfg, stop = got
    from trainer import loop_attempt as attempt

    install()
    rc = attempt.train(cfg, stop=stop)
    print(json.dumps(report(cfg.batch_size)), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
