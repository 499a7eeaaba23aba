"""`ops.runstate`: the figures a status carries besides its state (cost, ages, metrics, the wait for
other machines) and the small readers under them (`stamp`, `duration`, `merge_events`).

Facts are built by hand at a fixed time, as in test_runstate.py; each expected value is
written out, so a changed rounding, field name or bound shows.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from ops import runstate
from ops.runstate import RunFacts, classify
from runfolder import layout
from tests.ops.test_runstate import LOCAL, NOW, S3, at, ev  # the same fixed clock and event builder


def started(ago: float, price=None, note="", workers=1, attempt=1, **config) -> dict:
    cfg = {"steps": 100, "progress_every_seconds": 10, **config}
    if price is not None:
        cfg["price_per_hour"] = price
    if note:
        cfg["price_note"] = note
    return ev(layout.STARTED, ago, attempt=attempt, workers=workers, config=cfg)


def progress(ago: float, **extra) -> dict:
    return {"step": 40, "total": 100, "updated": at(ago), **extra}


# -- cost --

def test_a_cloud_run_counts_its_open_attempt_up_to_now_and_rounds_the_figures():
    # 1 h 1 min 1 s on 3 machines at 1.23456 per machine-hour, still running.
    facts = RunFacts(S3, [started(3661, price=1.23456, note="spot estimate", workers=3)], progress=progress(5))
    st = classify(facts, NOW)
    hours = 3661 / 3600 * 3
    assert st.machine_hours == round(hours, 4) == 3.0508
    assert st.cost_usd == round(hours * 1.23456, 2) == 3.77
    assert st.cost_note == "spot estimate"


def test_an_ended_run_counts_up_to_its_end_markers_time():
    facts = RunFacts(S3, [started(7200, price=2.0), ev(layout.FINISHED, 3600, step=100)],
                     end_marker=layout.COMPLETE, end={layout.MARKER_STEP: 100, "finished_at": at(1800)})
    st = classify(facts, NOW)
    assert (st.machine_hours, st.cost_usd) == (1.5, 3.0)  # to finished_at, not to now nor to `finished`
    facts = RunFacts(S3, [started(7200, price=2.0), ev(layout.FINISHED, 3600, step=100)],
                     end_marker=layout.COMPLETE, end={layout.MARKER_STEP: 100, layout.TIME: at(0)})
    assert classify(facts, NOW).machine_hours == 2.0  # no finished_at: the marker's own time


def test_a_cloud_run_without_a_price_has_hours_but_no_cost():
    st = classify(RunFacts(S3, [started(3600)], progress=progress(5)), NOW)
    assert (st.machine_hours, st.cost_usd, st.cost_note) == (1.0, None, "")


def test_a_local_run_without_a_price_bills_nothing_and_a_priced_one_does():
    st = classify(RunFacts(LOCAL, [started(3600)], progress=progress(5)), NOW)
    assert (st.machine_hours, st.cost_usd) == (None, None)
    st = classify(RunFacts(LOCAL, [started(3600, price=1.0)], progress=progress(5)), NOW)
    # A local run is counted up to its last event, not to now (it may have been stopped).
    assert (st.machine_hours, st.cost_usd) == (0.0, 0.0)


def test_attempts_without_a_price_are_said_when_others_have_one():
    events = [started(7200, attempt=1), ev(layout.PREEMPTED, 3600, step=10, attempt=1),
              started(3600, price=1.0, note="spot estimate", attempt=2)]
    st = classify(RunFacts(S3, events, progress=progress(5)), NOW)
    assert st.cost_usd == 1.0
    assert st.cost_note == "1 of 2 attempts without a price; spot estimate"
    # None priced: no cost, and no note about the unpriced ones.
    events = [started(7200, attempt=1), ev(layout.PREEMPTED, 3600, step=10, attempt=1), started(3600, attempt=2)]
    st = classify(RunFacts(S3, events, progress=progress(5)), NOW)
    assert (st.cost_usd, st.cost_note) == (None, "")


def test_nothing_written_costs_nothing():
    st = classify(RunFacts(S3), NOW)
    assert (st.machine_hours, st.cost_usd, st.cost_note) == (None, None, "")


# -- ages, metrics, the heartbeat interval, what is reported --

def test_ages_are_rounded_to_a_tenth_and_never_negative():
    facts = RunFacts(S3, [started(100)], progress=progress(12.345),
                     checkpoint_step=30, checkpoint_marker={"created": at(61.26)})
    st = classify(facts, NOW)
    assert st.progress_age_seconds == 12.3 and st.checkpoint.age_seconds == 61.3
    assert st.checkpoint.created == at(61.26)
    # Written "in the future" (a machine's clock ahead of this one): age 0, not negative.
    st = classify(RunFacts(S3, [started(100)], progress=progress(-30.0)), NOW)
    assert st.progress_age_seconds == 0.0 and st.heartbeat_age_seconds == 0.0
    st = classify(RunFacts(S3, [started(100)], progress=progress(0.4)), NOW)
    assert st.progress_age_seconds == 0.4


def test_a_checkpoint_markers_created_is_taken_only_as_text():
    st = classify(RunFacts(S3, [started(100)], checkpoint_step=30, checkpoint_marker={"created": 12345}), NOW)
    assert (st.checkpoint.step, st.checkpoint.created, st.checkpoint.age_seconds) == (30, None, None)


def test_metrics_keep_numbers_only_and_come_from_complete_first():
    doc = progress(5, metrics={"accuracy": 0.5, "epochs": 3, "flag": True, "name": "x", 7: 1.5})
    st = classify(RunFacts(S3, [started(100)], progress=doc), NOW)
    assert st.metrics == {"accuracy": 0.5, "epochs": 3.0, "7": 1.5}
    assert all(type(v) is float for v in st.metrics.values())
    assert classify(RunFacts(S3, [started(100)], progress=progress(5, metrics=[1, 2])), NOW).metrics == {}
    facts = RunFacts(S3, [started(100)], progress=doc, end_marker=layout.COMPLETE,
                     end={layout.MARKER_STEP: 100, "metrics": {"accuracy": 0.9}})
    assert classify(facts, NOW).metrics == {"accuracy": 0.9}
    # COMPLETE without metrics keeps progress.json's.
    facts = RunFacts(S3, [started(100)], progress=doc, end_marker=layout.COMPLETE, end={layout.MARKER_STEP: 100})
    assert classify(facts, NOW).metrics == {"accuracy": 0.5, "epochs": 3.0, "7": 1.5}


@pytest.mark.parametrize(("every", "limit"), [(60, 360), (1, 120), (0.5, 120), (0, 120), (-5, 120)])
def test_the_stall_bound_comes_from_the_runs_own_heartbeat_interval(every, limit):
    # Silent for just under and just over the bound; an interval of 0 or less is the default (10 s).
    events = [started(10_000, progress_every_seconds=every)]
    assert classify(RunFacts(S3, events, progress=progress(limit - 1)), NOW).state == runstate.RUNNING
    assert classify(RunFacts(S3, events, progress=progress(limit + 1)), NOW).state == runstate.STALLED


def test_the_stall_message_says_the_expected_interval():
    st = classify(RunFacts(S3, [started(10_000, progress_every_seconds=1)], progress=progress(600)), NOW)
    assert st.detail.startswith("no heartbeat for 10m 00s while training (expected every 1s)")


def test_events_reported_are_the_newest_and_none_when_asked_for_none():
    events = [started(100), *(ev(layout.CHECKPOINT, 90 - i, step=i) for i in range(5))]
    facts = RunFacts(S3, events, progress=progress(5))
    assert [e.get("step") for e in classify(facts, NOW, events=2).events] == [3, 4]
    assert classify(facts, NOW, events=0).events == []
    assert "config" not in classify(facts, NOW, events=10).events[0]


def test_the_status_says_when_it_was_checked():
    st = classify(RunFacts(S3), NOW)
    assert datetime.fromisoformat(st.checked_at).timestamp() == NOW
    assert st.to_json()["checked_at"] == st.checked_at


# -- machines waiting for the others --

WAIT = dict(generation=3, came=1, nodes=2, since="2026-06-01T10:00:00Z", until="2026-06-01T10:30:00Z")
WAIT_DETAIL = ("waiting for the other machines: 1 of 2 came to generation 3 (since 10:00:00 UTC); the run ends "
               "FAILED at 10:30:00 UTC unless the group brings the rest (TRAINSTACK_PEER_WAIT_S)")


def test_machines_waiting_for_the_others_say_so_and_are_no_stall():
    facts = RunFacts(S3, [started(7200), ev(layout.FAILED_EVENT, 3700, reason="peer lost", attempt=1)],
                     [ev(layout.WAITING_FOR_MACHINES, 3600, **WAIT)], progress=progress(3700))
    st = classify(facts, NOW)
    assert (st.state, st.detail) == (runstate.PREEMPTED, WAIT_DETAIL)


def test_a_wait_without_its_times_says_so():
    wait = {**WAIT, "since": None, "until": None}
    facts = RunFacts(S3, [started(7200)], [ev(layout.WAITING_FOR_MACHINES, 60, **wait)], progress=progress(5))
    assert classify(facts, NOW).detail == WAIT_DETAIL.replace("10:00:00", "").replace("10:30:00", "?")


@pytest.mark.parametrize(("wait_ago", "waiting"), [(100, True), (50, True), (150, False)])
def test_a_wait_counts_only_after_the_trainers_last_lifecycle_event(wait_ago, waiting):
    # Both at the same second: the wait is the newer (it is written after the trainer stops).
    facts = RunFacts(S3, [started(7200), ev(layout.FAILED_EVENT, 100, reason="peer lost", attempt=1)],
                     [ev(layout.WAITING_FOR_MACHINES, wait_ago, **WAIT)], progress=progress(100))
    assert (classify(facts, NOW).detail == WAIT_DETAIL) is waiting
    facts = RunFacts(S3, [started(7200), ev(layout.STARTED, 40, attempt=2, config={})],
                     [ev(layout.WAITING_FOR_MACHINES, 100, **WAIT)], progress=progress(5))
    assert classify(facts, NOW).detail != WAIT_DETAIL  # a generation formed again after the wait


def test_a_wait_with_an_unreadable_time_is_ignored():
    wait = {layout.EVENT: layout.WAITING_FOR_MACHINES, layout.TIME: "soon", **WAIT}
    facts = RunFacts(S3, [started(7200)], [wait], progress=progress(5))
    assert classify(facts, NOW).detail != WAIT_DETAIL
    # Nor when the trainer has written no lifecycle event to compare it with.
    facts = RunFacts(S3, [ev(layout.CHECKPOINT, 10, step=1)], [wait], progress=progress(5))
    assert classify(facts, NOW).detail == ""


def test_a_wait_with_no_trainer_event_before_it_counts():
    facts = RunFacts(S3, [ev(layout.CHECKPOINT, 100, step=1)], [ev(layout.WAITING_FOR_MACHINES, 60, **WAIT)],
                     progress=progress(100))
    assert classify(facts, NOW).detail == WAIT_DETAIL


# -- the small readers --

@pytest.mark.parametrize(("text", "expected"), [
    ("2026-06-01T12:00:00Z", NOW),
    ("2026-06-01T12:00:00+00:00", NOW),
    ("2026-06-01T14:00:00+02:00", NOW),
    ("", None), (None, None), (12345, None), ("soon", None), ("2026-06-01T12:00:00z", None),
])
def test_stamp_reads_the_times_the_run_folder_holds(text, expected):
    assert runstate.stamp(text) == expected


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (float("nan"), "-"), (float("inf"), "-"),
    (0, "0s"), (59.4, "59s"), (60, "1m 00s"), (3599, "59m 59s"), (3600, "1h 00m"), (7380, "2h 03m"),
    (86399, "23h 59m"), (86400, "1d 00h"), (86400 + 3 * 3600 + 59, "1d 03h"), (10 * 86400 + 23 * 3600, "10d 23h"),
])
def test_duration_for_people(seconds, text):
    assert runstate.duration(seconds) == text


def test_events_without_a_time_come_first_in_their_own_order():
    a = {layout.EVENT: "a"}
    b = ev("b", 10)
    c = {layout.EVENT: "c", layout.TIME: "1970-01-01T00:00:00.5+00:00"}
    assert [e[layout.EVENT] for e in runstate.merge_events([b, a], [c])] == ["a", "c", "b"]


# -- what an end marker and progress.json say --

def test_an_end_markers_step_counts_from_zero_and_a_negative_one_is_ignored():
    facts = RunFacts(S3, [started(100)], progress=progress(5), end_marker=layout.CANCELLED,
                     end={layout.MARKER_STEP: 0})
    st = classify(facts, NOW)
    assert (st.step, st.detail) == (0, "stopped on request at step 0")
    facts = RunFacts(S3, [started(100)], progress=progress(5), end_marker=layout.FAILED, end={layout.MARKER_STEP: -1})
    st = classify(facts, NOW)
    assert (st.step, st.detail) == (40, "")


def test_the_model_folder_is_named_once_whatever_the_uri_ends_with():
    for uri in (S3, S3 + "/"):
        facts = RunFacts(uri, [started(100)], end_marker=layout.COMPLETE, end={layout.MARKER_STEP: 100})
        assert classify(facts, NOW).detail == f"model in {S3}/{layout.MODEL_PREFIX}"
    facts = RunFacts("s3://bucket/runs/X/", [started(100)], end_marker=layout.COMPLETE, end={layout.MARKER_STEP: 1})
    assert classify(facts, NOW).detail == f"model in s3://bucket/runs/X/{layout.MODEL_PREFIX}"



# -- the trainer's own evaluation: the newest one and the best by --keep-best --

BEST = {"metric": "val_loss", "mode": "min", "step": 20, "value": 0.25, "metrics": {"val_loss": 0.25}}


@pytest.mark.parametrize(("best", "expected"), [
    (BEST, {"metric": "val_loss", "mode": "min", "step": 20, "value": 0.25}),
    ({**BEST, "exported": True}, {"metric": "val_loss", "mode": "min", "step": 20, "value": 0.25, "exported": True}),
    ({**BEST, "exported": False}, {"metric": "val_loss", "mode": "min", "step": 20, "value": 0.25, "exported": False}),
    ({**BEST, "exported": "yes"}, {"metric": "val_loss", "mode": "min", "step": 20, "value": 0.25}),
    ({**BEST, "value": 1}, {"metric": "val_loss", "mode": "min", "step": 20, "value": 1.0}),
    ({"metric": "val_auc", "step": 0, "value": 0.5}, {"metric": "val_auc", "mode": "", "step": 0, "value": 0.5}),
    ({**BEST, "mode": 1}, {"metric": "val_loss", "mode": "1", "step": 20, "value": 0.25}),
    ({**BEST, "metric": 3}, None), ({**BEST, "metric": None}, None),
    ({**BEST, "step": "20"}, None), ({**BEST, "step": 20.0}, None), ({k: v for k, v in BEST.items() if k != "step"}, None),
    ({**BEST, "value": "0.25"}, None), ({**BEST, "value": True}, None),
    ({k: v for k, v in BEST.items() if k != "value"}, None),
    ([BEST], None), ("val_loss", None), (None, None),
], ids=["whole", "exported", "not-exported", "exported-not-bool", "int-value", "no-mode", "mode-as-text",
        "metric-int", "metric-none", "step-text", "step-float", "no-step", "value-text", "value-bool", "no-value",
        "list", "text", "none"])
def test_the_best_is_read_only_when_well_formed(best, expected):
    st = classify(RunFacts(S3, [started(100)], progress=progress(5, best=best)), NOW)
    assert st.best == expected
    if expected is not None:
        assert type(st.best["value"]) is float


def test_the_newest_evaluation_comes_from_progress():
    st = classify(RunFacts(S3, [started(100)], progress=progress(5, evaluated_step=40, eval_seconds=2)), NOW)
    assert (st.evaluated_step, st.eval_seconds, st.best) == (40, 2.0, None)
    assert type(st.eval_seconds) is float
    st = classify(RunFacts(S3, [started(100)], progress=progress(5, evaluated_step="40", eval_seconds="2")), NOW)
    assert (st.evaluated_step, st.eval_seconds) == (None, None)
    st = classify(RunFacts(S3, [started(100)], progress=progress(5)), NOW)
    assert (st.evaluated_step, st.eval_seconds, st.best) == (None, None, None)


def test_complete_gives_the_best_and_the_evaluation_time_and_keeps_progress_s_otherwise():
    doc = progress(5, evaluated_step=40, eval_seconds=1.5, best=BEST)
    final = {**BEST, "step": 60, "value": 0.125, "exported": True}
    end = {layout.MARKER_STEP: 100, "best": final, "eval_seconds": 3}
    st = classify(RunFacts(S3, [started(100)], progress=doc, end_marker=layout.COMPLETE, end=end), NOW)
    assert (st.best, st.eval_seconds, st.evaluated_step) == (
        {"metric": "val_loss", "mode": "min", "step": 60, "value": 0.125, "exported": True}, 3.0, 40)
    # COMPLETE without them, or with a best that is not well formed: progress.json's stand.
    for end in ({layout.MARKER_STEP: 100}, {layout.MARKER_STEP: 100, "best": {"metric": "val_loss"}}):
        st = classify(RunFacts(S3, [started(100)], progress=doc, end_marker=layout.COMPLETE, end=end), NOW)
        assert (st.best, st.eval_seconds) == ({"metric": "val_loss", "mode": "min", "step": 20, "value": 0.25}, 1.5)
    # An eval_seconds COMPLETE holds is its word, even when unreadable.
    end = {layout.MARKER_STEP: 100, "eval_seconds": "soon"}
    st = classify(RunFacts(S3, [started(100)], progress=doc, end_marker=layout.COMPLETE, end=end), NOW)
    assert st.eval_seconds is None
    # Only COMPLETE's: a CANCELLED or FAILED marker's own fields are not read.
    for marker in (layout.CANCELLED, layout.FAILED):
        end = {layout.MARKER_STEP: 100, "best": final, "eval_seconds": 3}
        st = classify(RunFacts(S3, [started(100)], progress=doc, end_marker=marker, end=end), NOW)
        assert (st.best["step"], st.eval_seconds) == (20, 1.5)


def test_progress_fields_of_the_wrong_type_are_left_out():
    doc = {"step": "40", "total": "x", "updated": 12345}
    st = classify(RunFacts(S3, [started(100)], progress=doc, checkpoint_step=30), NOW)
    assert (st.step, st.total, st.progress_updated, st.progress_age_seconds) == (30, 100, None, None)
    st = classify(RunFacts(S3, [started(100)], progress=progress(5, total=500)), NOW)
    assert st.total == 500
    st = classify(RunFacts(S3, [ev(layout.STARTED, 100, attempt=1, config=[1])], progress={"step": 4}), NOW)
    assert st.total is None


def test_the_eta_comes_from_the_rate_and_the_global_batch():
    events = [ev(layout.STARTED, 100, attempt=1, global_batch=32, config={"steps": 100})]
    st = classify(RunFacts(S3, events, progress=progress(5, examples_per_sec=70.0)), NOW)
    assert st.eta_seconds == round(60 * 32 / 70.0, 1) == 27.4
    st = classify(RunFacts(S3, events, progress=progress(5, step=120, examples_per_sec=70.0)), NOW)
    assert st.eta_seconds == 0


# -- the heartbeat --

def test_the_heartbeat_is_rounded_to_a_tenth_and_never_negative():
    assert classify(RunFacts(S3, [started(100)], progress=progress(12.345)), NOW).heartbeat_age_seconds == 12.3
    assert classify(RunFacts(S3, [started(100)], progress=progress(0.4)), NOW).heartbeat_age_seconds == 0.4


def test_the_heartbeat_is_the_newest_written_event_not_the_latest_stamped():
    # The last line of events.jsonl is the trainer's latest word, whatever its time says.
    events = [started(1000), ev(layout.CHECKPOINT, 5, step=1), ev(layout.CHECKPOINT, 500, step=2)]
    assert classify(RunFacts(S3, events), NOW).heartbeat_age_seconds == 500


def test_silent_for_exactly_the_bound_is_not_yet_a_stall():
    assert classify(RunFacts(S3, [started(10_000)], progress=progress(120)), NOW).state == runstate.RUNNING


def test_progress_written_with_the_attempts_start_ends_the_starting_phase():
    # A progress.json stamped the same second as `resumed` belongs to this attempt: no quiet phase.
    events = [started(2000), ev(layout.RESUMED, 600, step=10)]
    assert classify(RunFacts(S3, events, progress=progress(600)), NOW).state == runstate.STALLED
    assert classify(RunFacts(S3, events, progress=progress(601)), NOW).state == runstate.RUNNING


# -- what a stall or a notice says --

def test_a_machine_taken_after_a_notice_says_when():
    facts = RunFacts(S3, [started(7200)], [ev(layout.SPOT_NOTICE, 3600)], progress=progress(3500))
    st = classify(facts, NOW)
    assert (st.state, st.detail) == (runstate.PREEMPTED, "the machine was taken after a spot notice at 11:00:00; "
                                                         "waiting for the group to start a machine")


def test_a_stall_after_a_failed_attempt_or_after_training_says_which():
    facts = RunFacts(S3, [started(7200), ev(layout.FAILED_EVENT, 3600, attempt=1, reason="disk full")])
    assert classify(facts, NOW).detail.startswith("no heartbeat for 1h 00m after attempt 1 failed (disk full) ")
    facts = RunFacts(S3, [started(7200), ev(layout.FINISHED, 3600, step=100)])
    assert classify(facts, NOW).detail.startswith(
        "no heartbeat for 1h 00m after training finished, before the model was written ")
    # A heartbeat but no lifecycle event at all (events.jsonl lost): training, not a failure.
    facts = RunFacts(S3, [ev(layout.CHECKPOINT, 3600, step=1)], progress=progress(3600))
    assert classify(facts, NOW).detail.startswith("no heartbeat for 1h 00m while training ")
