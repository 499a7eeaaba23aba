"""What a run tells the world: JSON event lines, `progress.json`, and a progress bar on a terminal.

Events (one JSON object per line on stdout when it is not a terminal, and appended to
`<run-uri>/events.jsonl`): `started`, `resumed` (step), `checkpoint` (step, seconds,
bytes), `preempted` (step), `finished` (step, metrics), `failed` (reason), `evaluated`
(step, validation metrics, examples, seconds; `trainer.metrics`), `eval_slow`, plus a few
informational ones (`checkpoint_skipped`, `checkpoint_failed`, `upload_retry`, `complete`).
Every event has `event`, `time` (UTC, ISO 8601) and `attempt` (1 for a run's first start).
The names, keys and fields are the run folder's contract in `runfolder.layout`.

Reading them back (and what they add up to across attempts) is `runfolder.events`.

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

from runfolder import layout
from runfolder.events import utc_now


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
            self._safe(self.store.append_lines, layout.EVENTS_KEY, lines)

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
            self._safe(self.store.put_bytes, layout.PROGRESS_KEY, json.dumps(doc).encode())

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


def _jsonable(o):
    try:
        return float(o)
    except (TypeError, ValueError):
        return str(o)
