"""A run folder that tells a night on spot machines, for the dashboard's tests, its bench and its docs.

Written with the trainer's own writers (``EventLog``, ``CheckpointStore.commit``) and with the
machines' lines as ``lib.sh`` writes them, on a clock of its own (``EventLog`` stamps events
with ``trainer.events.utc_now``, replaced while the run is written), so its attempts span hours:
two preemptions after spot notices, an idle gap, a move to another region, evaluations, a
TensorBoard event file and a COMPLETE end.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from runfolder import layout
from runfolder.storage import open_store
from trainer.events import EventLog

PRICE_NOTE = "spot estimate (dearest type), price table 2026-11-30"
EAST, WEST = "aws us-east-1", "aws us-west-2"
MOVE_REASON = "no spot capacity in aws us-east-1 for 15 min (controller)"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


class Clock:
    """A settable clock for ``trainer.events.utc_now`` (see :func:`clocked`)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> str:
        return _iso(self.t)


@dataclass
class Story:
    """What the story run holds, for the tests to count."""

    uri: str
    attempts: int
    preemptions: int
    spot_notices: int
    evaluations: int
    checkpoints: int
    moves: int
    end: float


def commit(store, work: Path, step: int) -> None:
    """A small checkpoint of ``step`` committed as the trainer commits one (files, then ``COMMITTED``)."""
    from trainer.checkpoint_store import CheckpointStore

    src = work / f"ckpt-src-{step}"
    src.mkdir(parents=True)
    (src / "state.json").write_text(json.dumps({"step": step}))
    (src / "ckpt.index").write_bytes(os.urandom(64))
    CheckpointStore(store).commit(step, str(src))


@contextlib.contextmanager
def clocked(clock: Clock) -> Iterator[None]:
    """``utc_now`` (the trainer's event log's and the run folder's) reads ``clock`` inside the block,
    the real time again after it."""
    import runfolder.events
    import trainer.events

    real = runfolder.events.utc_now
    trainer.events.utc_now = runfolder.events.utc_now = clock
    try:
        yield
    finally:
        trainer.events.utc_now = runfolder.events.utc_now = real


def _machine(store, machine: str, name: str, t: float, **fields) -> None:
    from runfolder.storage import NotFound

    key = layout.machine_events_key(machine)
    try:
        old = store.get_bytes(key)
    except NotFound:
        old = b""
    line = json.dumps({"event": name, "time": _iso(t), "instance": machine, **fields})
    store.put_bytes(key, old + line.encode() + b"\n")


def _tensorboard(store, losses: dict[int, float]) -> None:
    """A TensorBoard event file of ``train/loss``, written as the trainer's ``tf.summary.scalar`` writes it
    (a float tensor per step, in TFRecord framing) by TensorBoard's own record writer: TensorBoard's file
    writer would import TensorFlow (seconds) for its file system."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    out = io.BytesIO()
    w = RecordWriter(out)
    w.write(event_pb2.Event(wall_time=0.0, file_version="brain.Event:2").SerializeToString())
    for step, loss in sorted(losses.items()):
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[loss])
        value = summary_pb2.Summary.Value(tag="train/loss", tensor=tensor)
        w.write(event_pb2.Event(step=step, wall_time=0.0, summary=summary_pb2.Summary(value=[value])).SerializeToString())
    store.put_bytes(layout.TENSORBOARD_PREFIX + "events.out.tfevents.1.chief", out.getvalue())


def story(uri: str, work: Path, *, start: float, eval_every: int = 500, steps: int = 6000,
          checkpoint_every: int = 1000) -> Story:
    """A run preempted twice in aws us-east-1, moved to aws us-west-2, COMPLETE there with evaluations.

    ``work``: a local folder for the checkpoints' files before they are committed.
    """
    clock = Clock(start)
    with clocked(clock):
        return _story(uri, work, clock, eval_every=eval_every, steps=steps, checkpoint_every=checkpoint_every)


def _moved(store, at: float, step: int) -> None:
    """The controller's move to us-west-2 at ``step``, in its placement record and its events."""
    move = {"from": 0, "to": 1, "from_placement": EAST, "to_placement": WEST, "reason": MOVE_REASON, "step": step,
            "time": _iso(at), "done": True}
    store.put_bytes(layout.PLACEMENT_KEY, json.dumps({"active": 1, "since": move["time"], "moves": [move]}).encode())
    store.put_bytes(layout.PLACEMENT_EVENTS_KEY, (json.dumps({"event": layout.MOVED, **move}) + "\n").encode())


def _complete(store, losses: dict[int, float], end: float, *, steps: int, evals: dict[int, dict]) -> None:
    """The COMPLETE marker the trainer writes at ``end``: figures, cost, signature and best checkpoint, each
    as the run's evaluations have them (the newest evaluation's metrics, the best one's value and step)."""
    import runfolder.events
    from runfolder import cost

    events = runfolder.events.read_events(store)
    best_step = max(evals, key=lambda s: (evals[s]["val_accuracy"], s), default=None)
    doc = {"step": steps, "metrics": {"loss": losses[steps], **(evals[max(evals)] if evals else {})},
           "examples_seen": steps * 64, "attempts": 3, "seconds_lost_to_preemption": 800.0,
           "total_seconds": round(end - runfolder.events.parse_time(events[0][layout.TIME]), 3), "finished_at": _iso(end),
           **cost.run_cost(events, end=end).to_json(),
           "signature": {"endpoint": "serve", "signature": "serving_default",
                         "inputs": {"x": {"dtype": "float32", "shape": [None, 28, 28]}},
                         "outputs": {"output_0": {"dtype": "float32", "shape": [None, 10]}}},
           **({"best": {"metric": "val_accuracy", "mode": "max", "step": best_step,
                        "value": evals[best_step]["val_accuracy"], "exported": True}} if evals else {})}
    store.put_bytes(layout.COMPLETE, json.dumps(doc, indent=2).encode())


def _story(uri: str, work: Path, clock: Clock, *, eval_every: int, steps: int, checkpoint_every: int) -> Story:
    store = open_store(uri)
    log: EventLog | None = None
    evaluations = checkpoints = 0
    losses: dict[int, float] = {}
    evals: dict[int, dict] = {}

    def attempt(n: int, where: str) -> EventLog:
        nonlocal log
        if log is not None:
            log.close()
        log = EventLog(store, attempt=n, stream=io.StringIO(), tty=False)
        log.emit("started", config={"steps": steps, "batch_size": 64, "price_per_hour": 1.2 if where == EAST else 0.9,
                                    "price_note": PRICE_NOTE, "placement": where, "keep_best": "val_accuracy"},
                 global_batch=64, workers=1)
        return log

    def train(log: EventLog, first: int, last: int, seconds_per_step: float) -> None:
        nonlocal evaluations, checkpoints
        for step in range(first + 1, last + 1):
            clock.t += seconds_per_step
            if step % 100 == 0:
                losses[step] = round(2.3 * (0.9995 ** step) + 0.05, 4)
            if step % checkpoint_every == 0:
                commit(store, work, step)
                log.emit("checkpoint", step=step, seconds=3.2, bytes=48_000_000)
                checkpoints += 1
            if step % eval_every == 0 and step < steps:  # the trainer's loop: none at the last step
                evals[step] = {"val_accuracy": round(0.95 - 0.6 * (0.9993 ** step), 4),
                               "val_loss": round(1.6 * 0.9994 ** step + 0.08, 4)}
                log.emit("evaluated", step=step, metrics=evals[step], examples=10000, seconds=4.1)
                evaluations += 1
        log.progress(last, steps, losses.get(last // 100 * 100, 1.0), 2400.0)

    def preempted(log: EventLog, machine: str, step: int) -> None:
        # The spot notice, then the trainer's checkpoint at the step it reached, then its exit.
        nonlocal checkpoints
        _machine(store, machine, layout.SPOT_NOTICE, clock.t, cloud="aws", kind="termination")
        clock.t += 20
        commit(store, work, step)
        log.emit("checkpoint", step=step, seconds=3.4, bytes=48_000_000)
        checkpoints += 1
        clock.t += 5
        log.emit("preempted", step=step, signal="SIGTERM", seconds=3.4)

    # Attempt 1: i-0aaa in us-east-1, from 0 to `first`; a spot notice, then preempted.
    first, second = steps * 11 // 30, steps * 53 // 120  # 2200 and 2650 of 6000
    log = attempt(1, EAST)
    train(log, 0, first, 2.0)
    preempted(log, "i-0aaa", first)
    # Idle 25 minutes: no spot capacity; then i-0bbb in us-east-1 resumes and is preempted at `second`.
    clock.t += 25 * 60
    log = attempt(2, EAST)
    log.emit("resumed", step=first)
    train(log, first, second, 2.0)
    preempted(log, "i-0bbb", second)
    # The controller moves the run to us-west-2 after 15 minutes without capacity.
    clock.t += 15 * 60
    _moved(store, clock.t, second)
    clock.t += 8 * 60
    log = attempt(3, WEST)
    log.emit("resumed", step=second)
    train(log, second, steps, 2.4)
    log.emit("finished", step=steps, metrics={"loss": losses[steps]})
    log.close()
    end = clock.t + 40
    _machine(store, "i-0ccc", layout.MACHINE_FINISH, end + 5, cloud="aws", outcome="COMPLETE")
    _tensorboard(store, losses)
    _complete(store, losses, end, steps=steps, evals=evals)
    return Story(uri=uri, attempts=3, preemptions=2, spot_notices=2, evaluations=evaluations,
                 checkpoints=checkpoints, moves=1, end=end)
