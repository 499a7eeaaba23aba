"""The tick's price decision: what the stack tells it, what the run's own events say, and where to be.

At a decision point (controller/tick.py: the first launch, a preemption or lost machine, a failed launch,
the end of a move: every tick at which no trainer holds the run's lease; with ``rebalance``, also the tick
right after a commit) the tick prices every placement (:mod:`controller.prices`, the cache in the run
folder), estimates what finishing there would cost (:func:`controller.cost.estimate`), picks one
(:func:`controller.table.choose`) and writes the table (:func:`controller.table.write`).

**What the stack tells it** (:class:`Inputs`): ``controller/decision.json`` in the function's own code
package, written by ``pulumi up`` (components/placement.py's ``decision_document``)::

    {"policy": "cheapest", "rebalance": false, "move_floor_usd": 1.0, "move_fraction": 0.1,
     "steps": 60000, "checkpoint_every_s": 600, "checkpoint_bytes": 1073741824,
     "boot_s": {"aws": 600, "gcp": 600},
     "placements": [{"instance_types", "zones", "gpu", "estimate_per_hour", "restore_per_gb", "writes_per_gb",
                     "max_price_per_hour"[, "machines"]}, ...]}

A file, not the environment: Lambda's variables share 4 KB, which the placements' configuration alone
nearly fills with eight placements (components/aws/controller.py); the price inputs (every type, zone and
machine shape) would not fit beside it. The package is the function's own and read-only: no grant more, and
a ``pulumi up`` that changes a price input redeploys it with the code that reads it. Without the file (a
function deployed before it existed, a test) the controller follows the listed order (``inOrder``).

**What the run says** (:func:`history`), from its ``events.jsonl``: each placement's measured steps per hour
(consecutive ``checkpoint`` events of one attempt, or its ``resumed`` and the ``checkpoint`` after it; not the
commit a spot notice asked for, which ends an interval the stop cut short), its
preemptions (``preempted`` events) and machine-hours (from each ``started`` to the attempt's last event, times
``nodes``), by the ``placement`` label each ``started`` event's ``config`` carries (home's when it says none),
the newest checkpoint's ``bytes``, the newest ``data_staged`` event's ``bytes`` (what a machine stages of the
run's data at each start, controller/cost.py), and each cloud's **replacement boots**: from a ``preempted`` event to the
``resumed`` event (the checkpoint restored, training about to go on) of the next attempt when it is in the same
placement (the group replaced its machine): the relaunch, the boot, the image, the trainer's start and the
restore, all of which a preemption costs. The median of a cloud's boots is its ``boot_p``; a cloud the run has
no such boot in yet takes the stack's prior (``boot_s``: components/pricing.py's ``DECISION_BOOT_S``). Where
capacity was short after the notice, the wait counts too: an upper bound, as a preemption then costs that.

Standard library only but the price APIs' clients (imported where a fetch needs them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controller import cost, table
from controller.config import Config, Placement
from controller.prices import Offer, PriceBook, Quote, offer
from controller.record import epoch_of
from runfolder import layout
from runfolder.events import read_events

INPUTS_FILE = Path(__file__).with_name("decision.json")
# A replacement's boot to its first step, per cloud, until the run has measured one there and the stack says none
# (components/pricing.py's DECISION_BOOT_S, the prior the stack ships, is the same figure).
DEFAULT_BOOT_S = 600.0
# A checkpoint this close before a `preempted` event is the commit the spot notice asked for (history).
NOTICE_COMMIT_S = 60.0
# "Right after a commit" (rebalance): the steps since the newest commit took at most this long.
REBALANCE_WINDOW_S = 180.0
# What a tick may spend asking the price APIs (Lambda's timeout is 60 s; the groups come first).
PRICE_BUDGET_S = 20.0
PRICE_REASON = "for price: "
# A restart is decided again this often while it lasts (AWS's quotes refresh as often): not at every tick.
TABLE_EVERY_S = 600.0


def prices_budget(seconds: float = PRICE_BUDGET_S) -> Callable[[], bool]:
    """The tick's time for asking the price APIs, from now (:func:`controller.prices.time_budget`)."""
    from controller.prices import time_budget

    return time_budget(seconds)


class InputsError(ValueError):
    """The decision inputs are not usable; the message names the key."""


@dataclass(frozen=True)
class Inputs:
    """What the stack tells the controller's price decision (module docstring)."""

    policy: str = table.IN_ORDER
    rebalance: bool = False
    move_floor_usd: float = cost.DEFAULT_MOVE_FLOOR_USD
    move_fraction: float = cost.DEFAULT_MOVE_FRACTION
    steps: int | None = None
    """The run's total steps (``run.steps``): the work left before progress.json says its total."""
    checkpoint_every_s: float | None = None
    checkpoint_bytes: int = 2**30
    """The checkpoint's size before the run has written one (components/storage.py's assumed size)."""
    boot_s: Mapping[str, float] = field(default_factory=lambda: {"aws": DEFAULT_BOOT_S, "gcp": DEFAULT_BOOT_S})
    placements: tuple[Mapping, ...] = ()

    @property
    def cheapest(self) -> bool:
        return self.policy == table.CHEAPEST and bool(self.placements)


def _number(doc: Mapping, key: str, default, *, low: float = 0.0, high: float = math.inf):
    value = doc.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InputsError(f"{INPUTS_FILE.name}: {key}: expected a number from {low} to {high}, got {value!r}")
    return value


def parse_inputs(doc: Mapping, config: Config) -> Inputs:
    """The decision inputs in ``doc`` for ``config``'s placements; :class:`InputsError` names a bad key."""
    if not isinstance(doc, Mapping):
        raise InputsError(f"{INPUTS_FILE.name}: expected a JSON object, got {type(doc).__name__}")
    policy = doc.get("policy", table.CHEAPEST)
    if policy not in table.POLICIES:
        raise InputsError(f"{INPUTS_FILE.name}: policy: expected one of {', '.join(table.POLICIES)}, got {policy!r}")
    rebalance = doc.get("rebalance", False)
    if not isinstance(rebalance, bool):
        raise InputsError(f"{INPUTS_FILE.name}: rebalance: expected true or false, got {rebalance!r}")
    rows = doc.get("placements", [])
    if not isinstance(rows, list) or len(rows) != len(config.placements):
        raise InputsError(f"{INPUTS_FILE.name}: placements: expected one entry per placement "
                          f"({len(config.placements)}), got {rows!r:.200}")
    for p, row in zip(config.placements, rows, strict=True):
        if not isinstance(row, Mapping):
            raise InputsError(f"{INPUTS_FILE.name}: placements[{p.index}]: expected an object, got {row!r:.200}")
        try:
            offer(p.index, p.cloud, p.region, row)
        except ValueError as e:
            raise InputsError(f"{INPUTS_FILE.name}: {e}") from None
    boot = doc.get("boot_s", {})
    if not isinstance(boot, Mapping):
        raise InputsError(f"{INPUTS_FILE.name}: boot_s: expected {{cloud: seconds}}, got {boot!r}")
    boots = {c: float(_number(boot, c, DEFAULT_BOOT_S, high=86400.0)) for c in ("aws", "gcp")}
    steps = _number(doc, "steps", None, low=1)
    return Inputs(policy=policy, rebalance=rebalance,
                  move_floor_usd=float(_number(doc, "move_floor_usd", cost.DEFAULT_MOVE_FLOOR_USD, high=1e6)),
                  move_fraction=float(_number(doc, "move_fraction", cost.DEFAULT_MOVE_FRACTION, high=1.0)),
                  steps=None if steps is None else int(steps),
                  checkpoint_every_s=_number(doc, "checkpoint_every_s", None, low=1),
                  checkpoint_bytes=int(_number(doc, "checkpoint_bytes", 2**30)), boot_s=boots,
                  placements=tuple(dict(r) for r in rows))


def load_inputs(config: Config, path: Path | None = None) -> Inputs:
    """The inputs the stack shipped beside the code (``path``: :data:`INPUTS_FILE`); the listed order (``inOrder``)
    without the file."""
    path = INPUTS_FILE if path is None else path
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Inputs()
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise InputsError(f"{path.name}: not JSON ({e})") from None
    return parse_inputs(doc, config)


@dataclass
class Tally:
    """One placement's history in the run: steps trained over hours measured, preemptions, machine-hours."""

    steps: float = 0.0
    hours: float = 0.0
    preemptions: int = 0
    machine_hours: float = 0.0


@dataclass(frozen=True)
class History:
    """What the run's events say (module docstring), by placement index; the replacement boots by cloud."""

    tallies: Mapping[int, Tally]
    checkpoint_bytes: int | None = None
    checkpoint_interval_s: float | None = None
    boots: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    data_bytes: int | None = None
    """The newest ``data_staged`` event's bytes: what a machine stages of the run's data at each start."""
    """Seconds from a ``preempted`` event to the replacement's ``resumed`` in the same placement, by its cloud."""

    def rate(self, index: int) -> float | None:
        t = self.tallies.get(index)
        return t.steps / t.hours if t is not None and t.hours > 0 and t.steps > 0 else None

    def boot_s(self, cloud: str) -> float | None:
        """The run's measured replacement boot in ``cloud`` (the median of its boots there), None before one."""
        found = sorted(self.boots.get(cloud, ()))
        return found[(len(found) - 1) // 2] if found else None


def history(events: Sequence[Mapping], placements: Sequence[Placement], nodes: int) -> History:
    """The run's history by placement (module docstring) from its events in order."""
    by_label = {p.label: p.index for p in placements}
    tallies: dict[int, Tally] = {}
    where, started, last_t, prev_ckpt = 0, None, None, None
    newest_bytes, data_bytes, gaps = None, None, []
    boots: dict[str, list[float]] = {}
    notice, boot_from = None, None  # (placement, time) of the newest `preempted`; a replacement's boot since
    last_gap = None  # the newest checkpoint's part of the rate: (time, steps, seconds, counted as an interval)

    def close() -> None:
        if started is not None and last_t is not None and last_t > started:
            tallies.setdefault(where, Tally()).machine_hours += nodes * (last_t - started) / 3600

    for e in events:
        kind, t = e.get(layout.EVENT), epoch_of(e.get(layout.TIME))
        if kind == layout.STARTED:
            close()
            label = (e.get("config") or {}).get("placement") if isinstance(e.get("config"), dict) else None
            where, started, last_t, prev_ckpt = by_label.get(label, 0), t, t, None
            # The group's own replacement of a machine it lost to a preemption: its boot runs from the notice.
            boot_from = notice[1] if notice is not None and notice[0] == where else None
            notice = None
            continue
        if t is not None and started is not None:
            last_t = max(last_t or t, t)
        if kind == layout.PREEMPTED:
            tallies.setdefault(where, Tally()).preemptions += 1
            notice = (where, t) if t is not None else None
            if last_gap is not None and t is not None and 0 <= t - last_gap[0] <= NOTICE_COMMIT_S:
                # The commit the notice asked for ends an interval the stop cut short: neither its rate nor its length
                # is the training's cadence.
                tally = tallies[where]
                tally.steps -= last_gap[1]
                tally.hours -= last_gap[2] / 3600
                if last_gap[3]:
                    gaps.pop()
            last_gap = None
        elif kind == layout.RESUMED and isinstance(e.get("step"), int) and t is not None:
            # The checkpoint restored: training goes on from its step now (the rate counts from here), and the
            # replacement's boot, from its predecessor's notice to its first step, is over.
            if prev_ckpt is None:
                prev_ckpt = (e["step"], t, False)  # not a commit: no checkpoint interval counts from it
            if boot_from is not None and t > boot_from and where < len(placements):
                boots.setdefault(placements[where].cloud, []).append(t - boot_from)
            boot_from = None
        elif kind == layout.DATA_STAGED and isinstance(e.get("bytes"), int) and e["bytes"] >= 0:
            data_bytes = e["bytes"]
        elif kind == layout.CHECKPOINT and isinstance(e.get("step"), int) and t is not None:
            if isinstance(e.get("bytes"), int) and e["bytes"] > 0:
                newest_bytes = e["bytes"]
            last_gap = None
            if prev_ckpt is not None and e["step"] > prev_ckpt[0] and t > prev_ckpt[1]:
                tally = tallies.setdefault(where, Tally())
                tally.steps += e["step"] - prev_ckpt[0]
                tally.hours += (t - prev_ckpt[1]) / 3600
                if prev_ckpt[2]:
                    gaps.append(t - prev_ckpt[1])
                last_gap = (t, e["step"] - prev_ckpt[0], t - prev_ckpt[1], prev_ckpt[2])
            prev_ckpt = (e["step"], t, True)
    close()
    interval = sorted(gaps)[len(gaps) // 2] if gaps else None
    return History(tallies, newest_bytes, interval, {c: tuple(v) for c, v in boots.items()}, data_bytes)


def boot_for(hist: History, inputs: Inputs, cloud: str) -> tuple[float, str]:
    """(seconds, where they come from) of a replacement's boot in ``cloud``: the run's own (``measured``, the median
    of its boots there), else the stack's prior (``prior``)."""
    measured = hist.boot_s(cloud)
    if measured is not None:
        return measured, "measured"
    return float(inputs.boot_s.get(cloud, DEFAULT_BOOT_S)), "prior"


@dataclass(frozen=True)
class Verdict:
    """The price decision of one tick: where the run should be, the table written, and what a move's reason says."""

    to: int | None
    reason: str
    doc: dict
    cost_from: float | None = None
    cost_to: float | None = None


def price_tables(config: Config, inputs: Inputs, store, quotes: Sequence[Quote], *, active: int, now: float,
                 allowed: Mapping[int, str], committed: int | None, progress_step: int | None,
                 total: int | None, deadline: float | None, running_active: bool, booted_s: float | None,
                 restart: bool, first: bool = False) -> Verdict:
    """Estimate every placement, choose one, and the table as written (not written here).

    ``allowed``: each placement the waiting rules refuse now, with why (``controller.decide``); ``restart``: a
    training machine would be stopped (rebalance), so the saving must also cover :func:`cost.restart_cost`; ``first``:
    the run's first launch (no placement is active: no move threshold, :func:`controller.table.choose`)."""
    events = read_events(store)
    hist = history(events, config.placements, config.nodes)
    gpus = [row.get("gpu") for row in inputs.placements]
    measured: dict[str, float] = {}
    for p in config.placements:
        r = hist.rate(p.index)
        if r is not None and gpus[p.index]:
            measured[gpus[p.index]] = max(measured.get(gpus[p.index], 0.0), r)
    total = total or inputs.steps
    remaining = max(0, (total or 0) - (committed or 0))
    interval = inputs.checkpoint_every_s or hist.checkpoint_interval_s or 1800.0
    run = cost.RunFacts(nodes=config.nodes, remaining_steps=remaining, checkpoint_interval_s=interval,
                        checkpoint_bytes=hist.checkpoint_bytes or inputs.checkpoint_bytes, measured_rates=measured,
                        now=now, deadline=deadline, data_bytes=hist.data_bytes or 0)
    estimates, boots = [], []
    for p, row, q in zip(config.placements, inputs.placements, quotes, strict=True):
        tally = hist.tallies.get(p.index, Tally())
        boot, source = boot_for(hist, inputs, p.cloud)
        boots.append((round(boot, 1), source))
        left = None
        if p.index == active and booted_s is not None:  # its replacement's boot so far is a cost already paid
            left = max(0.0, boot - booted_s)
        facts = cost.PlacementFacts(
            index=p.index, price=q.price, gpu=row.get("gpu"), preemptions=tally.preemptions,
            machine_hours=tally.machine_hours, boot_s=boot, boot_left_s=left, restore_per_gb=row.get("restore_per_gb"),
            writes_per_gb=row.get("writes_per_gb"), max_price=row.get("max_price_per_hour"),
            allowed=p.index not in allowed, not_allowed=allowed.get(p.index, ""),
            running=p.index == active and running_active)
        estimates.append(cost.estimate(run, facts))
    restart_usd = 0.0
    labels = table.labels([(p.cloud, p.region, p.project) for p in config.placements])
    if restart:
        current = estimates[active]
        rate_from = current.rate or hist.rate(active)
        steps_since = max(0, (progress_step or 0) - (committed or 0))
        if not rate_from or committed is None or steps_since * 3600 / rate_from > REBALANCE_WINDOW_S:
            why = (f"a machine trains and its last commit is more than {REBALANCE_WINDOW_S:.0f} s of steps behind: "
                   "a rebalance waits for the next commit")
            stay = table.Choice(active, why)
            doc = table.document(table.rows(labels, quotes, estimates, now=now, boots=boots), stay, now=now, active=active,
                                 policy=table.CHEAPEST)
            return Verdict(active, why, doc, current.cost, current.cost)
        best = min((e for e in estimates if e.feasible), key=cost.rank_key, default=None)
        price_to = quotes[best.index].price if best is not None else None
        if rate_from and price_to is not None and quotes[active].price is not None:
            restart_usd = cost.restart_cost(nodes=config.nodes, price_to=price_to,
                                            boot_s=boot_for(hist, inputs, config.placements[best.index].cloud)[0],
                                            price_from=quotes[active].price, steps_since_commit=steps_since,
                                            rate_from=rate_from)
    choice = table.choose(estimates, active=active, policy=table.CHEAPEST, floor_usd=inputs.move_floor_usd,
                          fraction=inputs.move_fraction, restart_usd=restart_usd, first=first)
    doc = table.document(table.rows(labels, quotes, estimates, now=now, boots=boots), choice, now=now,
                         active=None if first else active, policy=table.CHEAPEST)
    doc["move"] = {"floor_usd": inputs.move_floor_usd, "fraction": inputs.move_fraction,
                   "restart_usd": round(restart_usd, 4)}
    by = {e.index: e for e in estimates}
    return Verdict(choice.index, choice.reason, doc, by[active].cost,
                   by[choice.index].cost if choice.index is not None else None)


def quotes(config: Config, inputs: Inputs, store, *, now: float,
           fetch: Callable[[Offer], Quote] | None, out_of_time: Callable[[], bool]) -> tuple[list[Quote], str]:
    """Each placement's quote for a decision: the cache refreshed where due (``fetch``; None: the cache as it is),
    a stale one unknown, the stack's price table standing in when none is live; and a note of what failed."""
    offers = [offer(p.index, p.cloud, p.region, row, nodes=config.nodes)
              for p, row in zip(config.placements, inputs.placements, strict=True)]
    book = PriceBook.open(store)
    note = ""
    if fetch is not None:
        try:
            book.update(offers, now=now, fetch=fetch, out_of_time=out_of_time)
        except Exception as e:  # noqa: BLE001 - a cache that cannot be written: the quotes read stand
            note = f"the price cache could not be written: {e}"[:300]
    estimates = {i: row.get("estimate_per_hour") for i, row in enumerate(inputs.placements)}
    return book.for_decision(offers, now=now, estimates=estimates), note
