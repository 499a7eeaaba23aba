"""Run a `fit` script (examples/keras-fit/train.py) unchanged, held at a chosen step until a stop signal lands.

    python -m tests.trainer.held_fit --hold-at 130 --flag FILE train.py --epochs 3 ...

The command a script-mode test gives the trainer instead of `python train.py`, so that the
parent's SIGTERM reaches the script at a known step, whatever the machine's load: after the
step `--hold-at` (the trainstack callback's count), it writes `--flag` and waits (at most
`HOLD_S`) for `trainer.fit`'s stop flag; the next batch is then the one the callback stops
after. The script and the helper run as they would: the hold only adds a callback after them.
"""

from __future__ import annotations

import argparse
import runpy
import sys

import keras

from trainer import fit

HOLD_S = 300.0


class Hold(keras.callbacks.Callback):
    def __init__(self, checkpoint: fit.RunCheckpoint, at: int, flag: str) -> None:
        super().__init__()
        self.checkpoint, self.at, self.flag = checkpoint, at, flag

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self.checkpoint.step == self.at and not fit.STOP.event.is_set():
            with open(self.flag, "w") as f:
                f.write(str(self.at))
            fit.STOP.event.wait(HOLD_S)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hold-at", type=int, required=True)
    p.add_argument("--flag", required=True)
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    plain = fit.callbacks

    def held(**kw):
        callbacks = plain(**kw)
        (checkpoint,) = [c for c in callbacks if isinstance(c, fit.RunCheckpoint)]
        return [*callbacks, Hold(checkpoint, a.hold_at, a.flag)]

    fit.callbacks = held
    sys.argv = [a.script, *a.args]
    runpy.run_path(a.script, run_name="__main__")


if __name__ == "__main__":
    main()
