"""Where a run stands, decided from what its folder holds: ``RunFacts`` in, ``RunStatus`` out.

``classify(facts, now)`` is pure: no store, no clock, no terminal. ``ops status`` reads the
facts from the bucket (``ops/status.py``), classifies them here, and renders the result;
``ops runs`` and ``ops stop`` read the same states. The rules for each state (the stall
bounds, a preemption, a local run that stopped) are here and nowhere else.

States: ``NOT STARTED`` (nothing written yet), ``RUNNING``, ``STALLED`` (the trainer's
heartbeat stopped: its process died or hangs, and nothing explains it), ``PREEMPTED``
(the last attempt stopped on a spot notice; waiting for the group to bring a machine
back), ``STOPPED`` (a local run that is not running: run the same command to resume), and
the end markers ``COMPLETE``, ``CANCELLED``, ``FAILED``, ``TIMED_OUT``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime

from runfolder import layout

NOT_STARTED = "NOT STARTED"
RUNNING = "RUNNING"
STALLED = "STALLED"
PREEMPTED = "PREEMPTED"
STOPPED = "STOPPED"
# The end markers are states of their own; exactly one ends a run.
FINAL_STATES = frozenset(layout.END_MARKERS)
FAILING_STATES = layout.FAILING_MARKERS
# A heartbeat older than this many intervals (and at least STALL_MIN_S) is a stall: the
# trainer rewrites progress.json every `progress_every_seconds` while it trains.
STALL_INTERVALS = 6
STALL_MIN_S = 120.0
# Phases with no heartbeat by design get longer: an attempt's start (staging data from
# the bucket, building the model) until its first progress, and the model export after
# `finished`.
QUIET_PHASE_S = 1800.0
DEFAULT_PROGRESS_EVERY_S = 10.0
DEFAULT_EVENTS = 6
RESUME_LOCAL = "stopped: run the same command to resume"
NO_SCRIPT_MODEL = "the script saved no model in fit.model_dir()"


@dataclass(frozen=True)
class RunFacts:
    """What a run's folder holds, read once (``ops.status.read_facts``): the input of :func:`classify`."""

    run_uri: str
    # events.jsonl, in its order.
    trainer_events: list[dict] = field(default_factory=list)
    # Every machine's and non-chief worker's events, each writer's in its order.
    machine_events: list[dict] = field(default_factory=list)
    # progress.json: None when absent, {} when unreadable.
    progress: dict | None = None
    # The newest committed checkpoint's step and its COMMITTED marker ({} when unreadable).
    checkpoint_step: int | None = None
    checkpoint_marker: dict = field(default_factory=dict)
    # The first end marker present (layout.END_MARKERS order) and its body ({} when unreadable).
    end_marker: str | None = None
    end: dict | None = None
    # When the run's first machine wrote the `deadline` object (its first boot), and when each decision table
    # was made (their keys say): the boots that goodput counts (runfolder.goodput).
    first_boot: float | None = None
    decision_times: tuple[float, ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing the trainer or the machines write is there (the run may not have started)."""
        return (self.end_marker is None and not self.trainer_events and not self.machine_events
                and self.progress is None and self.checkpoint_step is None)


@dataclass
class Checkpoint:
    """The newest committed checkpoint."""

    step: int
    created: str | None
    age_seconds: float | None


@dataclass
class RunStatus:
    """Where a run stands (what ``--json`` prints)."""

    run_uri: str
    state: str
    detail: str = ""
    step: int | None = None
    total: int | None = None
    loss: float | None = None
    # The script's own metrics (script mode: Keras's logs, e.g. accuracy, val_loss), newest first
    # from COMPLETE, else progress.json.
    metrics: dict = field(default_factory=dict)
    # The trainer's own loop: the step of the newest evaluation (its val_… are in `metrics`), the
    # seconds all evaluations took, and the best by --keep-best ({metric, mode, step, value}).
    evaluated_step: int | None = None
    eval_seconds: float | None = None
    best: dict | None = None
    examples_per_sec: float | None = None
    eta_seconds: float | None = None
    progress_updated: str | None = None
    progress_age_seconds: float | None = None
    heartbeat_age_seconds: float | None = None
    attempts: int = 0
    preemptions: int = 0
    spot_notices: int = 0
    checkpoint: Checkpoint | None = None
    end: dict | None = None
    events: list[dict] = field(default_factory=list)
    checked_at: str = ""
    # With --stack (and credentials): the group's machines and its latest failed launches.
    machines_running: int | None = None
    machines_desired: int | None = None
    launch_failures: list[str] = field(default_factory=list)
    # The placement controller's word that the run cannot train anywhere now (its newest `waiting`
    # event, while no machine has trained and no move came since), else "".
    waiting: str = ""
    group_note: str = ""
    # A managed scheduler's run (scheduler.json): its job as the service reports it (schedulers.JobState), or
    # why it could not be read.
    scheduler: dict | None = None
    job: object | None = None
    job_note: str = ""
    # A Job stack's (scheduler kubernetes, with --stack) Job as its cluster reports it (ops/kube.py JobView), or
    # why it was not read.
    kube_job: object | None = None
    kube_note: str = ""
    # Machine time (every attempt's start to its end, x nodes) and its cost at the price the
    # stack gave the machines (runfolder.cost); cost_note says what the price is (an estimate).
    machine_hours: float | None = None
    cost_usd: float | None = None
    cost_note: str = ""
    # The same per placement ('<cloud> <region>' as each attempt recorded it), in the order the
    # run first used them: [{placement, attempts, machine_hours, cost_usd}].
    placement_costs: list[dict] = field(default_factory=list)
    # Several placements: placement.json as the controller wrote it (active, since, moves), None
    # for a stack of one placement (ops/status.py reads it).
    placement: dict | None = None
    # The share of paid machine time that produced kept steps, with the boots, waits and lost steps against
    # it (runfolder.goodput's Goodput.to_json), None before any attempt.
    goodput: dict | None = None
    # The placement controller's newest decision table (decisions/<time>.json, controller/table.py), when
    # ops status reads it; None when the run folder has none.
    decision: dict | None = None

    @property
    def final(self) -> bool:
        """The run has ended (one of the end markers exists)."""
        return self.state in FINAL_STATES

    def to_json(self) -> dict:
        """A plain dict for ``json.dumps`` (a managed job's with its managed-spot saving)."""
        out = asdict(self)
        if out.get("job") is not None:
            out["job"]["saving"] = self.job.saving
        if self.kube_job is not None:
            out["kube_job"] = self.kube_job.to_json()
        return out


def stamp(text) -> float | None:
    """An ISO 8601 time as written in the run folder, as epoch seconds; None for anything else."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _age(when: str | None, now: float) -> float | None:
    t = stamp(when)
    return None if t is None else round(max(0.0, now - t), 1)


def duration(seconds: float | None) -> str:
    """A span of seconds for people: ``42s``, ``3m 05s``, ``2h 07m``, ``1d 03h``; ``-`` for none."""
    if seconds is None or not math.isfinite(seconds):  # an ETA from a NaN rate in a damaged progress.json
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def merge_events(trainer_events: list[dict], machine_events: list[dict]) -> list[dict]:
    """One timeline: the trainer's events and the machines', ordered by time (stable)."""
    merged = [*trainer_events, *machine_events]
    order = {id(e): i for i, e in enumerate(merged)}
    return sorted(merged, key=lambda e: (stamp(e.get(layout.TIME)) or 0.0, order[id(e)]))


def _brief(ev: dict) -> dict:
    """An event without its bulky fields (the full config of `started`)."""
    return {k: v for k, v in ev.items() if k != "config"}


def _number(doc: dict, key: str) -> float | None:
    v = doc.get(key)
    if not isinstance(v, int | float) or isinstance(v, bool):
        return None
    try:
        return float(v)
    except OverflowError:  # an integer no float holds: not a figure the trainer wrote
        return None


def _metrics(doc: dict | None) -> dict:
    """The numeric `metrics` of a progress.json or COMPLETE document."""
    found = (doc or {}).get("metrics")
    if not isinstance(found, dict):
        return {}
    return {str(k): float(v) for k, v in found.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _best(doc: dict | None) -> dict | None:
    """The `best` of a progress.json or COMPLETE document, when well-formed."""
    found = (doc or {}).get("best")
    if not isinstance(found, dict) or not isinstance(found.get("metric"), str) or not isinstance(found.get("step"), int):
        return None
    value = _number(found, "value")
    if value is None:
        return None
    best = {"metric": found["metric"], "mode": str(found.get("mode", "")), "step": found["step"], "value": value}
    if isinstance(found.get("exported"), bool):
        best["exported"] = found["exported"]
    return best


def is_local(run_uri: str) -> bool:
    """A run on this computer (``file://``): nothing restarts it and nothing bills it."""
    return run_uri.startswith("file://")


def _progress_every(starts: list[dict]) -> float:
    """The heartbeat interval the last attempt was started with."""
    for e in reversed(starts):
        cfg = e.get("config")
        if isinstance(cfg, dict):
            v = _number(cfg, "progress_every_seconds")
            if v and v > 0:
                return v
    return DEFAULT_PROGRESS_EVERY_S


def stall_after(progress_every_s: float) -> float:
    """Seconds without a heartbeat after which a running trainer counts as stalled."""
    return max(STALL_INTERVALS * progress_every_s, STALL_MIN_S)


def _checkpoint(facts: RunFacts, now: float) -> Checkpoint | None:
    if facts.checkpoint_step is None:
        return None
    marker = facts.checkpoint_marker
    created = marker.get("created") if isinstance(marker.get("created"), str) else None
    return Checkpoint(step=facts.checkpoint_step, created=created, age_seconds=_age(created, now))


def _controller_waiting(log: list[dict], trainer_log: list[dict], progress_updated: str | None) -> str:
    """The reason of the controller's newest ``waiting`` event, unless a machine trained or the run
    moved after it."""
    waits = [e for e in log if e.get(layout.EVENT) == layout.CONTROLLER_WAITING]
    if not waits:
        return ""
    when = stamp(waits[-1].get(layout.TIME))
    later = [stamp(e.get(layout.TIME)) for e in log if e.get(layout.EVENT) == layout.MOVED]
    later += [stamp(e.get(layout.TIME)) for e in trainer_log[-1:]] + [stamp(progress_updated)]
    if when is None or any(t is not None and t >= when for t in later):
        return ""
    return str(waits[-1].get("reason") or "")


def classify(facts: RunFacts, now: float, *, events: int = DEFAULT_EVENTS) -> RunStatus:
    """Say where the run stands at ``now`` (epoch seconds) from what its folder holds.

    ``events``: how many recent events (the trainer's and the machines', in time order)
    to include. Pure: the same facts and time give the same answer.
    """
    run_uri = facts.run_uri
    st = RunStatus(run_uri=run_uri, state=NOT_STARTED, checked_at=datetime.fromtimestamp(now).astimezone().isoformat(
        timespec="seconds"))

    trainer_log = facts.trainer_events
    log = merge_events(trainer_log, facts.machine_events)
    progress = facts.progress
    st.events = [_brief(e) for e in log[-events:]] if events > 0 else []
    starts = [e for e in trainer_log if e.get(layout.EVENT) == layout.STARTED]
    st.attempts = layout.attempts(trainer_log)
    st.preemptions = sum(1 for e in trainer_log if e.get(layout.EVENT) == layout.PREEMPTED)
    st.spot_notices = sum(1 for e in log if e.get(layout.EVENT) == layout.SPOT_NOTICE)
    st.checkpoint = _checkpoint(facts, now)
    _read_progress(st, progress, starts, now)

    if facts.end_marker is not None:
        _ended(st, facts, log)
        return st

    st.waiting = _controller_waiting(log, trainer_log, st.progress_updated)
    if not log and progress is None and st.checkpoint is None:
        st.detail = "nothing written yet: the machine may still be booting or waiting for spot capacity"
        return st

    st.state = RUNNING
    # A run that has not ended counts its newest attempt up to now (a stalled or preempted
    # machine may still be billing; a gone one's group brings another).
    _add_cost(st, log, now=None if is_local(run_uri) else now)
    _add_goodput(st, facts, log, now=None if is_local(run_uri) else now)
    _running(st, log, trainer_log, starts, now)
    return st


def _read_progress(st: RunStatus, progress: dict | None, starts: list[dict], now: float) -> None:
    """Fill the step, total, loss and metrics from progress.json, the newest checkpoint and the
    attempts' configs, in that order of trust."""
    if progress:
        st.step = int(progress["step"]) if isinstance(progress.get("step"), int) else None
        st.total = int(progress["total"]) if isinstance(progress.get("total"), int) else None
        st.loss = _number(progress, "loss")
        st.examples_per_sec = _number(progress, "examples_per_sec")
        st.metrics = _metrics(progress)
        st.evaluated_step = progress["evaluated_step"] if isinstance(progress.get("evaluated_step"), int) else None
        st.eval_seconds = _number(progress, "eval_seconds")
        st.best = _best(progress)
        st.progress_updated = progress.get("updated") if isinstance(progress.get("updated"), str) else None
        st.progress_age_seconds = _age(st.progress_updated, now)
    if st.step is None and st.checkpoint is not None:
        st.step = st.checkpoint.step
    if st.total is None:
        for e in reversed(starts):
            steps = (e.get("config") or {}).get("steps") if isinstance(e.get("config"), dict) else None
            if isinstance(steps, int):
                st.total = steps
                break


def _ended(st: RunStatus, facts: RunFacts, log: list[dict]) -> None:
    """A run with an end marker: its state, cost, last step and what it left behind."""
    marker, doc = facts.end_marker, facts.end or {}
    st.state, st.end = marker, facts.end
    ended = stamp(doc.get("finished_at")) or stamp(doc.get(layout.TIME))
    _add_cost(st, log, end=ended)
    _add_goodput(st, facts, log, end=ended)
    step = doc.get(layout.MARKER_STEP)
    if isinstance(step, int) and step >= 0:
        st.step = step
    if marker == layout.COMPLETE:
        st.metrics = _metrics(doc) or st.metrics
        st.best = _best(doc) or st.best
        st.eval_seconds = _number(doc, "eval_seconds") if "eval_seconds" in doc else st.eval_seconds
        st.detail = f"model in {facts.run_uri.rstrip('/')}/{layout.MODEL_PREFIX}"
        if doc.get("model_files") == 0:
            # A script that exited 0 without saving into fit.model_dir(): say so, and where its model went.
            st.detail = str(doc.get("model_note") or NO_SCRIPT_MODEL)
        elif doc.get("model_note"):
            st.detail += f" ({doc['model_note']})"
    elif marker == layout.CANCELLED:
        reason = doc.get(layout.MARKER_REASON)
        st.detail = f"stopped on request at step {st.step}" + (f" ({reason})" if reason else "")
    else:
        st.detail = str(doc.get(layout.MARKER_REASON) or "")


def _running(st: RunStatus, log: list[dict], trainer_log: list[dict], starts: list[dict], now: float) -> None:
    """A run that has not ended: its heartbeat, whether it is silent, what its newest lifecycle
    event says, and its time left."""
    run_uri = st.run_uri
    last = next((e for e in reversed(trainer_log) if e.get(layout.EVENT) in layout.LIFECYCLE), None)
    kind = last.get(layout.EVENT) if last else None
    # The trainer's heartbeat: its newest progress.json or event, whichever is later.
    beats = [t for t in (stamp(st.progress_updated), *(stamp(e.get(layout.TIME)) for e in trainer_log[-1:]))
             if t is not None]
    st.heartbeat_age_seconds = round(max(0.0, now - max(beats)), 1) if beats else None
    limit = stall_after(_progress_every(starts))
    last_at = stamp(last.get(layout.TIME)) if last else None
    progress_at = stamp(st.progress_updated)
    starting = kind in (layout.STARTED, layout.RESUMED) and (progress_at is None or (
        last_at is not None and progress_at < last_at))
    if starting or kind == layout.FINISHED:
        limit = max(limit, QUIET_PHASE_S)
    silent = st.heartbeat_age_seconds is not None and st.heartbeat_age_seconds > limit
    notice = next((e for e in reversed(log) if e.get(layout.EVENT) in (layout.SPOT_NOTICE, *layout.LIFECYCLE)), None)
    if kind == layout.PREEMPTED:
        if isinstance(last.get("step"), int) and not isinstance(last.get("step"), bool):
            # Where the run resumes (the stop's commit), not progress.json's last heartbeat: one step
            # for the bar and the words.
            st.step = last["step"]
        if is_local(run_uri):
            st.state, st.detail = STOPPED, f"{RESUME_LOCAL} (stopped at step {st.step})"
        else:
            st.state = PREEMPTED
            st.detail = f"stopped at step {st.step}; waiting for the group to start a machine"
    elif is_local(run_uri) and silent:
        # Nothing restarts a local run: a silent one was killed or its machine slept.
        st.state, st.detail = STOPPED, f"{RESUME_LOCAL} (no heartbeat for {duration(st.heartbeat_age_seconds)})"
    elif kind == layout.FAILED_EVENT and is_local(run_uri):
        # No machine retries a local run.
        st.state = STOPPED
        st.detail = (f"attempt {last.get(layout.ATTEMPT)} failed ({last.get('reason')}); fix the cause and "
                     "run the same command to resume from the newest checkpoint")
    elif kind == layout.FAILED_EVENT and not silent:
        st.detail = f"attempt {last.get(layout.ATTEMPT)} failed ({last.get('reason')}); the machine retries"
    elif notice is not None and notice.get(layout.EVENT) == layout.SPOT_NOTICE:
        if not silent:
            st.detail = "spot notice received: checkpointing before the machine is taken back"
        else:
            # Taken before the trainer could say so: the group brings a machine back.
            st.state = PREEMPTED
            st.detail = (f"the machine was taken after a spot notice at {str(notice.get(layout.TIME))[11:19]}; "
                         "waiting for the group to start a machine")
    elif silent:
        st.state = STALLED
        # `last` is None for a run with a heartbeat but no lifecycle event yet (events.jsonl lost or not written).
        if kind == layout.FAILED_EVENT and last is not None:
            what = f"after attempt {last.get(layout.ATTEMPT)} failed ({last.get('reason')})"
        elif kind == layout.FINISHED:
            what = "after training finished, before the model was written"
        else:
            what = "while starting" if starting else "while training"
        st.detail = (f"no heartbeat for {duration(st.heartbeat_age_seconds)} {what} (expected every "
                     f"{duration(_progress_every(starts))}): the trainer died or hangs; see `ops logs`")
    elif kind == layout.FINISHED:
        st.detail = "training finished; writing the model"
    elif starting:
        st.detail = f"attempt {last.get(layout.ATTEMPT)} starting: staging data, building the model"
    _waiting_for_machines(st, log, last_at)
    if st.state == RUNNING and st.step is not None and st.total and st.examples_per_sec:
        batch = next((e.get("global_batch") for e in reversed(trainer_log) if isinstance(e.get("global_batch"), int)),
                     None)
        if batch:
            st.eta_seconds = round(max(0, st.total - st.step) * batch / st.examples_per_sec, 1)


def _waiting_for_machines(st: RunStatus, log: list[dict], last_at: float | None) -> None:
    """Machines of several waiting for the others (a lost one not replaced yet) since after the
    trainer's last lifecycle event: say so, and when the run gives up (userdata/rendezvous.sh)."""
    wait = next((e for e in reversed(log) if e.get(layout.EVENT) in (layout.WAITING_FOR_MACHINES, *layout.LIFECYCLE)),
                None)
    if wait is None or wait.get(layout.EVENT) != layout.WAITING_FOR_MACHINES:
        return
    at = stamp(wait.get(layout.TIME))
    if at is None or (last_at is not None and at < last_at):
        return
    # No trainer runs while they wait: no heartbeat is expected, so this is no stall.
    if st.state == STALLED:
        st.state = PREEMPTED
    until = str(wait.get("until") or "")
    st.detail = (f"waiting for the other machines: {wait.get('came')} of {wait.get('nodes')} came to generation "
                 f"{wait.get('generation')} (since {str(wait.get('since') or '')[11:19]} UTC); the run ends FAILED "
                 f"at {until[11:19] or '?'} UTC unless the group brings the rest (TRAINSTACK_PEER_WAIT_S)")


def _add_cost(st: RunStatus, log: list[dict], *, now: float | None = None, end: float | None = None) -> None:
    from runfolder import cost

    total = cost.run_cost(log, now=now, end=end)
    if total is not None and total.cost_usd is None and is_local(st.run_uri):
        return  # a run on this computer, started without a price: nothing to bill
    if total is not None:
        st.machine_hours = round(total.machine_hours, 4)
        st.cost_usd = None if total.cost_usd is None else round(total.cost_usd, 2)
        st.cost_note = total.price_note
        if total.unpriced and total.cost_usd is not None:
            st.cost_note = f"{total.unpriced} of {total.attempts} attempts without a price; " + st.cost_note
        st.placement_costs = [p.to_json() for p in total.placements]


def _add_goodput(st: RunStatus, facts: RunFacts, log: list[dict], *, now: float | None = None,
                 end: float | None = None) -> None:
    from runfolder import goodput

    found = goodput.goodput(log, now=now, end=end, first_boot=facts.first_boot, launched_after=facts.decision_times,
                            completed=facts.end_marker == layout.COMPLETE)
    st.goodput = None if found is None else found.to_json()
    if st.goodput is not None and is_local(st.run_uri):
        st.goodput["notes"] = []  # no machine boots for a run on this computer
