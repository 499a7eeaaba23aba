"""What a script-mode command says, and what the run hears of it.

`trainer.fit`'s callback, in the user's command, appends one JSON object a line to a local file
(`TRAINSTACK_MESSAGES_FILE`); the trainer, its parent, is the one writer of the run's events and
`progress.json`. `CommandReport` reads the file from where it stopped (a torn last line waits for
its end; a line that is not a JSON object is skipped), keeps where the command stands (step,
total, metrics, examples seen, epoch, speed, last commit) and says each message as the run's event
and progress. It never imports TensorFlow.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from runfolder import layout


class CommandReport:
    """The command's messages file, read as it grows, and where the command stands."""

    def __init__(self, path: str, *, events, emit: Callable[..., dict],
                 on_commit: Callable[[], None] | None = None) -> None:
        self.path = path
        self.events = events  # the attempt's EventLog: progress.json
        self.emit = emit  # the attempt's events
        self.on_commit = on_commit  # after each commit's event (the chief keeps the outputs of it)
        self.step = 0
        self.total: int | None = None
        self.committed: int | None = None
        self.metrics: dict = {}
        self.examples_seen: int | None = None
        self.epoch: int | None = None
        self.rate: float | None = None
        self._offset = 0

    def read(self) -> None:
        """Turn the command's new message lines into events and progress (a torn last line waits)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                self.said(msg)

    def said(self, msg: dict) -> None:
        """One message: where the command stands, then its event (fields of the wrong type are left out)."""
        kind = msg.pop("kind", None)
        if isinstance(msg.get("step"), int):
            self.step = msg["step"]
        if isinstance(msg.get("total"), int):
            self.total = msg["total"]
        if isinstance(msg.get("examples_seen"), int):
            self.examples_seen = msg["examples_seen"]
        if isinstance(msg.get("metrics"), dict):
            self.metrics = msg["metrics"]
        if isinstance(msg.get("epoch"), int):
            self.epoch = msg["epoch"]
        if kind in ("progress", "epoch") and "examples_per_sec" in msg:
            self.rate = msg["examples_per_sec"]
        if kind == "progress":
            self.progress()
        elif kind == "epoch":
            self.emit("epoch", step=self.step, epoch=msg.get("epoch"), metrics=self.metrics)
            self.progress()
        elif kind == layout.CHECKPOINT:
            self.committed = msg.get("step")
            self.emit(layout.CHECKPOINT, step=msg.get("step"), seconds=msg.get("seconds"), bytes=msg.get("bytes"))
            # progress.json says the committed step too: a stop's commit is where the run stands.
            self.progress()
            if self.on_commit is not None:
                self.on_commit()
        elif kind == layout.RESUMED:
            self.emit(layout.RESUMED, step=msg.get("step"), examples_seen=msg.get("examples_seen"),
                      batches_seen=msg.get("step"), epoch=msg.get("epoch"), batch=msg.get("batch"))
        elif kind == "event" and isinstance(msg.get("event"), str):
            name = msg.pop("event")
            self.emit(name, **msg)

    def progress(self) -> None:
        """`progress.json` as the command stands now."""
        self.events.progress(self.step, self.total or 0, self.metrics.get("loss"), self.rate,
                             metrics=self.metrics, epoch=self.epoch)
