"""An attempt's frame in process: its number and events, the lease around the training, the exit
code of each way it ends, what it cleans up, the end markers' documents, and the first read that
says a run already ended.

`RunAttempt` is the same for the trainer's loop and a user's command; these drive it with a small
subclass over a `file://` run folder (no TensorFlow), where the trainer tests run whole processes.
"""

from __future__ import annotations

import io
import json
import os
import signal
from datetime import UTC, datetime, timedelta

import pytest

from runfolder import exits, layout
from runfolder.events import read_events
from runfolder.lease import LeaseHeld, LeaseLost
from runfolder.storage import open_store
from trainer import run_attempt
from trainer.config import TrainConfig
from trainer.run_attempt import RunAttempt, ended_before_start, loop_complete_message, report_ended, start


class _Attempt(RunAttempt):
    """Trains by calling `train(self)`; records what the frame called."""

    AGAIN_HINT = " (again)"

    def __init__(self, cfg, train=lambda self: exits.OK, failure=None, **kw):
        super().__init__(cfg, **kw)
        self.train, self.failure = train, failure
        self.calls: list[str] = []
        self.seen: dict = {}

    def _lease_lost(self, reason):
        raise LeaseLost(reason)

    def _step_now(self):
        return 12

    def _holding_lease(self):
        self.calls.append("holding")
        self.seen["lease_held_by_us"] = self.lease.epoch is not None

    def _train(self):
        self.calls.append("train")
        self.seen["work"] = os.path.isdir(self.work)
        self.seen["handler"] = signal.getsignal(signal.SIGTERM)
        return self.train(self)

    def _failure(self, error):
        return self.failure(self, error) if self.failure else None

    def _cleanup(self):
        self.calls.append("cleanup")
        self.seen["lease_at_cleanup"] = self.lease is not None and self.lease.epoch is not None


def _cfg(uri, **kw):
    return TrainConfig(run_uri=uri, **kw)


def _lines(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def _utc(text: str) -> bool:
    """An ISO time in UTC, now or a moment ago."""
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return when.utcoffset() == timedelta(0) and abs((datetime.now(UTC) - when).total_seconds()) < 300


def _lease_doc(uri):
    return json.loads(open_store(uri).get_bytes(layout.LEASE_KEY))


def test_an_attempt_is_numbered_after_the_runs_started_events(file_run):
    store = open_store(file_run.uri)
    store.put_bytes(layout.EVENTS_KEY, b"".join(json.dumps(e).encode() + b"\n" for e in [
        {"event": layout.STARTED, "attempt": 1}, {"event": layout.CHECKPOINT, "attempt": 1, "step": 5},
        {"event": layout.STARTED, "attempt": 2}, {"event": layout.PREEMPTED, "attempt": 2, "step": 9}]))
    out = io.StringIO()
    attempt = _Attempt(_cfg(file_run.uri), stream=out)
    assert attempt.events.attempt == 3 and len(attempt.history) == 4
    ev = attempt.emit(layout.STARTED, step=9)
    assert ev["attempt"] == 3 and attempt.own_events == [ev]
    attempt.events.close()
    assert read_events(store)[-1] == ev
    assert _lines(out)[-1] == ev


def test_a_fresh_run_trains_under_the_lease_and_cleans_up(file_run, tmp_path):
    out = io.StringIO()
    before = signal.getsignal(signal.SIGTERM)

    def train(self):
        self.emit(layout.STARTED, step=0)
        return 42

    attempt = _Attempt(_cfg(file_run.uri), train=train, stream=out)
    work = attempt.work
    assert os.path.basename(work).startswith("trainstack-") and os.path.isdir(work)
    assert attempt.run() == 42
    assert attempt.calls == ["holding", "train", "cleanup"]
    assert attempt.seen["lease_held_by_us"] and attempt.seen["work"] and attempt.seen["lease_at_cleanup"]
    assert attempt.seen["handler"] == attempt.stop._handle  # the stop listened while it trained
    assert signal.getsignal(signal.SIGTERM) is before  # and gave the signals back
    assert _lease_doc(file_run.uri)["released"] is True  # released after the cleanup
    assert not os.path.exists(work)  # its own work folder is gone
    assert attempt.stop_key._done.is_set()
    assert [e["event"] for e in read_events(open_store(file_run.uri))] == [layout.STARTED]


def test_a_given_work_folder_is_made_and_kept(file_run, tmp_path):
    work = tmp_path / "work" / "deep"
    attempt = _Attempt(_cfg(file_run.uri, work_dir=str(work)), stream=io.StringIO())
    assert attempt.work == str(work) and work.is_dir()
    assert attempt.run() == exits.OK
    assert work.is_dir()


def test_a_worker_takes_no_lease_and_writes_no_event_to_the_run(file_run):
    out = io.StringIO()

    def train(self):
        self.emit(layout.STARTED, step=0)
        return exits.OK

    attempt = _Attempt(_cfg(file_run.uri), train=train, stream=out, chief=False)
    assert attempt.lease is None and attempt.chief is False
    assert attempt.run() == exits.OK
    assert attempt.calls == ["train", "cleanup"]
    store = open_store(file_run.uri)
    assert not store.exists(layout.LEASE_KEY) and read_events(store) == []
    assert [e["event"] for e in _lines(out)] == [layout.STARTED]


def test_a_failure_is_said_with_its_type_and_step_and_exits_failed(file_run):
    out = io.StringIO()

    def train(self):
        raise ValueError("the data ran out")

    attempt = _Attempt(_cfg(file_run.uri), train=train, stream=out)
    assert attempt.run() == exits.FAILED
    [failed] = read_events(open_store(file_run.uri))
    assert failed["event"] == layout.FAILED_EVENT
    assert failed["reason"] == "ValueError: the data ran out" and failed["step"] == 12
    assert attempt.calls[-1] == "cleanup" and _lease_doc(file_run.uri)["released"] is True


def test_a_failure_the_attempt_knows_exits_with_its_own_code_and_nothing_more(file_run):
    out = io.StringIO()

    def train(self):
        raise KeyError("x")

    def failure(self, error):
        self.seen["error"] = error
        return 78

    attempt = _Attempt(_cfg(file_run.uri), train=train, failure=failure, stream=out)
    assert attempt.run() == 78
    assert isinstance(attempt.seen["error"], KeyError)
    assert read_events(open_store(file_run.uri)) == []


@pytest.mark.parametrize("error", [LeaseLost("another machine took the run"), LeaseHeld("held by b", {})])
def test_a_run_another_machine_holds_is_said_here_only_and_exits_lease_held(file_run, error):
    out = io.StringIO()

    def train(self):
        raise error

    attempt = _Attempt(_cfg(file_run.uri), train=train, stream=out)
    assert attempt.run() == exits.LEASE_HELD
    said = [e for e in _lines(out) if e["event"] == layout.FAILED_EVENT]
    assert said == [{**said[0], "reason": str(error), "step": 12}]
    assert read_events(open_store(file_run.uri)) == []  # nothing written to the run


def test_a_lease_held_by_another_machine_stops_the_attempt_before_it_trains(file_run):
    from runfolder.lease import RunLease

    other = RunLease(open_store(file_run.uri), holder="other-machine:1", ttl_s=60)
    other.acquire()
    out = io.StringIO()
    attempt = _Attempt(_cfg(file_run.uri, lease_wait_s=0.2), stream=out)
    assert attempt.run() == exits.LEASE_HELD
    assert "train" not in attempt.calls and "holding" not in attempt.calls
    assert _lease_doc(file_run.uri)["holder"] == "other-machine:1"
    # The wait is said here (the lease's own line), the failure too; the run's log has neither.
    assert [e["event"] for e in _lines(out)] == [layout.LEASE_WAIT, layout.FAILED_EVENT]
    assert _lines(out)[0]["holder"] == "other-machine:1" and _lines(out)[0]["attempt"] == 1
    assert read_events(open_store(file_run.uri)) == []


def test_the_lease_is_the_runs_with_the_configured_times_and_the_attempts_hooks(file_run):
    cfg = _cfg(file_run.uri, lease_ttl_s=90.0, lease_wait_s=7.0)
    attempt = _Attempt(cfg, stream=io.StringIO())
    assert attempt.cfg is cfg
    lease = attempt.lease
    assert lease.store is attempt.store and lease.ttl_s == 90.0 and lease.wait_s == 7.0
    assert lease.on_lost == attempt._lease_lost and lease.emit == attempt._lease_event
    assert attempt.stop_key.store is attempt.store
    assert attempt.run() == exits.OK
    assert _lease_doc(file_run.uri)["ttl_s"] == 90.0


def test_a_work_folder_removed_while_training_ends_the_attempt_as_it_would(file_run):
    import shutil

    def train(self):
        shutil.rmtree(self.work)  # e.g. the start-up watchdog's exit path cleans it first
        return 42

    assert _Attempt(_cfg(file_run.uri), train=train, stream=io.StringIO()).run() == 42


@pytest.mark.parametrize(("marker", "kind", "when", "message"), [
    (layout.COMPLETE, layout.ALREADY_COMPLETE, "finished_at", "run already COMPLETE; nothing to do (again)"),
    (layout.CANCELLED, layout.ALREADY_CANCELLED, "cancelled_at", "run already CANCELLED; nothing to do (again)"),
])
def test_a_run_that_ended_says_so_once_and_trains_nothing(file_run, marker, kind, when, message):
    store = open_store(file_run.uri)
    store.put_bytes(marker, json.dumps({layout.MARKER_STEP: 300, layout.MARKER_ATTEMPTS: 2, when: "then"}).encode())
    out = io.StringIO()
    attempt = _Attempt(_cfg(file_run.uri), stream=out)
    assert attempt.run() == exits.OK
    assert attempt.calls == ["cleanup"]
    [line] = _lines(out)
    assert line == {layout.EVENT: kind, layout.TIME: line[layout.TIME], layout.ATTEMPT: 2, "step": 300,
                    "ended_at": "then", "message": message}
    assert not store.exists(layout.LEASE_KEY) and read_events(store) == []


@pytest.mark.parametrize(("attempts", "said"), [(3, 3), (True, None), ("2", None), (None, None)])
def test_the_ended_line_names_the_markers_attempts_only_when_it_is_a_count(tmp_path, attempts, said):
    store = open_store(f"file://{tmp_path}/run")
    store.put_bytes(layout.CANCELLED, json.dumps({layout.MARKER_ATTEMPTS: attempts}).encode())
    out = io.StringIO()
    assert report_ended(store, attempt=9, stream=out, complete_message=lambda d: "x") is True
    [line] = _lines(out)
    assert line[layout.ATTEMPT] == said and line["message"] == "run already CANCELLED; nothing to do"
    assert line["step"] is None and line["ended_at"] is None


def test_complete_is_read_before_cancelled_and_worded_by_the_caller(tmp_path):
    store = open_store(f"file://{tmp_path}/run")
    store.put_bytes(layout.CANCELLED, b"{}")
    store.put_bytes(layout.COMPLETE, json.dumps({layout.MARKER_STEP: 5}).encode())
    out = io.StringIO()
    assert report_ended(store, attempt=1, stream=out, complete_message=lambda d: f"done at {d['step']}")
    assert [line["message"] for line in _lines(out)] == ["done at 5"]
    assert report_ended(open_store(f"file://{tmp_path}/other"), attempt=1, stream=out,
                        complete_message=lambda d: "x") is False


@pytest.mark.parametrize(("done", "steps", "message"), [
    ({"step": 100}, 300, "run already COMPLETE at 100 steps; --steps 300 does not extend it. To train further, "
                         "start a new run id (another --run-uri, or run.id in the stack)"),
    ({"step": 100}, 100, "run already COMPLETE; nothing to do"),
    ({"step": 100}, 50, "run already COMPLETE; nothing to do"),
    ({"step": "100"}, 300, "run already COMPLETE; nothing to do"),
    ({}, 300, "run already COMPLETE; nothing to do"),
])
def test_the_loops_complete_line_says_when_more_steps_were_asked(done, steps, message):
    assert loop_complete_message(done, steps) == message


def test_the_attempts_own_complete_line_names_its_hint(file_run):
    attempt = _Attempt(_cfg(file_run.uri), stream=io.StringIO())
    assert attempt._complete_message({}) == "run already COMPLETE; nothing to do (again)"
    attempt.events.close()


def test_cancelled_names_the_step_reason_and_every_attempt(file_run):
    store = open_store(file_run.uri)
    store.put_bytes(layout.EVENTS_KEY, json.dumps({"event": layout.STARTED, "attempt": 1}).encode() + b"\n")
    attempt = _Attempt(_cfg(file_run.uri), stream=io.StringIO())
    attempt.emit(layout.STARTED, step=4)
    attempt._write_cancelled(40, "budget reached", 1280)
    doc = json.loads(store.get_bytes(layout.CANCELLED))
    assert doc == {layout.MARKER_STEP: 40, layout.MARKER_ATTEMPTS: 2, layout.MARKER_REASON: "budget reached",
                   "examples_seen": 1280, "cancelled_at": doc["cancelled_at"]}
    assert _utc(doc["cancelled_at"])
    attempt.events.close()


def test_cancelled_before_any_start_counts_one_attempt(file_run):
    attempt = _Attempt(_cfg(file_run.uri), stream=io.StringIO())
    attempt._write_cancelled(0, "stop", None)
    doc = json.loads(open_store(file_run.uri).get_bytes(layout.CANCELLED))
    assert doc[layout.MARKER_ATTEMPTS] == 1 and doc["examples_seen"] is None
    attempt.events.close()


def test_complete_counts_the_earlier_attempts_and_this_ones(file_run):
    store = open_store(file_run.uri)
    store.put_bytes(layout.EVENTS_KEY, json.dumps({"event": layout.STARTED, "attempt": 1}).encode() + b"\n")
    attempt = _Attempt(_cfg(file_run.uri), stream=io.StringIO())
    attempt.emit(layout.STARTED, step=4)
    signature = {"endpoint": "serve", "inputs": {"x": {"dtype": "float32", "shape": [None, 4]}}}
    attempt._write_complete(step=50, metrics={"loss": 0.5}, examples_seen=1600, signature=signature,
                            best={"metric": "val_loss", "value": 0.4})
    doc = json.loads(store.get_bytes(layout.COMPLETE))
    assert doc[layout.MARKER_STEP] == 50 and doc[layout.MARKER_ATTEMPTS] == 2
    assert doc["metrics"] == {"loss": 0.5} and doc["examples_seen"] == 1600
    assert doc["best"] == {"metric": "val_loss", "value": 0.4} and doc["signature"] == signature
    attempt.events.close()


def test_the_first_read_says_an_ended_run_and_lets_a_fresh_one_go_on(file_run):
    out = io.StringIO()
    cfg = _cfg(file_run.uri)
    assert ended_before_start(cfg, complete_message=lambda d: "x", stream=out) is None
    assert out.getvalue() == ""
    open_store(file_run.uri).put_bytes(layout.COMPLETE, json.dumps({layout.MARKER_STEP: 7}).encode())
    assert ended_before_start(cfg, complete_message=lambda d: f"done {d['step']}", stream=out) == exits.OK
    assert [line["message"] for line in _lines(out)] == ["done 7"]


def test_the_first_read_of_an_unreachable_run_says_why_and_fails():
    out = io.StringIO()
    cfg = _cfg("nope://bucket/run")
    assert ended_before_start(cfg, complete_message=lambda d: "x", stream=out) == exits.FAILED
    [line] = _lines(out)
    assert line[layout.EVENT] == layout.FAILED_EVENT and line[layout.ATTEMPT] is None
    assert line["reason"].startswith("ValueError: ") and "nope://" in line["reason"]
    assert _utc(line[layout.TIME])


def test_the_first_read_leaves_a_marker_it_may_not_read_to_the_attempt(file_run, monkeypatch):
    def refused(store, key):
        raise PermissionError(f"{key}: access denied")

    monkeypatch.setattr(run_attempt, "read_json", refused)
    out = io.StringIO()
    assert ended_before_start(_cfg(file_run.uri), complete_message=lambda d: "x", stream=out) is None
    assert out.getvalue() == ""


def test_the_first_read_prints_to_stdout_by_default(file_run, capsys):
    open_store(file_run.uri).put_bytes(layout.CANCELLED, b"{}")
    assert ended_before_start(_cfg(file_run.uri), complete_message=lambda d: "x") == exits.OK
    assert json.loads(capsys.readouterr().out)["event"] == layout.ALREADY_CANCELLED


def test_start_makes_the_attempt_or_says_why_it_could_not(capsys):
    made = start(lambda cfg, stream=None, **kw: (cfg, stream, kw), "cfg", stream="s", chief=False)
    assert made == ("cfg", "s", {"chief": False})

    def broken(cfg, stream=None):
        raise OSError("no route to the store")

    out = io.StringIO()
    assert start(broken, "cfg", stream=out) is None
    [line] = _lines(out)
    assert line == {layout.EVENT: layout.FAILED_EVENT, layout.TIME: line[layout.TIME], layout.ATTEMPT: None,
                    "reason": "OSError: no route to the store"}
    assert start(broken, "cfg") is None
    assert json.loads(capsys.readouterr().out)["reason"] == "OSError: no route to the store"


def test_the_frames_own_hooks_are_the_subclasses_to_fill(file_run):
    attempt = RunAttempt(_cfg(file_run.uri), stream=io.StringIO())
    for hook in (attempt._step_now, attempt._train, lambda: attempt._lease_lost("x")):
        with pytest.raises(NotImplementedError):
            hook()
    assert attempt._failure(ValueError()) is None and attempt._holding_lease() is None
    assert attempt._cleanup() is None
    assert run_attempt.RunAttempt.WORK_PREFIX == "trainstack-" and RunAttempt.AGAIN_HINT == ""
    attempt.events.close()
