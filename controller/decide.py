"""What one tick does, decided from what it read: pure (no store, no cloud, no clock).

:func:`decide` takes the configuration, ``placement.json``'s record, what the run folder
says (:class:`RunView`) and what the active group says (:class:`GroupState`) at ``now``, and
answers one :class:`Decision`:

- ``finish``: the run has an end marker; every group goes to zero (nothing keeps billing).
- ``time_up``: the run's deadline (first start + ``maxRuntimeHours``) has passed with no end
  marker: the controller ends it ``TIMED_OUT`` and every group goes to zero. No group is sized up
  (no move, no size back) within ``LAUNCH_MARGIN_S`` of the deadline: the groups' own cap action
  counts from the stack's deployment, minutes before the first boot that wrote the deadline, and a
  machine started then would be stopped before it trained.
- ``move``: the active placement has had no training machine for ``wait_minutes`` (no
  heartbeat, no event, no live lease since) and its group reports failed launches for a
  reason another placement can fix (capacity, quota, price): the run goes to :func:`next_placement`.
- ``replace``: the active group has all its machines (``running ≥ nodes``) but the run has shown no
  progress for ``HUNG_S`` (a hung collective, a bad GPU, a bootstrap that never ends): the group is
  cycled (to zero, then back to ``nodes``: fresh machines), within the grants it already has. A
  placement whose machines were replaced once already since it became active counts as failed: the
  run moves when another placement may be tried.
- ``stay``: anything else, with the reason. A ``stay`` carries ``size``: the active group is put
  back to ``nodes`` when it stands below (a machine, a person or an earlier tick put it lower)
  while the run goes on, no ``STOP`` is asked and the deadline has not come.

A placement the run left because it could not launch is tried again only after every other
and not before ``2 × wait_minutes`` after it failed (:func:`candidates`); so is one whose own group
failed a launch for such a reason within that time (its activity, which an ``ops move`` away from it
does not erase). A placement whose group's API has failed at every tick for ``BROKEN_TICKS`` ticks
and ``BROKEN_S`` (``placement.json``'s ``broken``, :func:`is_broken`) is tried by no move until a call
to it succeeds again; an active one moves as one that cannot launch does.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.config import Config
from controller.record import Record, epoch_of, iso

FINISH, MOVE, REPLACE, STAY, TIME_UP = "finish", "move", "replace", "stay", "time_up"
# No progress (progress.json's update, a trainer event) for this long, with all the run's machines up,
# is a machine that bills without training. The machines watch themselves first (userdata/progress.sh:
# 3600 s from the trainer's start to its first progress, 1800 s between two, none while it finishes);
# this bound adds a slow boot (up to 15 min) and a margin to the longest of those, so the controller
# replaces only what the machine could not (a bootstrap that never reaches the trainer, a machine
# whose own watch died), never a machine still booting, staging, meeting its peers or exporting.
HUNG_S = 90 * 60
# After the controller cycles a group, a tick leaves it alone this long (its old machines are terminating,
# the new ones not yet seen); after that the new machines' own age counts, and a cycle a failed tick left
# undone is tried again.
REPLACED_GUARD_S = 10 * 60
# No machine is started this close to the run's deadline (see the module docstring).
LAUNCH_MARGIN_S = 15 * 60
CAPACITY, QUOTA, PRICE, OTHER = "capacity", "quota", "price", "other"
# Launch failures another placement can fix, and how the clouds say them (lower case). AWS:
# Auto Scaling's failed activities carry EC2's error code and message in StatusMessage
# (InsufficientInstanceCapacity "We currently do not have sufficient <type> capacity...",
# "There is no Spot capacity available that matches your request", UnfulfillableCapacity,
# VcpuLimitExceeded "You have requested more vCPU capacity than your current vCPU limit...",
# MaxSpotInstanceCountExceeded, SpotMaxPriceTooLow). GCP: a managed group's instance errors
# (listErrors, lastAttempt) carry ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS] ("does not have
# enough resources available", "is currently unavailable in the <zone> zone") and QUOTA_EXCEEDED.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (CAPACITY, ("insufficientinstancecapacity", "insufficientcapacity", "unfulfillablecapacity",
                "do not have sufficient", "no spot capacity", "capacity-not-available",
                "capacity-oversubscribed", "zone_resource_pool_exhausted", "does not have enough resources",
                "currently unavailable in the", "stockout")),
    (QUOTA, ("vcpulimitexceeded", "vcpu limit", "maxspotinstancecountexceeded", "max spot instance count",
             "instancelimitexceeded", "quota_exceeded", "quota '")),
    (PRICE, ("spotmaxpricetoolow", "price-too-low", "minimum required spot request fulfillment price")),
)
MOVABLE = frozenset({CAPACITY, QUOTA, PRICE})
BROKEN = "broken"  # a placement whose group's API fails at every tick (is_broken)
# A placement whose group's API failed at this many ticks in a row, over at least this long, is broken
# (a refused credential, a deleted group): a blip of the API fails a tick or two, not five over minutes.
BROKEN_TICKS = 5
BROKEN_S = 5 * 60


def failure_kind(message: str) -> str:
    """``capacity``, ``quota``, ``price`` or ``other``, from a cloud's launch failure message."""
    text = message.lower()
    for kind, needles in KINDS:
        if any(n in text for n in needles):
            return kind
    return OTHER


@dataclass(frozen=True)
class LaunchFailure:
    """One failed launch of a group: when (epoch seconds, None if unknown), the cloud's words."""

    time: float | None
    message: str

    @property
    def kind(self) -> str:
        return failure_kind(self.message)


@dataclass(frozen=True)
class GroupState:
    """A placement's group: machines running, the size asked for, failed launches since the last success."""

    running: int
    desired: int | None
    failures: tuple[LaunchFailure, ...] = ()
    launched: float | None = None
    """When its newest machine was launched (epoch seconds): AWS's activities say it; the tick also counts
    from when it first saw the running machines (``machines``) as they are now."""
    machines: tuple[str, ...] = ()
    """The running machines' ids (an instance id, a managed instance's id)."""
    error: str | None = None
    """Set when the group could not be read this tick (the cloud's error): the other fields say nothing."""

    def failed_launch_at(self, now: float, within: float) -> float | None:
        """The newest launch failure another placement could fix, if it is within ``within`` of ``now``."""
        times = [f.time for f in self.failures if f.time is not None and f.kind in MOVABLE and now - f.time < within]
        return max(times, default=None)


@dataclass(frozen=True)
class RunView:
    """What the run folder says, read by the tick: an end marker, the newest sign of a training
    machine (progress.json's ``updated``, the newest trainer event), the live lease's end, the
    newest committed step, whether ``STOP`` is asked, the run's deadline (epoch seconds, None
    while unknown) and how many attempts its events count."""

    ended: str | None = None
    heartbeat: float | None = None
    lease_until: float | None = None
    step: int | None = None
    stop: bool = False
    deadline: float | None = None
    attempts: int = 0
    progress_at: float | None = None
    """progress.json's ``updated``: the trainer's progress alone (userdata/progress.sh's signal; an event
    such as ``started`` is a sign of life, not of progress)."""
    finishing: bool = False
    """progress.json's step has reached its total: the final evaluation, commit and export, silent by design."""
    progress_step: int | None = None
    """progress.json's step (trained, not yet committed past ``step``)."""
    total: int | None = None
    """progress.json's total: the run's steps."""


@dataclass(frozen=True)
class Decision:
    """What to do: ``action`` (finish, time_up, move, stay), why, where to (for a move), and the
    size the active group is put back to (a stay whose group stands below ``nodes``)."""

    action: str
    reason: str
    to: int | None = None
    size: int | None = None
    stuck: str | None = None
    """Set when the run cannot train anywhere now: a key for what holds it (the reason says it)."""


def is_broken(record: Record, index: int, now: float) -> bool:
    """Whether placement ``index``'s group's API has failed at ``BROKEN_TICKS`` ticks in a row over ``BROKEN_S``."""
    entry = record.broken.get(str(index))
    if not entry:
        return False
    first = entry.get("first")
    return (int(entry.get("ticks") or 0) >= BROKEN_TICKS
            and isinstance(first, int | float) and now - first >= BROKEN_S)


def candidates(config: Config, record: Record, now: float, launch_failed: dict[int, float] | None = None) -> list[int]:
    """Placements the run may go to now, best first: never failed ones in order after the active
    one, then failed ones (oldest failure first) once ``2 × wait_minutes`` have passed since.

    A placement failed when the run left it because it could not launch (``record.failed_at``) or when
    its own group's launches failed for such a reason (``launch_failed``: the newest failure's time, as
    its activity says), whichever is newer; a broken one (:func:`is_broken`) is no candidate."""
    n = len(config.placements)
    order = [(record.active + k) % n for k in range(1, n) if not is_broken(record, (record.active + k) % n, now)]
    failed = {i: max(t for t in (record.failed_at.get(str(i)), (launch_failed or {}).get(i)) if t is not None)
              for i in order if str(i) in record.failed_at or (launch_failed or {}).get(i) is not None}
    fresh = [i for i in order if i not in failed]
    again = sorted((i for i in order if i in failed and now - failed[i] >= 2 * config.wait_s), key=lambda i: failed[i])
    return fresh + again


def last_sign(run: RunView, record: Record, group: GroupState) -> float | None:
    """The newest sign of a training machine in the active placement (or of it becoming active);
    without any, the oldest launch failure (the group has been trying since then), or when its group
    has not answered since (``record.broken``)."""
    signs = [t for t in (run.heartbeat, run.lease_until, epoch_of(record.since)) if t is not None]
    if signs:
        return max(signs)
    times = [f.time for f in group.failures if f.time is not None]
    first = (record.broken.get(str(record.active)) or {}).get("first")
    if isinstance(first, int | float):
        times.append(first)
    return min(times) if times else None


def replaced_here(record: Record) -> list[float]:
    """When the controller replaced the active placement's machines since it became active."""
    since = epoch_of(record.since) or 0.0
    return [t for t in record.hung.get(str(record.active), []) if t >= since]


def _hung(config: Config, record: Record, run: RunView, group: GroupState, now: float, active,
          launch_failed: dict[int, float] | None) -> Decision | None:
    """A ``replace`` (or a move) when all the run's machines are up and the run has shown no progress for
    ``HUNG_S``; None otherwise. The newest of: progress (progress.json), the placement becoming active, its
    newest machine's launch (or first sight) or failed launch; none within ``REPLACED_GUARD_S`` of a replacement."""
    if run.stop or run.finishing or not may_launch(run, now):
        return None
    if any(now - t < REPLACED_GUARD_S for t in record.hung.get(str(record.active), [])):
        return None
    signs = [run.progress_at, epoch_of(record.since), group.launched, *(f.time for f in group.failures)]
    known = [t for t in signs if t is not None]
    if not known or now - max(known) < HUNG_S:
        return None
    quiet = (now - max(known)) / 60
    why = (f"{active.label}: {group.running} machine(s) running but no progress for {quiet:.0f} min "
           f"(bound {HUNG_S // 60} min)")
    if replaced_here(record):
        options = candidates(config, record, now, launch_failed)
        if options:
            return Decision(MOVE, f"{why}, again after its machines were replaced: it counts as failed", to=options[0])
        return Decision(REPLACE, f"{why}, again after its machines were replaced, and no other placement may be "
                                 "tried yet: its machines are replaced again", stuck=f"{record.active}:hung:nowhere")
    return Decision(REPLACE, f"{why}: its machines are replaced (the group to zero, then back to {config.nodes})")


def decide(config: Config, record: Record, run: RunView, group: GroupState, now: float,
           launch_failed: dict[int, float] | None = None) -> Decision:
    """One tick's decision (module docstring); ``launch_failed``: the other groups' newest launch
    failures another placement could fix (:func:`candidates`), where the caller read them."""
    if run.ended:
        return Decision(FINISH, f"the run ended ({run.ended}): every group goes to zero")
    if run.deadline is not None and now >= run.deadline:
        return Decision(TIME_UP, time_up_reason(run.deadline))
    active = config.placements[record.active] if record.active < len(config.placements) else None
    if active is None:
        return Decision(STAY, f"placement.json names placement {record.active}, which the stack does not have")
    if not may_launch(run, now):
        return Decision(STAY, f"the run's deadline ({iso(run.deadline)}) is less than {LAUNCH_MARGIN_S // 60} min "
                              "away: no machine is started any more")
    decision = _stay_or_move(config, record, run, group, now, active, launch_failed)
    if (decision.action == STAY and not run.stop and group.desired is not None
            and group.desired < config.nodes):
        return Decision(STAY, f"{decision.reason}; its group stood at {group.desired} of {config.nodes}: "
                              f"sized back to {config.nodes}", size=config.nodes, stuck=decision.stuck)
    return decision


def time_up_reason(deadline: float) -> str:
    """Why a run past its deadline is ended ``TIMED_OUT`` (the marker's reason)."""
    return f"the run's deadline ({iso(deadline)}, its first start + maxRuntimeHours) passed and no machine ended it"


def may_launch(run: RunView, now: float) -> bool:
    """Whether a group may be sized up at ``now``: before ``LAUNCH_MARGIN_S`` ahead of the deadline."""
    return run.deadline is None or now < run.deadline - LAUNCH_MARGIN_S


def _stay_or_move(config: Config, record: Record, run: RunView, group: GroupState, now: float,
                  active, launch_failed: dict[int, float] | None) -> Decision:
    broken = is_broken(record, record.active, now)
    if group.error is None and group.running >= config.nodes:
        return _hung(config, record, run, group, now, active, launch_failed) or Decision(
            STAY, f"{active.label}: {group.running} machine(s) running")
    since = last_sign(run, record, group)
    if since is None:
        return Decision(STAY, f"{active.label}: no machine yet and no failed launch" if group.error is None else
                              f"{active.label}: its group could not be read: {group.error}")
    idle = now - since
    if idle < config.wait_s:
        return Decision(STAY, f"{active.label}: last sign of a training machine {idle / 60:.0f} min ago "
                              f"(moves after {config.wait_minutes} min without one)")
    if broken:
        kind, why = BROKEN, f"its group's API has failed at every tick: {record.broken[str(record.active)].get('error')}"
    elif group.error is not None:
        return Decision(STAY, f"{active.label}: no training machine for {idle / 60:.0f} min, and its group could "
                              f"not be read: {group.error}")
    else:
        recent = [f for f in group.failures if f.time is None or f.time >= since - 1]
        movable = [f for f in recent if f.kind in MOVABLE]
        if not movable:
            why = f"its launches fail for another reason: {recent[0].message}" if recent else "no failed launch"
            return Decision(STAY, f"{active.label}: no training machine for {idle / 60:.0f} min, but {why}",
                            stuck=f"{record.active}:other" if recent else None)
        kind, why = movable[0].kind, f"its group cannot launch ({movable[0].kind}): {movable[0].message}"
    options = candidates(config, record, now, launch_failed)
    if not options:
        return Decision(STAY, f"{active.label}: {why}; no other placement may be tried yet (a failed one waits "
                              f"{2 * config.wait_minutes} min, a broken one until its API answers)",
                        stuck=f"{record.active}:{kind}:nowhere")
    to = options[0]
    return Decision(MOVE, f"no training machine in {active.label} for {idle / 60:.0f} min; {why}", to=to)
