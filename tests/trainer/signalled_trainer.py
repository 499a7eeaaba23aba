"""`python -m trainer` that signals itself at a chosen moment: a stop that no loaded test machine delays.

    python -m tests.trainer.signalled_trainer --signal-at STEP:SIGNAL:DELAY_S TRAINER_ARGS...

The real trainer, whose first checkpoint at or past STEP starts a timer that sends SIGNAL (TERM,
KILL) to the trainer's own process DELAY_S seconds later, from wherever its loop then is: a
call, a snapshot, an upload. A test that waits for the trainer's report and then signals it
depends on being scheduled in time: on a loaded two-core machine the report may be read so
late that a fast loop runs hundreds of steps more, or to its end, before the signal lands.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def _armed(argv: list[str]) -> tuple[list[str], int, int, float]:
    """The trainer's arguments, and the step, signal and delay of `--signal-at`."""
    i = argv.index("--signal-at")
    step, name, delay = argv[i + 1].split(":")
    return argv[:i] + argv[i + 2:], int(step), getattr(signal, f"SIG{name}"), float(delay)


def main() -> None:
    from trainer import __main__ as entry

    sys.argv, at, sig, delay = _armed(sys.argv)
    with entry.imports_kept(), entry.quiet_native_stderr():  # as the trainer's own start imports
        from trainer import loop
    checkpoint = loop.TrainLoop._checkpoint  # AttributeError: the loop changed, update this module
    timers: list[threading.Timer] = []

    def checkpoint_then_arm(self, *, sync: bool) -> None:
        checkpoint(self, sync=sync)
        if not timers and self.state.step >= at:
            timers.append(threading.Timer(delay, os.kill, (os.getpid(), sig)))
            timers[0].daemon = True
            timers[0].start()

    loop.TrainLoop._checkpoint = checkpoint_then_arm
    entry.exit_now(entry.main())


if __name__ == "__main__":
    main()
