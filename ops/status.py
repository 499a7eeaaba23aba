"""`ops status`: where a training run stands, read from its folder in the bucket.

Everything comes from the run's contract files (`trainer/layout.py` names them): the end
markers (``COMPLETE``, ``CANCELLED``, ``FAILED``, ``TIMED_OUT``), ``progress.json`` (the
trainer's heartbeat, rewritten every ``progress_every_seconds`` while it trains), the
trainer's ``events.jsonl``, every machine's ``machine-events/<machine>.jsonl`` and the
``COMMITTED`` markers of the checkpoints. Nothing is asked of the machines, so it works
while they are preempted, after they are gone, and from any laptop with read access to
the bucket.

States: ``NOT STARTED`` (nothing written yet), ``RUNNING``, ``STALLED`` (the trainer's
heartbeat stopped: its process died or hangs, and nothing explains it), ``PREEMPTED``
(the last attempt stopped on a spot notice; waiting for the group to bring a machine
back), ``STOPPED`` (a local run that is not running: run the same command to resume),
``COMPLETE``, ``CANCELLED``, ``FAILED``, ``TIMED_OUT``. Exit status: 0; 1 for FAILED /
TIMED_OUT; 2 when there is no run at the URI or it cannot be read; 3 for STALLED.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime

from trainer import layout
from trainer.events import read_jsonl

NOT_STARTED = "NOT STARTED"
RUNNING = "RUNNING"
STALLED = "STALLED"
PREEMPTED = "PREEMPTED"
STOPPED = "STOPPED"
# The end markers are states of their own; exactly one ends a run.
FINAL_STATES = frozenset(layout.END_MARKERS)
FAILING_STATES = layout.FAILING_MARKERS
# States a watch cannot wait out: the run ended, or needs someone to look at it (a stall
# nothing explains) or to start it again (a local run).
WATCH_ENDS = FINAL_STATES | {STALLED, STOPPED}
EXIT_STALLED = 3
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
DEFAULT_INTERVAL_S = 5.0
STYLES = {
    NOT_STARTED: "dim",
    RUNNING: "bold cyan",
    STALLED: "bold magenta",
    PREEMPTED: "bold yellow",
    STOPPED: "bold yellow",
    layout.COMPLETE: "bold green",
    layout.CANCELLED: "bold yellow",
    layout.FAILED: "bold red",
    layout.TIMED_OUT: "bold red",
}
RESUME_LOCAL = "stopped: run the same command to resume"


class NoRun(Exception):
    """Nothing is stored at the run URI."""


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
    group_note: str = ""
    # Machine time (every attempt's start to its end, x nodes) and its cost at the price the
    # stack gave the machines (trainer.cost); cost_note says what the price is (an estimate).
    machine_hours: float | None = None
    cost_usd: float | None = None
    cost_note: str = ""

    @property
    def final(self) -> bool:
        """The run has ended (one of the end markers exists)."""
        return self.state in FINAL_STATES

    def to_json(self) -> dict:
        """A plain dict for ``json.dumps``."""
        return asdict(self)


def _stamp(text) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _age(stamp: str | None, now: float) -> float | None:
    t = _stamp(stamp)
    return None if t is None else round(max(0.0, now - t), 1)


def _json_doc(store, key: str) -> dict | None:
    """A small JSON object from the store; ``None`` if absent; ``{}`` if present but unreadable."""
    from trainer.storage import NotFound

    try:
        raw = store.get_bytes(key)
    except NotFound:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def read_machine_events(store) -> list[dict]:
    """Every machine's own events (``machine-events/<machine>.jsonl``) and every non-chief worker's
    (``worker-events/<address>.jsonl``: its ``failed`` events), each writer's in its order."""
    out = []
    for prefix in (layout.MACHINE_EVENTS_PREFIX, layout.WORKER_EVENTS_PREFIX):
        for key in store.list(prefix):
            if key.endswith(".jsonl"):
                out.extend(read_jsonl(store, key))
    return out


def merge_events(trainer_events: list[dict], machine_events: list[dict]) -> list[dict]:
    """One timeline: the trainer's events and the machines', ordered by time (stable)."""
    merged = [*trainer_events, *machine_events]
    order = {id(e): i for i, e in enumerate(merged)}
    return sorted(merged, key=lambda e: (_stamp(e.get(layout.TIME)) or 0.0, order[id(e)]))


def _newest_checkpoint(store, now: float) -> Checkpoint | None:
    from trainer.checkpoints import CheckpointStore

    steps = CheckpointStore(store).committed_steps()
    if not steps:
        return None
    step = steps[-1]
    marker = _json_doc(store, layout.committed_key(step)) or {}
    created = marker.get("created") if isinstance(marker.get("created"), str) else None
    return Checkpoint(step=step, created=created, age_seconds=_age(created, now))


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


def _is_local(run_uri: str) -> bool:
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


def read_status(run_uri: str, *, store=None, now: float | None = None, events: int = DEFAULT_EVENTS,
                must_exist: bool = False) -> RunStatus:
    """Read the run at ``run_uri`` and say where it stands.

    ``store``: the run's already opened store (a watch reuses one; opening an S3 client
    costs most of a second); ``events``: how many recent events to include;
    ``must_exist``: raise :class:`NoRun` when nothing at all is stored at the URI (a URI
    given by hand; a stack's run may not have been written yet while its machine boots).
    """
    from trainer.storage import open_store

    now = time.time() if now is None else now
    store = open_store(run_uri) if store is None else store
    st = RunStatus(run_uri=run_uri, state=NOT_STARTED, checked_at=datetime.fromtimestamp(now).astimezone().isoformat(
        timespec="seconds"))

    trainer_log = read_jsonl(store, layout.EVENTS_KEY)
    log = merge_events(trainer_log, read_machine_events(store))
    progress = _json_doc(store, layout.PROGRESS_KEY)
    st.events = [_brief(e) for e in log[-events:]] if events > 0 else []
    starts = [e for e in trainer_log if e.get(layout.EVENT) == layout.STARTED]
    st.attempts = layout.attempts(trainer_log)
    st.preemptions = sum(1 for e in trainer_log if e.get(layout.EVENT) == layout.PREEMPTED)
    st.spot_notices = sum(1 for e in log if e.get(layout.EVENT) == layout.SPOT_NOTICE)
    st.checkpoint = _newest_checkpoint(store, now)

    if progress:
        st.step = int(progress["step"]) if isinstance(progress.get("step"), int) else None
        st.total = int(progress["total"]) if isinstance(progress.get("total"), int) else None
        st.loss = _number(progress, "loss")
        st.examples_per_sec = _number(progress, "examples_per_sec")
        st.metrics = _metrics(progress)
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

    for marker in layout.END_MARKERS:
        doc = _json_doc(store, marker)
        if doc is not None:
            st.state, st.end = marker, doc
            ended = _stamp(doc.get("finished_at")) or _stamp(doc.get(layout.TIME))
            _add_cost(st, log, end=ended)
            step = doc.get(layout.MARKER_STEP)
            if isinstance(step, int) and step >= 0:
                st.step = step
            if marker == layout.COMPLETE:
                st.metrics = _metrics(doc) or st.metrics
                st.detail = f"model in {run_uri.rstrip('/')}/{layout.MODEL_PREFIX}"
            elif marker == layout.CANCELLED:
                reason = doc.get(layout.MARKER_REASON)
                st.detail = f"stopped on request at step {st.step}" + (f" ({reason})" if reason else "")
            else:
                st.detail = str(doc.get(layout.MARKER_REASON) or "")
            return st

    if not log and progress is None and st.checkpoint is None:
        if must_exist and not store.list(""):
            raise NoRun(f"no run at {run_uri}: nothing is stored there (check the URI, or give --stack "
                        "for a stack whose machine is still booting)")
        st.detail = "nothing written yet: the machine may still be booting or waiting for spot capacity"
        return st

    st.state = RUNNING
    # A run that has not ended counts its newest attempt up to now (a stalled or preempted
    # machine may still be billing; a gone one's group brings another).
    _add_cost(st, log, now=None if _is_local(run_uri) else now)
    last = next((e for e in reversed(trainer_log) if e.get(layout.EVENT) in layout.LIFECYCLE), None)
    kind = last.get(layout.EVENT) if last else None
    # The trainer's heartbeat: its newest progress.json or event, whichever is later.
    beats = [t for t in (_stamp(st.progress_updated), *(_stamp(e.get(layout.TIME)) for e in trainer_log[-1:]))
             if t is not None]
    st.heartbeat_age_seconds = round(max(0.0, now - max(beats)), 1) if beats else None
    limit = stall_after(_progress_every(starts))
    last_at = _stamp(last.get(layout.TIME)) if last else None
    progress_at = _stamp(st.progress_updated)
    starting = kind in (layout.STARTED, layout.RESUMED) and (progress_at is None or (
        last_at is not None and progress_at < last_at))
    if starting or kind == layout.FINISHED:
        limit = max(limit, QUIET_PHASE_S)
    silent = st.heartbeat_age_seconds is not None and st.heartbeat_age_seconds > limit
    notice = next((e for e in reversed(log) if e.get(layout.EVENT) in (layout.SPOT_NOTICE, *layout.LIFECYCLE)), None)
    if kind == layout.PREEMPTED:
        if _is_local(run_uri):
            st.state, st.detail = STOPPED, f"{RESUME_LOCAL} (stopped at step {last.get('step')})"
        else:
            st.state = PREEMPTED
            st.detail = f"stopped at step {last.get('step')}; waiting for the group to start a machine"
    elif _is_local(run_uri) and silent:
        # Nothing restarts a local run: a silent one was killed or its machine slept.
        st.state, st.detail = STOPPED, f"{RESUME_LOCAL} (no heartbeat for {_duration(st.heartbeat_age_seconds)})"
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
        st.detail = (f"no heartbeat for {_duration(st.heartbeat_age_seconds)} {what} (expected every "
                     f"{_duration(_progress_every(starts))}): the trainer died or hangs; see `ops logs`")
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
    return st


def _waiting_for_machines(st: RunStatus, log: list[dict], last_at: float | None) -> None:
    """Machines of several waiting for the others (a lost one not replaced yet) since after the
    trainer's last lifecycle event: say so, and when the run gives up (userdata/rendezvous.sh)."""
    wait = next((e for e in reversed(log) if e.get(layout.EVENT) in (layout.WAITING_FOR_MACHINES, *layout.LIFECYCLE)),
                None)
    if wait is None or wait.get(layout.EVENT) != layout.WAITING_FOR_MACHINES:
        return
    at = _stamp(wait.get(layout.TIME))
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
    from trainer import cost

    total = cost.run_cost(log, now=now, end=end)
    if total is not None and total.cost_usd is None and _is_local(st.run_uri):
        return  # a run on this computer, started without a price: nothing to bill
    if total is not None:
        st.machine_hours = round(total.machine_hours, 4)
        st.cost_usd = None if total.cost_usd is None else round(total.cost_usd, 2)
        st.cost_note = total.price_note
        if total.unpriced and total.cost_usd is not None:
            st.cost_note = f"{total.unpriced} of {total.attempts} attempts without a price; " + st.cost_note


def cost_text(st: RunStatus) -> str:
    """The status's cost line: machine time, and its cost with what the price is."""
    if st.machine_hours is None:
        return ""
    hours = f"{_duration(st.machine_hours * 3600)} machine time"
    if st.cost_usd is None:
        return f"{hours} (no price recorded with the run)"
    so_far = "" if st.final else " so far"
    note = f" ({st.cost_note})" if st.cost_note else ""
    return f"${st.cost_usd:,.2f}{so_far} for {hours}{note}"


def with_group(st: RunStatus, group) -> RunStatus:
    """Add what the stack's group is doing (an ``ops.hosts.GroupState``) to ``st``.

    A run that has not started while its group cannot launch a machine (no spot capacity,
    a vCPU quota of zero, a bad image) says why, instead of waiting forever.
    """
    st.machines_running, st.machines_desired = group.running, group.desired
    st.launch_failures = list(group.launch_failures)
    if st.launch_failures and st.state == NOT_STARTED and not group.running:
        st.detail = f"the group cannot launch a machine: {st.launch_failures[0]}"
    return st


def _snapshot(uri: str, args: argparse.Namespace, store=None) -> RunStatus:
    """One reading of the run (and, with --stack, of its group: a failure to read it is a note)."""
    from ops import hosts

    st = read_status(uri, store=store, events=args.events, must_exist=getattr(args, "run_uri", None) is not None)
    stack = getattr(args, "stack", None)
    if stack and not st.final and uri.startswith(("s3://", "gs://")):
        try:
            with_group(st, hosts.stack_group_state(stack))
        except hosts.HostsError as e:
            st.group_note = f"group not read: {e}"
    return st


# -- showing it ------------------------------------------------------------------------


def _duration(seconds: float | None) -> str:
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


def _event_line(ev: dict) -> str:
    stamp = str(ev.get("time", ""))
    clock = stamp[11:19] if len(stamp) >= 19 else stamp
    fields = " ".join(f"{k}={v}" for k, v in ev.items() if k not in ("event", "time"))
    line = f"{clock} {ev.get('event', '?')} {fields}"
    return line if len(line) <= 110 else line[:107] + "..."


def _metrics(doc: dict | None) -> dict:
    """The numeric `metrics` of a progress.json or COMPLETE document."""
    found = (doc or {}).get("metrics")
    if not isinstance(found, dict):
        return {}
    return {str(k): float(v) for k, v in found.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def metrics_text(metrics: dict) -> str:
    """`accuracy 0.9812   loss 0.0612   val_accuracy ...`, sorted by name."""
    return "   ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))


def render(st: RunStatus):
    """A rich renderable of the status (a progress bar for the steps)."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("run", st.run_uri)
    state = Text(st.state, style=STYLES.get(st.state, ""))
    if st.detail:
        state.append(f"  {st.detail}")
    grid.add_row("state", state)
    if st.total:
        step = st.step or 0
        bar = Table.grid(padding=(0, 1))
        bar.add_row(
            ProgressBar(total=st.total, completed=min(step, st.total), width=36),
            Text(f"{step}/{st.total} ({100 * step / st.total:.1f}%)"),
        )
        grid.add_row("progress", bar)
    elif st.step is not None:
        grid.add_row("progress", f"step {st.step}")
    if st.loss is not None or st.examples_per_sec is not None:
        loss = "-" if st.loss is None else f"{st.loss:.4g}"
        rate = "-" if st.examples_per_sec is None else f"{st.examples_per_sec:,.0f}"
        grid.add_row("loss", f"{loss}   examples/s {rate}   ETA {_duration(st.eta_seconds)}")
    if st.metrics:
        grid.add_row("metrics", metrics_text(st.metrics))
    if st.progress_updated:
        grid.add_row("updated", f"{st.progress_updated} ({_duration(st.progress_age_seconds)} ago)")
    grid.add_row(
        "attempts", f"{st.attempts}   preemptions {st.preemptions}   spot notices {st.spot_notices}"
    )
    if st.machines_running is not None:
        desired = "" if st.machines_desired is None else f" of {st.machines_desired}"
        grid.add_row("machines", f"{st.machines_running}{desired} running")
    for line in st.launch_failures:
        grid.add_row("launch failed", Text(line, style="red"))
    if st.group_note:
        grid.add_row("group", Text(st.group_note, style="dim"))
    if st.machine_hours is not None:
        grid.add_row("cost", cost_text(st))
    if st.checkpoint:
        age = f", {_duration(st.checkpoint.age_seconds)} ago" if st.checkpoint.age_seconds is not None else ""
        grid.add_row("checkpoint", f"step {st.checkpoint.step}{age}")
    else:
        grid.add_row("checkpoint", "none committed yet")
    for label, line in signature_lines(st.end):
        grid.add_row(label, line)
    if st.events:
        grid.add_row("events", Text("\n".join(_event_line(e) for e in st.events), no_wrap=True, overflow="ellipsis"))
    return Group(grid)


def signature_lines(end: dict | None) -> list[tuple[str, str]]:
    """How to call a finished run's SavedModel, from the signature COMPLETE records: (label, text) rows."""
    sig = (end or {}).get("signature")
    if not isinstance(sig, dict):
        return []

    def specs(d) -> str:
        # A record edited by hand or by another version may hold anything here: show what parses.
        if not isinstance(d, dict):
            return ""
        return ", ".join(f"{name} {spec.get('dtype')}[{', '.join('?' if x is None else str(x) for x in shape)}]"
                         for name, spec in d.items() if isinstance(spec, dict)
                         for shape in [spec.get("shape") if isinstance(spec.get("shape"), list) else []])

    return [("model", f"SavedModel endpoint {sig.get('endpoint', 'serve')}({specs(sig.get('inputs'))})"),
            ("returns", specs(sig.get("outputs")))]


def exit_code(st: RunStatus) -> int:
    """0; 1 for a run that ended FAILED or TIMED_OUT; 3 for a stalled one."""
    if st.state in FAILING_STATES:
        return 1
    return EXIT_STALLED if st.state == STALLED else 0


def _watch(uri: str, args: argparse.Namespace, console) -> RunStatus:
    from rich.live import Live

    from trainer.storage import open_store

    store = open_store(uri)
    st = _snapshot(uri, args, store)

    def wait() -> None:
        time.sleep(args.interval)

    if args.json:
        print(json.dumps(st.to_json()), flush=True)
        while st.state not in WATCH_ENDS:
            wait()
            st = _reread(uri, store, args, st)
            print(json.dumps(st.to_json()), flush=True)
        return st
    if console.is_terminal:
        with Live(render(st), console=console, auto_refresh=False) as live:
            while st.state not in WATCH_ENDS:
                wait()
                st = _reread(uri, store, args, st)
                live.update(render(st), refresh=True)
        return st
    console.print(render(st))
    seen = (st.state, st.step, len(st.events) and st.events[-1].get("time"))
    while st.state not in WATCH_ENDS:
        wait()
        st = _reread(uri, store, args, st)
        now = (st.state, st.step, len(st.events) and st.events[-1].get("time"))
        if now != seen:  # a log file gets a snapshot per change, not one per tick
            console.print()
            console.print(render(st))
            seen = now
    return st


def _reread(uri: str, store, args: argparse.Namespace, previous: RunStatus) -> RunStatus:
    """The next snapshot; a read that fails mid-watch keeps the last one (the bucket may blip)."""
    try:
        return _snapshot(uri, args, store)
    except Exception as e:  # noqa: BLE001 - any failure to read is reported the same way, then retried
        print(f"ops status: could not read the run ({type(e).__name__}: {e}); retrying", file=sys.stderr)
        return previous


def cmd_status(args: argparse.Namespace) -> int:
    """``ops status``: print where the run stands (``--watch``: until it ends)."""
    from rich.console import Console

    from ops import hosts

    try:
        uri = args.run_uri or hosts.run_uri_for_stack(args.stack)
    except hosts.HostsError as e:
        print(f"ops status: {e}", file=sys.stderr)
        return 2
    console = Console()
    try:
        if args.watch:
            st = _watch(uri, args, console)
        else:
            st = _snapshot(uri, args)
            if args.json:
                print(json.dumps(st.to_json()))
            else:
                console.print(render(st))
    except (ValueError, NoRun) as e:
        print(f"ops status: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - storage clients raise many types; each gets the same one line
        print(f"ops status: cannot read the run at {uri}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return exit_code(st)


def positive_float(text: str) -> float:
    """argparse type: a number above 0 (seconds, intervals)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
    return v


def non_negative_int(text: str) -> int:
    """argparse type: a whole number, 0 or more."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more")
    return v


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``status`` command to ``python -m ops``."""
    p = sub.add_parser("status", help="where a run stands: state, progress, attempts, checkpoints, events")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--stack", help="stack name: the run URI comes from its outputs (pulumi CLI)")
    where.add_argument("--run-uri", help="the run's URI: s3://B/runs/ID, gs://B/runs/ID or file:///...")
    p.add_argument("--watch", action="store_true",
                   help="refresh until the run ends, stalls, or (a local run) stops")
    p.add_argument("--interval", type=positive_float, default=DEFAULT_INTERVAL_S,
                   help="seconds between refreshes with --watch (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object (one per refresh with --watch)")
    p.add_argument("--events", type=non_negative_int, default=DEFAULT_EVENTS, help="how many recent events (default: %(default)s)")
    p.set_defaults(func=cmd_status)
