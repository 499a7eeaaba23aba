"""`ops status`: where a training run stands, read from its folder in the bucket.

Everything comes from the run's contract files, through the trainer's own store and
readers (``trainer.storage.open_store``, ``trainer.events.read_events``,
``trainer.checkpoints.CheckpointStore``): the end markers (``COMPLETE``, ``FAILED``,
``TIMED_OUT``), ``progress.json``, ``events.jsonl`` and the ``COMMITTED`` markers of the
checkpoints. Nothing is asked of the machines, so it works while they are preempted,
after they are gone, and from any laptop with read access to the bucket.

States: ``NOT STARTED`` (nothing written yet), ``RUNNING``, ``PREEMPTED`` (the last
attempt stopped on a spot notice; waiting for the group to bring a machine back),
``COMPLETE``, ``FAILED``, ``TIMED_OUT``. Exit status: 0, or 1 for FAILED / TIMED_OUT,
2 when the run cannot be found or read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime

NOT_STARTED = "NOT STARTED"
RUNNING = "RUNNING"
PREEMPTED = "PREEMPTED"
COMPLETE = "COMPLETE"
FAILED = "FAILED"
TIMED_OUT = "TIMED_OUT"
# Written once, by the trainer (COMPLETE) or by the machine's finish script (the others).
END_MARKERS = (COMPLETE, FAILED, TIMED_OUT)
FINAL_STATES = frozenset(END_MARKERS)
FAILING_STATES = frozenset({FAILED, TIMED_OUT})
# The events that change what the run is doing; the others (checkpoint, store_retry…) don't.
LIFECYCLE = {"started", "resumed", "preempted", "finished", "failed"}
STALE_PROGRESS_S = 600
DEFAULT_EVENTS = 6
DEFAULT_INTERVAL_S = 5.0
STYLES = {
    NOT_STARTED: "dim",
    RUNNING: "bold cyan",
    PREEMPTED: "bold yellow",
    COMPLETE: "bold green",
    FAILED: "bold red",
    TIMED_OUT: "bold red",
}


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
    examples_per_sec: float | None = None
    eta_seconds: float | None = None
    progress_updated: str | None = None
    progress_age_seconds: float | None = None
    attempts: int = 0
    preemptions: int = 0
    spot_notices: int = 0
    checkpoint: Checkpoint | None = None
    end: dict | None = None
    events: list[dict] = field(default_factory=list)
    checked_at: str = ""

    @property
    def final(self) -> bool:
        """The run has ended (one of the end markers exists)."""
        return self.state in FINAL_STATES

    def to_json(self) -> dict:
        """A plain dict for ``json.dumps``."""
        return asdict(self)


def _age(stamp: str | None, now: float) -> float | None:
    if not stamp:
        return None
    try:
        return round(max(0.0, now - datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()), 1)
    except ValueError:
        return None


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


def _newest_checkpoint(store, now: float) -> Checkpoint | None:
    from trainer.checkpoints import MARKER, CheckpointStore

    steps = CheckpointStore(store).committed_steps()
    if not steps:
        return None
    step = steps[-1]
    marker = _json_doc(store, f"checkpoints/ckpt-{step}/{MARKER}") or {}
    created = marker.get("created") if isinstance(marker.get("created"), str) else None
    return Checkpoint(step=step, created=created, age_seconds=_age(created, now))


def _brief(ev: dict) -> dict:
    """An event without its bulky fields (the full config of `started`)."""
    return {k: v for k, v in ev.items() if k != "config"}


def _number(doc: dict, key: str) -> float | None:
    v = doc.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def read_status(run_uri: str, *, store=None, now: float | None = None, events: int = DEFAULT_EVENTS) -> RunStatus:
    """Read the run at ``run_uri`` and say where it stands.

    ``store``: the run's already opened store (a watch reuses one; opening an S3 client
    costs most of a second); ``events``: how many recent events to include.
    """
    from trainer.events import PROGRESS_KEY, read_events
    from trainer.storage import open_store

    now = time.time() if now is None else now
    store = open_store(run_uri) if store is None else store
    st = RunStatus(run_uri=run_uri, state=NOT_STARTED, checked_at=datetime.fromtimestamp(now).astimezone().isoformat(
        timespec="seconds"))

    log = read_events(store)
    progress = _json_doc(store, PROGRESS_KEY)
    st.events = [_brief(e) for e in log[-events:]] if events > 0 else []
    starts = [e for e in log if e.get("event") == "started"]
    attempts = [e.get("attempt") for e in log if isinstance(e.get("attempt"), int)]
    st.attempts = max([len(starts), *attempts]) if (starts or attempts) else 0
    st.preemptions = sum(1 for e in log if e.get("event") == "preempted")
    st.spot_notices = sum(1 for e in log if e.get("event") == "spot_notice")
    st.checkpoint = _newest_checkpoint(store, now)

    if progress:
        st.step = int(progress["step"]) if isinstance(progress.get("step"), int) else None
        st.total = int(progress["total"]) if isinstance(progress.get("total"), int) else None
        st.loss = _number(progress, "loss")
        st.examples_per_sec = _number(progress, "examples_per_sec")
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

    for marker in END_MARKERS:
        doc = _json_doc(store, marker)
        if doc is not None:
            st.state, st.end = marker, doc
            final_step = doc.get("step", doc.get("final_step"))
            if isinstance(final_step, int) and final_step >= 0:
                st.step = final_step
            if marker == COMPLETE:
                st.detail = "model in " + run_uri.rstrip("/") + "/model/"
            else:
                st.detail = str(doc.get("reason") or "")
            if isinstance(doc.get("attempts"), int) and marker == COMPLETE:
                st.attempts = max(st.attempts, doc["attempts"])
            return st

    if not log and progress is None and st.checkpoint is None:
        st.detail = "nothing written yet: the machine may still be booting or waiting for spot capacity"
        return st

    st.state = RUNNING
    last = next((e for e in reversed(log) if e.get("event") in LIFECYCLE), None)
    kind = last.get("event") if last else None
    if kind == "preempted":
        st.state = PREEMPTED
        st.detail = f"stopped at step {last.get('step')}; waiting for the group to start a machine"
    elif kind == "failed":
        st.detail = f"attempt {last.get('attempt')} failed ({last.get('reason')}); the machine retries"
    elif kind == "finished":
        st.detail = "training finished; writing the model"
    else:
        notice = next((e for e in reversed(log) if e.get("event") in ("spot_notice", *LIFECYCLE)), None)
        if notice and notice.get("event") == "spot_notice":
            st.detail = "spot notice received: checkpointing before the machine is taken back"
        elif st.progress_age_seconds is not None and st.progress_age_seconds > STALE_PROGRESS_S:
            st.detail = f"no progress for {_duration(st.progress_age_seconds)}"
    if st.state == RUNNING and st.step is not None and st.total and st.examples_per_sec:
        batch = next((e.get("global_batch") for e in reversed(log) if isinstance(e.get("global_batch"), int)), None)
        if batch:
            st.eta_seconds = round(max(0, st.total - st.step) * batch / st.examples_per_sec, 1)
    return st


# -- showing it ------------------------------------------------------------------------


def _duration(seconds: float | None) -> str:
    if seconds is None:
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
    if st.progress_updated:
        grid.add_row("updated", f"{st.progress_updated} ({_duration(st.progress_age_seconds)} ago)")
    grid.add_row(
        "attempts", f"{st.attempts}   preemptions {st.preemptions}   spot notices {st.spot_notices}"
    )
    if st.checkpoint:
        age = f", {_duration(st.checkpoint.age_seconds)} ago" if st.checkpoint.age_seconds is not None else ""
        grid.add_row("checkpoint", f"step {st.checkpoint.step}{age}")
    else:
        grid.add_row("checkpoint", "none committed yet")
    if st.events:
        grid.add_row("events", Text("\n".join(_event_line(e) for e in st.events), no_wrap=True, overflow="ellipsis"))
    return Group(grid)


def exit_code(st: RunStatus) -> int:
    """0, or 1 for a run that ended FAILED or TIMED_OUT."""
    return 1 if st.state in FAILING_STATES else 0


def _watch(uri: str, args: argparse.Namespace, console) -> RunStatus:
    from rich.live import Live

    from trainer.storage import open_store

    store = open_store(uri)
    st = read_status(uri, store=store, events=args.events)

    def wait() -> None:
        time.sleep(args.interval)

    if args.json:
        print(json.dumps(st.to_json()), flush=True)
        while not st.final:
            wait()
            st = _reread(uri, store, args, st)
            print(json.dumps(st.to_json()), flush=True)
        return st
    if console.is_terminal:
        with Live(render(st), console=console, auto_refresh=False) as live:
            while not st.final:
                wait()
                st = _reread(uri, store, args, st)
                live.update(render(st), refresh=True)
        return st
    console.print(render(st))
    seen = (st.state, st.step, len(st.events) and st.events[-1].get("time"))
    while not st.final:
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
        return read_status(uri, store=store, events=args.events)
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
            st = read_status(uri, events=args.events)
            if args.json:
                print(json.dumps(st.to_json()))
            else:
                console.print(render(st))
    except ValueError as e:
        print(f"ops status: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - storage clients raise many types; each gets the same one line
        print(f"ops status: cannot read the run at {uri}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return exit_code(st)


def _positive(text: str) -> float:
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
    p.add_argument("--watch", action="store_true", help="refresh until the run ends")
    p.add_argument("--interval", type=_positive, default=DEFAULT_INTERVAL_S,
                   help="seconds between refreshes with --watch (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object (one per refresh with --watch)")
    p.add_argument("--events", type=non_negative_int, default=DEFAULT_EVENTS, help="how many recent events (default: %(default)s)")
    p.set_defaults(func=cmd_status)
