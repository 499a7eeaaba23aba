"""What a run's machines have cost: machine time from the run's events x nodes x price per machine-hour.

Each attempt starts at its `started` event and lasts until the last thing heard from it: its
own last event, or a machine's event (spot notice, finish) before the next attempt starts.
An attempt killed without a word (a preemption the trainer could not report, a crash) still
counts up to its last event; the run's newest attempt, while the run has not ended and
nothing has ended that attempt (preempted, failed, cancelled, a spot notice, the machine's
finish), counts up to now. Nodes come from the attempt's `started` event (`workers`), the price from its config
(`price_per_hour`, set by the stack from its price table; `price_note` says what it is, e.g.
a spot estimate and the table's date), the placement from its config too (`placement`, '<cloud>
<region>', set by the stack), so a run that moved between placements shows each one's share. The time a machine spends booting and pulling the image
before the trainer starts is not in the events, so the figure is a little under the bill.

Standard library only: the trainer's container imports it to record the total in COMPLETE,
and `ops status` / `ops runs` to show the cost so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runfolder import layout
from runfolder.events import parse_time

# Events after which an attempt's machine is going or gone: it is not counted up to now.
_ENDS_ATTEMPT = frozenset({layout.PREEMPTED, layout.FAILED_EVENT, layout.CANCELLED_EVENT, layout.SPOT_NOTICE,
                           layout.MACHINE_FINISH, layout.MACHINE_STALLED})
# Events in the run's logs that no machine of the attempt before them wrote: placement.jsonl's moves, the
# controller's word that the run cannot train anywhere now (written while no machine trains), and a Job's next
# pod's `pod` event (written as it starts, before its trainer: the time it waited is no attempt's).
_NOT_A_MACHINE = frozenset({layout.MOVED, layout.CONTROLLER_WAITING, layout.POD_STARTED})


@dataclass(frozen=True)
class Span:
    """One attempt's machine time."""

    attempt: int | None
    start: float
    end: float
    nodes: int
    price_per_hour: float | None
    open: bool = False
    """Still running: the end is `now`."""
    placement: str | None = None
    """Where the attempt ran ('<cloud> <region>'), when its config says."""

    @property
    def machine_hours(self) -> float:
        """Hours x nodes."""
        return max(0.0, self.end - self.start) / 3600.0 * self.nodes

    @property
    def cost(self) -> float | None:
        """Machine-hours x price, or None when this attempt was started without a price."""
        return None if self.price_per_hour is None else self.machine_hours * self.price_per_hour


@dataclass(frozen=True)
class PlacementCost:
    """One placement's share of a run: its attempts' machine time and cost."""

    placement: str
    attempts: int
    machine_hours: float
    cost_usd: float | None
    """None when none of its attempts carries a price; a partial sum when only some do."""

    def to_json(self) -> dict:
        return {"placement": self.placement, "attempts": self.attempts, "machine_hours": round(self.machine_hours, 4),
                "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 2)}


@dataclass(frozen=True)
class RunCost:
    """A run's machine time and cost so far (or in total, once it has ended)."""

    machine_hours: float
    cost_usd: float | None
    """None when no attempt carries a price; a partial sum when only some do (see `unpriced`)."""
    price_note: str
    attempts: int
    unpriced: int = 0
    """Attempts started without a price (their time is in machine_hours, not in cost_usd)."""
    running: bool = False
    placements: tuple[PlacementCost, ...] = ()
    """Each placement's share, in the order the run first used them; empty when no attempt says where
    it ran. Attempts that do not say are left out of it (their time is in the totals)."""

    def to_json(self) -> dict:
        """The fields COMPLETE and `ops status --json` record."""
        out = {"machine_hours": round(self.machine_hours, 4),
               "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 2),
               "cost_note": self.price_note}
        if self.placements:
            out["placements"] = [p.to_json() for p in self.placements]
        return out


def event_time(ev: dict) -> float | None:
    """An event's time in epoch seconds; None where it has none that parses."""
    try:
        return parse_time(ev[layout.TIME])
    except (KeyError, TypeError, ValueError):
        return None


def _positive(value, kind):
    """`value` when it is a positive, finite number of `kind`; None for anything else a damaged event holds
    (an integer no float holds would raise where the cost is multiplied out)."""
    if not isinstance(value, kind) or isinstance(value, bool):
        return None
    try:
        return value if 0 < float(value) < math.inf else None
    except OverflowError:
        return None


def spans(events: list[dict], *, now: float | None = None, end: float | None = None) -> list[Span]:
    """Every attempt's machine time, from the run's events (the trainer's and the machines', any order).

    `end`: when the run ended (its end marker's time), if known; `now`: the time to count the
    newest attempt up to while the run has not ended (None: up to its last event).
    """
    timed = sorted(((t, i, e) for i, e in enumerate(events) if (t := event_time(e)) is not None), key=lambda x: x[:2])
    starts = [k for k, (_t, _i, e) in enumerate(timed) if e.get(layout.EVENT) == layout.STARTED]
    out = []
    for n, k in enumerate(starts):
        t0, _i, ev = timed[k]
        last = n == len(starts) - 1
        stop = len(timed) if last else starts[n + 1]
        # A move or a `waiting` is the controller's, written while no machine of the run trains: it ends no
        # attempt's time.
        t1 = max(t for t, _i, e in timed[k:stop] if e is ev or e.get(layout.EVENT) not in _NOT_A_MACHINE)
        ended = any(e.get(layout.EVENT) in _ENDS_ATTEMPT for _t, _i, e in timed[k:stop])
        is_open = False
        if last and end is not None:
            t1 = max(t1, end)
        elif last and now is not None and not ended:
            t1, is_open = max(t1, now), True
        cfg = ev.get("config") if isinstance(ev.get("config"), dict) else {}
        price = _positive(cfg.get("price_per_hour"), int | float)
        where = cfg.get("placement")
        out.append(Span(attempt=ev.get(layout.ATTEMPT), start=t0, end=t1, nodes=_positive(ev.get("workers"), int) or 1,
                        price_per_hour=None if price is None else float(price), open=is_open,
                        placement=where if isinstance(where, str) and where.strip() else None))
    return out


def by_placement(found: list[Span]) -> tuple[PlacementCost, ...]:
    """The spans' machine time and cost per placement, in the order of each one's first attempt."""
    groups: dict[str, list[Span]] = {}
    for s in found:
        if s.placement is not None:
            groups.setdefault(s.placement, []).append(s)
    out = []
    for where, group in groups.items():
        priced = [s.cost for s in group if s.cost is not None]
        out.append(PlacementCost(placement=where, attempts=len(group), machine_hours=sum(s.machine_hours for s in group),
                                 cost_usd=sum(priced) if priced else None))
    return tuple(out)


def run_cost(events: list[dict], *, now: float | None = None, end: float | None = None) -> RunCost | None:
    """The run's machine-hours and cost (see `spans`); None before any attempt started."""
    found = spans(events, now=now, end=end)
    if not found:
        return None
    priced = [s.cost for s in found if s.cost is not None]
    note = ""
    for ev in reversed(events):
        if ev.get(layout.EVENT) == layout.STARTED and isinstance(ev.get("config"), dict):
            note = str(ev["config"].get("price_note") or "")
            if note:
                break
    return RunCost(machine_hours=sum(s.machine_hours for s in found), cost_usd=sum(priced) if priced else None,
                   price_note=note, attempts=len(found), unpriced=len(found) - len(priced),
                   running=any(s.open for s in found), placements=by_placement(found))
