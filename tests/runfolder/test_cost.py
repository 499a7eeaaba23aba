"""The cost arithmetic (`runfolder.cost`): every attempt's start to its end x nodes x price per machine-hour.

Events are written as the trainer and the machines write them (ISO times; `started` with the
config and `workers`); times here are whole minutes after T0 so each figure can be checked
by hand.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runfolder import cost, layout
from trainer.export import complete_record

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).isoformat(timespec="milliseconds")


def ts(minutes: float) -> float:
    return (T0 + timedelta(minutes=minutes)).timestamp()


def ev(kind: str, minutes: float, attempt: int | None = None, **fields) -> dict:
    return {layout.EVENT: kind, layout.TIME: at(minutes), layout.ATTEMPT: attempt, **fields}


def started(minutes: float, attempt: int, *, workers: int = 1, price: float | None = 2.0, note: str = "",
            placement: str | None = None) -> dict:
    config = {"steps": 100}
    if price is not None:
        config["price_per_hour"] = price
    if note:
        config["price_note"] = note
    if placement is not None:
        config["placement"] = placement
    return ev(layout.STARTED, minutes, attempt, config=config, workers=workers)


def test_one_finished_attempt_is_its_start_to_the_end_marker():
    events = [started(0, 1), ev(layout.CHECKPOINT, 20, 1, step=50), ev(layout.FINISHED, 55, 1, step=100)]
    total = cost.run_cost(events, end=ts(60))
    assert (total.machine_hours, total.cost_usd, total.running) == (1.0, 2.0, False)


def test_preemptions_count_each_attempt_and_not_the_wait_between():
    events = [
        started(0, 1), ev(layout.PREEMPTED, 30, 1, step=40),          # 30 min
        # 15 minutes with no machine: the group was getting capacity back; not billed.
        started(45, 2), ev(layout.RESUMED, 46, 2, step=40),
        {layout.EVENT: layout.SPOT_NOTICE, layout.TIME: at(75), "instance": "i-2"},  # taken, no word from the trainer
        started(90, 3), ev(layout.FINISHED, 120, 3, step=100),
    ]
    spans = cost.spans(events, end=ts(120))
    assert [(s.attempt, round((s.end - s.start) / 60)) for s in spans] == [(1, 30), (2, 30), (3, 30)]
    total = cost.run_cost(events, end=ts(120))
    assert total.machine_hours == pytest.approx(1.5) and total.cost_usd == pytest.approx(3.0)


def test_several_nodes_multiply_and_each_attempt_keeps_its_own_price_and_size():
    events = [started(0, 1, workers=4, price=10.0), ev(layout.PREEMPTED, 30, 1),
              started(30, 2, workers=2, price=12.0), ev(layout.FINISHED, 60, 2)]
    total = cost.run_cost(events, end=ts(60))
    # 0.5 h x 4 x $10 + 0.5 h x 2 x $12
    assert total.machine_hours == pytest.approx(3.0) and total.cost_usd == pytest.approx(32.0)


def test_a_running_attempt_counts_up_to_now():
    events = [started(0, 1, workers=2, note="spot estimate, price table 2026-11-30"), ev(layout.CHECKPOINT, 10, 1)]
    total = cost.run_cost(events, now=ts(45))
    assert total.running and total.machine_hours == pytest.approx(1.5) and total.cost_usd == pytest.approx(3.0)
    assert total.price_note == "spot estimate, price table 2026-11-30"
    # Without `now` it counts up to the last event heard.
    assert cost.run_cost(events).machine_hours == pytest.approx(2 * 10 / 60)


@pytest.mark.parametrize("ending", [layout.PREEMPTED, layout.FAILED_EVENT, layout.SPOT_NOTICE, layout.MACHINE_FINISH,
                                    layout.MACHINE_STALLED])
def test_an_attempt_something_ended_is_not_counted_up_to_now(ending):
    events = [started(0, 1), ev(ending, 20, 1)]
    total = cost.run_cost(events, now=ts(500))
    assert not total.running and total.machine_hours == pytest.approx(20 / 60)


def test_an_attempt_killed_without_a_word_counts_to_its_last_event_and_machine_events_count():
    events = [started(0, 1), ev(layout.CHECKPOINT, 12, 1), started(40, 2), ev(layout.FINISHED, 50, 2)]
    machine = [{layout.EVENT: layout.REBALANCE, layout.TIME: at(18), "instance": "i-1"}]
    spans = cost.spans(machine + events, end=ts(50))  # any order: sorted by time
    assert [round((s.end - s.start) / 60) for s in spans] == [18, 10]


def test_attempts_without_a_price_give_time_but_no_cost():
    events = [started(0, 1, price=None), ev(layout.FINISHED, 30, 1)]
    total = cost.run_cost(events, end=ts(30))
    assert total.machine_hours == pytest.approx(0.5) and total.cost_usd is None and total.unpriced == 1
    assert total.to_json() == {"machine_hours": 0.5, "cost_usd": None, "cost_note": ""}
    assert cost.run_cost([ev(layout.CHECKPOINT, 1, 1)]) is None  # nothing started: no figure at all


def test_complete_records_the_total():
    events = [started(0, 1, workers=2, price=3.0, note="on-demand (dearest type), price table 2026-11-30"),
              ev(layout.PREEMPTED, 20, 1), started(30, 2, workers=2, price=3.0), ev(layout.FINISHED, 70, 2)]
    rec = complete_record(step=100, metrics={"loss": 0.1}, examples_seen=6400, events=events, finished_at=ts(70))
    # (20 + 40) min x 2 nodes x $3/h
    assert rec["machine_hours"] == pytest.approx(2.0) and rec["cost_usd"] == pytest.approx(6.0)
    assert rec["cost_note"] == "on-demand (dearest type), price table 2026-11-30"


def test_a_run_that_moved_splits_its_time_and_cost_by_placement_and_complete_records_them():
    # Home trains, is preempted, returns once, then the run moves to another region at another price.
    events = [started(0, 1, workers=2, price=1.0, placement="aws us-east-1"), ev(layout.PREEMPTED, 30, 1),
              started(40, 2, workers=2, price=1.0, placement="aws us-east-1"), ev(layout.PREEMPTED, 55, 2),
              started(90, 3, workers=2, price=1.5, placement="aws us-west-2"), ev(layout.FINISHED, 150, 3)]
    total = cost.run_cost(events, end=ts(150))
    got = [(p.placement, p.attempts, round(p.machine_hours, 4), p.cost_usd) for p in total.placements]
    # home: (30 + 15) min x 2 nodes = 1.5 h at $1; west: 60 min x 2 = 2 h at $1.5
    assert got == [("aws us-east-1", 2, 1.5, pytest.approx(1.5)), ("aws us-west-2", 1, 2.0, pytest.approx(3.0))]
    assert total.machine_hours == pytest.approx(3.5) and total.cost_usd == pytest.approx(4.5)
    rec = complete_record(step=100, metrics={"loss": 0.1}, examples_seen=6400, events=events, finished_at=ts(150))
    assert rec["placements"] == [
        {"placement": "aws us-east-1", "attempts": 2, "machine_hours": 1.5, "cost_usd": 1.5},
        {"placement": "aws us-west-2", "attempts": 1, "machine_hours": 2.0, "cost_usd": 3.0},
    ]


def test_a_move_written_after_a_preemption_adds_no_machine_time():
    # The controller moves the run 25 minutes after the preemption; no machine ran in between.
    events = [started(0, 1, placement="aws us-east-1"), ev(layout.PREEMPTED, 30, 1),
              {layout.EVENT: layout.MOVED, layout.TIME: at(55), "from": 0, "to": 1, "reason": "no capacity"},
              started(60, 2, placement="aws us-west-2"), ev(layout.FINISHED, 90, 2)]
    spans = cost.spans(events, end=ts(90))
    assert [round((s.end - s.start) / 60) for s in spans] == [30, 30]


def test_attempts_that_do_not_say_where_they_ran_stay_in_the_total_only():
    events = [started(0, 1, placement=None), ev(layout.PREEMPTED, 30, 1),
              started(30, 2, price=None, placement="gcp us-central1"), ev(layout.FINISHED, 60, 2),
              # A damaged config's placement is not a name.
              started(60, 3, placement=" "), ev(layout.FINISHED, 90, 3)]
    total = cost.run_cost(events, end=ts(90))
    assert [p.to_json() for p in total.placements] == [
        {"placement": "gcp us-central1", "attempts": 1, "machine_hours": 0.5, "cost_usd": None}]
    assert total.machine_hours == pytest.approx(1.5) and total.cost_usd == pytest.approx(2.0)
    # Nothing recorded where it ran: no placements field at all (a stack of one placement before this field).
    assert "placements" not in cost.run_cost(events[:2], end=ts(30)).to_json()


def test_the_controllers_waiting_is_no_machine_time_of_the_attempt_before_it():
    events = [started(0, 1), ev(layout.PREEMPTED, 30, 1, step=40),
              # An hour with no capacity anywhere: the controller says so; no machine runs.
              {layout.EVENT: layout.CONTROLLER_WAITING, layout.TIME: at(90), "reason": "no capacity", "placement": 0,
               "key": "k"},
              started(120, 2), ev(layout.FINISHED, 150, 2, step=100)]
    assert [round((s.end - s.start) / 60) for s in cost.spans(events, end=ts(150))] == [30, 30]
