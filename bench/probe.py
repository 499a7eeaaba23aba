"""`python -m trainer`, with marks of where its start-up seconds go.

Runs exactly what `trainer/__main__.py` runs (signal flag first, then config, then
`trainer.loop_attempt.train`), with thin wrappers around the start-up phases of `trainer.loop_attempt`
and `trainer.loop`:
imports, the strategy, the model build, the restore of a checkpoint, the data set, and the
first call of the train step (tracing plus its steps). Each mark is seconds since the bench
started the process (`BENCH_T0`, the parent's `time.time()` just before spawning), and is
written as JSON to `BENCH_MARKS` after the first and second calls, so the parent can watch
for the first step. A renamed function in either fails here at once (AttributeError),
which is how `tests/bench` notices that the probe needs updating. From the second call on it
also keeps the process's CPU seconds (`loop_cpu_s`, every thread's) and the steps run
(`loop_steps`), written with the marks at the end.

Usage: BENCH_T0=... BENCH_MARKS=marks.json python -m bench.probe --run-uri ... (trainer flags)
"""

from __future__ import annotations

import json
import os
import sys
import time

T0 = float(os.environ.get("BENCH_T0") or time.time())
MARKS: dict[str, float] = {"python": time.time() - T0}
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def mark(name: str) -> None:
    """Record `name` at the current time (seconds since the process was spawned)."""
    MARKS[name] = round(time.time() - T0, 4)


def dump() -> None:
    """Write the marks so far to `BENCH_MARKS` (atomically), if set."""
    path = os.environ.get("BENCH_MARKS")
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(MARKS, fh)
    os.replace(tmp, path)


def _timed(owner, name: str, label: str) -> None:
    original = getattr(owner, name)  # AttributeError: trainer.loop changed, update this probe

    def wrapper(*args, **kwargs):
        mark(label + "_start")
        try:
            return original(*args, **kwargs)
        finally:
            mark(label + "_end")

    setattr(owner, name, wrapper)


def install() -> None:
    """Wrap the start-up phases of `trainer.loop_attempt` and `trainer.loop` (call after importing them)."""
    from trainer import loop
    from trainer import loop_attempt as attempt

    _timed(attempt, "make_strategy", "strategy")
    _timed(loop, "seeded_model", "model")
    _timed(loop.TrainLoop, "restore", "restore")
    # The loop's input, whichever it is (in-memory arrays, a stream whose files stage meanwhile).
    _timed(loop, "open_feed", "dataset")
    make = loop.make_train_step

    def make_train_step(*args, **kwargs):
        fn = make(*args, **kwargs)
        calls = [0]

        def step(*a, **kw):
            calls[0] += 1
            n = calls[0]
            if n <= 2:
                mark(f"call{n}_start")
            if n == 2:
                # The process's CPU seconds from the second call on (the first traces the step), every
                # thread's (checkpoint writes and uploads, tf.data, summaries) over the steps they served.
                MARKS["loop_cpu_start"] = time.process_time()
            out = fn(*a, **kw)
            if n >= 2:
                MARKS["loop_cpu_s"] = round(time.process_time() - MARKS["loop_cpu_start"], 4)
                MARKS["loop_steps"] = MARKS.get("loop_steps", 0) + int(a[1])
            if n <= 2:
                mark(f"call{n}_end")
                if n == 1:
                    MARKS["first_step"] = MARKS["call1_end"]
                dump()
            return out

        step.get_concrete_function = fn.get_concrete_function  # the loop traces first before a skip
        return step

    loop.make_train_step = make_train_step


def configured(argv: list[str]):
    """What `python -m trainer` sets up first: the stop flag's signal handlers, then the config. Returns
    `(cfg, stop)`, or 2 for a config refused (its line on stderr, as the trainer prints it)."""
    from trainer.signals import StopRequest

    stop = StopRequest().install()
    from trainer.config import ConfigError, load_config

    try:
        return load_config(argv), stop
    except ConfigError as e:
        print(f"trainer: error: {e}", file=sys.stderr)
        return 2


def main() -> int:
    """Run the trainer as `python -m trainer` would; returns its exit code."""
    got = configured(sys.argv[1:])
    if isinstance(got, int):
        return got
    cfg, stop = got
    from trainer.__main__ import imports_kept

    mark("imports_start")
    with imports_kept():  # as `python -m trainer` imports them
        import keras  # noqa: F401 - timed here: the imports are a phase of their own
        import tensorflow  # noqa: F401

        mark("imports_tf")
        from trainer import loop_attempt as attempt

    mark("imports_end")
    install()
    rc = attempt.train(cfg, stop=stop)
    mark("exit")
    dump()
    return rc


if __name__ == "__main__":
    sys.exit(main())
