"""One tick of the controller, and the move itself (which ``ops move`` calls too).

:func:`tick` reads the run folder (:func:`read_run`), ``placement.json`` and the active
group, asks :func:`controller.decide.decide`, and acts:

- a move recorded but not carried out (its tick stopped between steps) is finished first;
- ``finish``: every group not at zero goes to zero;
- a ``STOP`` no trainer heeds (none holds the lease, or nothing progressed for ``STOP_GRACE_S`` since
  it was asked): ``CANCELLED`` is written, the controller's (``instance``: controller), and every
  group goes to zero: a stop asked is a stop, with or without a machine;
- ``time_up`` (the run's deadline passed, no end marker): ``TIMED_OUT`` is written, as a
  machine's finish path writes it, and every group goes to zero. The deadline is the run
  folder's ``deadline`` file; a tick that finds none (no machine has booted yet) writes it from
  ``max_runtime_s``, once (create-if-absent), and the machines then read the same one;
- ``move``: :func:`start_move` records it (a conditional write: of two ticks at once, one
  wins; the other does nothing), then :func:`finish_move` carries it out:
  (1) the active group to zero, (2) the old lease expired (else the next tick goes on),
  (3) the next placement's group to ``nodes``, (4) one ``moved`` event, then the move is
  marked done. Every step is idempotent, so a tick that stops anywhere leaves a state the
  next one finishes;
- ``replace`` (all the run's machines up, no progress for ``HUNG_S``): recorded in ``placement.json``
  (``hung``, a conditional write), then the active group is cycled: to zero and back to ``nodes``;
- ``launch`` (the first launch, with ``cheapest``): every group starts at zero (components/common.py's
  ``group_size``), and a tick that finds a run not started (no machine in any group, no event, no lease, no
  progress, no commit, and ``placement.json`` names no placement launched or moved to) prices every placement,
  writes the decision table (``first_launch``) and records the chosen placement active (a conditional write:
  of two ticks at once, one launches), then sizes its group to ``nodes``. A group that cannot be read holds the
  first launch to the next tick (a group ``pulumi up`` has not made yet must not send the run elsewhere), unless
  it is broken; a price decision that fails launches the listed order's first placement. From there on the run
  is as any other: its group refusing capacity moves it by the failed-launch rules;
- otherwise every placement but the active one is kept at zero, and the active group is put back
  to ``nodes`` when it stands below (:func:`controller.decide.decide`'s ``size``). A run that cannot
  train anywhere now (``stuck``) gets a ``waiting`` event with the reason among the placement
  events, once per cause, which ``ops status`` shows.

Each placement's errors stay inside it: a group that cannot be read or sized (a refused credential, a
deleted group, an API still failing after its retries) keeps no other duty of the tick from being done
(the other groups' sizes, the active group's size back, the ``waiting`` event); the tick raises one
:class:`CloudError` naming every such group at its end. Every tick calls every placement's group at
least once (:class:`Watched` notes how each answered) and keeps ``placement.json``'s ``broken`` up to
date: a group that failed at every tick for ``BROKEN_TICKS`` ticks over ``BROKEN_S`` is marked failed
and named in a ``waiting`` event, no move goes to it, and a move under way to it is abandoned.

A tick acts only on the record it read: before it sizes anything it reads ``placement.json``
again and, if another writer (a move) changed it meanwhile, leaves the sizing to the next tick; it
never zeroes the placement the current record names active, and a move whose record changed
under it does not size its new group up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from controller import choice as choices
from controller import record as records
from controller import table as tables
from controller.clouds import CloudError
from controller.config import Config, Placement
from controller.decide import (
    FINISH,
    LAUNCH_MARGIN_S,
    MOVE,
    REPLACE,
    STAY,
    TIME_UP,
    Decision,
    GroupState,
    RunView,
    candidates,
    decide,
    is_broken,
    may_launch,
    time_up_reason,
)
from controller.prices import Offer, Quote
from controller.record import Record, epoch_of, iso
from runfolder import layout
from runfolder.lease import CLOCK_SKEW_S, LeaseRecord
from runfolder.storage import NotFound, PreconditionFailed, Store, open_store

LAUNCH = "launch"  # the tick's action at the run's first launch (``cheapest``: every group starts at zero)
# Who wrote an end marker the controller wrote (the ``instance`` field, a machine's id otherwise).
CONTROLLER_INSTANCE = "controller"
# A stop asked this long ago, with no progress since, is one the trainer holding the lease does not heed (it
# hangs): a trainer sees STOP within a step and commits (a checkpoint's upload fits well inside).
STOP_GRACE_S = 30 * 60


@dataclass
class TickResult:
    """What a tick (or a move) did: the decision, the groups it sized, the move it recorded or finished."""

    action: str
    reason: str
    resized: list[dict] = field(default_factory=list)
    move: dict | None = None
    waiting: str | None = None
    errors: list[str] = field(default_factory=list)
    """The groups that could not be read or sized (a tick raises them, joined, at its end)."""
    price: str | None = None
    """What the price decision found wrong (a price API, the cache, the inputs), when it did: the tick went on."""

    def to_json(self) -> dict:
        out = asdict(self)
        if not self.errors:
            del out["errors"]  # a tick that reached every group logs as before
        if self.price is None:
            del out["price"]
        return out


def read_run(store: Store) -> RunView:
    """The run folder as the controller reads it: end marker, newest sign of training, live lease, step,
    STOP, deadline and attempts."""
    ended = next((name for name in layout.END_MARKERS if store.exists(name)), None)
    signs = []
    attempts = 0
    finishing, progress_at, progress_step, total = False, None, None, None
    try:
        progress = json.loads(store.get_bytes(layout.PROGRESS_KEY))
        if isinstance(progress, dict):
            progress_at = epoch_of(progress.get("updated"))
            signs.append(progress_at)
            step, total = progress.get("step"), progress.get("total")
            finishing = isinstance(step, int) and isinstance(total, int) and 0 < total <= step
            progress_step = step if isinstance(step, int) else None
            total = total if isinstance(total, int) and total > 0 else None
    except (NotFound, ValueError):
        pass
    try:
        lines = store.get_bytes(layout.EVENTS_KEY).decode(errors="replace").strip().splitlines()
        # Only the newest event and the attempts (``started`` events) count here: a line is parsed only when it
        # may be one of those (a run's log grows by a checkpoint event every few minutes, read at every tick).
        newest = None
        for line in reversed(lines):
            newest = _event(line)
            if newest is not None:
                break  # a line cut short by a machine taken mid-write (the last, most often): the one before counts
        signs.append(epoch_of(newest.get(layout.TIME)) if newest is not None else None)
        attempts = layout.attempts([e for line in lines if layout.STARTED in line and (e := _event(line)) is not None])
    except NotFound:
        pass
    lease = read_lease(store)
    lease_until = lease.expires if lease is not None and not lease.released else None
    steps = []
    for key in store.list(layout.CHECKPOINTS_PREFIX):
        found = layout.checkpoint_key_step(key)
        if found and found[1] == layout.COMMITTED:
            steps.append(found[0])
    heartbeat = max((s for s in signs if s is not None), default=None)
    return RunView(ended=ended, heartbeat=heartbeat, lease_until=lease_until, step=max(steps, default=None),
                   stop=store.exists(layout.STOP_KEY), deadline=read_deadline(store), attempts=attempts,
                   finishing=finishing, progress_at=progress_at, progress_step=progress_step, total=total)


def _event(line: str) -> dict | None:
    """One line of ``events.jsonl`` as an event; None for a line cut short or not an object."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def read_deadline(store: Store) -> float | None:
    """The run's deadline (epoch seconds) from its ``deadline`` file; None while there is none."""
    try:
        digits = "".join(c for c in store.get_bytes(layout.DEADLINE_KEY).decode(errors="replace") if c.isdigit())
    except NotFound:
        return None
    return float(digits) if digits else None


def ensure_deadline(config: Config, store: Store, run: RunView, now: float) -> RunView:
    """``run`` with its deadline: the ``deadline`` file, or, when none is written yet and the cap is
    known, one written now (create-if-absent, in the machines' format: epoch seconds and a newline)."""
    if run.deadline is not None or config.max_runtime_s is None:
        return run
    with contextlib.suppress(PreconditionFailed):  # a machine (or another tick) wrote it first: theirs counts
        store.put_bytes_if(layout.DEADLINE_KEY, f"{int(now) + config.max_runtime_s}\n".encode(), version=None)
    deadline = read_deadline(store)
    return RunView(**{**asdict(run), "deadline": deadline})


def write_end(store: Store, outcome: str, reason: str, run: RunView, now: float,
              instance: str = CONTROLLER_INSTANCE) -> bool:
    """Write the end marker ``outcome`` (create-if-absent, unless any end marker is there), as a machine's
    finish path writes it: ``instance`` names who ended the run; the step is the newest committed one.
    True if this call wrote it."""
    if any(store.exists(name) for name in layout.END_MARKERS):
        return False
    body = {"outcome": outcome, layout.MARKER_REASON: reason, "instance": instance, layout.TIME: iso(now),
            layout.MARKER_STEP: -1 if run.step is None else run.step, layout.MARKER_ATTEMPTS: run.attempts}
    try:
        store.put_bytes_if(outcome, (json.dumps(body) + "\n").encode(), version=None)
    except PreconditionFailed:  # a machine's finish path wrote it meanwhile
        return False
    return True


def end_timed_out(config: Config, clouds, store: Store, run: RunView, reason: str, now: float) -> TickResult:
    """Write ``TIMED_OUT`` (unless an end marker is there), as a machine's finish path does, and put
    every group to zero."""
    result = TickResult(TIME_UP, f"{reason}: the controller ended it {layout.TIMED_OUT}; every group at zero")
    write_end(store, layout.TIMED_OUT, reason, run, now)
    _zero(clouds, config.placements, result.resized, result.errors)
    return result


def stop_unheeded(store: Store, run: RunView, now: float) -> str | None:
    """Why a run asked to stop must be ended by whoever sees it (the controller, ``ops stop``), or None while
    a trainer may still heed it: no trainer holds the run's lease (none trains), or the request is older
    than ``STOP_GRACE_S`` and nothing has progressed since (one that holds it and hangs)."""
    if not run.stop:
        return None
    held = lease_gone(store, now)
    if held is None:
        return "a stop was asked and no machine is training: ended without one"
    asked = stop_asked_at(store)
    if asked is not None and now - asked >= STOP_GRACE_S and (run.progress_at is None or run.progress_at < asked):
        return (f"a stop was asked at {iso(asked)} and nothing has progressed since ({held}): ended without "
                "the trainer")
    return None


def stop_asked_at(store: Store) -> float | None:
    """When ``STOP`` was asked (its ``requested`` stamp), None when it does not say."""
    try:
        doc = json.loads(store.get_bytes(layout.STOP_KEY))
    except (NotFound, ValueError):
        return None
    return epoch_of(doc.get("requested")) if isinstance(doc, dict) else None


def end_stopped(config: Config, clouds, store: Store, run: RunView, reason: str, now: float) -> TickResult:
    """End a run whose stop no trainer heeds: ``CANCELLED`` (the controller's), every group to zero."""
    result = TickResult(FINISH, f"{reason}: the controller ended it {layout.CANCELLED}; every group at zero")
    write_end(store, layout.CANCELLED, reason, run, now)
    _zero(clouds, config.placements, result.resized, result.errors)
    return result


def read_lease(store: Store) -> LeaseRecord | None:
    try:
        return LeaseRecord.parse(store.get_bytes(layout.LEASE_KEY))
    except NotFound:
        return None


def lease_gone(store: Store, now: float) -> str | None:
    """None once no trainer can hold the run's lease (absent, released or expired, as
    ``runfolder/lease.py`` reads it); else who holds it and until when."""
    lease = read_lease(store)
    if lease is None or lease.released or lease.expires + CLOCK_SKEW_S < now:
        return None
    return f"the run's lease is held by {lease.holder} until {iso(lease.expires + CLOCK_SKEW_S)}"


class Watched:
    """The groups as a tick calls them, noting how each placement's calls answered: ``failed[index]``
    holds a placement's newest error, ``answered`` the placements a call succeeded for."""

    def __init__(self, clouds) -> None:
        self.clouds = clouds
        self.failed: dict[int, str] = {}
        self.answered: set[int] = set()
        self.maybe_broken = False  # the record the tick read has `broken` entries

    def _call(self, p: Placement, fn, *args):
        try:
            out = fn(p, *args)
        except CloudError as e:
            self.failed[p.index] = str(e)
            raise
        self.answered.add(p.index)
        return out

    def state(self, p: Placement) -> GroupState:
        return self._call(p, self.clouds.state)

    def desired(self, p: Placement) -> int:
        return self._call(p, self.clouds.desired)

    def set_size(self, p: Placement, n: int) -> None:
        self._call(p, self.clouds.set_size, n)


def _resize(clouds, p: Placement, n: int, done: list[dict]) -> None:
    if clouds.desired(p) != n:
        clouds.set_size(p, n)
        done.append({"placement": p.index, "group": p.group, "size": n})


def _zero(clouds, placements, done: list[dict], errors: list[str] | None = None) -> None:
    """Every one of ``placements`` to zero; one that cannot be reached (a refused credential, an API
    still failing after its retries) does not keep the others up: its error goes to ``errors`` or,
    without that list, is raised naming each, after."""
    missed = []
    for p in placements:
        try:
            _resize(clouds, p, 0, done)
        except CloudError as e:
            missed.append(str(e))
    if errors is not None:
        errors.extend(missed)
    elif missed:
        raise CloudError("; ".join(missed))


def _contained(errors: list[str], fn, *args) -> None:
    """``fn(*args)``; a group's :class:`CloudError` goes to ``errors`` (the tick's other duties go on)."""
    try:
        fn(*args)
    except CloudError as e:
        errors.append(str(e))


def moved_on(store: Store, rec: Record) -> bool:
    """Whether the run has moved on from ``rec``'s move (another move recorded, or an end marker)."""
    if any(store.exists(name) for name in layout.END_MARKERS):
        return True
    current, _ = records.read(store)  # last: nothing is read between it and the sizing that follows
    return current.active != rec.active or len(current.moves) != len(rec.moves)


def current_record(store: Store, version: str | None) -> Record | None:
    """``placement.json`` as it is now if it is still at ``version`` and the run has not ended; else None.

    Read right before a tick sizes anything: a move (or the run's end) since the tick's first read
    makes what it decided stale, and the next tick decides again from what is there.
    """
    if any(store.exists(name) for name in layout.END_MARKERS):
        return None
    current, current_version = records.read(store)  # last: nothing is read between it and the sizing
    return current if current_version == version else None


def start_move(config: Config, store: Store, rec: Record, version: str | None, to: int, reason: str,
               step: int | None, now: float, *, failed: bool) -> tuple[Record, str]:
    """Record the move from the active placement to ``to`` (not yet carried out); conditional on
    ``version``: raises :class:`PreconditionFailed` when another writer changed the record first."""
    move = {"from": rec.active, "to": to, "from_placement": config.placements[rec.active].label,
            "to_placement": config.placements[to].label, "reason": reason, "step": step, "time": iso(now),
            "done": False}
    failed_at = dict(rec.failed_at)
    if failed:
        failed_at[str(rec.active)] = round(now, 3)
    new = Record(active=to, since=iso(now), moves=[*rec.moves, move], failed_at=failed_at, broken=rec.broken,
                 hung=rec.hung, seen={k: v for k, v in rec.seen.items() if k != str(to)})
    return new, records.write(store, new, version)


def finish_move(config: Config, clouds, store: Store, rec: Record, version: str, now: float,
                run: RunView | None = None, clock: Callable[[], float] | None = None, *,
                contain: bool = False) -> TickResult:
    """Carry out ``rec``'s pending move (idempotent); a lease still held leaves it for the next tick.

    ``run`` (its deadline) and ``clock`` (the time now, read again before the new group is sized up):
    no group is sized up within the launch margin of the deadline. ``contain`` (a tick): an old group
    that cannot be reached is noted in the result's ``errors`` and the move goes on (the lease keeps its
    machines, if any, from training beside the new ones; later ticks keep zeroing it); the new group's
    error, too, is noted, and the move stays under way.
    """
    move = rec.pending
    assert move is not None
    old, new = config.placements[move["from"]], config.placements[move["to"]]
    result = TickResult(MOVE, move["reason"], move=move)
    if moved_on(store, rec):
        result.reason = f"{layout.PLACEMENT_KEY} changed meanwhile (another move, or the run ended): left to its writer"
        return result
    if contain:  # (1)
        _contained(result.errors, _resize, clouds, old, 0, result.resized)
    else:
        _resize(clouds, old, 0, result.resized)
    held = lease_gone(store, now)  # (2)
    if held:
        result.waiting = f"{held}; {new.label}'s group starts once it has expired"
        return result
    if run is not None and not may_launch(run, (clock or (lambda: now))()):
        result.waiting = (f"the run's deadline is less than {LAUNCH_MARGIN_S // 60} min away: {new.label}'s group is "
                          "not started")
        return result
    if moved_on(store, rec):  # read last, right before the one step that starts a machine
        result.reason = f"{layout.PLACEMENT_KEY} changed meanwhile (another move, or the run ended): left to its writer"
        return result
    if contain:  # (3)
        _contained(result.errors, _resize, clouds, new, config.nodes, result.resized)
        if result.errors and new.index in getattr(clouds, "failed", {}):
            result.waiting = f"{new.label}'s group could not be sized up: the move stays under way"
            return result
    else:
        _resize(clouds, new, config.nodes, result.resized)
    number = len(rec.moves)
    records.append_moved_once(store, {  # (4)
        layout.EVENT: layout.MOVED, layout.TIME: iso(now), layout.ATTEMPT: None, "move": number,
        "from": move["from"], "to": move["to"], "from_placement": old.label, "to_placement": new.label,
        "reason": move["reason"], "step": move["step"]})
    for _ in range(records.CONFLICT_TRIES):  # mark it done, unless another tick has
        rec.moves[-1] = {**move, "done": True, "done_time": iso(now)}
        try:
            records.write(store, rec, version)
            break
        except PreconditionFailed:
            rec, version = records.read(store)
            if len(rec.moves) != number or rec.moves[-1].get("done"):
                break
            move = rec.moves[-1]
    else:  # the record kept changing under us: the move is carried out, the next tick marks it
        raise PreconditionFailed(f"{layout.PLACEMENT_KEY} kept changing while the move was marked done")
    result.move = rec.moves[number - 1]
    return result


def tick(config: Config, clouds, now: float, *, store: Store | None = None,
         clock: Callable[[], float] | None = None, inputs: choices.Inputs | None = None,
         prices: Callable[[], Callable[[Offer], Quote]] | None = None) -> TickResult:
    """One pass of the controller (module docstring); safe to run twice at once.

    ``now`` is when the tick started; ``clock`` (default: ``now`` throughout) is read again before a
    group is sized up, so a tick that ran long does not start a machine past the launch margin.
    ``inputs`` (:mod:`controller.choice`; None: the listed order) and ``prices`` (makes the fetch that asks
    the clouds for a quote; None: the cache alone) drive the price decision.
    Raises :class:`CloudError` naming every group it could not reach, once every other duty is done.
    """
    store = open_store(config.run_uri) if store is None else store
    clock = clock or (lambda: now)
    watched = Watched(clouds)
    result = _tick(config, watched, store, now, clock, inputs, prices)
    for p in config.placements:  # every group is called each tick (a move under way may touch only two)
        if p.index not in watched.answered and p.index not in watched.failed:
            with contextlib.suppress(CloudError):
                watched.desired(p)
    _note_health(config, watched, store, now)
    if result.errors:
        error = CloudError("; ".join(result.errors))
        error.result = result  # type: ignore[attr-defined] - what the tick did besides
        raise error
    return result


def _tick(config: Config, clouds: Watched, store: Store, now: float, clock: Callable[[], float],
          inputs: choices.Inputs | None = None, prices=None) -> TickResult:
    run = read_run(store)
    if run.ended:
        result = TickResult(FINISH, f"the run ended ({run.ended}): every group at zero")
        _zero(clouds, config.placements, result.resized, result.errors)
        return result
    run = ensure_deadline(config, store, run, now)
    if run.deadline is not None and now >= run.deadline:
        return end_timed_out(config, clouds, store, run, time_up_reason(run.deadline), now)
    unheeded = stop_unheeded(store, run, now)
    if unheeded is not None:
        return end_stopped(config, clouds, store, run, unheeded, now)
    rec, version = records.read(store)
    clouds.maybe_broken = bool(rec.broken)
    if rec.pending:
        if is_broken(rec, rec.pending["to"], now):
            return _abandon(config, clouds, store, rec, version, now)
        return finish_move(config, clouds, store, rec, version, now, run, clock, contain=True)
    if rec.active >= len(config.placements):
        return TickResult(STAY, f"{layout.PLACEMENT_KEY} names placement {rec.active}, which the stack does not have")
    if inputs is not None and inputs.cheapest and not_started(run, rec):
        launched = _first_launch(config, clouds, store, rec, version, run, now, clock, inputs, prices)
        if launched is not None:
            return launched
    active = config.placements[rec.active]
    try:
        group = clouds.state(active)
    except CloudError as e:
        group = GroupState(running=0, desired=None, error=str(e))
    group, rec, version = _seen(store, rec, version, group, now)
    launch_failed = _launch_failed(config, clouds, rec, run, group, now)
    decision: Decision = decide(config, rec, run, group, now, launch_failed)
    failed, price_note = decision.action == MOVE, None
    if inputs is not None and inputs.cheapest:
        if launch_failed is None:  # not read (machines up): a move for price weighs the other groups' failures too
            def launch_failed_now():
                return _launch_failed(config, clouds, rec, run, group, now, always=True)
        else:
            def launch_failed_now():
                return launch_failed
        decision, price_note = _by_price(config, inputs, store, rec, run, group, decision, now, prices,
                                         launch_failed_now)
    if decision.action == MOVE:
        try:
            rec, version = start_move(config, store, rec, version, decision.to, decision.reason, run.step, now,
                                      failed=failed)
        except PreconditionFailed:
            return TickResult(STAY, f"another tick changed {layout.PLACEMENT_KEY} first: it moves the run")
        result = finish_move(config, clouds, store, rec, version, now, run, clock, contain=True)
        result.price = price_note
        return result
    if decision.action == REPLACE:
        return _replace(config, clouds, store, rec, version, run, decision, now, clock)
    result = TickResult(decision.action, decision.reason, price=price_note)
    if group.error is not None:
        result.errors.append(group.error)
    current = current_record(store, version)
    if current is None:
        result.reason = (f"{layout.PLACEMENT_KEY} changed (a move) or the run ended while this tick read the run: "
                         "the next tick acts on it")
        return result
    _zero(clouds, [p for p in config.placements if p.index != current.active], result.resized, result.errors)
    if decision.size is not None and may_launch(run, clock()):
        _contained(result.errors, _resize, clouds, active, decision.size, result.resized)
    if decision.stuck is not None:  # said where `ops status` shows it: the run does not wait in silence
        records.note_waiting(store, {layout.EVENT: layout.CONTROLLER_WAITING, layout.TIME: iso(now),
                                     layout.ATTEMPT: None, "reason": decision.reason, "placement": active.label,
                                     "key": decision.stuck}, after=run.heartbeat)
    return result


def not_started(run: RunView, rec: Record) -> bool:
    """Whether the run folder shows a run no machine has started: no event, lease, progress or commit, and
    ``placement.json`` names no placement launched (its ``since``) or moved to."""
    return (run.attempts == 0 and run.heartbeat is None and run.lease_until is None and run.step is None
            and run.progress_at is None and rec.since is None and not rec.moves)


def _first_launch(config: Config, clouds: Watched, store: Store, rec: Record, version: str | None, run: RunView,
                  now: float, clock: Callable[[], float], inputs: choices.Inputs, prices) -> TickResult | None:
    """The run's first launch (module docstring): None when a group has a machine or is sized up already (a
    person, a stack deployed before the groups started at zero: the run is not one the first tick launches)."""
    broken = {p.index: "its group's API has failed at every tick: marked failed until it answers"
              for p in config.placements if is_broken(rec, p.index, now)}
    unread = []
    for p in config.placements:
        if p.index in broken:
            continue
        try:
            group = clouds.state(p)
        except CloudError as e:
            unread.append(str(e))
            continue
        if group.running or (group.desired or 0) > 0:
            return None
    if unread:
        return TickResult(STAY, "the first launch waits for every group to answer (a group not made yet, or an API "
                                "failing): the next tick decides", errors=unread)
    to, why, note = _first_choice(config, store, run, now, inputs, prices, broken)
    if to is None:
        return TickResult(STAY, f"the first launch: {why}")
    new = dataclasses.replace(rec, active=to, since=iso(now))
    try:
        version = records.write(store, new, version)
    except PreconditionFailed:
        return TickResult(STAY, f"another tick changed {layout.PLACEMENT_KEY} first: it launches the run", price=note)
    chosen = config.placements[to]
    result = TickResult(LAUNCH, f"the first launch, in {chosen.label}: {why}", price=note)
    if current_record(store, version) is None:
        result.reason = f"{layout.PLACEMENT_KEY} changed or the run ended meanwhile: the next tick acts on it"
        return result
    _zero(clouds, [p for p in config.placements if p.index != to], result.resized, result.errors)
    if may_launch(run, clock()):
        _contained(result.errors, _resize, clouds, chosen, config.nodes, result.resized)
    return result


def _first_choice(config: Config, store: Store, run: RunView, now: float, inputs: choices.Inputs, prices,
                  broken: dict[int, str]) -> tuple[int | None, str, str | None]:
    """Where the first launch goes, why, and what failed on the way (a price API, the cache): the decision table's
    choice, written (``first_launch``); whatever fails leaves the listed order's first placement not broken."""
    fallback = next((p.index for p in config.placements if p.index not in broken), None)
    try:
        fetch = prices() if prices is not None else None
        quotes, note = choices.quotes(config, inputs, store, now=now, fetch=fetch,
                                      out_of_time=choices.prices_budget())
        verdict = choices.price_tables(config, inputs, store, quotes, active=0, now=now, allowed=broken,
                                       committed=None, progress_step=None, total=None, deadline=run.deadline,
                                       running_active=False, booted_s=None, restart=False, first=True)
    except Exception as e:  # noqa: BLE001 - the run is launched whatever the prices do
        why = f"the price decision failed: {type(e).__name__}: {e}"[:500]
        return fallback, "the listed order's first placement (the price decision failed)", why
    doc, to = verdict.doc, verdict.to
    if to is None:  # nothing feasible: the run trains toward its deadline rather than wait
        to = fallback
        doc["chosen"] = to
        doc["reason"] += f"; the first launch goes to the listed order's first placement, {to}"
    doc["first_launch"], doc["step"] = True, None
    tables.write(store, doc, now=now)
    return to, str(doc["reason"]), note or None


def _seen(store: Store, rec: Record, version: str | None, group: GroupState, now: float
          ) -> tuple[GroupState, Record, str | None]:
    """``group`` with ``launched`` no earlier than when a tick first saw its running machines as they are now
    (``placement.json``'s ``seen``, written when they change: a conditional write, left to the next tick
    when another writer came first), and the record and version as they are after it."""
    if group.error is not None or not group.machines:
        return group, rec, version
    key, ids = str(rec.active), list(group.machines)
    seen = rec.seen.get(key) or {}
    at = seen.get("at") if seen.get("ids") == ids and isinstance(seen.get("at"), int | float) else None
    if at is None:
        at = now
        new = dataclasses.replace(rec, seen={**rec.seen, key: {"ids": ids, "at": round(now, 3)}})
        with contextlib.suppress(PreconditionFailed):
            version = records.write(store, new, version)
            rec = new
    launched = max(t for t in (group.launched, at) if t is not None)
    return dataclasses.replace(group, launched=launched), rec, version


def _replace(config: Config, clouds: Watched, store: Store, rec: Record, version: str | None, run: RunView,
             decision: Decision, now: float, clock: Callable[[], float]) -> TickResult:
    """Cycle the active group (to zero, then back to ``nodes``): its machines, up without progress, are
    replaced by fresh ones. Recorded first (a conditional write: of two ticks at once, one replaces)."""
    key = str(rec.active)
    rec.hung = {**rec.hung, key: [*rec.hung.get(key, [])[-4:], round(now, 3)]}
    result = TickResult(REPLACE, decision.reason)
    try:
        version = records.write(store, rec, version)
    except PreconditionFailed:
        result.action, result.reason = STAY, f"another writer changed {layout.PLACEMENT_KEY} first: the next tick decides"
        return result
    if current_record(store, version) is None:
        result.action = STAY
        result.reason = f"{layout.PLACEMENT_KEY} changed (a move) or the run ended meanwhile: the next tick acts on it"
        return result
    active = config.placements[rec.active]
    _zero(clouds, [p for p in config.placements if p.index != rec.active], result.resized, result.errors)
    _contained(result.errors, _resize, clouds, active, 0, result.resized)
    if active.index not in clouds.failed and may_launch(run, clock()):
        _contained(result.errors, _resize, clouds, active, config.nodes, result.resized)
    if decision.stuck is not None:
        records.note_waiting(store, {layout.EVENT: layout.CONTROLLER_WAITING, layout.TIME: iso(now),
                                     layout.ATTEMPT: None, "reason": decision.reason, "placement": active.label,
                                     "key": decision.stuck})
    return result


def _launch_failed(config: Config, clouds: Watched, rec: Record, run: RunView, group: GroupState,
                   now: float, *, always: bool = False) -> dict[int, float] | None:
    """Each other placement's newest launch failure another placement could fix, within ``2 × wait_minutes``
    (its group's own activity): read only when the active placement may be left (no machine trains there), or
    ``always`` (a move for price)."""
    if not always and group.error is None and group.running >= config.nodes:
        return None  # the run stays: nothing to weigh
    out: dict[int, float] = {}
    for p in config.placements:
        if p.index == rec.active or is_broken(rec, p.index, now):
            continue
        try:
            t = clouds.state(p).failed_launch_at(now, 2 * config.wait_s)
        except CloudError:
            continue  # a group that cannot be read now is weighed by `broken`
        if t is not None:
            out[p.index] = t
    return out


def _by_price(config: Config, inputs: choices.Inputs, store: Store, rec: Record, run: RunView, group: GroupState,
              decision: Decision, now: float, prices, launch_failed: Callable[[], dict[int, float] | None]
              ) -> tuple[Decision, str | None]:
    """The decision with ``cheapest`` (controller/choice.py): where a failure move goes, and a move for price.

    A decision point is a failure move (``decision`` is one: it goes to the feasible placement of least
    expected cost among those the waiting rules allow, the listed order's next when none has a known cost),
    or a tick at which no trainer holds the run's lease (the first launch, a preemption or lost machine, the
    end of a move: the run leaves for a placement whose saving beats the move threshold). A machine that
    trains is never stopped for price, unless ``rebalance``: then only right after a commit, and only when
    the saving also covers the restart. Neither comes within ``wait_minutes`` of the move before (no flapping),
    inside the launch margin, with a stop asked, or from a placement whose group cannot be read. Whatever
    fails here (a price API, the cache, an estimate) leaves ``decision`` as it was, and is returned as a note:
    the tick goes on."""
    if decision.action not in (MOVE, STAY) or run.stop or rec.pending or not may_launch(run, now):
        return decision, None
    training = trainer_holds(run, now)
    if decision.action == STAY:
        last_move = epoch_of(rec.moves[-1].get("time")) if rec.moves else None
        since = max(t for t in (last_move, epoch_of(rec.since), -1.0) if t is not None)
        if (decision.stuck is not None or group.error is not None
                or is_broken(rec, rec.active, now) or now - since < config.wait_s or run.finishing
                or training and not inputs.rebalance or _decided_lately(store, rec, run, now, training)):
            return decision, None
    try:
        return _priced(config, inputs, store, rec, run, group, decision, now, prices, launch_failed, training)
    except Exception as e:  # noqa: BLE001 - one broken part (a price API, the cache) never stops the tick's duties
        return decision, f"the price decision failed: {type(e).__name__}: {e}"[:500]


def _decided_lately(store: Store, rec: Record, run: RunView, now: float, training: bool) -> bool:
    """Whether this decision point has been decided already: the newest table is of the active placement and,
    for a restart, younger than ``TABLE_EVERY_S`` (a quote's refresh) and no older than the run's last sign of
    training (a new restart is decided at once, a long one again as its prices refresh); for a training run
    (``rebalance``), of the newest commit (one decision a commit)."""
    latest = tables.latest(store)
    at = epoch_of((latest or {}).get("time"))
    if latest is None or at is None or latest.get("active") != rec.active:
        return False
    if training:
        return latest.get("step") == run.step
    return now - at < choices.TABLE_EVERY_S and at >= (run.heartbeat or 0.0)


def trainer_holds(run: RunView, now: float) -> bool:
    """Whether a trainer may be training now: it holds the run's lease, as :func:`lease_gone` reads it (not
    released, not past its end and the clocks' skew), as :func:`read_run` found it."""
    return run.lease_until is not None and run.lease_until + CLOCK_SKEW_S >= now


def _priced(config: Config, inputs: choices.Inputs, store: Store, rec: Record, run: RunView, group: GroupState,
            decision: Decision, now: float, prices, launch_failed, training: bool) -> tuple[Decision, str | None]:
    order = candidates(config, rec, now, launch_failed())
    options = set(order)
    allowed = {p.index: "the waiting rules do not allow it now (a failed or broken placement waits)"
               for p in config.placements if p.index not in options and p.index != rec.active}
    if decision.action == MOVE:
        allowed[rec.active] = decision.reason
    fetch = prices() if prices is not None else None
    quotes, note = choices.quotes(config, inputs, store, now=now, fetch=fetch,
                                  out_of_time=choices.prices_budget())
    booted = now - group.launched if group.running and group.launched is not None else None
    verdict = choices.price_tables(config, inputs, store, quotes, active=rec.active, now=now, allowed=allowed,
                                   committed=run.step, progress_step=run.progress_step, total=run.total,
                                   deadline=run.deadline, running_active=training, booted_s=booted, restart=training)
    doc = verdict.doc
    doc["step"] = run.step  # the newest commit it was decided at
    if decision.action == MOVE:
        to = verdict.to
        if to is None or verdict.cost_to is None:
            # Nothing priced: the listed order's next feasible placement; nothing feasible: the listed order's next.
            feasible = {r["index"] for r in doc["rows"] if r["feasible"]}
            to = next((i for i in order if i in feasible), decision.to)
            doc["chosen"] = to
            doc["reason"] += f"; the move goes to the listed order's next{' feasible' if to in feasible else ''} " \
                             f"placement, {to}"
        tables.write(store, doc, now=now)
        return Decision(MOVE, f"{decision.reason}; to placement {to}: {doc['reason']}", to=to), note
    active_row = doc["rows"][rec.active]
    if verdict.to is None or verdict.to == rec.active or verdict.cost_to is None or (
            verdict.cost_from is None and active_row["feasible"]):
        # Staying: a move for price needs the target's cost, and the active placement's too unless it is
        # infeasible now (its price above the maximum, its deadline out of reach there): then any known feasible
        # placement is better than one that cannot finish.
        if verdict.to is not None and verdict.to != rec.active:
            doc["chosen"], doc["reason"] = rec.active, f"staying: {doc['reason']}, but without a known cost there"
        tables.write(store, doc, now=now)
        return decision, note
    tables.write(store, doc, now=now)
    return Decision(MOVE, f"{choices.PRICE_REASON}{verdict.reason}", to=verdict.to), note


def _abandon(config: Config, clouds: Watched, store: Store, rec: Record, version: str | None,
             now: float) -> TickResult:
    """Give up the move under way to a broken placement: the move is marked done and abandoned, the
    placement failed; the next tick decides from there (the run moves on as from one that cannot launch)."""
    move = rec.pending
    assert move is not None
    to = config.placements[move["to"]] if move["to"] < len(config.placements) else None
    why = (f"placement {move['to']} ({to.label if to else '?'})'s group's API has failed at every tick since "
           f"{iso(rec.broken[str(move['to'])]['first'])}: the move to it is abandoned")
    rec.moves[-1] = {**move, "done": True, "done_time": iso(now), "abandoned": why}
    rec.failed_at[str(move["to"])] = round(now, 3)
    result = TickResult(STAY, why)
    try:
        records.write(store, rec, version)
    except PreconditionFailed:
        result.reason = f"another writer changed {layout.PLACEMENT_KEY} first: the next tick decides"
    return result


def _note_health(config: Config, watched: Watched, store: Store, now: float) -> None:
    """Keep ``placement.json``'s ``broken`` as this tick found the groups (module docstring); a placement
    that has just become broken is marked failed and named in a ``waiting`` event. Written only when it
    changes; a write another writer beat is left to the next tick."""
    if not watched.failed and not watched.maybe_broken:
        return  # nothing to note: no read of the record
    with contextlib.suppress(PreconditionFailed, NotFound):
        rec, version = records.read(store)
        broken = {k: dict(v) for k, v in rec.broken.items()}
        for i in watched.answered - set(watched.failed):
            broken.pop(str(i), None)
        for i, error in watched.failed.items():
            entry = broken.setdefault(str(i), {"first": round(now, 3), "ticks": 0})
            entry["ticks"] = int(entry.get("ticks") or 0) + 1
            entry["error"] = error[:500]
        if broken == rec.broken:
            return
        rec.broken = broken
        for key, entry in broken.items():
            if entry.get("said") or not is_broken(rec, int(key), now):
                continue
            index = int(key)  # said first, marked after: a tick stopped between says it again, never not at all
            label = config.placements[index].label if index < len(config.placements) else key
            records.note_waiting(store, {
                layout.EVENT: layout.CONTROLLER_WAITING, layout.TIME: iso(now), layout.ATTEMPT: None,
                "reason": (f"{label}'s group could not be reached at {entry['ticks']} ticks in a row since "
                           f"{iso(entry['first'])}: it is marked failed and no move goes there until it "
                           f"answers ({entry.get('error')})"),
                "placement": label, "key": f"{key}:broken"})
            entry["said"] = True
            rec.failed_at[key] = round(now, 3)
        records.write(store, rec, version)


class MoveError(RuntimeError):
    """A move asked for cannot be made (the run ended, it is already there); the message says why."""


def move(config: Config, clouds, to: Placement, reason: str, *, store: Store | None = None,
         wait_s: float = 0.0, poll_s: float = 5.0, clock: Callable[[], float] = time.time,
         sleep: Callable[[float], None] = time.sleep) -> TickResult:
    """Move the run to ``to`` now (``ops move``), waiting up to ``wait_s`` for the old lease to expire.

    The same record and steps as a tick's move; raises :class:`MoveError` when the run has ended,
    its deadline has passed or it is already active there, :class:`PreconditionFailed` when a tick moved it meanwhile.
    """
    store = open_store(config.run_uri) if store is None else store
    run = read_run(store)
    if run.ended:
        raise MoveError(f"the run has ended ({run.ended}); nothing to move")
    if not may_launch(run, clock()):
        passed = clock() >= run.deadline  # type: ignore[operator]
        raise MoveError(f"the run's deadline ({iso(run.deadline)}) " + (
            "has passed: the controller's next tick ends the run TIMED_OUT" if passed else
            f"is less than {LAUNCH_MARGIN_S // 60} min away: a machine started now would be stopped by the cap "
            "before it trained") + "; nothing to move")
    rec, version = records.read(store)
    if rec.pending is None:
        if rec.active == to.index:
            raise MoveError(f"the run is already in placement {to.index} ({to.label})")
        rec, version = start_move(config, store, rec, version, to.index, reason, run.step, clock(), failed=False)
    elif rec.pending["to"] != to.index:
        raise MoveError(f"a move to placement {rec.pending['to']} is under way; run this again once it is done")
    deadline = clock() + wait_s
    while True:
        result = finish_move(config, clouds, store, rec, version, clock(), run, clock)
        if result.waiting is None or clock() >= deadline:
            return result
        sleep(min(poll_s, max(0.0, deadline - clock())))
        rec, version = records.read(store)
        if rec.pending is None:
            return TickResult(MOVE, reason, move=rec.moves[-1] if rec.moves else None)
