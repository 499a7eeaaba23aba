"""`python -m trainer`, held after its first checkpoint until a stop signal arrives.

The sandbox's fake `docker run` runs this in the trainer's place when a test sets
`FAKE_TRAINER_MODULE=tests.userdata.held_trainer` (and `FAKE_TRAINER_PATH` to the checkout):
the real trainer, whose loop waits after its first checkpoint (saved, its upload going on in
the background) until SIGTERM or SIGINT sets the stop flag, or HOLD_S passes. A spot notice
sent once the trainer says it is held (`$FAKE_STATE/trainer-held`, holding the step) lands
mid-training at a known step, however slowly the machine trains: the run can be short.
After the signal the loop goes on as it would have: its next call, then the stop.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

HOLD_S = 300.0  # a bound on the hold: a test that never stops the trainer still ends


def main() -> None:
    from trainer import __main__ as entry

    with entry.imports_kept(), entry.quiet_native_stderr():  # as the trainer's own start imports
        from trainer import loop
    checkpoint = loop.TrainLoop._checkpoint  # AttributeError: the loop changed, update this module
    held: list[int] = []

    def checkpoint_then_hold(self, *, sync: bool) -> None:
        checkpoint(self, sync=sync)
        if held:
            return
        held.append(self.state.step)
        mark = Path(os.environ["FAKE_STATE"]) / "trainer-held"
        mark.write_text(f"{self.state.step}\n")
        deadline = time.monotonic() + HOLD_S
        while not self.stop.requested and time.monotonic() < deadline:
            time.sleep(0.05)

    loop.TrainLoop._checkpoint = checkpoint_then_hold
    entry.exit_now(entry.main())


if __name__ == "__main__":
    main()
