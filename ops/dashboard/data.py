"""What the dashboard shows, read from the bucket: a row per run and one run's whole story.

Nothing here reads a run folder on its own: the runs are the folders ``ops runs`` lists
(``ops.runs.read_runs``), each read with ``ops status``'s reader (``ops.status.read_facts``)
and classified by ``ops.runstate.classify``; machine time and cost come from
``runfolder.cost``, the code ``ops status`` and the trainer's ``COMPLETE`` use, so the figures
are the same. What is added is what a page needs beyond a status: the attempts as spans on a
time axis, the marks on it, the curves, the cost as it grew, and notes for what could not be
read (a damaged line, a missing file) so that a page never fails because of one.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from ops import runs, runstate, status, why
from runfolder import cost, goodput, layout
from runfolder.storage import NotFound, read_json

# Events drawn on the timeline as marks (the others are in the event count only).
MARKS = (layout.SPOT_NOTICE, layout.PREEMPTED, layout.FAILED_EVENT, layout.MOVED, layout.CANCELLED_EVENT,
         layout.REBALANCE)
TICKS = (layout.EVALUATED, layout.CHECKPOINT)
# Newest-first train metric names in a status's metrics (script mode) or progress (the loop: `loss`).
TRAIN_PREFIX = "train/"
VAL_PREFIX = "val_"
# The loop's own scalars that are not curves worth a chart of their own.
TB_SKIP = frozenset({"learning_rate", "step_time_s", "examples_per_sec", "checkpoint_s", "checkpoint_save_s",
                     "eval_s"})
TB_MAX_BYTES = 64 << 20  # event files beyond this are not read for curves (a note says so)
# A run not over whose folder has not changed for this long (placement and machine events included) is no
# longer refreshed: its stack may be destroyed, and it would never get an end marker. The longest a live
# run's folder stays unchanged by design: an attempt's start, staging data (ops status's stall bound then).
QUIET_S = runstate.QUIET_PHASE_S
# An ended run's folder is listed again at most this often by the runs table (to see it changed or emptied).
RELIST_S = 900.0
# A decision of the placement controller (decisions/<time>.json) on the timeline: each is a mark; the newest
# this many tables are read and shown (the older ones' times come from their keys, without a read).
DECISION = "decision"
DECISION_TABLES = 20
TAIL_CHECK = 64  # bytes before the end of what was read, fetched again to check that a file only grew
# How a machine's recorded price says it carries its placement's checkpoint writes to home's bucket
# (components.userdata.price_env writes the note; a test reads it from there).
WRITES_NOTE = re.compile(r"\+ checkpoint writes to home \$(\d+(?:\.\d+)?)/h")


@dataclass
class Row:
    """One run in the runs table."""

    id: str
    uri: str
    state: str
    detail: str
    step: int | None
    total: int | None
    train_metric: tuple[str, float] | None
    val_metric: tuple[str, float] | None
    best: dict | None
    attempts: int
    preemptions: int
    moves: int
    placements: list[str]
    machine_hours: float | None
    cost_usd: float | None
    cost_note: str
    age_seconds: float
    final: bool
    goodput: float | None = None
    """Kept / paid machine time (runfolder.goodput), None before anything was paid."""
    goodput_text: str = ""


@dataclass
class Span:
    """One attempt on the timeline: where it ran and from when to when (epoch seconds)."""

    attempt: int | None
    lane: str
    start: float
    end: float
    open: bool
    placement: str | None
    cost_usd: float | None
    price_per_hour: float | None
    nodes: int
    # What goodput counts of it (runfolder.goodput): its boot from `launch` to its first step, and the training
    # from `kept_until` to `train_end` that was lost (None where goodput did not find the attempt).
    launch: float | None = None
    first_step: float | None = None
    kept_until: float | None = None
    train_end: float | None = None
    lost_steps: int = 0
    uncommitted: bool = False


@dataclass
class Mark:
    """A moment on the timeline: a spot notice, a preemption, a move, an evaluation, a checkpoint."""

    kind: str
    at: float
    lane: str | None
    text: str


@dataclass
class Decision:
    """One decision table of the placement controller: when, its key, and the table (None: not read)."""

    at: float
    key: str
    doc: dict | None


@dataclass
class RunPage:
    """Everything one run's page shows."""

    row: Row
    st: runstate.RunStatus
    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    end: Mark | None = None
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    curve_source: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    events: int = 0
    now: float = 0.0
    # What each placement's recorded price is (its attempts' `price_note`, the newest): away from home's
    # region it carries the checkpoint writes to home's bucket (see `writes_per_hour`).
    price_notes: dict[str, str] = field(default_factory=dict)
    # The controller's decisions, oldest first (their tables: the newest DECISION_TABLES only).
    decisions: list[Decision] = field(default_factory=list)


def _row(run_id: str, run, st: runstate.RunStatus, age: float) -> Row:
    metrics = dict(st.metrics)
    train = None
    if st.loss is not None:
        train = ("loss", st.loss)
    else:
        named = sorted((k, v) for k, v in metrics.items() if not k.startswith(VAL_PREFIX))
        train = next(((k, v) for k, v in named if "loss" in k), named[0] if named else None)
    vals = sorted((k, v) for k, v in metrics.items() if k.startswith(VAL_PREFIX))
    val = None
    if vals:
        prefer = st.best["metric"] if st.best else ""
        val = next(((k, v) for k, v in vals if k == prefer), next(((k, v) for k, v in vals if k != "val_loss"),
                                                                    vals[0]))
    placement = st.placement if isinstance(st.placement, dict) else {}
    moves = [m for m in placement.get("moves") or [] if isinstance(m, dict)]
    return Row(id=run_id, uri=run.uri, state=st.state, detail=st.detail, step=st.step, total=st.total,
               train_metric=train, val_metric=val, best=st.best, attempts=st.attempts, preemptions=st.preemptions,
               moves=len(moves), placements=[str(p.get("placement")) for p in st.placement_costs],
               machine_hours=st.machine_hours, cost_usd=st.cost_usd, cost_note=st.cost_note,
               age_seconds=round(max(0.0, age), 1), final=st.final,
               goodput=(st.goodput or {}).get("goodput"), goodput_text=why.goodput_text(st.goodput))


def live(row: Row) -> bool:
    """Whether a page showing this run should refresh itself: the run has not ended, and something in
    its folder (events, progress, placement, a machine's events) changed within :data:`QUIET_S`. A run
    whose stack was destroyed never gets its end marker; its pages stop asking the bucket."""
    return not row.final and row.age_seconds <= QUIET_S


def table(store, now: float, cache: dict | None = None, objects: dict | None = None) -> tuple[list[Row], list[str]]:
    """A row per run in the bucket's ``store`` (newest first), and notes for the runs that could not be read.

    The runs are listed and read side by side, as ``ops runs`` reads them (``ops.runs.read_runs``).
    ``cache``: the rows of earlier calls; a run that has ended and not changed since (the newest
    object in its folder is the same) is not read again, and its folder is not even listed again
    for :data:`RELIST_S` (an ended run's folder is left alone: only its removal, which the
    bucket's listing of run folders shows at once, is expected). ``objects``: see ``ops.runs.Listed``.
    """
    cache = {} if cache is None else cache

    def aged(changed: float, row: Row) -> Row:
        row.age_seconds = round(max(0.0, now - changed), 1)
        return row

    def known(run_id: str):
        kept = cache.get(run_id)
        if kept is not None and 0 <= now - kept[2] < RELIST_S:
            return kept[0], aged(kept[0], kept[1])
        return None

    def one(run_id: str, view, keys: dict, changed: float) -> Row | str:
        kept = cache.get(run_id)
        if kept is not None and kept[0] == changed:
            cache[run_id] = (changed, kept[1], now)
            return aged(changed, kept[1])
        run = runs.Listed(view, keys, objects)
        try:
            st = status.read_status(run.uri, store=run, events=0, now=now, checkpoint_marker=False)
        except Exception as e:  # noqa: BLE001 - one unreadable run is a note; the others are still shown
            return f"run {run_id}: could not be read ({type(e).__name__}: {e})"
        row = _row(run_id, run, st, now - changed)
        if row.final:  # an ended run's row changes only when its folder does
            cache[run_id] = (changed, row, now)
        return row

    got = runs.read_runs(store, one, known)
    return [r for r in got if isinstance(r, Row)], [r for r in got if isinstance(r, str)]


# -- one run ---------------------------------------------------------------------------


def _lines(store, key: str) -> int:
    """The non-empty lines of a JSON-lines object (0 when it is absent)."""
    try:
        raw = store.get_bytes(key)
    except NotFound:
        raw = b""
    return sum(1 for line in raw.splitlines() if line.strip())


def _damaged(store, facts: runstate.RunFacts) -> list[str]:
    """Notes for the lines the event readers (``trainer.events.read_jsonl``) skipped: what was stored, less
    what was read. Counting lines costs a tenth of parsing them again."""
    notes = []
    bad = _lines(store, layout.EVENTS_KEY) - len(facts.trainer_events)
    if bad > 0:
        notes.append(f"{layout.EVENTS_KEY}: {bad} damaged line{'s' if bad > 1 else ''} skipped (not JSON, or not an event)")
    keys = [k for prefix in (layout.MACHINE_EVENTS_PREFIX, layout.WORKER_EVENTS_PREFIX) for k in store.list(prefix)
            if k.endswith(".jsonl")]
    bad = sum(_lines(store, k) for k in keys) - len(facts.machine_events)
    if bad > 0:
        notes.append(f"{layout.MACHINE_EVENTS_PREFIX} and {layout.WORKER_EVENTS_PREFIX}: {bad} damaged "
                     f"line{'s' if bad > 1 else ''} skipped (not JSON, or not an event)")
    return notes


def _cost_window(st: runstate.RunStatus, facts: runstate.RunFacts, now: float) -> dict:
    """The ``now``/``end`` that ``classify`` counts the machine time up to (``runstate._add_cost``)."""
    if facts.end_marker is not None:
        doc = facts.end or {}
        return {"end": runstate.stamp(doc.get("finished_at")) or runstate.stamp(doc.get(layout.TIME))}
    if st.state == runstate.NOT_STARTED:
        return {}
    return {"now": None if runstate.is_local(st.run_uri) else now}


def price_notes(events: list[dict]) -> dict[str, str]:
    """Each placement's price note, from the newest ``started`` event there (``runfolder.cost`` prices each
    attempt by its own config)."""
    out: dict[str, str] = {}
    for ev in events:
        cfg = ev.get("config") if ev.get(layout.EVENT) == layout.STARTED else None
        if isinstance(cfg, dict) and isinstance(cfg.get("placement"), str) and cfg.get("price_note"):
            out[cfg["placement"]] = str(cfg["price_note"])
    return out


def writes_per_hour(note: str) -> float | None:
    """USD an hour of checkpoint writes to home's bucket that a price note says its price includes; None
    when it includes none (home's region, or a price recorded before the writes were priced)."""
    found = WRITES_NOTE.search(note or "")
    return float(found.group(1)) if found else None


def _lanes(found: list[cost.Span], machine_events: list[dict], local: bool) -> list[str]:
    """A lane name per attempt: the machine its events came from while it ran, else its placement (a run
    in a local folder: this computer). The last machine to write before the attempt ended is its own; a
    machine's events in the minute after it count only when none came before (its finish), since a Job's
    replacement pod writes its `pod` event seconds after the evicted one's attempt ended."""
    out = []
    stamped = [(t, e.get("instance")) for e in machine_events
               if isinstance(e.get("instance"), str) and (t := runstate.stamp(e.get(layout.TIME))) is not None]
    for s in found:
        seen = [m for t, m in stamped if s.start - 600 <= t <= s.end] or [
            m for t, m in stamped if s.end < t <= s.end + 60]
        machine = seen[-1] if seen else None
        if machine:
            out.append(f"{machine}" + (f" ({s.placement})" if s.placement else ""))
        else:
            out.append(s.placement or ("this computer" if local else "machine"))
    return out


def _mark_text(ev: dict) -> str:
    kind = ev.get(layout.EVENT)
    if kind == layout.MOVED:
        return (f"moved {ev.get('from_placement', ev.get('from'))} -> {ev.get('to_placement', ev.get('to'))}"
                + (f" at step {ev['step']}" if isinstance(ev.get("step"), int) else "")
                + f": {ev.get('reason', '')}")
    if kind == layout.EVALUATED:
        metrics = ev.get("metrics") if isinstance(ev.get("metrics"), dict) else {}
        return f"evaluated at step {ev.get('step')}: " + ", ".join(
            f"{k} {v:.4g}" for k, v in sorted(metrics.items()) if isinstance(v, int | float))
    fields = ", ".join(f"{k} {v}" for k, v in ev.items() if k not in (layout.EVENT, layout.TIME, "config", "instance")
                       and not isinstance(v, dict | list))
    return f"{kind}" + (f" ({fields})" if fields else "")


def _lane_at(spans: list[Span], t: float) -> str | None:
    for s in spans:
        if s.start - 1 <= t <= s.end + 1:
            return s.lane
    before = [s for s in spans if s.start <= t]
    return before[-1].lane if before else (spans[0].lane if spans else None)


def _eval_curves(events: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Each metric of the ``evaluated`` events against its step (a resumed attempt's repeats: the newest wins)."""
    curves: dict[str, dict[int, float]] = {}
    for ev in events:
        if ev.get(layout.EVENT) != layout.EVALUATED or not isinstance(ev.get("step"), int):
            continue
        for k, v in (ev.get("metrics") or {}).items() if isinstance(ev.get("metrics"), dict) else ():
            if isinstance(v, int | float) and not isinstance(v, bool):
                curves.setdefault(str(k), {})[ev["step"]] = float(v)
    return {k: sorted(v.items()) for k, v in curves.items()}


@dataclass
class EventFile:
    """What was read of one TensorBoard event file, so that the next read fetches only what was added.

    Event files only grow (the trainer appends, and its upload replaces the object with the longer
    file): a refresh asks the store for the bytes from ``offset`` on, preceded by ``tail``, the bytes
    just before it; when they are not what the store sends first, the file was replaced by another
    and is read again whole.
    """

    size: int
    modified: object
    offset: int = 0  # where its last whole record ends
    tail: bytes = b""
    scalars: dict[str, dict[int, float]] = field(default_factory=dict)
    damaged: int = 0

    def weight(self) -> int:
        """About the bytes it holds in memory (a step and its value in a dict: ~100 bytes)."""
        return 256 + len(self.tail) + sum(64 + len(tag) + 100 * len(pts) for tag, pts in self.scalars.items())


def _read_records(f: EventFile, data: bytes, pos: int) -> None:
    """Add the whole records of ``data`` from ``pos`` on to ``f`` (``data`` ends at the file's end as read,
    and its ``pos`` is the file's ``f.offset``). A record cut at the end (a file still being written)
    waits for the next read, as TensorBoard's own reader does."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2

    base = f.offset - pos  # where data begins in the file
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + 12 + length + 4  # length, its CRC, the record, its CRC
        if end > len(data):
            break
        body = data[pos + 12:pos + 12 + length]
        pos = end
        ev = event_pb2.Event()
        try:
            ev.ParseFromString(body)
        except DecodeError:
            f.damaged += 1
            continue
        for v in ev.summary.value:
            value = _scalar(v)
            if value is not None and v.tag not in TB_SKIP:
                f.scalars.setdefault(v.tag, {})[int(ev.step)] = value
    f.offset = base + pos
    f.tail = data[max(0, pos - TAIL_CHECK):pos]


def _event_file(store, key: str, info, kept) -> EventFile:
    """One event file's scalars: kept as they were when the listing shows it unchanged, else read on from
    where the last read ended, else read whole."""
    name = f"{store.uri}/{key}"
    old = kept.get(name) if kept is not None else None
    if old is not None and (old.size, old.modified) == (info.size, info.modified):
        return old
    if old is not None and info.size >= old.offset:
        data = store.get_range(key, old.offset - len(old.tail))
        if data.startswith(old.tail):
            # A copy: another request may be drawing from the kept one.
            f = EventFile(info.size, info.modified, old.offset, old.tail,
                          {tag: dict(pts) for tag, pts in old.scalars.items()}, old.damaged)
            _read_records(f, data, len(old.tail))
            if kept is not None:
                kept[name] = f
            return f
    f = EventFile(info.size, info.modified)
    _read_records(f, store.get_range(key, 0), 0)
    if kept is not None:
        kept[name] = f
    return f


def tensorboard_scalars(store, kept=None) -> tuple[dict[str, list[tuple[int, float]]], list[str]]:
    """The scalars of the run's ``tensorboard/`` event files: name -> [(step, value)], and notes.

    Read here from the TFRecord framing and TensorBoard's own protocol buffers, not through
    TensorFlow: importing TensorFlow costs seconds, and the dashboard serves a laptop that
    may not have it. ``kept`` (a dict-like cache the caller keeps, ``ops.dashboard.cache.Kept``):
    what earlier reads found, by file, so that a refresh reads only each file's new tail
    (:class:`EventFile`); without it every file is read whole.
    """
    out: dict[str, dict[int, float]] = {}
    notes = []
    try:
        files = {k: v for k, v in store.stat(layout.TENSORBOARD_PREFIX).items() if "tfevents" in k}
    except Exception as e:  # noqa: BLE001 - the curves are optional; the page says why they are missing
        return {}, [f"tensorboard/ could not be listed ({type(e).__name__}: {e})"]
    for key, info in sorted(files.items()):
        if info.size > TB_MAX_BYTES:
            notes.append(f"{key}: {info.size >> 20} MiB, not read for curves (open it with ops tensorboard)")
            continue
        try:
            f = _event_file(store, key, info, kept)
        except Exception as e:  # noqa: BLE001 - same as above
            notes.append(f"{key} could not be read ({type(e).__name__})")
            continue
        # A file in a folder names its curves by it: Keras's callback writes `epoch_loss` to both train/ and
        # validation/, two curves and not one.
        folder = key[len(layout.TENSORBOARD_PREFIX):].rpartition("/")[0]
        for tag, pts in f.scalars.items():
            out.setdefault(f"{folder}/{tag}" if folder else tag, {}).update(pts)
        if f.damaged:
            notes.append(f"{key}: {f.damaged} damaged record{'s' if f.damaged > 1 else ''} skipped")
    return {k: sorted(v.items()) for k, v in out.items()}, notes


def _scalar(v) -> float | None:
    """A summary value's number: ``simple_value`` (TF 1 style) or a one-element float tensor (``tf.summary.scalar``)."""
    if v.HasField("simple_value"):
        return float(v.simple_value)
    if v.HasField("tensor") and not v.tensor.tensor_shape.dim:
        t = v.tensor
        for vals in (t.float_val, t.double_val, t.int_val, t.int64_val):
            if len(vals):
                return float(vals[0])
        fmt = {1: "<f", 2: "<d"}.get(t.dtype)  # DT_FLOAT, DT_DOUBLE
        if fmt and len(t.tensor_content) == struct.calcsize(fmt):
            return float(struct.unpack(fmt, t.tensor_content)[0])
    return None


def _read_notes(run, facts, st) -> list[str]:
    """What of the run folder could not be read, or is not there yet, one note each."""
    notes = list(_damaged(run, facts))
    if not facts.trainer_events:
        notes.append(f"{layout.EVENTS_KEY} is missing or empty: no attempt to draw yet")
    if facts.progress is None and not st.final:
        notes.append(f"{layout.PROGRESS_KEY} is missing: no heartbeat from the trainer yet")
    elif facts.progress == {}:
        notes.append(f"{layout.PROGRESS_KEY} could not be read (not a JSON object)")
    if facts.end_marker is not None and not facts.end:
        notes.append(f"{facts.end_marker} could not be read (not a JSON object): its reason is not known")
    if st.placement == {}:
        notes.append(f"{layout.PLACEMENT_KEY} could not be read (not a JSON object)")
    return notes


def _end_mark(facts, st, spans: list[Span]) -> Mark | None:
    """The end marker's mark: at its own time, else at the last attempt's end; None before the run ends."""
    if facts.end_marker is None:
        return None
    doc = facts.end or {}
    at = runstate.stamp(doc.get("finished_at")) or runstate.stamp(doc.get(layout.TIME))
    if at is None and spans:
        at = spans[-1].end
    if at is None:
        return None
    reason = st.detail or str(doc.get(layout.MARKER_REASON) or "")
    return Mark(kind=facts.end_marker, at=at, lane=None, text=f"{facts.end_marker}" + (f": {reason}" if reason else ""))


def run_page(store, run_id: str, now: float, objects: dict | None = None, curves=None) -> RunPage:
    """One run's page, read from the bucket's ``store``. Raises :class:`KeyError` for a run that is not there.

    ``objects``: see ``ops.runs.Listed``; ``curves``: see :func:`tensorboard_scalars`."""
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise KeyError(run_id)
    run = runs.run_view(store, run_id)
    # Only this run's folder is listed: the bucket may hold hundreds.
    stored = run.stat("")
    if not stored:
        raise KeyError(run_id)
    changed = max(info.modified.timestamp() for info in stored.values())
    run = runs.Listed(run, stored, objects)
    notes: list[str] = []
    # As ops.status.read_status reads it, keeping the facts: the page draws every event.
    facts = status.read_facts(run, run.uri)
    st = runstate.classify(facts, now, events=0)
    st.placement = read_json(run, layout.PLACEMENT_KEY)
    page = RunPage(row=_row(run_id, run, st, now - changed), st=st, now=now)

    notes.extend(_read_notes(run, facts, st))

    log = runstate.merge_events(facts.trainer_events, facts.machine_events)
    page.events = len(log)
    page.price_notes = price_notes(facts.trainer_events)
    window = _cost_window(st, facts, now)
    found = cost.spans(log, **window)
    kept = goodput.goodput(log, **window, first_boot=facts.first_boot, launched_after=facts.decision_times,
                           completed=facts.end_marker == layout.COMPLETE)
    parts = {} if kept is None else {(i, a.attempt): a for i, a in enumerate(kept.attempts)}
    for i, (s, lane) in enumerate(zip(found, _lanes(found, facts.machine_events, runstate.is_local(st.run_uri)),
                                      strict=True)):
        a = parts.get((i, s.attempt))
        page.spans.append(Span(attempt=s.attempt, lane=lane, start=s.start, end=s.end, open=s.open,
                               placement=s.placement, cost_usd=s.cost, price_per_hour=s.price_per_hour,
                               nodes=s.nodes, launch=a and a.launch, first_step=a and a.first_step,
                               kept_until=a and a.kept_until, train_end=a and a.train_end,
                               lost_steps=a.lost_steps if a else 0, uncommitted=bool(a and a.uncommitted_h)))
    for ev in log:
        kind = ev.get(layout.EVENT)
        at = runstate.stamp(ev.get(layout.TIME))
        if at is None or kind not in (*MARKS, *TICKS):
            continue
        page.marks.append(Mark(kind=str(kind), at=at, lane=_lane_at(page.spans, at), text=_mark_text(ev)))
    if not any(m.kind == layout.MOVED for m in page.marks) and isinstance(st.placement, dict):
        # placement.json records a move even where its event was not written (an older controller).
        for m in st.placement.get("moves") or []:
            at = runstate.stamp(m.get("time")) if isinstance(m, dict) else None
            if at is not None:
                page.marks.append(Mark(kind=layout.MOVED, at=at, lane=None, text=_mark_text({"event": "moved", **m})))
    page.end = _end_mark(facts, st, page.spans)

    _decisions(page, run, stored, notes)

    scalars, tb_notes = tensorboard_scalars(run, curves)
    notes.extend(tb_notes)
    for name, points in scalars.items():
        page.curves[name] = points
        page.curve_source[name] = "TensorBoard"
    for name, points in _eval_curves(facts.trainer_events).items():
        # The evaluated events name the metrics as the status does (val_…); TensorBoard's validation/… twin
        # (the loop's, or Keras's evaluation_…_vs_iterations) holds the same points: the events' curve is kept.
        bare = name.removeprefix(VAL_PREFIX)
        page.curves.pop(f"validation/{bare}", None)
        page.curves.pop(f"validation/evaluation_{bare}_vs_iterations", None)
        page.curves[name] = points
        page.curve_source[name] = f"{layout.EVALUATED} events"
    page.notes = notes
    return page


def decision_summary(doc: dict | None) -> str:
    """A decision's one line: where it chose and why (``ops.why``'s words)."""
    rows = why.decision_lines(doc)
    return rows[0][1] if rows else "decision (its table could not be read)"


def _decisions(page: RunPage, run, stored: dict, notes: list[str]) -> None:
    """The run's decision tables as marks on the timeline: their times from the listing, the newest
    :data:`DECISION_TABLES` tables read (through the page's bounded object cache), the older ones not."""
    found = sorted((t, k) for k in stored if (t := layout.decision_time(k)) is not None)
    for n, (t, key) in enumerate(found):
        doc = None
        if n >= len(found) - DECISION_TABLES:
            doc = read_json(run, key)
            if not doc:
                notes.append(f"{key} could not be read (not a JSON object)")
                doc = None
        page.decisions.append(Decision(at=t, key=key, doc=doc))
        page.marks.append(Mark(kind=DECISION, at=t, lane=None, text=decision_summary(doc) if doc else
                               "decision" + ("" if n >= len(found) - DECISION_TABLES else
                                             " (an older one: its table is not read here)")))
    if len(found) > DECISION_TABLES:
        notes.append(f"{len(found)} decisions: the newest {DECISION_TABLES} tables are shown, the older ones as "
                     f"marks only (each is {layout.DECISIONS_PREFIX}<time>.json in the run's folder)")
    page.st.decision = next((d.doc for d in reversed(page.decisions) if d.doc), None)
