"""`ops status`: where a training run stands, read from its folder in the bucket.

Three parts, in this order: reading the run's contract files (`runfolder/layout.py` names
them) into ``RunFacts`` (``read_facts``); deciding the state from them, which is
``ops.runstate.classify`` (pure, and where the states and their rules are described);
and showing it (``render``, ``--json``, ``--watch``).

The files: the end markers (``COMPLETE``, ``CANCELLED``, ``FAILED``, ``TIMED_OUT``),
``progress.json`` (the trainer's heartbeat, rewritten every ``progress_every_seconds``
while it trains), the trainer's ``events.jsonl``, every machine's
``machine-events/<machine>.jsonl`` and the ``COMMITTED`` markers of the checkpoints.
Nothing is asked of the machines, so it works while they are preempted, after they are
gone, and from any laptop with read access to the bucket.

Exit status (ops/cli.py): 0; 1 for FAILED / TIMED_OUT; 2 when there is no run at the URI
or it cannot be read; 3 for STALLED.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ops import why
from ops.cli import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STALLED,
    non_negative_int,
    positive_float,
    run_uri,
)
from ops.runstate import (
    DEFAULT_EVENTS,
    FAILING_STATES,
    FINAL_STATES,
    NOT_STARTED,
    PREEMPTED,
    RUNNING,
    STALLED,
    STOPPED,
    RunFacts,
    RunStatus,
    classify,
    duration,
)
from runfolder import layout
from runfolder.events import read_jsonl

# States a watch cannot wait out: the run ended, or needs someone to look at it (a stall
# nothing explains) or to start it again (a local run).
WATCH_ENDS = FINAL_STATES | {STALLED, STOPPED}
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


class NoRun(Exception):
    """Nothing is stored at the run URI."""


def read_machine_events(store) -> list[dict]:
    """Every machine's own events (``machine-events/<machine>.jsonl``) and every non-chief worker's
    (``worker-events/<address>.jsonl``: its ``failed`` events), each writer's in its order."""
    out = []
    for prefix in (layout.MACHINE_EVENTS_PREFIX, layout.WORKER_EVENTS_PREFIX):
        for key in store.list(prefix):
            if key.endswith(".jsonl"):
                out.extend(read_jsonl(store, key))
    return out


def read_facts(store, run_uri: str, *, checkpoint_marker: bool = True) -> RunFacts:
    """What the run's folder holds, for :func:`ops.runstate.classify`: reads only, decides nothing.

    Each small JSON document is read with ``runfolder.storage.read_json``, as the trainer reads
    them: absent is ``None``, present but unreadable is ``{}``. ``checkpoint_marker=False``: the
    newest checkpoint's step from the listing, its marker not fetched (its time, which only a
    status shows, is then unknown): a request less a run for a list of runs.
    """
    from runfolder.checkpoints import committed_steps
    from runfolder.storage import read_json

    trainer_events = read_jsonl(store, layout.EVENTS_KEY)
    machine_events = read_machine_events(store)
    progress = read_json(store, layout.PROGRESS_KEY)
    steps = committed_steps(store)
    step = steps[-1] if steps else None
    marker = (read_json(store, layout.committed_key(step)) or {}) if step is not None and checkpoint_marker else {}
    end_marker, end = None, None
    for name in layout.END_MARKERS:  # exactly one ends a run: the first found is it
        doc = read_json(store, name)
        if doc is not None:
            end_marker, end = name, doc
            break
    deadline = store.stat(layout.DEADLINE_KEY).get(layout.DEADLINE_KEY)
    decisions = tuple(t for k in store.list(layout.DECISIONS_PREFIX) if (t := layout.decision_time(k)) is not None)
    return RunFacts(run_uri, trainer_events, machine_events, progress=progress, checkpoint_step=step,
                    checkpoint_marker=marker, end_marker=end_marker, end=end,
                    first_boot=None if deadline is None else deadline.modified.timestamp(), decision_times=decisions)


def read_status(run_uri: str, *, store=None, now: float | None = None, events: int = DEFAULT_EVENTS,
                must_exist: bool = False, checkpoint_marker: bool = True, decision: bool = False) -> RunStatus:
    """Read the run at ``run_uri`` and say where it stands.

    ``store``: the run's already opened store (a watch reuses one; opening an S3 client
    costs most of a second); ``events``: how many recent events to include;
    ``must_exist``: raise :class:`NoRun` when nothing at all is stored at the URI (a URI
    given by hand; a stack's run may not have been written yet while its machine boots);
    ``decision``: read the controller's newest decision table too (``controller.table.latest``).
    """
    from runfolder.storage import open_store, read_json

    now = time.time() if now is None else now
    store = open_store(run_uri) if store is None else store
    facts = read_facts(store, run_uri, checkpoint_marker=checkpoint_marker)
    if facts.empty and must_exist and not store.list(""):
        raise NoRun(f"no run at {run_uri}: nothing is stored there (check the URI, or give --stack "
                    "for a stack whose machine is still booting)")
    st = classify(facts, now, events=events)
    st.placement = read_json(store, layout.PLACEMENT_KEY)
    st.scheduler = read_json(store, layout.SCHEDULER_KEY)
    if decision and facts.decision_times:
        from controller import table

        st.decision = table.latest(store)
    return st


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


def with_job(st: RunStatus, store, *, client=None, now: float | None = None) -> bool:
    """Add the run's managed job (its scheduler.json; none on the groups) to ``st``, and when the job ended
    without the trainer's own marker, write the run's (the room's record_end: SageMaker's MaxWaitTimeExceeded
    ends it TIMED_OUT with the job's reason). True when that wrote a marker ``st`` does not show yet."""
    from ops import jobs

    try:
        st.job = jobs.job_state(store, client=client)
    except jobs.service_errors() as e:
        st.job_note = f"job not read: {' '.join(str(e).split())}"
        return False
    if st.job is None:
        return False
    marker = jobs.record_end(store, st.job, now=time.time() if now is None else now)
    return marker is not None and not st.final


def job_lines(job) -> list[tuple[str, str]]:
    """The managed job's rows: its status and secondary status, then its training and billable time and the
    managed-spot saving, 1 - billable / training (the service's own figures, not an estimate)."""
    if job is None:
        return []
    rows = [("job", f"{job.name}  {job.status}" + (f" / {job.secondary}" if job.secondary else "")
             + (f"  {job.message}" if job.message else ""))]
    if job.training_s is not None:
        billed = "-" if job.billable_s is None else f"{job.billable_s} s"
        saving = "" if job.saving is None else f"   managed-spot saving {job.saving:.0%} (1 - billable / training)"
        rows.append(("billing", f"training {job.training_s} s   billable {billed}{saving}"
                                + (f"   spot interruptions {job.interruptions}" if job.interruptions else "")))
    return rows


def _snapshot(uri: str, args: argparse.Namespace, store=None) -> RunStatus:
    """One reading of the run (and, with --stack, of its group: a failure to read it is a note)."""
    from ops import hosts
    from runfolder.storage import open_store

    st = read_status(uri, store=store, events=args.events, must_exist=getattr(args, "run_uri", None) is not None,
                     decision=True)
    if st.scheduler is not None:
        store = open_store(uri) if store is None else store
    if st.scheduler is not None and with_job(st, store):
        # The job's own end (the wait ran out, a failure, a stop) is now the run's marker: read it again.
        job, note = st.job, st.job_note
        st = read_status(uri, store=store, events=args.events, decision=True)
        st.job, st.job_note = job, note
        return st
    stack = getattr(args, "stack", None)
    if not hasattr(args, "kube_target"):  # read once: a watch asks the same cluster each time
        from ops import kube

        args.kube_target = kube.stack_target(stack) if stack else None
    if args.kube_target is not None:
        from ops import kube

        # A Job stack has no group: its Job, read from the cluster, is what schedules the run.
        st.kube_job, st.kube_note = kube.read_job(args.kube_target)
        if st.kube_job is not None and not st.final:
            store = open_store(uri) if store is None else store
            if kube.record_end(st.kube_job, store, now=time.time()) is not None:
                # The Job's failure is now the run's marker: read it again.
                job, note = st.kube_job, st.kube_note
                st = read_status(uri, store=store, events=args.events)
                st.kube_job, st.kube_note = job, note
        return st
    if st.job is None and not st.job_note and stack and not st.final and uri.startswith(("s3://", "gs://")):
        active = st.placement.get("active", 0) if isinstance(st.placement, dict) else 0
        try:
            # After a move the run trains in another placement's group (placement.json says which).
            with_group(st, hosts.placement_group_state(stack, active) if active else hosts.stack_group_state(stack))
        except hosts.HostsError as e:
            st.group_note = f"group not read: {e}"
    return st


# -- showing it ------------------------------------------------------------------------


def cost_text(st: RunStatus) -> str:
    """The status's cost line: machine time, and its cost with what the price is."""
    if st.machine_hours is None:
        return ""
    hours = f"{duration(st.machine_hours * 3600)} machine time"
    if st.cost_usd is None:
        return f"{hours} (no price recorded with the run)"
    so_far = "" if st.final else " so far"
    note = f" ({st.cost_note})" if st.cost_note else ""
    return f"${st.cost_usd:,.2f}{so_far} for {hours}{note}"


def placement_cost_lines(st: RunStatus) -> list[str]:
    """Each placement's machine time and cost, once the run has trained in more than one."""
    if len(st.placement_costs) < 2:
        return []
    lines = []
    for p in st.placement_costs:
        hours = f"{duration(float(p.get('machine_hours') or 0) * 3600)} machine time"
        money = "no price" if p.get("cost_usd") is None else f"${p['cost_usd']:,.2f}"
        n = p.get("attempts")
        lines.append(f"{p.get('placement')}: {money} for {hours}, {n} attempt{'' if n == 1 else 's'}")
    return lines


def _event_line(ev: dict) -> str:
    stamp = str(ev.get("time", ""))
    clock = stamp[11:19] if len(stamp) >= 19 else stamp
    fields = " ".join(f"{k}={v}" for k, v in ev.items() if k not in ("event", "time"))
    line = f"{clock} {ev.get('event', '?')} {fields}"
    return line if len(line) <= 110 else line[:107] + "..."


def metrics_text(metrics: dict) -> str:
    """`accuracy 0.9812   loss 0.0612   val_accuracy ...`, sorted by name."""
    return "   ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))


def evaluation_text(st: RunStatus) -> str:
    """`   (evaluated at step 400; evaluation 3.2 s in all)`, when the trainer's loop evaluated."""
    parts = []
    if st.evaluated_step is not None:
        parts.append(f"evaluated at step {st.evaluated_step}")
    if st.eval_seconds is not None:
        spent = f"{st.eval_seconds:.1f}s" if st.eval_seconds < 60 else duration(st.eval_seconds)
        parts.append(f"evaluation {spent} in all")
    return f"   ({'; '.join(parts)})" if parts else ""


def best_text(best: dict) -> str:
    """`val_accuracy 0.9812 at step 400 (max)`, and whether model/ holds it once the run ended."""
    text = f"{best['metric']} {best['value']:.4g} at step {best['step']}"
    if best.get("mode"):
        text += f" ({best['mode']})"
    if best.get("exported") is True:
        text += "; exported as model/"
    elif best.get("exported") is False:
        text += "; its checkpoint could not be read: model/ is the final one"
    return text


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
        grid.add_row("loss", f"{loss}   examples/s {rate}   ETA {duration(st.eta_seconds)}")
    if st.metrics:
        grid.add_row("metrics", metrics_text(st.metrics) + evaluation_text(st))
    if st.best:
        grid.add_row("best", best_text(st.best))
    if st.progress_updated:
        grid.add_row("updated", f"{st.progress_updated} ({duration(st.progress_age_seconds)} ago)")
    grid.add_row(
        "attempts", f"{st.attempts}   preemptions {st.preemptions}   spot notices {st.spot_notices}"
    )
    for label, line in placement_lines(st.placement):
        grid.add_row(label, line)
    for label, line in why.decision_lines(st.decision):
        grid.add_row(label, line)
    if st.waiting:
        grid.add_row("waiting", Text(f"the run cannot train anywhere now: {st.waiting}", style="bold red"))
    if st.machines_running is not None:
        desired = "" if st.machines_desired is None else f" of {st.machines_desired}"
        grid.add_row("machines", f"{st.machines_running}{desired} running")
    for line in st.launch_failures:
        grid.add_row("launch failed", Text(line, style="red"))
    if st.group_note:
        grid.add_row("group", Text(st.group_note, style="dim"))
    for label, line in job_lines(st.job):
        grid.add_row(label, line)
    if st.job_note:
        grid.add_row("job", Text(st.job_note, style="dim"))
    if st.kube_job is not None:
        first, *rest = st.kube_job.lines()
        grid.add_row("job", first.removeprefix("job ") + "".join(f"\n{line.strip()}" for line in rest))
    if st.kube_note:
        grid.add_row("job", Text(st.kube_note.removeprefix("job "), style="dim"))
    if st.machine_hours is not None:
        grid.add_row("cost", cost_text(st))
        for line in placement_cost_lines(st):
            grid.add_row("", line)
    if st.goodput:
        grid.add_row("goodput", why.goodput_text(st.goodput))
    if st.checkpoint:
        age = f", {duration(st.checkpoint.age_seconds)} ago" if st.checkpoint.age_seconds is not None else ""
        grid.add_row("checkpoint", f"step {st.checkpoint.step}{age}")
    else:
        grid.add_row("checkpoint", "none committed yet")
    for label, line in signature_lines(st.end):
        grid.add_row(label, line)
    if st.events:
        grid.add_row("events", Text("\n".join(_event_line(e) for e in st.events), no_wrap=True, overflow="ellipsis"))
    return Group(grid)


def placement_lines(placement: dict | None) -> list[tuple[str, str]]:
    """The active placement and every move (placement.json, written by the controller and ``ops move``)."""
    if not isinstance(placement, dict):
        return []
    moves = [m for m in placement.get("moves") or [] if isinstance(m, dict)]
    active = placement.get("active", 0)
    label = next((m.get("to_placement") for m in reversed(moves) if m.get("to") == active), None)
    since = str(placement.get("since") or "")[:19].replace("T", " ")
    rows = [("placement", f"{active}{f' ({label})' if label else ''}" + (f" since {since}" if since else ""))]
    for m in moves:
        when = str(m.get("time", ""))[:19].replace("T", " ")
        step = f" at step {m['step']}" if isinstance(m.get("step"), int) else ""
        under_way = "" if m.get("done") else " (under way)"
        rows.append(("moved", f"{when} {m.get('from_placement', m.get('from'))} -> "
                              f"{m.get('to_placement', m.get('to'))}{step}{under_way}: {m.get('reason', '')}"))
    return rows


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
        return EXIT_FAILED
    return EXIT_STALLED if st.state == STALLED else EXIT_OK


def _watch(uri: str, args: argparse.Namespace, console) -> RunStatus:
    from rich.live import Live

    from runfolder.storage import open_store

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
        uri = run_uri(args)
    except hosts.HostsError as e:
        print(f"ops status: {e}", file=sys.stderr)
        return EXIT_ERROR
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
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - storage clients raise many types; each gets the same one line
        print(f"ops status: cannot read the run at {uri}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ERROR
    return exit_code(st)


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
