"""`python -m trainer`: parse the config, train, exit with the run's code (0, 143 or failure).

TensorFlow's start-up prints C++ log lines that would bury the run's own lines (the absl
"log messages before absl::InitializeLog()" warning, oneDNN and CPU-feature notes, the CUDA
plugin registration errors of GPU builds). Some ignore `TF_CPP_MIN_LOG_LEVEL`, so besides
setting it (2: warnings and errors only, unless the user set it) the import is done with the
process's stderr captured and replayed without those known lines. `--verbose` (or
`TRAINSTACK_VERBOSE=1`) shows everything, as TensorFlow prints it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator

from trainer.quiet import quiet_native_stderr


@contextlib.contextmanager
def imports_kept() -> Iterator[None]:
    """Import TensorFlow and the trainer without the cyclic collector, then freeze what they built.

    The imports make a few hundred thousand objects that live as long as the process; the
    collector's full passes walk all of them again and again, during the import and then while
    the train step is traced. Collecting off during the import and `gc.freeze()` after it (the
    collector then skips those objects) save about 0.8 s of CPU a start, a tenth of a short
    run's (docs: https://docs.python.org/3/library/gc.html#gc.freeze). What the run allocates
    afterwards is collected as usual.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    from trainer.signals import StopRequest

    stop = StopRequest().install()
    from trainer.config import ConfigError, load_config

    try:
        cfg = load_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        print(f"trainer: error: {e}", file=sys.stderr)
        return 2
    if cfg.command is not None:
        # Script mode: the user's command trains; this process keeps the run's guarantees
        # and never imports TensorFlow itself (trainer/script.py).
        from trainer.script import run_script

        return run_script(cfg, stop=stop)
    # A run that already ended exits here, before TensorFlow's import (a machine rebooting
    # after the end, `ops` asking again): the attempt would read the same markers after it.
    from trainer.run_attempt import ended_before_start, loop_complete_message

    code = ended_before_start(cfg, complete_message=lambda done: loop_complete_message(done, cfg.steps))
    if code is not None:
        return code
    with imports_kept():
        if cfg.verbose:
            from trainer.loop_attempt import train
        else:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            with quiet_native_stderr():
                from trainer.loop_attempt import train

    return train(cfg, stop=stop, keep=HELD)


# The `LoopAttempt`, held until the process ends: see exit_now.
HELD: list = []


def exit_now(code: int) -> None:
    """End the process with `code` without the interpreter's teardown.

    By the time `main` returns, everything the attempt writes is written: the checkpoint is
    committed, the events and TensorBoard files are in the run folder, the lease is released.
    What the teardown would still do is free TensorFlow's objects, and freeing a tf.data
    iterator waits for its autotuning thread's next wake-up, a period that grows with the
    run's length: measured 7-22 s after a SIGTERM, on a machine that is being taken back or
    is billing for nothing.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
