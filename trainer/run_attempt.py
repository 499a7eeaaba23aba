"""What every attempt of a run does, whoever trains: the trainer's own loop or the user's command.

`RunAttempt` owns the run's store and events, the stop request (signals and the run folder's
STOP), the local work folder, the run's lease (the chief takes it), the first read (a run that
already ended says so and exits 0), the turning of any exception into the exit code the boot
scripts act on, and the end markers' documents (CANCELLED, COMPLETE). Two attempts build on
it: `trainer.loop_attempt.LoopAttempt` (the loop, TensorFlow in this process) and
`trainer.script.ScriptRun` (the user's command as a child; this process never imports
TensorFlow, so neither does this module).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

from runfolder import exits, layout
from runfolder.events import read_events, utc_now
from runfolder.lease import LeaseHeld, LeaseLost, RunLease
from runfolder.storage import open_store, read_json
from trainer.config import TrainConfig
from trainer.events import EventLog
from trainer.signals import StopKeyPoller, StopRequest


class RunAttempt:
    """One attempt of a run, around whatever trains; subclasses say how it trains (`_train`)."""

    #: Prefix of the local work folder when --work-dir is not given.
    WORK_PREFIX = "trainstack-"
    #: Added to the "run already ended" line.
    AGAIN_HINT = ""

    def __init__(self, cfg: TrainConfig, *, stream=None, stop: StopRequest | None = None, chief: bool = True):
        self.cfg = cfg
        self.chief = chief
        self.store = open_store(cfg.run_uri)
        self.history = read_events(self.store)
        # Only the chief writes the run's log; the other workers print their events.
        self.events = EventLog(self.store if chief else None, attempt=1 + layout.attempts(self.history), stream=stream)
        self.own_events: list[dict] = []
        self._own_work = cfg.work_dir is None
        self.work = cfg.work_dir or tempfile.mkdtemp(prefix=self.WORK_PREFIX)
        os.makedirs(self.work, exist_ok=True)
        self.stop = stop or StopRequest()
        # The run folder's STOP (ops stop).
        self.stop_key = StopKeyPoller(self.store)
        # The chief writes the run's objects, so it alone takes the run's lease.
        self.lease = RunLease(self.store, ttl_s=cfg.lease_ttl_s, wait_s=cfg.lease_wait_s, on_lost=self._lease_lost,
                              emit=self._lease_event) if chief else None

    # -- events --

    def emit(self, event: str, **fields) -> dict:
        ev = self.events.emit(event, **fields)
        self.own_events.append(ev)
        return ev

    def _lease_event(self, kind: str, fields: dict) -> None:
        # Printed only: until it holds the lease this trainer writes nothing to the run.
        self.events.emit(kind, local_only=True, **fields)

    def _lease_lost(self, reason: str) -> None:
        """Another machine took the run: what stops this attempt's writes."""
        raise NotImplementedError

    # -- the attempt --

    def _step_now(self) -> int:
        """The step this attempt stands at, for its `failed` event."""
        raise NotImplementedError

    def _train(self) -> int:
        """Train, holding the lease (the chief); returns the exit code."""
        raise NotImplementedError

    def _holding_lease(self) -> None:
        """Called once the lease is held, before training."""

    def _failure(self, error: Exception) -> int | None:
        """The exit code of an exception this kind of attempt knows, after saying why; None for any other."""
        return None

    def _cleanup(self) -> None:
        """What this kind of attempt stops before the shared cleanup (the lease, the stop, the events)."""

    def run(self) -> int:
        """The whole attempt; returns the exit code."""
        self.stop.install()
        try:
            if self._already_complete():
                return exits.OK
            if self.lease is not None:
                self.lease.acquire()
                self.lease.start()
                self._holding_lease()
            return self._train()
        except (LeaseHeld, LeaseLost) as e:
            # Another machine trains this run: say so here, write nothing there.
            self.events.emit(layout.FAILED_EVENT, local_only=True, reason=str(e), step=self._step_now())
            return exits.LEASE_HELD
        except Exception as e:  # noqa: BLE001 - any failure ends the attempt the same way
            code = self._failure(e)
            if code is not None:
                return code
            self.emit(layout.FAILED_EVENT, reason=f"{type(e).__name__}: {e}", step=self._step_now())
            return exits.FAILED
        finally:
            self._cleanup()
            if self.lease is not None:
                self.lease.release()
            self.stop.restore()
            self.stop_key.close()
            self.events.close()
            if self._own_work:
                shutil.rmtree(self.work, ignore_errors=True)

    def _already_complete(self) -> bool:
        """True (and says so) when the run already ended as COMPLETE or CANCELLED: nothing to do."""
        return report_ended(self.store, attempt=self.events.attempt, stream=self.events.stream,
                            complete_message=self._complete_message, again_hint=self.AGAIN_HINT)

    def _complete_message(self, done: dict) -> str:
        return f"run already COMPLETE; nothing to do{self.AGAIN_HINT}"

    # -- end markers (the chief's, each written last: one atomic object) --

    def _write_cancelled(self, step: int, reason: str, examples_seen: int | None) -> None:
        doc = {
            layout.MARKER_STEP: step,
            layout.MARKER_ATTEMPTS: layout.attempts(self.history + self.own_events) or 1,
            layout.MARKER_REASON: reason,
            "examples_seen": examples_seen,
            "cancelled_at": utc_now(),
        }
        self.store.put_bytes(layout.CANCELLED, json.dumps(doc, indent=2).encode())

    def _write_complete(self, *, step: int, metrics: dict, examples_seen: int | None, signature, **extra) -> None:
        """COMPLETE; `extra` are `export.complete_record`'s optional fields (the evaluation's `best`, `eval_seconds`)."""
        from trainer import export as export_mod

        export_mod.write_complete(self.store, step=step, metrics=metrics, examples_seen=examples_seen,
                                  events=self.history + self.own_events, finished_at=time.time(), signature=signature,
                                  **extra)


def report_ended(store, *, attempt: int, stream, complete_message, again_hint: str = "") -> bool:
    """True, after printing one line, when the run already ended as COMPLETE or CANCELLED.

    Printed, not appended: the run's log ended with its `finished` or `cancelled` event. The line
    carries the time it is said, the run's last attempt (the marker's count) and when it ended.
    `complete_message(done)` words the COMPLETE case (the loop's names the steps asked for).
    """
    for marker, kind, when in ((layout.COMPLETE, layout.ALREADY_COMPLETE, "finished_at"),
                               (layout.CANCELLED, layout.ALREADY_CANCELLED, "cancelled_at")):
        done = read_json(store, marker)
        if done is None:
            continue
        message = (complete_message(done) if marker == layout.COMPLETE
                   else f"run already {marker}; nothing to do{again_hint}")
        # Said now, about the run's last attempt: no new attempt started (`attempt` is the one it would have been).
        attempts = done.get(layout.MARKER_ATTEMPTS)
        line = {layout.EVENT: kind, layout.TIME: utc_now(),
                layout.ATTEMPT: attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else None,
                "step": done.get(layout.MARKER_STEP), "ended_at": done.get(when), "message": message}
        stream.write(json.dumps(line) + "\n")
        stream.flush()
        return True
    return False


def loop_complete_message(done: dict, steps: int) -> str:
    """The trainer loop's line for a COMPLETE run, given the `--steps` asked for."""
    step = done.get(layout.MARKER_STEP)
    if isinstance(step, int) and steps > step:
        # A COMPLETE run is never extended in place: its model and COMPLETE record stay what they are.
        return (f"run already COMPLETE at {step} steps; --steps {steps} does not extend it. To train "
                f"further, start a new run id (another --run-uri, or run.id in the stack)")
    return "run already COMPLETE; nothing to do"


def ended_before_start(cfg: TrainConfig, *, complete_message, stream=None) -> int | None:
    """The first read of an attempt, before whatever trains is loaded (TensorFlow: ~5 s of CPU).

    `EXIT_OK` after saying so when the run already ended (what `RunAttempt.run` would say and
    return); `EXIT_FAILED` after the `failed` line when the run's store cannot be read at all
    (what `start` would); None when the run goes on: the attempt then reads the markers again,
    as it always does.
    """
    out = stream or sys.stdout
    try:
        store = open_store(cfg.run_uri)
        history = read_events(store)
    except Exception as e:  # noqa: BLE001 - the attempt could not start either: the same line, the same code
        _say_not_started(e, out)
        return exits.FAILED
    try:
        ended = report_ended(store, attempt=1 + layout.attempts(history), stream=out,
                             complete_message=complete_message)
    except Exception:  # noqa: BLE001 - the attempt's own read says what went wrong, in its events
        return None
    return exits.OK if ended else None


def _say_not_started(error: Exception, out) -> None:
    line = {layout.EVENT: layout.FAILED_EVENT, layout.TIME: utc_now(), layout.ATTEMPT: None,
            "reason": f"{type(error).__name__}: {error}"}
    out.write(json.dumps(line) + "\n")
    out.flush()


def start(make, cfg: TrainConfig, *, stream=None, **kw):
    """`make(cfg, stream=..., **kw)`, or None after printing the `failed` line when it cannot even start
    (e.g. the run's store cannot be reached at all): the caller then exits `EXIT_FAILED`."""
    try:
        return make(cfg, stream=stream, **kw)
    except Exception as e:  # noqa: BLE001 - whatever stops the attempt from starting ends it the same way
        _say_not_started(e, stream or sys.stdout)
        return None
