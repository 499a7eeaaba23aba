"""What a run tells the world: JSON event lines, `progress.json`, and a progress bar on a terminal.

Events (one JSON object per line on stdout when it is not a terminal, and appended to
`<run-uri>/events.jsonl`): `started`, `resumed` (step), `checkpoint` (step, seconds,
bytes), `preempted` (step), `finished` (step, metrics), `failed` (reason), `evaluated`
(step, validation metrics, examples, seconds; `trainer.metrics`), `eval_slow`, plus a few
informational ones (`checkpoint_skipped`, `checkpoint_failed`, `upload_retry`, `complete`).
Every event has `event`, `time` (UTC, ISO 8601) and `attempt` (1 for a run's first start).
The names, keys and fields are the run folder's contract in `runfolder.layout`.

Also here: what a run's events add up to across attempts (`seconds_lost`, and the attempt
count through `layout.attempts`).

Writes to the bucket happen on one background thread in order, so a slow or failing
object store never holds up a training step; `close()` waits for them. Writes that pile up
behind a slow store are coalesced: the event lines waiting are appended in one write, and
only the newest `progress.json` and one pending run of each background task are kept, so
a store that was failing for a while is caught up in a few requests, not one per event.
Only the chief writes to the bucket; other workers print.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime

from runfolder import layout

# Re-exported for readers that import them from here (ops/status.py); defined in layout.
EVENTS_KEY = layout.EVENTS_KEY
PROGRESS_KEY = layout.PROGRESS_KEY


def utc_now() -> str:
    """Current UTC time as ISO 8601 with milliseconds."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def parse_time(text: str) -> float:
    """An event's `time` back to a POSIX timestamp."""
    return datetime.fromisoformat(text).timestamp()


def read_events(store) -> list[dict]:
    """The run's events so far (an unreadable line is skipped: it cannot be trusted)."""
    return read_jsonl(store, EVENTS_KEY)


def read_jsonl(store, key: str) -> list[dict]:
    """The JSON objects of a JSON-lines object of the run; a torn or foreign line is skipped."""
    from runfolder.storage import NotFound

    try:
        raw = store.get_bytes(key).decode("utf-8", "replace")
    except NotFound:
        return []
    out = []
    for line in raw.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        # A line whose `event` is not a name is foreign too: every reader matches it against
        # names (sets of them included, where a list or an object would raise).
        if isinstance(ev, dict) and isinstance(ev.get(layout.EVENT, ""), str):
            out.append(ev)
    return out


class EventLog:
    """Emits events to stdout and the run's `events.jsonl`; shows a progress bar on a terminal."""

    def __init__(self, store=None, *, attempt: int = 1, stream=None, tty: bool | None = None):
        self.store = store
        self.attempt = attempt
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="events") if store is not None else None
        self._pending: list[Future] = []
        self._lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queued: set = set()  # coalesced writes waiting for the writer thread
        self._lines: list[str] = []  # event lines not yet handed to the store
        self._progress_doc: dict | None = None
        self._progress = None
        self._rich_console = None
        self._task = None

    # -- events --

    def emit(self, event: str, *, local_only: bool = False, **fields) -> dict:
        """Record one event; returns it. `local_only` events are printed but not stored."""
        ev = {layout.EVENT: event, layout.TIME: utc_now(), layout.ATTEMPT: self.attempt, **fields}
        line = json.dumps(ev, default=_jsonable, sort_keys=False)
        with self._lock:
            if self.tty:
                self._console_print(ev)
            else:
                self.stream.write(line + "\n")
                self.stream.flush()
        if not local_only and self._pool is not None:
            with self._queue_lock:
                self._lines.append(line)
            self._schedule("events", self._write_lines)
        return ev

    def _write_lines(self) -> None:
        with self._queue_lock:
            lines, self._lines = self._lines, []
        if lines:
            self._safe(self.store.append_lines, EVENTS_KEY, lines)

    def _console_print(self, ev: dict) -> None:
        skip = (layout.EVENT, layout.TIME, layout.ATTEMPT, "config")
        text = " ".join(f"{k}={v}" for k, v in ev.items() if k not in skip)
        msg = f"[bold]{ev[layout.EVENT]}[/bold] {text}"
        self._console().log(msg)

    def _console(self):
        if self._rich_console is None:
            from rich.console import Console

            self._rich_console = Console(file=self.stream, log_path=False)
        return self._rich_console

    def _submit(self, fn, *args) -> None:
        if self._pool is None or fn is None:
            return
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._pool.submit(self._safe, fn, *args))

    def _schedule(self, key, fn) -> None:
        """Queue `fn()` on the writer thread unless a run of `key` is already waiting to start."""
        if self._pool is None:
            return
        with self._queue_lock:
            if key in self._queued:
                return
            self._queued.add(key)

        def run() -> None:
            with self._queue_lock:
                self._queued.discard(key)  # from here on, a new request queues a new run
            fn()

        self._submit(run)

    def _safe(self, fn, *args) -> None:
        # An event that cannot be written is reported on stderr, never fatal: the
        # checkpoints, not the log, are what a resume depends on.
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - every failure is reported the same way
            print(f"trainstack: could not write {args[0] if args else ''} to the run: {e}", file=sys.stderr)

    def progress(self, step: int, total: int, loss: float | None, examples_per_sec: float | None, **extra) -> None:
        """Rewrite `progress.json` in the background (the caller decides how often); `extra`
        fields that are not None are added (script mode: `metrics`, `epoch`)."""
        doc = {
            "step": step,
            "total": total,
            "loss": loss,
            "examples_per_sec": examples_per_sec,
            "attempt": self.attempt,
            "updated": utc_now(),
            **{k: v for k, v in extra.items() if v is not None},
        }
        if self.store is not None:
            with self._queue_lock:
                self._progress_doc = doc
            self._schedule("progress", self._write_progress)

    def _write_progress(self) -> None:
        with self._queue_lock:
            doc, self._progress_doc = self._progress_doc, None
        if doc is not None:
            self._safe(self.store.put_bytes, PROGRESS_KEY, json.dumps(doc).encode())

    def background(self, fn) -> None:
        """Run `fn()` on the writer thread, after the writes already queued; not again while
        a run of the same `fn` is still waiting there (the later request is the same work)."""
        self._schedule(("background", fn), lambda: self._safe(fn))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued write is done (or `timeout` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for f in list(self._pending):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                f.result(timeout=left)
            except TimeoutError:
                return

    # -- terminal progress bar --

    def start_bar(self, total: int, completed: int) -> None:
        """Show a rich progress bar (steps, loss, examples/s, ETA) when on a terminal."""
        if not self.tty:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[rate]} ex/s"),
            TimeRemainingColumn(),
            console=self._console(),
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task("train", total=total, completed=completed, loss="-", rate="-")

    def update_bar(self, step: int, loss: float | None = None, rate: float | None = None) -> None:
        """Advance the bar to `step`."""
        if self._progress is None:
            return
        fields = {}
        if loss is not None:
            fields["loss"] = f"{loss:.4f}"
        if rate is not None:
            fields["rate"] = f"{rate:,.0f}"
        self._progress.update(self._task, completed=step, **fields)

    def stop_bar(self) -> None:
        """Remove the progress bar (events print as plain lines again)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def close(self, timeout: float | None = 120.0) -> None:
        """Stop the bar and wait for queued writes."""
        self.stop_bar()
        self.flush(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def seconds_lost(events: list[dict]) -> float:
    """Time the run stood still because machines were taken: from each interrupted attempt's end to the next `resumed`.

    An attempt is interrupted when it ends with `preempted`, with a `failed` event whose
    `exit_code` says a peer was missing or lost (`layout.EXIT_NO_CLUSTER`, `EXIT_PEER_LOST`),
    or with nothing at all: a machine reclaimed without notice (SIGKILL) writes no last
    event, so the attempt's last event is the last moment it is known to have run.
    A failure of the attempt's own (any other `failed`) is not preemption and not counted.
    """
    peer_codes = (layout.EXIT_NO_CLUSTER, layout.EXIT_PEER_LOST)
    lost, since, last, ended, current = 0.0, None, None, True, None
    for ev in events:
        kind = ev.get(layout.EVENT)
        try:
            t = parse_time(ev[layout.TIME])
        except (KeyError, TypeError, ValueError):
            continue
        attempt = ev.get(layout.ATTEMPT)
        # A new attempt speaks (its `started`, or an event before it such as a start-up `failed`).
        if kind == layout.STARTED or (attempt is not None and attempt != current):
            if not ended and since is None and last is not None:
                since = last  # the previous attempt stopped without a word: killed
            ended, current = False, attempt
        if kind == layout.PREEMPTED or (kind == layout.FAILED_EVENT and ev.get("exit_code") in peer_codes):
            since = t if since is None else since
            ended = True
        elif kind in (layout.FINISHED, layout.FAILED_EVENT, layout.CANCELLED_EVENT):
            ended = True
        elif kind == layout.RESUMED and since is not None:
            lost += max(0.0, t - since)
            since = None
        last = t
    return round(lost, 3)


def _jsonable(o):
    try:
        return float(o)
    except (TypeError, ValueError):
        return str(o)
