"""Goodput (`runfolder.goodput`): the paid machine time that produced kept steps, and what took the rest.

Each run folder here is built by hand as the trainer, the machines and the controller write it; times
are whole minutes after T0, so every figure can be checked on paper (hours = minutes / 60 x nodes).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runfolder import goodput, layout

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).isoformat(timespec="milliseconds")


def ts(minutes: float) -> float:
    return (T0 + timedelta(minutes=minutes)).timestamp()


def ev(kind: str, minutes: float, attempt: int | None = None, **fields) -> dict:
    return {layout.EVENT: kind, layout.TIME: at(minutes), layout.ATTEMPT: attempt, **fields}


def machine(kind: str, minutes: float, **fields) -> dict:
    return {layout.EVENT: kind, layout.TIME: at(minutes), "instance": "i-1", **fields}


def started(minutes: float, attempt: int, workers: int = 1) -> dict:
    return ev(layout.STARTED, minutes, attempt, config={"steps": 1000, "price_per_hour": 1.0}, workers=workers)


def h(minutes: float) -> float:
    """Machine-hours of `minutes`, rounded as the figures are compared."""
    return round(minutes / 60, 6)


def figures(g: goodput.Goodput) -> dict:
    return {k: round(getattr(g, k), 6) for k in ("paid_h", "kept_h", "boot_h", "idle_h", "lost_h", "uncommitted_h")}


def test_a_run_that_finished_keeps_all_its_training_and_pays_its_boot_and_export():
    events = [started(10, 1), ev(layout.CHECKPOINT, 40, 1, step=500), ev(layout.FINISHED, 70, 1, step=1000),
              machine(layout.MACHINE_FINISH, 75, outcome="COMPLETE")]
    g = goodput.goodput(events, end=ts(75), first_boot=ts(0), completed=True)
    # 10 min boot (deadline written at 0, trainer started at 10), 60 min trained, 5 min export and shutdown.
    assert figures(g) == {"paid_h": h(75), "kept_h": h(60), "boot_h": h(10), "idle_h": h(5), "lost_h": 0.0,
                          "uncommitted_h": 0.0}
    assert g.share == pytest.approx(60 / 75) and g.lost_steps == 0 and g.notes == ()


def test_a_preemption_without_a_word_loses_the_steps_after_the_last_commit():
    events = [
        started(0, 1), ev(layout.CHECKPOINT, 20, 1, step=200), ev(layout.EVALUATED, 28, 1, step=280, metrics={}),
        # Taken at once: no `preempted` from the trainer; the spot notice at 30 is the last thing heard.
        machine(layout.SPOT_NOTICE, 30),
        started(40, 2), ev(layout.RESUMED, 42, 2, step=200), ev(layout.FINISHED, 100, 2, step=1000),
    ]
    g = goodput.goodput(events, end=ts(100), first_boot=ts(0), completed=True)
    first, second = g.attempts
    assert (round(first.kept_h, 6), round(first.lost_h, 6)) == (h(20), h(10))  # 20..30 trained again
    assert first.lost_steps == 80  # at least 280 - 200: the events tell no later step
    # The replacement: booted from the old machine's end (30) to its restore's end (42).
    assert round(second.boot_h, 6) == h(12) and round(second.kept_h, 6) == h(58)
    assert figures(g) == {"paid_h": h(100), "kept_h": h(78), "boot_h": h(12), "idle_h": 0.0, "lost_h": h(10),
                          "uncommitted_h": 0.0}
    assert g.lost_steps == 80


def test_a_preemption_the_trainer_stopped_for_loses_nothing():
    events = [started(0, 1), ev(layout.CHECKPOINT, 20, 1, step=200), machine(layout.SPOT_NOTICE, 29),
              ev(layout.PREEMPTED, 30, 1, step=300), started(40, 2), ev(layout.RESUMED, 41, 2, step=300),
              ev(layout.FINISHED, 90, 2, step=1000)]
    g = goodput.goodput(events, end=ts(90), first_boot=ts(0), completed=True)
    assert g.lost_h == 0 and g.lost_steps == 0
    assert round(g.attempts[0].kept_h, 6) == h(30)


def test_a_long_boot_counts_from_the_controllers_last_word_before_the_launch():
    events = [started(0, 1), ev(layout.PREEMPTED, 30, 1, step=300),
              # An hour without capacity; the controller decided at 95 and the machine started at 120.
              started(120, 2), ev(layout.RESUMED, 125, 2, step=300), ev(layout.FINISHED, 185, 2, step=1000)]
    without = goodput.goodput(events, end=ts(185), first_boot=ts(0), completed=True)
    assert round(without.attempts[1].boot_h, 6) == h(95)  # the whole gap: an upper bound, said so
    assert any("upper bound" in n for n in without.notes)
    told = goodput.goodput(events, end=ts(185), first_boot=ts(0), completed=True, launched_after=[ts(95)])
    assert round(told.attempts[1].boot_h, 6) == h(30)
    moved = goodput.goodput([*events, machine(layout.MOVED, 100, **{"from": 0, "to": 1, "reason": "x", "step": 300})],
                            end=ts(185), first_boot=ts(0), completed=True)
    assert round(moved.attempts[1].boot_h, 6) == h(25)
    # The first launch: the controller's first tick wrote the deadline at -6 and decided at -2.
    first = goodput.goodput(events, end=ts(185), first_boot=ts(-6), completed=True, launched_after=[ts(-2)])
    assert round(first.attempts[0].boot_h, 6) == h(2)
    assert told.share == pytest.approx((30 + 60) / (30 + 30 + 60))  # attempt 1, the boot and restore, attempt 2


def test_several_machines_count_each_machine_and_their_wait_for_each_other():
    events = [
        machine(layout.WAITING_FOR_MACHINES, 8, generation=0, came=3, nodes=4, since=at(5), until=at(35)),
        started(10, 1, workers=4), ev(layout.CHECKPOINT, 40, 1, step=400),
        ev(layout.FINISHED, 70, 1, step=1000),
    ]
    g = goodput.goodput(events, end=ts(70), first_boot=ts(0), completed=True)
    # Boot 0..5 for all four; 5..10 three waited (idle) while the fourth still booted.
    assert figures(g) == {"paid_h": h(4 * 70), "kept_h": h(4 * 60), "boot_h": h(4 * 5 + 5), "idle_h": h(3 * 5),
                          "lost_h": 0.0, "uncommitted_h": 0.0}
    lost = goodput.goodput([started(0, 1, workers=2), ev(layout.CHECKPOINT, 10, 1, step=100),
                            machine(layout.SPOT_NOTICE, 25), started(30, 2, workers=2),
                            ev(layout.RESUMED, 31, 2, step=100)], now=ts(40), first_boot=ts(0))
    # One machine's loss stops both: 15 min lost on each.
    assert round(lost.lost_h, 6) == h(30) and round(lost.uncommitted_h, 6) == h(2 * 9)


def test_a_running_attempt_since_its_last_commit_is_uncommitted_not_lost():
    events = [started(0, 1), ev(layout.CHECKPOINT, 30, 1, step=300)]
    g = goodput.goodput(events, now=ts(45), first_boot=ts(0))
    assert figures(g) == {"paid_h": h(45), "kept_h": h(30), "boot_h": 0.0, "idle_h": 0.0, "lost_h": 0.0,
                          "uncommitted_h": h(15)}


def test_a_stalled_trainer_is_idle_from_its_last_word():
    events = [started(0, 1), ev(layout.CHECKPOINT, 30, 1, step=300), ev(layout.EVALUATED, 35, 1, step=350, metrics={}),
              machine(layout.MACHINE_STALLED, 60, reason="no progress", committed=300, key="i-1"),
              started(70, 2), ev(layout.RESUMED, 71, 2, step=300), ev(layout.FINISHED, 100, 2, step=1000)]
    g = goodput.goodput(events, end=ts(100), first_boot=ts(0), completed=True)
    first = g.attempts[0]
    assert (round(first.kept_h, 6), round(first.lost_h, 6), round(first.idle_h, 6)) == (h(30), h(5), h(25))
    assert first.lost_steps == 50


def test_a_first_boot_not_recorded_is_said_and_nothing_before_the_start_is_counted():
    g = goodput.goodput([started(0, 1), ev(layout.FINISHED, 30, 1, step=1000)], end=ts(30), completed=True)
    assert g.boot_h == 0 and g.share == 1.0
    assert any("first machine's boot" in n for n in g.notes)
    assert goodput.goodput([], now=ts(5)) is None
    assert goodput.goodput([started(0, 1)], now=ts(0)).share is None


def test_a_fresh_start_after_a_loss_keeps_nothing_of_the_attempt_before():
    events = [started(0, 1), ev(layout.EVALUATED, 20, 1, step=200, metrics={}), machine(layout.SPOT_NOTICE, 25),
              started(30, 2), ev(layout.FINISHED, 60, 2, step=1000)]
    g = goodput.goodput(events, end=ts(60), first_boot=ts(0), completed=True)
    assert round(g.attempts[0].lost_h, 6) == h(25) and g.attempts[0].kept_h == 0 and g.lost_steps == 200


def test_to_json_names_each_figure():
    g = goodput.goodput([started(0, 1), ev(layout.FINISHED, 30, 1, step=1000)], end=ts(30), first_boot=ts(-6),
                        completed=True)
    doc = g.to_json()
    assert doc["goodput"] == pytest.approx(30 / 36, abs=1e-4)
    assert {"paid_h", "kept_h", "boot_h", "idle_h", "lost_h", "uncommitted_h", "lost_steps", "boots",
            "notes"} <= set(doc)


KINDS = [layout.STARTED, layout.RESUMED, layout.CHECKPOINT, layout.EVALUATED, layout.PREEMPTED, layout.FINISHED,
         layout.FAILED_EVENT, layout.SPOT_NOTICE, layout.MACHINE_STALLED, layout.WAITING_FOR_MACHINES, layout.MOVED,
         layout.CONTROLLER_WAITING, layout.MACHINE_FINISH]


def test_any_log_splits_its_paid_time_into_parts_that_add_up():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    one = st.builds(lambda kind, minute, attempt, step, workers, came: {
        layout.EVENT: kind, layout.TIME: at(minute), layout.ATTEMPT: attempt, "step": step, "workers": workers,
        "came": came, "since": at(minute - 3)},
        st.sampled_from(KINDS), st.integers(0, 300), st.integers(1, 4), st.one_of(st.none(), st.integers(-5, 900)),
        st.one_of(st.none(), st.integers(1, 4), st.just(True)), st.one_of(st.none(), st.integers(0, 6)))

    @settings(max_examples=120, deadline=None, derandomize=True)
    @given(st.lists(one, max_size=14), st.one_of(st.none(), st.integers(-20, 300)), st.booleans(),
           st.lists(st.integers(-20, 300), max_size=3))
    def check(events, boot, completed, marks):
        g = goodput.goodput(events, now=ts(320), first_boot=None if boot is None else ts(boot), completed=completed,
                            launched_after=[ts(m) for m in marks])
        if g is None:
            assert not any(e[layout.EVENT] == layout.STARTED for e in events)
            return
        for a in g.attempts:
            assert min(a.boot_h, a.idle_h, a.lost_h, a.uncommitted_h, a.kept_h, a.lost_steps) >= 0
        assert g.paid_h == pytest.approx(g.kept_h + g.boot_h + g.idle_h + g.lost_h + g.uncommitted_h)
        assert g.share is None or 0 <= g.share <= 1 + 1e-9

    check()
