"""Goodput: the share of a run's paid machine time that produced steps the run kept; what took the rest.

Everything is derived from what the run folder already records, with the machine time of
:mod:`runfolder.cost` (each attempt from its ``started`` event to the last thing heard from it,
x nodes) plus the boots before each attempt. Each attempt's paid time splits into:

- **boot**: from the machine's launch to the attempt's first step. The run folder records no
  machine's launch. The first machine's boot counts from when the run's ``deadline`` object was
  written (the first machine's supervisor writes it on the run's first boot, after cloud-init: the
  minutes before are not recorded; the placement controller's first tick may write it first, and
  then a decision after it bounds the launch as below); a replacement's from the latest of the previous attempt's end, a move, a controller
  ``waiting`` event and a decision table (``ops`` passes their times, from their keys), all of which
  come before the replacement was launched. Where capacity was short and nothing of these was
  written meanwhile, the wait for it counts as boot: an upper bound.
  Then the trainer's own start: from ``started`` to ``resumed`` (the checkpoint restored); a first
  attempt's start-up before its first step is not recorded and counts as training.
- **idle**: paid time with no training: machines of several waiting for the others
  (``waiting_for_machines``, from its ``since``, counting the machines that came), and an attempt's
  end after its last step (the model's export after ``finished``, the stop after ``preempted``,
  ``failed`` or ``cancelled``; a ``stalled`` trainer from its last event to the machine's stop).
- **lost**: training after the last commit the run went on from: the next attempt's ``resumed`` step
  names it; a preemption the trainer could stop for commits first and loses nothing, a machine
  taken without a word loses what it trained since its last ``checkpoint`` (up to the last thing
  heard from it). ``lost_steps``: the steps so lost, as far as the events tell (at least that many).
- **uncommitted**: the running attempt's training since its last commit: kept once it commits.
- **kept**: the rest, the training whose steps the run kept.

goodput = kept / paid. A machine the group may be booting now, before its trainer starts, is not
counted yet. Standard library only, pure: ``ops status``, ``ops runs`` and the dashboard call it
with what they read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from runfolder import cost, layout

# Trainer events that end an attempt's training (the machine may go on: an export, a stop).
_TRAINING_ENDS = frozenset({layout.PREEMPTED, layout.FINISHED, layout.CANCELLED_EVENT, layout.FAILED_EVENT})
# Ends after which what was trained since the last commit is kept: the trainer commits before it says so.
_COMMITS_FIRST = frozenset({layout.PREEMPTED, layout.FINISHED, layout.CANCELLED_EVENT})
# The controller's words between two attempts: a replacement is launched after them.
_CONTROLLER = frozenset({layout.MOVED, layout.CONTROLLER_WAITING})
_BETWEEN = frozenset({layout.WAITING_FOR_MACHINES, layout.CONTROLLER_WAITING})
# The trainer's events (the rest of a merged log is the machines' and the controller's).
_TRAINER = frozenset({layout.STARTED, layout.RESUMED, layout.CHECKPOINT, layout.EVALUATED, *_TRAINING_ENDS})


@dataclass(frozen=True)
class Attempt:
    """One attempt's paid machine-hours (x nodes) by what they went to."""

    attempt: int | None
    nodes: int
    boot_h: float
    idle_h: float
    lost_h: float
    uncommitted_h: float
    kept_h: float
    lost_steps: int = 0
    launch: float | None = None
    """When its boot is counted from (epoch seconds)."""
    first_step: float | None = None
    kept_until: float | None = None
    """Its training up to here was kept; from here to ``train_end`` it was lost (or is not committed yet)."""
    train_end: float | None = None

    @property
    def paid_h(self) -> float:
        return self.boot_h + self.idle_h + self.lost_h + self.uncommitted_h + self.kept_h


@dataclass(frozen=True)
class Goodput:
    """A run's goodput so far (module docstring) and the machine-hours against it."""

    paid_h: float
    kept_h: float
    boot_h: float
    idle_h: float
    lost_h: float
    uncommitted_h: float
    lost_steps: int
    boots: int
    attempts: tuple[Attempt, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def share(self) -> float | None:
        """kept / paid; None before anything was paid."""
        return None if self.paid_h <= 0 else self.kept_h / self.paid_h

    def to_json(self) -> dict:
        """The figures ``ops status --json`` and ``ops runs --json`` print (hours rounded to the second)."""
        out = {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()
               if k not in ("attempts", "notes")}
        out["goodput"] = None if self.share is None else round(self.share, 4)
        out["notes"] = list(self.notes)
        return out


_time = cost.event_time


def _step(ev: dict) -> int | None:
    v = ev.get("step")
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _count(ev: dict, key: str) -> int | None:
    v = ev.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _before_start(found: list, k: int, first_boot: float | None, marks: list[float],
                  timed: list[tuple[float, int, dict]]) -> tuple[float, float, float]:
    """Attempt ``k``'s launch time, its machines' boot before their start and their wait for the others (hours)."""
    s = found[k]
    if k == 0:
        # The controller's first tick may write the deadline before it decides where the first machine goes.
        launch = s.start if first_boot is None or first_boot > s.start else max(
            [first_boot, *(m for m in marks if first_boot <= m <= s.start)])
    else:
        launch = max([found[k - 1].end, *(m for m in marks if found[k - 1].end <= m <= s.start)])
    waits = [e for t, _i, e in timed if launch <= t <= s.start and e.get(layout.EVENT) == layout.WAITING_FOR_MACHINES]
    if not waits:
        return launch, (s.start - launch) / 3600 * s.nodes, 0.0
    since = _time({layout.TIME: waits[-1].get("since")}) or _time(waits[-1])
    since = min(max(since, launch), s.start)
    came = min(_count(waits[-1], "came") or s.nodes, s.nodes)
    boot_pre = (since - launch) / 3600 * s.nodes + (s.start - since) / 3600 * (s.nodes - came)
    return launch, boot_pre, (s.start - since) / 3600 * came


def _training(s, trainer: list[dict], window: list[dict]) -> tuple[float, int, dict | None, float]:
    """Span ``s``'s first step's time and step, the trainer's event that ended its training, and when it ended."""
    resumed = next((e for e in trainer if e.get(layout.EVENT) == layout.RESUMED), None)
    first_step = min(max(_time(resumed) or s.start, s.start), s.end) if resumed else s.start
    from_step = (_step(resumed) or 0) if resumed else 0
    ending = next((e for e in trainer if e.get(layout.EVENT) in _TRAINING_ENDS and _time(e) >= first_step), None)
    stalled = next((e for e in window if e.get(layout.EVENT) == layout.MACHINE_STALLED), None)
    if ending is not None:
        train_end = _time(ending)
    elif stalled is not None:
        # No progress for the machine's bound: the trainer's last word is the last time it trained.
        train_end = max([first_step, *(_time(e) for e in trainer if _time(e) <= _time(stalled))])
    else:
        train_end = s.end  # still running, or taken without a word: trained up to the last thing heard
    return first_step, from_step, ending, min(max(train_end, first_step), s.end)


def goodput(events: list[dict], *, now: float | None = None, end: float | None = None,
            first_boot: float | None = None, launched_after: Iterable[float] = (),
            completed: bool = False) -> Goodput | None:
    """The run's goodput from its events (the trainer's and the machines', any order), None before any attempt.

    ``now`` / ``end``: as :func:`runfolder.cost.spans` counts the machine time (the newest attempt up to now while
    the run has not ended; up to its end marker's time once it has). ``first_boot``: when the run's first machine
    wrote the ``deadline`` object; ``launched_after``: other times a replacement was launched after when they fall
    between two attempts (the decision tables' times); ``completed``: the run
    ended COMPLETE (its last attempt's training is kept).
    """
    # A wait for the other machines comes before the attempt it leads to (runfolder.cost counts it as the machine
    # time of the attempt before), and the controller's `waiting` is no machine's: neither extends the attempt before.
    found = cost.spans([e for e in events if e.get(layout.EVENT) not in _BETWEEN], now=now, end=end)
    if not found:
        return None
    timed = sorted(((t, i, e) for i, e in enumerate(events) if (t := _time(e)) is not None), key=lambda x: x[:2])
    marks = sorted({*launched_after, *(t for t, _i, e in timed if e.get(layout.EVENT) in _CONTROLLER)})
    notes = []
    if first_boot is None or first_boot > found[0].start:
        notes.append("the first machine's boot is not recorded (no deadline object before its start)")
    windows = []
    for k, s in enumerate(found):
        stop = found[k + 1].start if k + 1 < len(found) else float("inf")
        windows.append([e for t, _i, e in timed if s.start <= t < stop])
    attempts = []
    for k, s in enumerate(found):
        window = windows[k]
        trainer = [e for e in window if e.get(layout.EVENT) in _TRAINER]
        launch, boot_pre, wait_h = _before_start(found, k, first_boot, marks, timed)
        # -- the attempt itself: start-up, training, its end
        first_step, from_step, ending, train_end = _training(s, trainer, window)
        commits = [(_time(e), _step(e)) for e in trainer
                   if e.get(layout.EVENT) == layout.CHECKPOINT and _step(e) is not None and _time(e) <= train_end]
        steps = [x for e in trainer if (x := _step(e)) is not None and _time(e) <= train_end]
        last_step = max([from_step, *steps])
        kind = ending.get(layout.EVENT) if ending is not None else None
        uncommitted = 0.0
        if k + 1 < len(found):
            nxt = next((e for e in windows[k + 1] if e.get(layout.EVENT) == layout.RESUMED), None)
            went_on = (_step(nxt) or 0) if nxt is not None else 0
            if kind in _COMMITS_FIRST and went_on >= last_step:
                kept_until = train_end
            else:
                kept_until = max([first_step, *(t for t, st in commits if st <= went_on)]) if went_on > from_step \
                    else first_step
            lost_steps = max(0, last_step - max(went_on, from_step))
        elif completed or kind in _COMMITS_FIRST:
            kept_until, lost_steps = train_end, 0
        else:
            kept_until = max([first_step, *(t for t, _st in commits)])
            committed = max([from_step, *(st for _t, st in commits)])
            if s.open:
                uncommitted, lost_steps = train_end - kept_until, 0
            else:
                lost_steps = max(0, last_step - committed)
        kept_until = min(max(kept_until, first_step), train_end)
        n = s.nodes
        lost = 0.0 if uncommitted else (train_end - kept_until)
        attempts.append(Attempt(
            attempt=s.attempt, nodes=n, boot_h=boot_pre + (first_step - s.start) / 3600 * n,
            idle_h=wait_h + (s.end - train_end) / 3600 * n, lost_h=lost / 3600 * n,
            uncommitted_h=uncommitted / 3600 * n, kept_h=(kept_until - first_step) / 3600 * n, lost_steps=lost_steps,
            launch=launch, first_step=first_step, kept_until=kept_until, train_end=train_end))
    if len(found) > 1:
        notes.append("a replacement's boot counts from the last thing before its launch (the previous machine's "
                     "end, a move, a decision): an upper bound where capacity was short")
    return Goodput(paid_h=sum(a.paid_h for a in attempts), kept_h=sum(a.kept_h for a in attempts),
                   boot_h=sum(a.boot_h for a in attempts), idle_h=sum(a.idle_h for a in attempts),
                   lost_h=sum(a.lost_h for a in attempts), uncommitted_h=sum(a.uncommitted_h for a in attempts),
                   lost_steps=sum(a.lost_steps for a in attempts), boots=len(attempts), attempts=tuple(attempts),
                   notes=tuple(notes))
