"""A deterministic simulation of the placement controller's world: ticks, moves, machines, leases, the cap.

The project's own code makes every decision: :func:`controller.tick.tick` and
:func:`controller.tick.move` (with :mod:`controller.decide` and :mod:`controller.record`),
:class:`runfolder.lease.RunLease`, :class:`trainer.checkpoint_store.CheckpointStore`'s commit protocol
(upload, verify, fence, marker, prune) and :mod:`runfolder.layout`'s names and end markers. Around
it, stand-ins run on a virtual clock, driven by one seeded random generator:

- **the store** (:class:`SimStore`): a versioned object store with conditional writes. Faults, per
  operation: ``503`` (the store's own retries gave up: :class:`Unavailable`), a conditional write
  refused as in flight (``WriteConflict``, nothing written), a conditional write whose answer was
  lost (written, and the caller told ``PreconditionFailed``, as its retry would be), and *slow*:
  an operation of a tick or of ``ops move`` that pauses while the rest of the world goes on (the
  event loop runs nested up to the pause's end, then the operation runs). That is how a tick's
  reads and writes interleave with other ticks, moves and machines.
- **the groups** (:class:`Group`): an Auto Scaling group / managed instance group, sized as
  ``controller.clouds`` and ``finish.sh`` size it (min = max = desired, so one number here); a
  launch takes 1-4 min and the machine boots in 0.5-2 min more; while the placement has no capacity each try fails, recorded as the
  cloud words it (capacity, quota, price, other) and retried with backoff (1, 2, 4, 5 min); a
  success clears the failures; a group above desired terminates its newest machines. The
  scheduled cap action puts every group's min, max and desired to 0 at deploy + the cap. In some
  schedules one placement's group API refuses every call of the controller and ``ops move`` for a
  while or for good (a refused credential, a deleted group's API): the group itself goes on.
- **the machines** (:class:`Machine`), as the supervisor and trainer behave: the first boot writes
  the ``deadline`` file (unless there is one); each minute a machine looks for an end marker
  (then finishes: its group to zero, shut down) and for its deadline (then finishes ``TIMED_OUT``,
  as ``finish.sh`` writes it); the chief (the group's oldest machine, once ``nodes`` machines are
  up) takes the lease (``RunLease``, no waiting: it looks again next minute), resumes from the
  newest committed step, trains ``STEPS_PER_MIN`` steps a minute, writes ``progress.json``,
  commits every few minutes (``CheckpointStore.commit``, fenced by the lease), renews the lease
  every ``ttl / 4``, obeys ``STOP`` (commit, ``CANCELLED``) and writes ``COMPLETE`` at its last
  step. A spot notice (2 min on AWS, 30 s on GCP) makes the chief commit and release the lease;
  a hard kill leaves the lease to expire (a machine is taken about once an hour, and about half of a
  placement's machines get their notice when its capacity goes). A peer lost stops the chief's
  training until the group has ``nodes`` machines again. Each placement's cloud (AWS or GCP) is
  drawn per schedule, for its notice. The silences that are no hang: in some schedules boots take
  5-15 min, a chief stages for up to 20 min after it takes the lease (once a machine), and the export
  after the last step takes up to 30 min (progress.json says step = total). In a quarter of the schedules
  (2.5-3 hours long) 10 % of machines hang: a bootstrap that never ends (up, never a peer) or a trainer that hangs (it keeps
  the lease, renewed by its own thread, and never progresses; its peers with it); spot takes a hung
  machine back only once in four hours. The groups report no launch time (as a managed instance
  group does): the controller counts from when it first saw a machine.
- **the scheduler**: a tick each minute (a few seconds late at random); a tick that raises is
  retried 1 and 2 minutes later (Lambda's asynchronous retries; per schedule, on or off); some
  ticks are slow (overlapping the next ones and ``ops move``); in some schedules it misses 30-45 min
  of ticks. The store goes down for 2-10 min in some; ``finish.sh``'s scale-down fails in some (half
  or all of the time); the cap action comes 5 min late or not at all in some; a started event is
  followed by a line cut short in some.
- **the prices** (:meth:`Sim.price_world`, a generator of their own): each placement's spot price steps every
  20-90 min by 0.7-1.4 times; the price API fails per fetch (0, 10 or 50 %) and in some schedules is down for
  30 min to 2 hours (every cached price goes stale); what the stack tells the controller (``controller/choice.py``'s
  inputs): ``cheapest`` in four schedules of five (``inOrder`` else), ``rebalance`` in a quarter, a move threshold
  of 0-0.2 USD and 5-30 %, the price table's list price. The machines write the events the controller measures
  the run by: ``started`` (with its placement), ``checkpoint`` (step, bytes), ``preempted``.
- **the operator**: ``ops move`` to a random placement and ``ops stop`` at random times, and the
  active group put to 0 from outside the controller (by hand, or a machine's finish path whose end
  marker could not be written: ``finish.sh`` scales the group down all the same).

Invariants, checked after every event (:meth:`Sim.check`) and at the end (:meth:`Sim.finish`):

1. At most one machine trains with a valid lease (``RunLease.check`` passes).
2. The newest committed step never goes backwards, no checkpoint below it is committed later,
   and a resumed chief starts from the newest committed step.
3. After an end marker, every group is at 0 once two ticks that started after it have completed,
   and no group is sized up again; while the run goes on, no tick zeroes the placement the
   current ``placement.json`` names active (a group the controller cannot reach is left to 5).
4. While the run goes on (no end marker, no ``STOP``), more than ``LAUNCH_MARGIN_S`` before its
   deadline, and some placement has capacity throughout: a machine trains within
   :meth:`Sim.liveness_bound` of the last one stopping (or of the last ``ops move``, or of the world
   taking a machine of the active group: spot can take a booting machine before its peers are up). When no
   placement could launch, the controller said so within that bound (a ``waiting`` event, which
   ``ops status`` shows, or a ``moved`` one): no run waits in silence.
5. No group is sized above 0 after the cap (the scheduled action's time or the deadline,
   whichever is first); a run past its deadline has an end marker at the end.
6. The ``moved`` events match the record's moves one for one; a move the controller makes comes
   ``wait_minutes`` or more after the move before it, and a failure move that long after the last training
   (one move per failure episode; a move for price comes at a restart, weighed by 12-14).
7. No machine is up without training longer than :meth:`Sim.idle_bound` while some placement could
   have launched the run (a group no controller can reach is left to the cap); the machine-minutes
   without training are reported per schedule.
8. A placement whose API has refused every call for :meth:`Sim.broken_bound`, and ``BROKEN_TICKS`` + 2 ticks
   that met the refusal ended by saying so (not by the store's error first), is named in a ``waiting`` event
   written since, and no move to it stays under way that long.
9. The controller replaces (cycles) a group only where one of its machines hung; a machine booting
   (5-15 min), staging, waiting for its peers or exporting is never replaced.
10. A stop asked is a stop: the run has an end marker within :meth:`Sim.stop_bound`, whether a machine
    trains or not (the trainer's ``CANCELLED``, or the controller's).
11. No group is sized up inside the launch margin (``LAUNCH_MARGIN_S`` before the deadline).
12. A move for price saves more than the move threshold (``moveFloorUsd`` and ``moveFraction`` of the active
    placement's expected cost, after the restart's cost), by the table the tick wrote for it, or leaves an active
    placement that is infeasible for one of known cost; none is made without its table or a known cost there.
13. No move the controller makes goes to a placement the waiting rules refuse (one the record marks failed less
    than ``2 x wait_minutes`` before, or broken); with ``cheapest`` none goes to a
    placement its table marks infeasible while another is feasible (when none is, a failure move goes where the
    listed order says, as ``inOrder``), and every such move is its table's choice.
14. With ``rebalance`` off, no move for price stops a machine that trains (holds a valid lease, as in 1, taken
    before the tick began).

Where the machines' finish path could not scale their group down, invariant 3 is the controller's own end
branch zeroing it; where the cap action came late or failed, invariant 5 holds the controller to the deadline.

What the stand-ins leave out, and where that matters:

- A cloud call (size a group, read it) is instantaneous: a tick pauses only at store operations,
  *before* the operation. The project's code reads the store last right before it sizes a group,
  so in the simulation nothing lands between that read and the call; in a real account one API
  call's latency remains, and the next tick repairs what it got wrong (invariant 3's two ticks).
- Every clock agrees (no skew); the lease's skew margin is never tested here (``tests/trainer``
  does). Launches are all or nothing per placement (capacity is a placement's, not a zone's).
- The trainer is a counter: no TensorFlow, no data, no evaluation; a commit is one small file.
  Rendezvous of several machines is "``nodes`` machines up in the group"; a worker's own
  failures, the bootstrap's retries and the relaunch loop of ``finish.sh`` are not modelled.
- Invariant 4 does not count a run with ``STOP`` (invariant 10 does).

It ships (``python -m controller.replay`` drives it by a price trace: :mod:`simworld.replay`), outside the
controller's function package. ``python -m tests.controller.sim --schedules 2000`` runs schedules 0..1999 and
prints the figures; a failing schedule prints its seed, and ``--seed N --trace`` replays it event by event.
``--plant NAME`` puts one of the fixes back (the tests' ``PLANTS``) to show the invariants catch it.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import json
import os
import random
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from controller import choice as choices
from controller import decide as decides
from controller import record as records
from controller import tick as ticks
from controller.clouds import CloudError
from controller.config import Config, parse
from controller.decide import LAUNCH_MARGIN_S, GroupState, LaunchFailure
from controller.prices import PriceError, Quote
from controller.record import iso
from runfolder import layout
from runfolder.lease import CLOCK_SKEW_S, DEFAULT_TTL_S, LeaseBusy, LeaseHeld, LeaseLost, RunLease
from runfolder.storage.base import ObjectInfo, Store
from runfolder.storage.errors import NotFound, PreconditionFailed, WriteConflict
from trainer.checkpoint_store import CheckpointError, CheckpointStore

TICK_S = 60.0
STEPS_PER_MIN = 10
NOTICE_S = {"aws": 120.0, "gcp": 30.0}
# What each cloud says for a failed launch, by kind (as controller.decide reads them).
FAILURE_WORDS = {
    "capacity": "We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested.",
    "quota": "You have requested more vCPU capacity than your current vCPU limit of 8 allows (VcpuLimitExceeded).",
    "price": "SpotMaxPriceTooLow: your Spot request price is lower than the minimum required.",
    "other": "The image id '[ami-12c6146b]' does not exist. Launching EC2 instance failed.",
}
START = 1_800_000_000.0  # the virtual clock's zero (an epoch second: time stamps read like real ones)
class Unavailable(Exception):  # noqa: N818 - the store's word for it (HTTP 503)
    """503 Service Unavailable: the store's own retries gave up."""


class Violation(AssertionError):
    """An invariant failed; the message names it, the time and the seed."""


# -- the store -----------------------------------------------------------------------------------


class SimStore(Store):
    """A versioned in-memory object store whose operations go through :meth:`Sim.store_op` (faults, pauses)."""

    def __init__(self, sim: Sim) -> None:
        super().__init__("file:///sim/runs/r")
        self.sim = sim
        self.objects: dict[str, tuple[bytes, int]] = {}
        self.version = 0
        self.committed: set[int] = set()
        self.history: dict[str, bytes] = {}  # placement.json at each version (for the "stale" plant)

    def _retrying(self, op: str, key: str, fn: Callable[[], object]) -> object:
        self.sim.store_op(op, key)
        return fn()

    def _set(self, key: str, data: bytes) -> str:
        self.version += 1
        self.objects[key] = (data, self.version)
        if key == layout.PLACEMENT_KEY:
            self.history[str(self.version)] = data
        self.sim.stored(key, data)
        return str(self.version)

    def _put_bytes(self, key: str, data: bytes) -> None:
        self._set(key, data)

    def _get_bytes(self, key: str) -> bytes:
        return self._get_versioned(key)[0]

    def _get_versioned(self, key: str) -> tuple[bytes, str]:
        if key not in self.objects:
            raise NotFound(key)
        data, version = self.objects[key]
        return data, str(version)

    def _put_bytes_if(self, key: str, data: bytes, version: str | None) -> str:
        current = self.objects.get(key)
        if (current is None) != (version is None) or current is not None and str(current[1]) != version:
            raise PreconditionFailed(f"{key}: changed")
        fault = self.sim.write_fault()
        if fault == "conflict":
            raise WriteConflict(f"{key}: another write in flight (409)")
        written = self._set(key, data)
        if fault == "lost":
            raise PreconditionFailed(f"{key}: the answer was lost; the retry met this very write")
        return written

    def _put_file(self, key: str, path: str, cancel) -> None:
        with open(path, "rb") as f:
            self._set(key, f.read())

    def _get_file(self, key: str, path: str) -> None:
        with open(path, "wb") as f:
            f.write(self._get_bytes(key))

    def _exists(self, key: str) -> bool:
        return key in self.objects

    def _stat(self, prefix: str) -> dict[str, ObjectInfo]:
        when = datetime.fromtimestamp(self.sim.now, tz=UTC)
        return {k: ObjectInfo(len(v[0]), when) for k, v in self.objects.items() if k.startswith(prefix)}

    def _delete_keys(self, keys: list[str]) -> None:
        for k in keys:
            self.objects.pop(k, None)
            self.sim.stored(k, None)

    def peek(self, key: str) -> bytes | None:
        """The object without faults or pauses (for the invariants)."""
        got = self.objects.get(key)
        return None if got is None else got[0]


# -- the groups ----------------------------------------------------------------------------------


@dataclass
class Group:
    """One placement's group: sizes, machines, launches in flight and failed launches since the last success."""

    index: int
    cloud: str
    desired: int = 0
    machines: list[Machine] = field(default_factory=list)
    launching: list[float] = field(default_factory=list)  # when each launch in flight completes
    failures: list[LaunchFailure] = field(default_factory=list)
    next_try: float = 0.0
    hung_seen_at: float | None = None  # the last time one of its machines was up and hung
    joined_at: float = 0.0  # when its newest machine came up
    backoff: float = 60.0

    def __repr__(self) -> str:
        return f"group-{self.index}(desired={self.desired}, machines={len(self.machines)}, launching={len(self.launching)})"


class SimClouds:
    """The controller's view of the groups (``desired``, ``state``, ``set_size``), as controller.clouds answers."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    def desired(self, p) -> int:
        self.sim.cloud_op(p.index)
        return self.sim.groups[p.index].desired

    def state(self, p) -> GroupState:
        self.sim.cloud_op(p.index)
        g = self.sim.groups[p.index]
        # No launch time, as a managed instance group says none: the tick counts from when it saw the machines.
        return GroupState(running=len(g.machines), desired=g.desired, failures=tuple(g.failures),
                          machines=tuple(sorted(m.name for m in g.machines)))

    def set_size(self, p, n: int) -> None:
        self.sim.cloud_op(p.index)
        self.sim.size(p.index, n, self.sim.actor_name())


# -- the machines --------------------------------------------------------------------------------


@dataclass(eq=False)
class Machine:
    """One machine as its supervisor and trainer behave (module docstring)."""

    name: str
    group: Group
    up_at: float
    alive: bool = True
    lease: RunLease | None = None
    ckpt: CheckpointStore | None = None
    step: int = 0
    last_commit: float = 0.0
    training: bool = False
    noticed: bool = False
    booted: bool = False
    hang: str | None = None  # "boot": its bootstrap never ends; "train": its trainer (or collective) hangs
    staging_until: float | None = None  # the attempt's start: staging, restore (no progress, by design)
    exporting_until: float | None = None  # after the last step: the final commit and export (no progress)
    gone_at: float | None = None
    idle_s: float = 0.0  # up without training, this stretch
    lease_at: float = 0.0  # when it took the run's lease

    def __repr__(self) -> str:
        held = f", lease {self.lease.epoch}" if self.lease is not None else ""
        return f"{self.name}({'training' if self.training else 'up' if self.alive else 'gone'}{held}, step {self.step})"


@dataclass
class Actor:
    """Whoever runs now: a tick, ``ops move``, a machine, a group; a slow one pauses at its ``pause_at``-th store op."""

    name: str
    pause_at: int | None = None
    pause_s: float = 0.0
    ops: int = 0
    refused: set[int] = field(default_factory=set)  # the placements whose API refused it


# -- the world -----------------------------------------------------------------------------------


class Sim:
    """One schedule: the world drawn from ``seed``, run to its end with the invariants checked after every event."""

    # long function: the world drawn from its seed in one place, in the order the seed draws it (moving a draw changes every schedule)
    def __init__(self, seed: int, *, plant: str | None = None, trace: bool = False) -> None:
        self.seed, self.plant, self.trace = seed, plant, trace
        r = self.rng = random.Random(seed)
        self.now = START
        self.heap: list[tuple[float, int, Callable, tuple]] = []
        self.seq = 0
        self.depth = 0
        self.quiet = False  # the invariants' own reads: no faults, no pauses
        self._record, self._deadline, self._marker = records.Record(), None, None  # as stored last
        self.said_at: float | None = None
        self.said_keys: dict[str, float] = {}
        self.actors: list[Actor] = []
        self.store = SimStore(self)
        self.nplacements = r.choice((2, 2, 3, 3))
        self.nodes = r.choice((1, 1, 2, 3))
        self.wait_minutes = r.choice((2, 3, 5, 10))
        self.cap_s = r.choice((90, 120, 150, 180)) * 60
        # Machines that never train (a bootstrap that never ends, a hung collective); their runs are longer, so
        # that the controller's bound (HUNG_S) is reached inside them.
        self.phung = r.choice((0.0, 0.0, 0.0, 0.1))
        if self.phung:
            self.cap_s = r.choice((150, 180)) * 60
        self.target_steps = STEPS_PER_MIN * r.randint(20, 200)
        self.commit_every = r.choice((3, 5, 10)) * 60.0
        self.p503 = r.choice((0.0, 0.002, 0.01, 0.03))
        self.pwrite = r.choice((0.0, 0.01, 0.05))
        self.pcloud = r.choice((0.0, 0.005, 0.02))
        self.pslow = r.choice((0.0, 0.05, 0.2, 0.5))
        self.retries = r.random() < 0.5
        self.clouds = [r.choice(("aws", "gcp")) for _ in range(self.nplacements)]
        self.config: Config = parse({
            "run_uri": self.store.uri, "nodes": self.nodes, "wait_minutes": self.wait_minutes,
            "max_runtime_s": self.cap_s, "placements": [
                {"cloud": "aws", "region": f"region-{i}", "project": None, "group": f"group-{i}"}
                for i in range(self.nplacements)]})
        self.groups = [Group(i, self.clouds[i]) for i in range(self.nplacements)]
        # Per placement, when a tick that its API refused ended having noted it (raised CloudError, not the
        # store's error first): the ticks that can count a placement broken.
        self.refused_ticks: list[list[float]] = [[] for _ in range(self.nplacements)]
        self.groups[0].desired = self.nodes  # the stack starts home's group at nodes, the others at 0
        self.sim_clouds = SimClouds(self)
        # Capacity: each placement's outages (start, end, kind); "other" ones stay short (a bad image fixed).
        self.outages: list[list[tuple[float, float, str]]] = []
        for _ in range(self.nplacements):
            spans, t = [], START + r.uniform(-600, 1800)
            while t < START + self.cap_s + 3600:
                kind = r.choice(("capacity", "capacity", "quota", "price", "other"))
                length = r.uniform(60, (self.wait_minutes * 60 - 30) if kind == "other" else 5400)
                spans.append((t, t + length, kind))
                t += length + r.uniform(300, 5400)
            self.outages.append(spans)
        # A placement whose group's API refuses the controller (a refused credential, a deleted group's
        # API answers): for a while, or for good; the group itself goes on.
        self.broken: list[tuple[float, float] | None] = [None] * self.nplacements
        if r.random() < 0.2:
            a = START + r.uniform(0, self.cap_s)
            self.broken[r.randrange(self.nplacements)] = (a, a + r.uniform(600, 3600) if r.random() < 0.5 else
                                                         float("inf"))
        self.cap_at = START + self.cap_s  # the groups' scheduled action, counted from the deployment
        self.machines: list[Machine] = []
        self.count = 0
        # What the invariants remember.
        self.max_committed: int | None = None
        self.ended_at: float | None = None
        self.stop_at: float | None = None
        self.last_training: float = START
        self.training_since: float | None = None
        self.last_operator_move: float = START
        self.last_taken: float = START  # the world took a machine of the active group (spot, a kill, by hand)
        self.trained_at: list[float] = []
        self.ticks_after_end = 0
        self.moves_seen = 0
        self.sizes: list[tuple[float, int, int, str]] = []
        self.events = 0
        self.idle_s = 0.0
        self.ticks = 0
        self.tick_failures = 0
        self.end = START + self.cap_s + 40 * 60
        # The silences that are no hang: a boot of 5-15 minutes, the attempt's start (staging), the export.
        self.boot_s = r.choice(((30.0, 120.0), (30.0, 120.0), (300.0, 900.0)))
        self.stage_s = r.choice((0.0, 0.0, 600.0, 1200.0))
        self.export_s = r.choice((0.0, 0.0, 600.0, 1800.0))
        # The rest of an account's world: a scheduler that misses 30-45 min of ticks, store outages of
        # minutes, finish.sh's scale-down failing (the controller's end branch zeroes), a cap action late
        # or failed, events.jsonl lines cut short by a machine taken mid-write.
        self.gap = None
        if r.random() < 0.15:  # (after the first half hour, as the store's outages below)
            a = START + r.uniform(1800, self.cap_s)
            self.gap = (a, a + r.uniform(1800, 2700))
        self.store_down: list[tuple[float, float]] = []
        if r.random() < 0.15:
            for _ in range(r.randint(1, 3)):
                # After the first half hour: a gap or an outage before any deadline is written is left out
                # (the controller knows the deadline, not the groups' cap action's time, which can then be
                # more than the launch margin earlier: a group sized up after it).
                a = START + r.uniform(1800, self.cap_s)
                self.store_down.append((a, a + r.uniform(120, 600)))
        self.pscale_fail = r.choice((0.0, 0.0, 0.5, 1.0))
        self.cap_late = r.choice((0.0, 0.0, 0.0, 300.0, None))  # None: the cap action failed
        self.pcut = r.choice((0.0, 0.0, 0.3))
        self.checkpoint_bytes = 10**9  # what each commit's event says (the controller's measured size)
        self.attempt = 1  # the attempt number the machines' events carry
        self.price_world()

    def price_world(self) -> None:
        """Each placement's spot price over time (a step every 20-90 min, by 0.7-1.4 times), the price API's
        failures (per fetch, and in some schedules an outage long enough for every price to go stale), and what
        the stack tells the controller (the policy, the threshold, the price table's list price). Drawn from a
        generator of its own: the rest of the schedule is drawn as before."""
        r = random.Random(self.seed * 7919 + 17)
        self.policy = r.choice((choices.table.CHEAPEST,) * 4 + (choices.table.IN_ORDER,))
        if self.policy == choices.table.CHEAPEST and self.nplacements > 1:
            self.groups[0].desired = 0  # as the stack makes them (components/common.py's group_size): the first tick launches
        self.rebalance = r.random() < 0.25
        self.prices: list[list[tuple[float, float]]] = []
        for _ in range(self.nplacements):
            t, price, steps = START - 3600, r.uniform(0.3, 1.5), []
            while t < self.end + 3600:
                steps.append((t, round(price, 4)))
                t += r.uniform(1200, 5400)
                price = min(3.0, max(0.1, price * r.uniform(0.7, 1.4)))
            self.prices.append(steps)
        self.pprice_fail = r.choice((0.0, 0.0, 0.1, 0.5))
        self.price_down = None
        if r.random() < 0.15:
            a = START + r.uniform(0, self.cap_s)
            self.price_down = (a, a + r.uniform(1800, 7200))
        self.price_rng = r
        rows = [{"instance_types": ["g5.xlarge"], "zones": [], "gpu": "A10G",
                 "estimate_per_hour": round(self.prices[i][0][1] * 1.2, 4),
                 "restore_per_gb": 0.0 if i == 0 else (0.02 if self.clouds[i] == self.clouds[0] else 0.09),
                 "writes_per_gb": 0.0 if i == 0 else (0.02 if self.clouds[i] == self.clouds[0] else 0.12),
                 "max_price_per_hour": r.choice((None, None, 2.0))} for i in range(self.nplacements)]
        self.inputs = choices.parse_inputs({
            "policy": self.policy, "rebalance": self.rebalance, "move_floor_usd": r.choice((0.0, 0.05, 0.2)),
            "move_fraction": r.choice((0.05, 0.1, 0.3)), "steps": self.target_steps,
            "checkpoint_every_s": self.commit_every, "checkpoint_bytes": 10**9,
            "boot_s": {"aws": sum(self.boot_s) / 2, "gcp": sum(self.boot_s) / 2}, "placements": rows}, self.config)
        self.price_moves = 0
        self.last_table: tuple[str, dict] | None = None  # who wrote the newest decision table, and the table

    def price_at(self, index: int, t: float) -> float:
        steps = self.prices[index]
        return steps[max(0, bisect.bisect_right(steps, (t, float("inf"))) - 1)][1]

    def price_fetch(self):
        """The tick's fetch of a quote (controller.prices' ``fetch``): the world's price now, or the API's failure."""
        if self.price_down is not None and self.price_down[0] <= self.now < self.price_down[1]:
            raise PriceError("EC2 answered 503 (the price API is down)")

        def fetch(offer) -> Quote:
            if self.pprice_fail and self.price_rng.random() < self.pprice_fail:
                raise PriceError(f"placement {offer.index}: DescribeSpotPriceHistory failed (throttled)")
            return Quote(price=self.price_at(offer.index, self.now), source="aws", as_of=self.now)

        return fetch

    # -- the event loop ------------------------------------------------------------------------

    def at(self, t: float, fn: Callable, *args) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, fn, args))

    def run_until(self, until: float) -> None:
        while self.heap and self.heap[0][0] <= until:
            t, _, fn, args = heapq.heappop(self.heap)
            self.now = max(self.now, t)
            if self.trace:
                print(f"{self.now - START:9.1f} {'  ' * self.depth}{fn.__name__}{shown(args)}")
            fn(*args)
            self.events += 1
            self.check()
        self.now = max(self.now, until)

    @contextlib.contextmanager
    def acting(self, actor: Actor) -> Iterator[Actor]:
        self.actors.append(actor)
        try:
            yield actor
        finally:
            self.actors.pop()

    def actor_name(self) -> str:
        return self.actors[-1].name if self.actors else "world"

    def store_op(self, op: str, key: str) -> None:
        if self.quiet:
            return
        actor = self.actors[-1] if self.actors else None
        if actor is not None:
            actor.ops += 1
            if actor.pause_at == actor.ops and self.depth < 2:
                self.depth += 1
                try:
                    self.run_until(self.now + actor.pause_s)  # the rest of the world goes on meanwhile
                finally:
                    self.depth -= 1
        if any(a <= self.now < b for a, b in self.store_down):
            raise Unavailable(f"503 on {op} {key} (the store is down)")
        if self.p503 and self.rng.random() < self.p503:
            raise Unavailable(f"503 on {op} {key}")

    def write_fault(self) -> str | None:
        x = self.rng.random()
        if x < self.pwrite:
            return "conflict"
        if x < 2 * self.pwrite:
            return "lost"
        return None

    def cloud_op(self, index: int) -> None:
        if self.broken_at(index, self.now):
            if self.actors:
                self.actors[-1].refused.add(index)
            raise CloudError(f"placement {index}: AccessDenied (the controller's credential is refused)")
        if self.pcloud and self.rng.random() < self.pcloud:
            raise CloudError("the group's API failed after its retries (throttled)")

    def stored(self, key: str, data: bytes | None) -> None:
        if key == layout.PLACEMENT_KEY:
            new = records.Record() if data is None else records.Record.parse(data)
            if len(new.moves) > len(self._record.moves):
                self.check_choice(new.moves[-1])
            self._record = new
            return
        if key.startswith(layout.DECISIONS_PREFIX) and data is not None:
            self.last_table = (self.actor_name(), json.loads(data))
            return
        if key == layout.PLACEMENT_EVENTS_KEY and data is not None:
            self.said_at = self.now  # a `waiting` or `moved` event appended
            last = data.decode(errors="replace").strip().splitlines()[-1:]
            with contextlib.suppress(ValueError, IndexError):
                self.said_keys[str(json.loads(last[0]).get("key"))] = self.now
            return
        if key == layout.DEADLINE_KEY:
            digits = "".join(c for c in (data or b"").decode() if c.isdigit())
            self._deadline = float(digits) if digits else None
            return
        if key in layout.END_MARKERS:
            self._marker = key if data is not None else None
            return
        found = layout.checkpoint_key_step(key) if key.startswith(layout.CHECKPOINTS_PREFIX) else None
        if found is None or found[1] != layout.COMMITTED:
            return
        step = found[0]
        if data is None:
            self.store.committed.discard(step)
            return
        if self.max_committed is not None and step < self.max_committed:
            self.fail(2, f"checkpoint {step} committed below the newest committed step {self.max_committed}")
        self.store.committed.add(step)
        self.max_committed = max(self.store.committed)

    def size(self, index: int, n: int, who: str) -> None:
        g = self.groups[index]
        if n > 0:
            deadline = self.deadline()
            if deadline is not None and self.now >= deadline - LAUNCH_MARGIN_S:
                self.fail(11, f"{who} sized group {index} to {n} {(deadline - self.now) / 60:.1f} min before the "
                              f"deadline, inside the {LAUNCH_MARGIN_S // 60}-minute launch margin")
            if self.ended_at is not None:
                self.fail(3, f"{who} sized group {index} to {n} after the run ended")
            if self.now >= self.cap_time():
                self.fail(5, f"{who} sized group {index} to {n} after the cap ({self.cap_time() - START:.0f})")
        elif who.startswith("tick") and self.ended_at is None and self.store.peek(layout.STOP_KEY) is None:
            rec = self.record()
            if rec.active == index and self.now < self.deadline_or_cap() and not self.any_marker():
                replaced = rec.hung.get(str(index), [])
                if not replaced or self.now - replaced[-1] > 200:
                    self.fail(3, f"{who} zeroed group {index}, the active placement of the current record")
                if g.hung_seen_at is None or self.now - g.hung_seen_at > 600:
                    self.fail(9, f"{who} replaced the machines of group {index}, none of which hung: "
                                 f"{g.machines}")
        self.sizes.append((self.now, index, n, who))
        if self.trace:
            print(f"{self.now - START:9.1f} {'  ' * self.depth}  {who}: group {index} -> {n}")
        g.desired = n
        self.reconcile(g)

    # -- time, record, markers -----------------------------------------------------------------

    def deadline(self) -> float | None:
        return self._deadline

    def cap_time(self) -> float:
        d = self.deadline()
        return self.cap_at if d is None else min(self.cap_at, d)

    def slack(self) -> float:
        """The world's own delays: the scheduler's gap, the store's outages."""
        return ((self.gap[1] - self.gap[0]) if self.gap else 0.0) + sum(b - a for a, b in self.store_down)

    def cap_limit(self) -> float:
        """When every group is at 0 at the latest: the cap action's time, or, where it came late or failed, the
        controller's ending of the run at its deadline (ticks, slow ones, the world's delays)."""
        if self.cap_late == 0.0:
            return self.cap_time()
        late = self.cap_at + self.cap_late if self.cap_late is not None else float("inf")
        return min(late, self.deadline_or_cap() + 4 * TICK_S + 2 * 150 + self.slack())

    def deadline_or_cap(self) -> float:
        d = self.deadline()
        return self.cap_at if d is None else d

    def record(self) -> records.Record:
        return self._record

    def any_marker(self) -> str | None:
        return self._marker

    def capacity(self, index: int, t: float) -> str | None:
        """The kind of outage placement ``index`` has at ``t``; None when it can launch."""
        return next((kind for a, b, kind in self.outages[index] if a <= t < b), None)

    def clear_between(self, index: int, a: float, b: float) -> bool:
        broken = self.broken[index]
        if broken is not None and broken[0] < b and a < broken[1]:
            return False
        return not any(x < b and a < y for x, y, _ in self.outages[index])

    def broken_at(self, index: int, t: float) -> bool:
        """Whether placement ``index``'s group's API refuses every call at ``t`` (the group itself works on)."""
        broken = self.broken[index]
        return broken is not None and broken[0] <= t < broken[1]

    def broken_between(self, index: int, a: float, b: float) -> bool:
        """Whether placement ``index``'s group's API refused every call at some time between ``a`` and ``b``."""
        broken = self.broken[index]
        return broken is not None and broken[0] <= b and a < broken[1]

    def broken_bound(self) -> float:
        """A placement broken this long is named in a ``waiting`` event, and no move to it is still under way:
        the controller's own bound (BROKEN_TICKS ticks over BROKEN_S), ticks that failed on the store, slow ones."""
        return decides.BROKEN_S + (decides.BROKEN_TICKS + 8) * TICK_S + 2 * 150 + self.slack()

    # -- groups ---------------------------------------------------------------------------------

    def reconcile(self, g: Group) -> None:
        """Terminate the newest machines of a group above desired; launches wait for the group's own step."""
        while len(g.machines) + len(g.launching) > g.desired:
            if g.launching:
                g.launching.pop()
            else:
                self.terminate(g.machines[-1], "scale-in")

    def group_step(self, g: Group) -> None:
        if not g.desired and not g.machines and not g.launching:  # a group at 0 with nothing in flight: nothing to do
            self.at(self.now + 30, self.group_step, g)
            return
        with self.acting(Actor(f"group-{g.index}")):
            for done in [t for t in g.launching if t <= self.now]:
                g.launching.remove(done)
                self.count += 1
                m = Machine(f"m{self.count}-p{g.index}", g, up_at=self.now)
                g.machines.append(m)
                g.joined_at = self.now
                self.machines.append(m)
                g.failures.clear()  # a success: the failures since the last one are gone
                g.backoff = 60.0
                if self.phung and self.rng.random() < self.phung:
                    m.hang = self.rng.choice(("boot", "train"))
                self.at(self.now + self.rng.uniform(*self.boot_s), self.boot, m)
                self.plan_preemption(m)
            self.reconcile(g)
            if len(g.machines) + len(g.launching) < g.desired and self.now >= g.next_try:
                kind = self.capacity(g.index, self.now)
                if kind is None:
                    for _ in range(g.desired - len(g.machines) - len(g.launching)):
                        g.launching.append(self.now + self.rng.uniform(60, 240))
                else:
                    g.failures.append(LaunchFailure(self.now, FAILURE_WORDS[kind]))
                    g.next_try = self.now + g.backoff
                    g.backoff = min(300.0, g.backoff * 2)
        self.at(self.now + 30, self.group_step, g)

    def cap_action(self) -> None:
        for g in self.groups:
            g.desired = 0
            self.reconcile(g)

    # -- machines -------------------------------------------------------------------------------

    def plan_preemption(self, m: Machine) -> None:
        r = self.rng
        # A hung machine is taken back as rarely as the capacity of a calm region allows (once in 4 hours):
        # what stops its bill is the controller, not luck.
        when = self.now + r.expovariate(1 / (4 * 3600 if m.hang else 3600))
        self.at(when, self.spot_notice if r.random() < 0.7 else self.hard_kill, m)

    def boot(self, m: Machine) -> None:
        """The supervisor's first steps: the run's deadline (written at the first boot), then its loop."""
        if not m.alive or m.hang == "boot":
            return  # a bootstrap that never ends: up, billed, never a peer
        m.booted = True
        with self.acting(Actor(m.name)), contextlib.suppress(Unavailable):
            if not self.store.exists(layout.DEADLINE_KEY):
                self.store.put_bytes(layout.DEADLINE_KEY, f"{int(self.now) + self.cap_s}\n".encode())
        self.at(self.now + 1, self.machine_step, m)

    def machine_step(self, m: Machine) -> None:
        if not m.alive:
            return
        with self.acting(Actor(m.name)):
            try:
                self._machine_step(m)
            except Unavailable:
                self.stop_training(m, release=True)  # a trainer that met a dead store exits; its supervisor starts another
        if m.alive:
            self.at(self.now + 60, self.machine_step, m)

    def _machine_step(self, m: Machine) -> None:
        if any(self.store.exists(name) for name in layout.END_MARKERS):
            self.finish_machine(m, None)
            return
        deadline = self.deadline()
        if deadline is not None and self.now >= deadline:
            self.finish_machine(m, layout.TIMED_OUT)
            return
        g = m.group
        peers = [x for x in g.machines if x.alive and x.booted]
        if peers[0] is not m:
            return  # not the chief: it trains while the chief does
        if len(peers) < self.nodes:
            if m.training or m.lease is not None:
                self.stop_training(m, release=True)  # a peer lost: the trainer exits, the supervisor waits
            return
        if m.lease is None:
            lease = RunLease(self.store, holder=f"{m.name}/1", wait_s=0, clock=lambda: self.now,
                             monotonic=lambda: self.now, sleep=lambda s: None)
            try:
                lease.acquire()
            except (LeaseHeld, PreconditionFailed):
                return
            m.lease, m.ckpt = lease, CheckpointStore(self.store, keep=3, lease=lease, upload_workers=1)
            m.lease_at = self.now
            newest = max(m.ckpt.committed_steps(), default=0)
            if newest != (self.max_committed or 0):
                self.fail(2, f"{m.name} resumed from step {newest}, not the newest committed {self.max_committed}")
            m.step, m.last_commit = newest, self.now
            self.begin_attempt(m)
            self.store.append_line(layout.EVENTS_KEY, json.dumps(
                {layout.EVENT: layout.STARTED, layout.TIME: iso(self.now), layout.ATTEMPT: self.attempt,
                 "config": {"placement": self.config.placements[g.index].label}}))
            self.resumed(m, newest)
            if self.pcut and self.rng.random() < self.pcut:  # a line cut short: the machine before was taken mid-write
                self.store.append_line(layout.EVENTS_KEY, '{"event": "checkpoint", "ti')
            self.at(self.now + m.lease.ttl_s / 4, self.renew, m, m.lease)
            if self.stage_s and m.staging_until is None:  # once a machine: a restarted trainer finds its data
                m.staging_until = self.now + self.rng.uniform(0, self.stage_s)
            if m.staging_until is not None and self.now < m.staging_until:
                return
            if not any(x.hang == "train" for x in peers):
                self.set_training(m, True)
            return
        if any(x.hang == "train" for x in peers):
            if m.training:
                self.stop_training(m, keep=True)
            return  # a hung trainer or collective: the lease is renewed (its own thread), nothing trains
        if m.staging_until is not None and self.now < m.staging_until:
            return
        if m.exporting_until is not None:
            if self.now >= m.exporting_until:
                self.store.put_bytes(layout.COMPLETE, json.dumps({"step": m.step}).encode())
                self.finish_machine(m, None)
            return
        try:
            m.lease.check()
        except LeaseLost:
            self.stop_training(m)
            return
        self.set_training(m, True)
        m.step += self.steps_per_min(g.index)
        self.store.put_bytes(layout.PROGRESS_KEY, json.dumps(
            {"step": m.step, "total": self.target_steps, "updated": iso(self.now)}).encode())
        if self.store.exists(layout.STOP_KEY):
            if self.commit(m):
                self.store.put_bytes(layout.CANCELLED, json.dumps({"step": m.step}).encode())
                self.finish_machine(m, None)
            return
        if m.step >= self.target_steps:
            if self.commit(m):
                if self.export_s:
                    m.exporting_until = self.now + self.rng.uniform(0, self.export_s)
                    self.stop_training(m, keep=True)
                    return
                self.store.put_bytes(layout.COMPLETE, json.dumps({"step": m.step}).encode())
                self.finish_machine(m, None)
            return
        if self.now - m.last_commit >= self.commit_every:
            self.commit(m)

    def commit(self, m: Machine) -> bool:
        try:
            m.ckpt.commit(m.step, CKPT_DIR)
        except LeaseLost:
            self.stop_training(m)
            return False
        except (CheckpointError, Unavailable, PreconditionFailed, LeaseBusy):
            return False  # not committed; the trainer tries again at its next checkpoint
        m.last_commit = self.now
        self.event(layout.CHECKPOINT, step=m.step, bytes=self.checkpoint_bytes)  # the controller measures its rate from these
        return True

    def event(self, kind: str, **fields) -> None:
        """A trainer event in ``events.jsonl`` (one that cannot be written is lost, as the trainer's are)."""
        with contextlib.suppress(Unavailable):
            self.store.append_line(layout.EVENTS_KEY, json.dumps(
                {layout.EVENT: kind, layout.TIME: iso(self.now), layout.ATTEMPT: self.attempt, **fields}))

    def renew(self, m: Machine, lease: RunLease) -> None:
        if not m.alive or m.lease is not lease:
            return
        with self.acting(Actor(m.name)):
            try:
                lease.renew()
            except LeaseLost:
                self.stop_training(m)
                return
            except (Unavailable, LeaseBusy):
                pass  # the renew loop tries again next round
        self.at(self.now + lease.ttl_s / 4, self.renew, m, lease)

    def set_training(self, m: Machine, on: bool) -> None:
        m.training = on
        if on and self.training_since is None:
            self.training_since = self.now

    def stop_training(self, m: Machine, *, release: bool = False, keep: bool = False) -> None:
        """The trainer exits: its lease goes with it (released when it can say so, else left to expire);
        ``keep``: its training ends, and it keeps the lease to export."""
        if m.training:
            self.last_training = self.now
        m.training = False
        if not keep:
            if release and m.lease is not None:
                with contextlib.suppress(Unavailable):
                    m.lease.release()
            m.lease, m.ckpt = None, None
            m.exporting_until = None
        if not any(x.training for x in self.machines):
            self.training_since = None

    def spot_notice(self, m: Machine) -> None:
        if not m.alive or m.noticed:
            return
        m.noticed = True
        with self.acting(Actor(m.name)):
            if m.training and m.lease is not None:
                with contextlib.suppress(Unavailable):
                    self.commit(m)
                self.event(layout.PREEMPTED, step=m.step)
                self.stop_training(m, release=True)
            else:
                self.stop_training(m)
        self.at(self.now + NOTICE_S[m.group.cloud], self.terminate, m, "spot")

    def hard_kill(self, m: Machine) -> None:
        if m.alive:
            self.terminate(m, "hard kill")

    def terminate(self, m: Machine, why: str) -> None:
        if not m.alive:
            return
        if m.training:
            self.last_training = self.now
        if why in ("spot", "hard kill") and m.group.index == self.record().active:
            self.last_taken = self.now
        m.alive, m.training, m.gone_at = False, False, self.now
        if m in m.group.machines:
            m.group.machines.remove(m)
        if not any(x.training for x in self.machines):
            self.training_since = None

    def finish_machine(self, m: Machine, outcome: str | None) -> None:
        """finish.sh: the marker (FAILED / TIMED_OUT, unless one is there), the group to zero, shut down."""
        if outcome is not None and not self.any_marker():
            with contextlib.suppress(Unavailable):
                self.store.put_bytes(outcome, json.dumps({"outcome": outcome, "reason": "the run's deadline passed",
                                                          "instance": m.name}).encode())
        if not (self.pscale_fail and self.rng.random() < self.pscale_fail):  # else: finish.sh's scale-down failed
            self.size(m.group.index, 0, f"finish {m.name}")
        self.terminate(m, "finish")

    # -- the controller and the operator -------------------------------------------------------

    def scheduled_tick(self, attempt: int = 0) -> None:
        slow = self.rng.random() < self.pslow
        actor = Actor(f"tick@{self.now - START:.0f}", pause_at=self.rng.randint(1, 14) if slow else None,
                      pause_s=self.rng.uniform(20, 150))
        started = self.now
        with self.acting(actor):
            try:
                result = ticks.tick(self.config, self.sim_clouds, self.now, store=self.store, clock=lambda: self.now,
                                    inputs=self.inputs, prices=self.price_fetch)
                if self.trace:
                    print(f"{self.now - START:9.1f} {'  ' * self.depth}  -> {result.action}: {result.reason} "
                          f"{result.resized or ''}{' waiting: ' + result.waiting if result.waiting else ''}")
            except (Unavailable, CloudError, PreconditionFailed) as e:
                if isinstance(e, CloudError):
                    for i in actor.refused:
                        self.refused_ticks[i].append(self.now)
                if self.trace:
                    did = getattr(e, "result", None)
                    print(f"{self.now - START:9.1f} {'  ' * self.depth}  -> {type(e).__name__}: {e}"
                          + (f" (after {did.action}: {did.reason})" if did is not None else ""))
                self.tick_failures += 1
                if self.retries and attempt < 2:
                    self.at(self.now + 60 * (attempt + 1), self.scheduled_tick, attempt + 1)
                return
            finally:
                self.ticks += 1
        if self.ended_at is not None and started > self.ended_at:
            self.ticks_after_end += 1

    def next_tick(self) -> None:
        if self.gap is None or not self.gap[0] <= self.now < self.gap[1]:  # the scheduler's gap: no tick
            self.scheduled_tick()
        self.at(self.now - (self.now - START) % TICK_S + TICK_S + self.rng.uniform(0, 5), self.next_tick)

    def operator_move(self) -> None:
        to = self.config.placements[self.rng.randrange(self.nplacements)]
        actor = Actor("ops move", pause_at=self.rng.randint(1, 10) if self.rng.random() < self.pslow else None,
                      pause_s=self.rng.uniform(5, 90))
        with self.acting(actor):
            try:
                ticks.move(self.config, self.sim_clouds, to, "asked by sim (ops move)", store=self.store, wait_s=0,
                           clock=lambda: self.now, sleep=lambda s: None)
            except (ticks.MoveError, PreconditionFailed, Unavailable, CloudError):
                return
        self.last_operator_move = self.now

    def outside_zero(self) -> None:
        """The active group put to 0 from outside the controller: by hand in the console, or by a machine's
        finish path whose end marker could not be written (finish.sh scales the group down all the same)."""
        if self.groups[self.record().active].machines:
            self.last_taken = self.now
        self.size(self.record().active, 0, "console")

    def operator_stop(self) -> None:
        with self.acting(Actor("ops stop")), contextlib.suppress(Unavailable):
            if self.any_marker() is None:
                self.store.put_bytes(layout.STOP_KEY, json.dumps(
                    {"requested": iso(self.now), "reason": "asked by sim (ops stop)"}).encode())
                self.stop_at = self.now if self.stop_at is None else self.stop_at

    # -- invariants -----------------------------------------------------------------------------

    def fail(self, number: int, what: str) -> None:
        raise Violation(f"seed {self.seed}: invariant {number} at t={self.now - START:.0f} s: {what}")

    def liveness_bound(self) -> float:
        """No training for longer than this, while some placement can launch, is a run waiting in vain:
        each other placement's wait and its failed-placement pause, the old lease, a launch, a boot,
        the nodes' joining, the attempt's start (twice: a chief lost while it stages), three ticks (slow
        ones included) and, where machines hang, the controller's bound for them."""
        return (self.nplacements * (2 * self.config.wait_s + 3 * TICK_S) + DEFAULT_TTL_S + CLOCK_SKEW_S
                + 2 * 300 + 240 + self.boot_s[1] + 2 * self.stage_s + 3 * TICK_S + 2 * 150 + self.hung_allowance()
                + self.slack())

    def hung_allowance(self) -> float:
        """Where machines hang: the controller's bound, the cycle's ticks, the fresh machine's boot (twice:
        the placement's first replacement, then a move away)."""
        return 2 * (decides.HUNG_S + 3 * TICK_S + self.boot_s[1] + 240) if self.phung else 0.0

    def idle_bound(self, m: Machine | None = None) -> float:
        """A machine up this long without training is billed for nothing: its boot and its peers' (one
        each, a peer taken meanwhile), the wait for a move (or the lease of the machine before), a peer's
        launch, ticks; where its group had a machine that
        hung, the controller's bound for that too."""
        hung = m is not None and m.group.hung_seen_at is not None and self.now - m.group.hung_seen_at < 2 * 3600
        base = (self.nodes * self.boot_s[1] + self.config.wait_s + 2 * 300 + 240 + DEFAULT_TTL_S + CLOCK_SKEW_S
                + 4 * TICK_S + 2 * 150 + self.slack())
        return max(base, decides.HUNG_S + decides.REPLACED_GUARD_S + 6 * TICK_S + 2 * 150 + self.slack()) if hung else base

    def check(self) -> None:
        valid = [m for m in self.machines if m.alive and m.training and m.lease is not None and m.lease.lost is None
                 and self.now < m.lease._valid_until]  # noqa: SLF001 - the lease's own notion of "may write"
        if len(valid) > 1:
            self.fail(1, f"{', '.join(m.name for m in valid)} all train with a valid lease")
        marker = self.any_marker()
        if marker and self.ended_at is None:
            self.ended_at = self.now
        if self.ended_at is not None and self.ticks_after_end >= 2:
            # A group the controller cannot reach is left to its machines' finish path and the cap (5).
            up = [g.index for g in self.groups if g.desired > 0 and not self.broken_at(g.index, self.now)]
            if up:
                self.fail(3, f"groups {up} still up two ticks after the run ended ({marker})")
        # (A group no controller can reach, whose cap action failed, is its machines' finish path's alone; once
        # its API answers again the controller zeroes it at its next ticks, not in the same instant: a tick
        # that the refusal stopped does not run again before the next minute, slow ones later still.)
        if self.now > self.cap_limit() and any(g.desired > 0 and (self.cap_late == 0.0 or not self.broken_between(
                g.index, self.now - 4 * TICK_S - 2 * 150, self.now)) for g in self.groups):
            self.fail(5, f"a group is above 0 after the cap: {[g.desired for g in self.groups]}")
        if any(m.training for m in self.machines if m.alive):
            self.last_training = self.now
            if not self.trained_at or self.trained_at[-1] < self.now:
                self.trained_at.append(self.now)
        self.check_liveness()
        self.check_moves()
        self.check_broken()
        if self.stop_at is not None and marker is None and self.now - self.stop_at > self.stop_bound():
            self.fail(10, f"a stop asked at {self.stop_at - START:.0f} s has not ended the run")

    def stop_bound(self) -> float:
        """A stop ends the run within this: the trainer's next step and commit, the attempt's start (a chief
        that stages sees it after), or the controller's grace for a trainer that holds the lease and hangs; the
        lease's expiry and ticks (slow ones, retried ones)."""
        return (max(ticks.STOP_GRACE_S, self.stage_s) + DEFAULT_TTL_S + CLOCK_SKEW_S + 5 * TICK_S + 2 * 150
                + self.commit_every + self.slack())

    def check_broken(self) -> None:
        for i, span in enumerate(self.broken):
            if span is None or not span[0] + self.broken_bound() < self.now < span[1]:
                continue
            # The controller learns of a refusal only at a tick that reaches the group's API and then writes
            # what it found: where the store fails most ticks first (its 503s, slow ticks), BROKEN_TICKS such
            # ticks can take longer than any bound in minutes. Two more: a note another writer beat, redone.
            ticks_since = len(self.refused_ticks[i]) - bisect.bisect_left(self.refused_ticks[i], span[0])  # in order
            if ticks_since < decides.BROKEN_TICKS + 2:
                continue
            if self.said_keys.get(f"{i}:broken", -1.0) < span[0]:
                self.fail(8, f"placement {i} has refused every call since {span[0] - START:.0f} s and no waiting "
                             "event names it")
            pending = self.record().pending
            if (pending is not None and pending.get("to") == i and self.any_marker() is None
                    and self.now - (records.epoch_of(pending.get("time")) or START) > self.broken_bound()):
                self.fail(8, f"a move to placement {i}, broken since {span[0] - START:.0f} s, is still under way")

    def check_liveness(self) -> None:
        if self.ended_at is not None or self.stop_at is not None or self.training_since is not None:
            return
        # A machine of the active group taken by the world (spot, a hard kill, the group zeroed by hand) starts
        # the run's wait again, trained or not: with boots of 5-15 min and 2-3 nodes, spot can take a booting
        # machine before its peers are up, again and again, and no controller makes a cloud keep a machine.
        since = max(self.last_training, self.last_operator_move, self.last_taken)
        if self.now >= self.deadline_or_cap() - LAUNCH_MARGIN_S or self.now - since <= self.liveness_bound():
            return
        if not any(self.clear_between(i, since, self.now) for i in range(self.nplacements)):
            # Nowhere to go: the run may wait, but not in silence (a `waiting` or `moved` event in the window).
            said = self.said_at  # once per cause: a cause that lasts is said once, since the training stopped
            if said is None or said < since:
                self.fail(4, f"no machine has trained for {(self.now - since) / 60:.0f} min, no placement could "
                             "launch, and the controller said nothing (no waiting or moved event)")
            return
        self.fail(4, f"no machine has trained for {(self.now - since) / 60:.0f} min (bound "
                     f"{self.liveness_bound() / 60:.0f}) while placement(s) "
                     f"{[i for i in range(self.nplacements) if self.clear_between(i, since, self.now)]} "
                     f"could launch; groups {[g.desired for g in self.groups]}, record active "
                     f"{self.record().active}")

    def check_choice(self, move: dict) -> None:
        """Invariants 12-14, as the controller records a move (its table was written just before, by the same tick)."""
        if str(move.get("reason", "")).startswith("asked"):
            return
        # 13, by the world: the waiting rules, as the tick read them (the record before this move: the groups'
        # own failed launches count where the tick could read them, which a flaky API may not allow), allow the
        # placement the run goes to.
        to, t = move["to"], records.epoch_of(move.get("time")) or self.now
        prior = self._record
        failed = prior.failed_at.get(str(to))
        if failed is not None and t - failed < 2 * self.config.wait_s - 1:
            self.fail(13, f"move {move['from']} -> {to}: placement {to} failed {(t - failed) / 60:.1f} min "
                          f"before, and a failed placement waits {2 * self.config.wait_minutes} min")
        if decides.is_broken(prior, to, t):
            self.fail(13, f"move {move['from']} -> {to}: placement {to} is broken")
        if not self.inputs.cheapest:
            return
        by_price = str(move.get("reason", "")).startswith(choices.PRICE_REASON)
        who, doc = self.last_table if self.last_table is not None else (None, {})
        if who != self.actor_name():
            if by_price:
                self.fail(12, f"a move for price {move['from']} -> {move['to']} without its decision table")
            return  # a failure move the price decision left alone (it failed, or a stop was asked): as inOrder
        rows = doc["rows"]
        frm = move["from"]
        if doc["chosen"] != to or doc["active"] != frm:
            self.fail(13, f"move {frm} -> {to} is not its table's choice ({doc['active']} -> {doc['chosen']})")
        if not rows[to]["feasible"] and any(r["feasible"] for r in rows):
            self.fail(13, f"move {frm} -> {to} goes to a placement its table marks infeasible ({rows[to]['why']}) "
                          f"while {[r['index'] for r in rows if r['feasible']]} were feasible")
        if not by_price:
            return
        self.price_moves += 1
        current, best = rows[frm]["cost"], rows[to]["cost"]
        if best is None or current is None and rows[frm]["feasible"]:
            self.fail(12, f"a move for price {frm} -> {to} without a known cost for both ({current}, {best})")
        saving = None if current is None else current - best - doc["move"]["restart_usd"]
        floor, fraction = self.inputs.move_floor_usd, self.inputs.move_fraction
        if saving is not None and not (saving > floor and saving > fraction * current):
            self.fail(12, f"a move for price {frm} -> {to} saves {saving:.4f} USD of {current:.4f}: not more than "
                          f"{floor} USD and {fraction:.0%}")
        if not self.inputs.rebalance:
            # (A lease taken after the tick began is one no tick could have seen: a race the lease's fence and the
            # move's own wait for the old lease settle, not a price decision.)
            training = [m.name for m in self.groups[frm].machines if m.alive and m.training and m.lease is not None
                        and m.lease.lost is None and self.now < m.lease._valid_until  # noqa: SLF001 - as invariant 1
                        and m.lease_at < t]
            if training:
                self.fail(14, f"a move for price {frm} -> {to} stops {training}, training, with rebalance off")

    def check_moves(self) -> None:
        rec = self.record()
        if len(rec.moves) == self.moves_seen:
            return
        for m in rec.moves[self.moves_seen:]:
            if not str(m.get("reason", "")).startswith("asked"):
                t = records.epoch_of(m.get("time")) or self.now
                by_price = str(m.get("reason", "")).startswith(choices.PRICE_REASON)
                # A machine's last heartbeat (progress.json, each minute) may precede its last minute of training.
                i = bisect.bisect_right(self.trained_at, t - self.config.wait_s + TICK_S + 1)
                if i < len(self.trained_at) and self.trained_at[i] <= t and not by_price:  # (12-14 weigh those)
                    self.fail(6, f"move {m['from']} -> {m['to']} at {t - START:.0f} s came less than wait_minutes "
                                 f"after a machine trained (at {self.trained_at[i] - START:.0f} s)")
                prev = [records.epoch_of(x.get("time")) for x in rec.moves[: rec.moves.index(m)]]
                if prev and prev[-1] is not None and t - prev[-1] < self.config.wait_s - 1:
                    self.fail(6, f"move {m} came {(t - prev[-1]):.0f} s after the move before it")
        self.moves_seen = len(rec.moves)

    def finish(self) -> dict:
        """The end-of-schedule checks and the schedule's figures."""
        rec = self.record()
        self.quiet = True
        events, _ = records.read_events(self.store)
        moved = [e for e in events if e.get(layout.EVENT) == layout.MOVED]
        numbers = [e["move"] for e in moved]
        if len(numbers) != len(set(numbers)):
            self.fail(6, f"a move has two moved events: {numbers}")
        for e in moved:
            m = rec.moves[e["move"] - 1] if 0 < e["move"] <= len(rec.moves) else None
            if m is None or (m["from"], m["to"]) != (e["from"], e["to"]):
                self.fail(6, f"moved event {e} matches no move of the record")
        done = [i + 1 for i, m in enumerate(rec.moves) if m.get("done") and not m.get("abandoned")]
        if sorted(set(done) - set(numbers)):
            self.fail(6, f"moves {sorted(set(done) - set(numbers))} are done without their moved event")
        if self.now >= self.deadline_or_cap() + 3 * TICK_S + self.slack() and self.any_marker() is None:
            self.fail(5, "the run is past its deadline and has no end marker")
        idle = self.idle_s
        return {"seed": self.seed, "ended": self.any_marker(), "moves": len(rec.moves), "machines": self.count,
                "idle_machine_min": round(idle / 60, 1), "ticks": self.ticks, "tick_failures": self.tick_failures,
                "events": self.events, "nodes": self.nodes, "placements": self.nplacements,
                "replaced": sum(len(v) for v in rec.hung.values()),
                "hung": sum(1 for m in self.machines if m.hang is not None), "policy": self.policy,
                "price_moves": self.price_moves}

    # -- one schedule ---------------------------------------------------------------------------

    def planting(self) -> contextlib.AbstractContextManager:
        """What the schedule runs inside: nothing here; the tests' simulator puts a fix back (its plants)."""
        return contextlib.nullcontext()

    def begin_attempt(self, m: Machine) -> None:
        """A chief took the lease: a trainer starts. The schedules number every attempt 1 (the controller reads
        its rates from one attempt's consecutive commits all the same); the replay counts them."""

    def resumed(self, m: Machine, step: int) -> None:
        """A trainer restored ``step``; the schedules write nothing for it, the replay what the trainer writes."""

    def steps_per_min(self, index: int) -> int:
        """The steps a chief trains each minute at placement ``index``."""
        return STEPS_PER_MIN

    def run(self) -> dict:
        r = self.rng
        self.at(START + r.uniform(0, 60), self.next_tick)
        for g in self.groups:
            self.at(START + r.uniform(0, 30), self.group_step, g)
        if self.cap_late is not None:
            self.at(self.cap_at + self.cap_late, self.cap_action)
        for _ in range(r.choice((0, 0, 1, 2, 4))):
            self.at(START + r.uniform(0, self.cap_s), self.operator_move)
        if r.random() < 0.15:
            self.at(START + r.uniform(0, self.cap_s), self.operator_stop)
        for _ in range(r.choice((0, 0, 1, 2))):
            self.at(START + r.uniform(0, self.cap_s), self.outside_zero)
        for i, spans in enumerate(self.outages):
            for a, _b, _k in spans:
                self.at(a, self.outage_starts, i)
        self.at(START, self.idle_meter)
        with self.planting():
            self.run_until(self.end)
        return self.finish()

    def outage_starts(self, index: int) -> None:
        """Spot capacity gone: about half the placement's machines get their notice now."""
        for m in list(self.groups[index].machines):
            if self.rng.random() < 0.5:
                self.at(self.now, self.spot_notice, m)

    def idle_meter(self) -> None:
        """Each 30 s, every machine up and not training (a non-chief trains while its chief does) is billed idle."""
        trains = {m.group.index for m in self.machines if m.alive and (
            m.training or (m.staging_until or 0.0) > self.now or m.exporting_until is not None) and m.hang is None}
        for m in self.machines:
            if not m.alive:
                continue
            if m.hang is not None:
                m.group.hung_seen_at = self.now
            if m.group.index in trains:
                m.idle_s = 0.0
                continue
            m.idle_s += 30
            self.idle_s += 30
            if self.broken_at(m.group.index, self.now):
                m.idle_s = 0.0  # billed, and reported; no controller can reach its group to stop it
            hung = m.group.hung_seen_at is not None and self.now - m.group.hung_seen_at < 2 * 3600
            # Where a machine hangs, the bound counts from the group's newest machine (a new peer is a new
            # start for all: the controller gives it its boot); else from the machine's own idle stretch.
            stretch = min(m.idle_s, self.now - m.group.joined_at) if hung else m.idle_s
            if any(x.alive and x.lease is not None and self.broken_at(x.group.index, self.now) for x in self.machines):
                m.idle_s = stretch = 0.0  # the lease, held where no controller reaches: the meter starts again
            if stretch > self.idle_bound(m) and (m.hang is not None or any(
                    self.clear_between(i, self.now - m.idle_s, self.now) for i in range(self.nplacements))):
                # (Where no placement could have launched all the machines the run waits, said by invariant 4;
                # a machine that hangs is replaced whatever the capacity: its bill stops.)
                self.fail(7, f"{m.name} has been up {stretch / 60:.0f} min without training (bound "
                             f"{self.idle_bound(m) / 60:.0f}); groups {[g.desired for g in self.groups]}, record "
                             f"active {self.record().active}")
        self.at(self.now + 30, self.idle_meter)


_CKPT = tempfile.mkdtemp(prefix="trainstack-sim-")
CKPT_DIR = os.path.join(_CKPT, "ckpt")
os.makedirs(CKPT_DIR, exist_ok=True)
with open(os.path.join(CKPT_DIR, "weights.bin"), "wb") as _f:
    _f.write(b"w" * 64)


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def shown(args: tuple) -> str:
    """An event's arguments as the trace prints them: no object's address (two replays print the same bytes)."""
    return _ADDRESS.sub("", repr(args))


