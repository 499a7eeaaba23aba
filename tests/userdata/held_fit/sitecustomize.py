"""A fit script's `trainer.fit`, held after its first epoch until a stop signal arrives.

A test puts this folder on the sandbox trainer's PYTHONPATH (`FAKE_TRAINER_PATH`); script mode
passes it on to the user's script, where Python imports this module at start-up. It imports
nothing itself: once the script imports `trainer.fit`, `RunCheckpoint.on_epoch_end` is wrapped so that
after the first epoch's checkpoint the script waits until SIGTERM or SIGINT sets the stop flag
(or HOLD_S passes), writing `$FAKE_STATE/trainer-held` (the step) first. A notice sent once that
file is there lands mid-training at a known step, however slowly the machine trains; after it,
the next batch stops the script as it would have. The trainer process itself (script mode) never
imports `trainer.fit`, so nothing changes there.
"""

import importlib.abc
import importlib.machinery
import os
import sys
import time
from pathlib import Path

HOLD_S = 300.0  # a bound on the hold: a test that never stops the script still ends


def _hold(fit) -> None:
    original = fit.RunCheckpoint.on_epoch_end  # AttributeError: trainer/fit.py changed, update this module
    held: list[int] = []

    def on_epoch_end(self, epoch, logs=None):
        original(self, epoch, logs)
        if held:
            return
        held.append(self.step)
        (Path(os.environ["FAKE_STATE"]) / "trainer-held").write_text(f"{self.step}\n")
        deadline = time.monotonic() + HOLD_S
        while not fit.STOP.event.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)

    fit.RunCheckpoint.on_epoch_end = on_epoch_end


class _AfterFit(importlib.abc.MetaPathFinder):
    """Finds `trainer.fit` as Python would, and holds it once it has run."""

    def find_spec(self, name, path, target=None):
        if name != "trainer.fit":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _hold(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("FAKE_STATE"):
    sys.meta_path.insert(0, _AfterFit())
