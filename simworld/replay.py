"""Replay a price trace through the controller's own tick and decision: ``python -m controller.replay TRACE.jsonl``.

A user choosing the move threshold replays their own price history: the simulated world (:mod:`simworld.world`)
runs the stack's run once per policy (``cheapest``, ``inOrder``), its prices, capacity and preemptions driven by the
trace, every other fault of the tests' schedules off; the controller's :func:`controller.tick.tick` decides, each
virtual minute, as it does in the account. The format (docs/placements.md, "Replay a price history") is JSON lines:

- the first line, the run: ``{"stack": "stacks/Pulumi.regions.yaml", "steps": 60000,
  "steps_per_hour": {"0": 20000, "1": 18000}, "checkpoint_gib": 2.0}`` and, optionally, ``"max_runtime_hours"``
  (the stack's ``compute.maxRuntimeHours`` for this replay). The stack file gives the placements, ``nodes``,
  ``placement.waitMinutes``, the move threshold and each placement's price inputs, loaded by the project's
  settings loader and made into the controller's inputs as ``pulumi up`` makes them
  (components/pricing.py's ``decision_document``); ``steps_per_hour`` names every placement;
- then events in time order, ``t`` in seconds from the run's start, each about one ``placement``:
  ``{"t": 3600, "placement": 1, "price": 0.31}`` (the spot price from then on, USD per machine-hour; ``null``: the
  price API stops answering for it, so the cached price ages until it counts as unknown; a number later answers
  again), ``{"t": 7200, "placement": 0, "capacity": false}`` (no launch succeeds there; ``true``: capacity is back),
  ``{"t": 9000, "placement": 0, "preempt": true}`` (each machine there gets its spot notice).

Before a placement's first price event its price is the price table's estimate (the decision inputs'
``estimate_per_hour``). A machine is billed the spot price from the moment it is up to the moment it is gone; each
attempt that resumes elsewhere than home reads the checkpoint (``restore_per_gb``), and each commit away from home
writes it home (``writes_per_gb``). The output, one JSON object per policy, last:
``{"policy", "cost_usd", "hours", "moves", "goodput", "finished", "placement"}`` (``placement``: where the run
ended). The same trace prints the same bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from controller import choice as choices
from controller.config import parse
from controller.prices import PriceError, Quote
from runfolder import goodput as goodputs
from runfolder import layout
from simworld import world

ROOT = Path(__file__).resolve().parents[1]
EXIT_BAD_TRACE = 2
EXIT_VIOLATION = 1
# The replayed world's own delays, fixed (the tests' schedules draw them): a boot of 3 min after a launch of 1-4.
BOOT_S = 180.0
# After the run's end marker, a few more minutes (the groups put to 0), then the replay stops.
AFTER_END_S = 300.0
# Access entries for a placement on the other cloud: the replay reaches no cloud, the controller's config wants them.
_ACCESS = {"aws": {"aws_role_arn": "arn:aws:iam::123456789012:role/replay", "audience": "replay"},
           "gcp": {"gcp_audience": "//iam.googleapis.com/projects/123456789/locations/global/workloadIdentityPools/"
                                   "replay/providers/replay",
                   "service_account": "replay-sa@replay.iam.gserviceaccount.com"}}
_EVENT_KINDS = ("price", "capacity", "preempt")


class TraceError(ValueError):
    """A trace line is not usable; the message names the line and the key."""


@dataclass(frozen=True)
class Trace:
    """A parsed trace: the run (the first line) and its events."""

    stack: Path
    steps: int
    steps_per_hour: Mapping[int, float]
    checkpoint_bytes: int
    max_runtime_hours: float | None
    events: tuple[Mapping, ...] = field(default_factory=tuple)


def _number(value, where: str, *, low: float = 0.0, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or (
            value <= low if strict else value < low):
        raise TraceError(f"{where}: expected a number {'above' if strict else 'of at least'} {low}, got {value!r}")
    return float(value)


def _read_event(where: str, doc: dict, per_hour: dict, last: float) -> dict:
    """One event line after the run's (``last``: the time of the line above)."""
    for key in doc:
        if key not in ("t", "placement", *_EVENT_KINDS):
            raise TraceError(f"{where}: {key}: not a key of an event (expected t, placement and one of "
                             f"{', '.join(_EVENT_KINDS)})")
    for key in ("t", "placement"):
        if key not in doc:
            raise TraceError(f"{where}: {key}: missing")
    t = _number(doc["t"], f"{where}: t")
    if t < last:
        raise TraceError(f"{where}: t: {doc['t']} comes before the line above ({last:g}): events go in time order")
    index = doc["placement"]
    if isinstance(index, bool) or not isinstance(index, int) or index not in per_hour:
        raise TraceError(f"{where}: placement: expected one of {sorted(per_hour)} (steps_per_hour's), "
                         f"got {index!r}")
    kinds = [k for k in _EVENT_KINDS if k in doc]
    if len(kinds) != 1:
        raise TraceError(f"{where}: {'/'.join(kinds) or 'price'}: expected exactly one of "
                         f"{', '.join(_EVENT_KINDS)}")
    kind = kinds[0]
    value = doc[kind]
    if kind == "price" and value is not None:
        _number(value, f"{where}: price", strict=True)
    elif kind == "capacity" and not isinstance(value, bool):
        raise TraceError(f"{where}: capacity: expected true or false, got {value!r}")
    elif kind == "preempt" and value is not True:
        raise TraceError(f"{where}: preempt: expected true, got {value!r}")
    return {"t": t, "placement": index, kind: value}


def read_trace(path: Path) -> Trace:
    """The trace in ``path``; :class:`TraceError` names the first bad line and key."""
    lines = path.read_text().splitlines()
    docs = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError as e:
            raise TraceError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(doc, dict):
            raise TraceError(f"{path}:{n}: expected a JSON object, got {doc!r:.80}")
        docs.append((n, doc))
    if not docs:
        raise TraceError(f"{path}: empty; the first line is the run: {{\"stack\", \"steps\", \"steps_per_hour\", "
                         "\"checkpoint_gib\"}")
    n, head = docs[0]
    where = f"{path}:{n}"
    known = {"stack", "steps", "steps_per_hour", "checkpoint_gib", "max_runtime_hours"}
    for key in head:
        if key not in known:
            raise TraceError(f"{where}: {key}: not a key of the run's line (expected {', '.join(sorted(known))})")
    for key in ("stack", "steps", "steps_per_hour", "checkpoint_gib"):
        if key not in head:
            raise TraceError(f"{where}: {key}: missing from the run's line")
    if not isinstance(head["stack"], str):
        raise TraceError(f"{where}: stack: expected a stack file's path, got {head['stack']!r}")
    stack = Path(head["stack"])
    # Relative to where the command runs, else to the trace's folder, else to the project (the examples' way).
    for base in (path.parent, ROOT):
        if not stack.is_absolute() and not stack.exists() and (base / stack).exists():
            stack = base / stack
    if not stack.exists():
        raise TraceError(f"{where}: stack: no such file {head['stack']!r}")
    steps = head["steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise TraceError(f"{where}: steps: expected a whole number of at least 1, got {steps!r}")
    rates = head["steps_per_hour"]
    if not isinstance(rates, dict) or not rates:
        raise TraceError(f"{where}: steps_per_hour: expected {{\"0\": steps, ...}} per placement, got {rates!r}")
    per_hour = {}
    for key, value in rates.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise TraceError(f"{where}: steps_per_hour.{key}: expected a placement's index")
        per_hour[int(key)] = _number(value, f"{where}: steps_per_hour.{key}", low=60.0)
    gib = _number(head["checkpoint_gib"], f"{where}: checkpoint_gib", strict=True)
    runtime = head.get("max_runtime_hours")
    if runtime is not None:
        runtime = _number(runtime, f"{where}: max_runtime_hours", strict=True)
    events, last = [], 0.0
    for n, doc in docs[1:]:
        event = _read_event(f"{path}:{n}", doc, per_hour, last)
        last = event["t"]
        events.append({**event, "line": n})
    return Trace(stack, steps, per_hour, round(gib * 2**30), runtime, tuple(events))


def stack_inputs(trace: Trace, run_uri: str) -> tuple[dict, dict, int]:
    """The controller's configuration and decision inputs for the trace's stack, as ``pulumi up`` makes them, and
    the run's cap in seconds. A bad stack raises the settings loader's error (one line naming the key)."""
    from components import placement, pricing
    from components import settings as config

    try:
        raw = config.raw_from_config(config.read_stack_file(trace.stack))
        if trace.max_runtime_hours is not None:
            raw["compute"] = {**(raw.get("compute") or {}), "maxRuntimeHours": trace.max_runtime_hours}
        settings = config.load_settings(raw, stack=config.stack_name_of(trace.stack))
    except ValueError as e:  # the settings loader's ConfigError: one line naming the key
        raise TraceError(f"stack {trace.stack}: {e}") from None
    n = len(settings.placement_list)
    missing = sorted(set(range(n)) - set(trace.steps_per_hour))
    extra = sorted(set(trace.steps_per_hour) - set(range(n)))
    if missing or extra:
        raise TraceError(f"steps_per_hour: the stack has placements 0..{n - 1}; "
                         f"{'missing ' + str(missing) if missing else 'no placement ' + str(extra)}")
    access = {i: _ACCESS[p.cloud] for i, p in enumerate(settings.placement_list) if p.cloud != settings.cloud}
    conf = placement.controller_config(settings, run_uri, [f"group-{i}" for i in range(n)], access)
    doc = pricing.decision_document(settings)
    doc.update(steps=trace.steps, checkpoint_bytes=trace.checkpoint_bytes)
    return conf, doc, conf["max_runtime_s"]


class Replay(world.Sim):
    """The simulated world driven by a trace: its prices, capacity and preemptions; no other fault."""

    def __init__(self, trace: Trace, policy: str) -> None:
        self._replaying = True
        super().__init__(0)  # a seeded world, then everything the trace and the stack say replaces it
        conf, doc, cap_s = stack_inputs(trace, self.store.uri)
        self.trace_run = trace
        self.config = parse(conf)
        n = self.nplacements = len(self.config.placements)
        self.nodes, self.wait_minutes, self.cap_s = self.config.nodes, self.config.wait_minutes, cap_s
        self.clouds = [p.cloud for p in self.config.placements]
        self.phung = self.p503 = self.pwrite = self.pcloud = self.pslow = self.pcut = self.pscale_fail = 0.0
        self.retries, self.gap, self.store_down, self.cap_late = True, None, [], 0.0
        self.stage_s = self.export_s = 0.0
        self.boot_s = (BOOT_S, BOOT_S)
        self.target_steps = trace.steps
        self.commit_every = float(doc["checkpoint_every_s"] or 600)
        self.checkpoint_bytes = trace.checkpoint_bytes
        self.groups = [world.Group(i, self.clouds[i]) for i in range(n)]
        self.refused_ticks = [[] for _ in range(n)]
        self.broken = [None] * n
        self.cap_at = world.START + self.cap_s
        self.end = world.START + self.cap_s + 40 * 60
        self.policy = policy
        doc["policy"] = policy
        if policy != choices.table.CHEAPEST:  # as `pulumi up` makes them (components/common.py's group_size): with
            self.groups[0].desired = self.nodes  # cheapest every group starts at 0 and the first tick launches
        self.inputs = choices.parse_inputs(doc, self.config)
        self.rebalance = self.inputs.rebalance
        self.rows = doc["placements"]
        # Prices, capacity, the price API's silences, from the trace.
        self.prices = [[(world.START - 3600, float(r["estimate_per_hour"] or 0.0))] for r in self.rows]
        self.silent: list[list[tuple[float, float]]] = [[] for _ in range(n)]
        self.outages = [[] for _ in range(n)]
        down: dict[int, float] = {}
        quiet: dict[int, float] = {}
        for e in trace.events:
            i, t = e["placement"], world.START + e["t"]
            if "price" in e:
                if e["price"] is None:
                    quiet.setdefault(i, t)
                else:
                    self.prices[i].append((t, float(e["price"])))
                    if i in quiet:
                        self.silent[i].append((quiet.pop(i), t))
            elif "capacity" in e:
                if not e["capacity"]:
                    down.setdefault(i, t)
                elif i in down:
                    self.outages[i].append((down.pop(i), t, "capacity"))
        for i, t in down.items():
            self.outages[i].append((t, math.inf, "capacity"))
        for i, t in quiet.items():
            self.silent[i].append((t, math.inf))
        self.pprice_fail, self.price_down, self.price_moves, self.last_table = 0.0, None, 0, None
        self.started_once = False

    def price_world(self) -> None:
        if not getattr(self, "_replaying", False):
            super().price_world()

    def price_fetch(self):
        def fetch(offer) -> Quote:
            if any(a <= self.now < b for a, b in self.silent[offer.index]):
                raise PriceError(f"placement {offer.index}: the price API does not answer (the trace says so)")
            return Quote(price=self.price_at(offer.index, self.now), source=self.clouds[offer.index], as_of=self.now)

        return fetch

    def plan_preemption(self, m: world.Machine) -> None:
        pass  # the trace's preempt events alone take machines

    def begin_attempt(self, m: world.Machine) -> None:
        if self.started_once:
            self.attempt += 1
        self.started_once = True

    def resumed(self, m: world.Machine, step: int) -> None:
        if step > 0:  # as the trainer says it restored a checkpoint (goodput counts what was lost from it)
            self.event(layout.RESUMED, step=step)

    def _machine_step(self, m: world.Machine) -> None:
        if not m.noticed:  # a machine with its spot notice has committed and stopped: it starts no trainer again
            super()._machine_step(m)

    def fail(self, number: int, what: str) -> None:
        raise world.Violation(f"{self.policy}: invariant {number} at t={self.now - world.START:.0f} s: {what}")

    def steps_per_min(self, index: int) -> int:
        return max(1, round(self.trace_run.steps_per_hour[index] / 60))

    def preempt(self, index: int) -> None:
        for m in list(self.groups[index].machines):
            self.spot_notice(m)

    def replay(self) -> dict:
        """Run the trace to the run's end (or its cap) and say what it cost."""
        self.at(world.START + 1, self.next_tick)
        for g in self.groups:
            self.at(world.START, self.group_step, g)
        self.at(self.cap_at, self.cap_action)
        for e in self.trace_run.events:
            if "preempt" in e:
                self.at(world.START + e["t"], self.preempt, e["placement"])
        while self.now < self.end and not (self.ended_at is not None and self.now >= self.ended_at + AFTER_END_S):
            self.run_until(self.now + 600)
        return self.result()

    def result(self) -> dict:
        self.quiet = True
        ended = self.ended_at if self.ended_at is not None else self.now
        cost = 0.0
        for m in self.machines:
            a, b = m.up_at, m.gone_at if m.gone_at is not None else self.now
            cuts = [t for t, _ in self.prices[m.group.index] if a < t < b]
            for x, y in zip([a, *cuts], [*cuts, b], strict=True):
                cost += self.price_at(m.group.index, x) * (y - x) / 3600
        events = self.trainer_events()
        gb = self.checkpoint_bytes / 1e9  # transfer prices are per GB (controller/cost.py)
        where, committed = 0, False
        for e in events:
            kind = e.get(layout.EVENT)
            if kind == layout.STARTED:
                where = self.index_of(e)
                if committed:
                    cost += float(self.rows[where]["restore_per_gb"] or 0.0) * gb
            elif kind == layout.CHECKPOINT:
                committed = True
                cost += float(self.rows[where]["writes_per_gb"] or 0.0) * gb
        marker = self.any_marker()
        first_boot = None if self.deadline() is None else self.deadline() - self.cap_s  # as the deadline was written
        found = goodputs.goodput(events, now=self.now, end=ended if marker else None, first_boot=first_boot,
                                 completed=marker == layout.COMPLETE)
        share = None if found is None or found.share is None else round(found.share, 4)
        return {"policy": self.policy, "cost_usd": round(cost, 4), "hours": round((ended - world.START) / 3600, 4),
                "moves": len(self.record().moves), "goodput": share, "finished": marker == layout.COMPLETE,
                "placement": self.record().active}

    def trainer_events(self) -> list[dict]:
        data = self.store.peek(layout.EVENTS_KEY) or b""
        out = []
        for line in data.decode().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def index_of(self, started: Mapping) -> int:
        label = (started.get("config") or {}).get("placement")
        return next((p.index for p in self.config.placements if p.label == label), 0)


def replay(trace: Trace, policy: str) -> dict:
    """One policy's run over the trace (:class:`Replay`)."""
    return Replay(trace, policy).replay()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m controller.replay", description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path, help="the trace (JSON lines: the run, then events in time order)")
    p.add_argument("--policy", choices=choices.table.POLICIES, action="append",
                   help="replay this policy only (repeatable; default: cheapest, then inOrder)")
    args = p.parse_args(argv)
    policies = args.policy or [choices.table.CHEAPEST, choices.table.IN_ORDER]
    try:
        trace = read_trace(args.trace)
        out = [replay(trace, policy) for policy in policies]
    except (TraceError, OSError, ValueError) as e:
        print(f"controller.replay: {e}", file=sys.stderr)
        return EXIT_BAD_TRACE
    except world.Violation as e:
        print(f"controller.replay: the controller broke an invariant of the simulated world: {e}", file=sys.stderr)
        return EXIT_VIOLATION
    for doc in out:
        print(json.dumps(doc, sort_keys=False))
    return 0
