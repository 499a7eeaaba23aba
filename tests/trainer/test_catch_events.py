"""The event log's promises, one by one: what a line holds and in which order, what a reader skips,
what a failing or slow store costs the trainer (never an exception, never more than the wait it
was given), the terminal's lines and bar, and the time lost across attempts of every shape.
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
from decimal import Decimal
from pathlib import PurePosixPath

import pytest

from runfolder import layout
from runfolder.events import read_events, read_jsonl, seconds_lost, utc_now
from runfolder.storage import open_store
from trainer.events import EventLog


def _store(tmp_path):
    return open_store(f"file://{tmp_path}/run")


# -- what a line holds --


def test_a_line_starts_with_its_name_time_and_attempt_and_holds_any_value(tmp_path):
    out = io.StringIO()
    log = EventLog(_store(tmp_path), stream=out, tty=False)
    log.emit("checkpoint", zeta=1, alpha=Decimal("0.5"), path=PurePosixPath("/data/x"))
    log.close()
    line = out.getvalue().splitlines()[0]
    assert line.startswith('{"event": "checkpoint", "time": "')
    ev = json.loads(line)
    assert list(ev) == ["event", "time", "attempt", "zeta", "alpha", "path"]  # as given, not sorted
    assert (ev["attempt"], ev["alpha"], ev["path"]) == (1, 0.5, "/data/x")  # attempt 1 unless told
    assert ev["time"].endswith("+00:00") and utc_now().endswith("+00:00")
    assert read_events(_store(tmp_path)) == [ev]


def test_a_reader_skips_torn_foreign_and_undecodable_lines_and_reads_on(tmp_path):
    store = _store(tmp_path)
    raw = b"\n".join([b'{"event": "started", "attempt": 1}', b'{"event": "checkp', b"[1, 2]", b"7",
                      b'{"event": ["not", "a", "name"]}', b'{"event": "caf\xff", "n": 1}',
                      b'{"no_event": true}', b'{"event": "finished"}'])
    store.put_bytes(layout.EVENTS_KEY, raw)
    got = read_jsonl(store, layout.EVENTS_KEY)
    assert [e.get("event") for e in got] == ["started", "caf\ufffd", None, "finished"]
    assert read_jsonl(store, "absent.jsonl") == []


# -- a slow or failing store --


class Held:
    """A store whose appends wait until released."""

    def __init__(self, store) -> None:
        self.store, self.release, self.entered = store, threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.store, name)

    def append_lines(self, key, lines):
        self.entered.set()
        self.release.wait(20)
        self.store.append_lines(key, lines)


def test_close_waits_no_longer_than_its_timeout_for_a_held_store(tmp_path):
    held = Held(_store(tmp_path))
    log = EventLog(held, stream=io.StringIO(), tty=False)
    log.emit("started")
    assert held.entered.wait(10)
    # The writer thread is named for what it does (a thread dump of a stuck trainer says so).
    assert any(t.name.startswith("events_") for t in threading.enumerate())
    timer = threading.Timer(5.0, held.release.set)
    timer.start()
    try:
        t0 = time.monotonic()
        log.flush(timeout=0.1)
        flushed = time.monotonic() - t0
        t0 = time.monotonic()
        log.close(timeout=0.1)
        closed = time.monotonic() - t0
    finally:
        held.release.set()
        timer.cancel()
    assert flushed < 0.9 and closed < 0.9, (flushed, closed)


def test_flush_without_a_timeout_waits_for_every_write(tmp_path):
    held = Held(_store(tmp_path))
    log = EventLog(held, stream=io.StringIO(), tty=False)
    log.emit("started")
    assert held.entered.wait(10)
    log.emit("checkpoint", step=1)
    threading.Timer(0.3, held.release.set).start()
    log.flush()
    assert [e["event"] for e in read_events(held.store)] == ["started", "checkpoint"]
    log.close(timeout=None)


def test_a_write_that_fails_is_one_line_on_stderr_and_never_an_exception(tmp_path, capfd):
    store = _store(tmp_path)

    def refuse(key, *_args):
        raise OSError(f"refused {key}")

    store.append_lines = refuse
    store.put_bytes = refuse
    log = EventLog(store, stream=io.StringIO(), tty=False)
    log.emit("started")
    log.flush()
    log.progress(1, 10, 0.5, 10.0)
    log.flush()
    log.background(lambda: refuse("x"))
    log.close()
    err = capfd.readouterr().err.splitlines()
    assert err == ["trainstack: could not write events.jsonl to the run: refused events.jsonl",
                   "trainstack: could not write progress.json to the run: refused progress.json",
                   "trainstack: could not write  to the run: refused x"]


def test_without_a_store_nothing_is_written_and_nothing_fails(capfd):
    out = io.StringIO()
    log = EventLog(None, stream=out, tty=False)
    log.emit("started")
    log.progress(1, 10, 0.5, 10.0)
    log.background(lambda: 1 / 0)
    log.update_bar(3)  # no bar: nothing to advance
    log.close()
    assert [json.loads(line)["event"] for line in out.getvalue().splitlines()] == ["started"]
    assert capfd.readouterr().err == ""


def test_two_background_tasks_queued_behind_a_held_store_both_run(tmp_path):
    held = Held(_store(tmp_path))
    log = EventLog(held, stream=io.StringIO(), tty=False)
    ran: list[str] = []
    log.emit("started")
    assert held.entered.wait(10)
    log.background(lambda: ran.append("tensorboard"))
    log.background(lambda: ran.append("outputs"))
    held.release.set()
    log.close()
    assert sorted(ran) == ["outputs", "tensorboard"]


def test_progress_json_is_the_documented_document(tmp_path):
    store = _store(tmp_path)
    log = EventLog(store, attempt=3, stream=io.StringIO(), tty=False)
    log.progress(7, 70, 0.25, 123.0, epoch=2, metrics=None)
    log.close()
    doc = json.loads(store.get_bytes(layout.PROGRESS_KEY))
    updated = doc.pop("updated")
    assert doc == {"step": 7, "total": 70, "loss": 0.25, "examples_per_sec": 123.0, "attempt": 3, "epoch": 2}
    assert updated.endswith("+00:00")


# -- the terminal --


def test_on_a_terminal_events_are_plain_words_and_the_bar_shows_steps_loss_and_rate():
    out = io.StringIO()
    log = EventLog(None, stream=out, tty=True)
    log.start_bar(100, 10)
    log.update_bar(40, 0.25, 1234.0)
    log.emit("started", config={"steps": 5}, step=1)
    log.emit("checkpoint", step=40, seconds=0.1, bytes=10)
    log.close()
    text = out.getvalue()
    assert "started step=1" in text and "config" not in text and "steps" not in text
    assert "checkpoint step=40 seconds=0.1 bytes=10" in text
    assert "events.py" not in text  # rich's log path would point at this module, not the user's run
    bar = [line for line in text.splitlines() if line.startswith("train ")]
    # Off a real terminal rich draws the bar once, when it stops: close() stopped it.
    assert len(bar) == 1 and "40/100 loss 0.2500 1,234 ex/s" in bar[0], text
    assert "━━━" in bar[0] and bar[0].rstrip().endswith(":--")  # the bar itself, and the time left
    log.update_bar(50)  # after the bar stopped: nothing to advance


def test_a_bar_with_only_steps_shows_dashes_and_the_starting_step():
    out = io.StringIO()
    log = EventLog(None, stream=out, tty=True)
    log.start_bar(50, 20)
    log.close()
    (bar,) = [line for line in out.getvalue().splitlines() if line.startswith("train ")]
    assert "20/50 loss - - ex/s" in bar


def test_a_stream_that_is_a_terminal_is_detected_and_a_pipe_gets_json_lines():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term, pipe = Terminal(), io.StringIO()
    for stream in (term, pipe):
        log = EventLog(None, stream=stream)
        log.start_bar(10, 0)
        log.emit("checkpoint", step=4)
        log.close()
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", term.getvalue())  # rich's colours on a terminal
    assert "checkpoint step=4" in shown and '{"event"' not in shown
    assert [json.loads(line)["event"] for line in pipe.getvalue().splitlines()] == ["checkpoint"]


# -- time lost across attempts --


def _at(kind: str, t: float, attempt: int | None, **fields) -> dict:
    from datetime import UTC, datetime

    return {"event": kind, "time": datetime.fromtimestamp(1_790_000_000 + t, UTC).isoformat(timespec="milliseconds"),
            "attempt": attempt, **fields}


@pytest.mark.parametrize(("events", "lost"), [
    # A machine's boot events before the first start are no lost time.
    ([_at("bootstrap", 0, None), _at("started", 100, 1), _at("resumed", 101, 1)], 0),
    # The run's own failure, then a new attempt: not preemption.
    ([_at("started", 0, 1), _at("failed", 10, 1, exit_code=1), _at("started", 50, 2), _at("resumed", 51, 2)], 0),
    ([_at("started", 0, 1), _at("cancelled", 10, 1), _at("started", 50, 2), _at("resumed", 51, 2)], 0),
    # Resumed half a second after the notice: half a second, to the millisecond.
    ([_at("started", 0, 1), _at("preempted", 10, 1), _at("resumed", 10.5, 2)], 0.5),
    ([_at("started", 0, 1), _at("preempted", 10, 1), _at("started", 11, 2), _at("resumed", 11.2345, 2)], 1.234),
    # An event without a readable time is skipped, and the rest still count.
    ([_at("started", 0, 1), {"event": "checkpoint", "attempt": 1}, _at("preempted", 10, 1),
      _at("started", 20, 2), _at("resumed", 30, 2), {"event": "x", "time": "yesterday", "attempt": 2},
      _at("preempted", 40, 2), _at("started", 45, 3), _at("resumed", 47, 3)], 27),
])
def test_seconds_lost_over_attempts_of_every_shape(events, lost):
    assert seconds_lost(events) == lost
