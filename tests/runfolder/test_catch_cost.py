"""The cost arithmetic on what a damaged or partial event holds, and the figures as recorded.

A `started` event's price and machine count come from the stack through the environment; one
that is zero, negative, infinite, not a number or a boolean is no price (or one machine), never
a cost of zero or a division by nothing. The recorded figures are rounded as COMPLETE and
`ops status --json` document them: hours to 4 places, dollars to 2.
"""

from __future__ import annotations

import math

import pytest

from runfolder import cost, layout
from tests.runfolder.test_cost import ev, started, ts


@pytest.mark.parametrize("price", [0, 0.0, -2.0, math.inf, math.nan, True, "2.0", None, 10**400])
def test_a_price_that_is_no_positive_finite_number_is_no_price(price):
    events = [started(0, 1, price=None), ev(layout.PREEMPTED, 60, 1)]
    events[0]["config"]["price_per_hour"] = price

    total = cost.run_cost(events)

    assert (total.machine_hours, total.cost_usd, total.unpriced, total.attempts) == (1.0, None, 1, 1)


@pytest.mark.parametrize("workers", [0, -1, True, "2", 2.0, None, math.inf])
def test_a_machine_count_that_is_no_positive_integer_is_one_machine(workers):
    events = [started(0, 1, price=3.0), ev(layout.PREEMPTED, 60, 1)]
    events[0]["workers"] = workers
    if workers is None:
        del events[0]["workers"]

    total = cost.run_cost(events)

    assert (total.machine_hours, total.cost_usd) == (1.0, 3.0)


def test_a_valid_price_and_count_are_taken_as_given():
    events = [started(0, 1, workers=3, price=0.5), ev(layout.PREEMPTED, 60, 1)]
    total = cost.run_cost(events)
    assert (total.machine_hours, total.cost_usd, total.unpriced, total.attempts) == (3.0, 1.5, 0, 1)


def test_without_a_price_note_the_note_is_empty_and_every_attempt_is_counted():
    events = [started(0, 1), ev(layout.PREEMPTED, 10, 1), started(20, 2), ev(layout.PREEMPTED, 30, 2),
              started(40, 3, price=None)]

    total = cost.run_cost(events, end=ts(50))

    assert total.price_note == "" and total.attempts == 3 and total.unpriced == 1
    assert total.to_json()["cost_note"] == ""


def test_the_recorded_figures_are_rounded_to_four_and_two_places():
    # A third of an hour on one machine at $1/h, twice, in two placements.
    events = [started(0, 1, price=1.0, placement="aws us-east-1"), ev(layout.PREEMPTED, 20, 1),
              started(30, 2, price=1.0, placement="gcp us-central1")]

    doc = cost.run_cost(events, end=ts(50)).to_json()

    assert doc == {"machine_hours": 0.6667, "cost_usd": 0.67, "cost_note": "", "placements": [
        {"placement": "aws us-east-1", "attempts": 1, "machine_hours": 0.3333, "cost_usd": 0.33},
        {"placement": "gcp us-central1", "attempts": 1, "machine_hours": 0.3333, "cost_usd": 0.33}]}
    assert isinstance(doc["cost_usd"], float)


def test_a_running_attempt_is_open_and_an_ended_one_is_not():
    events = [started(0, 1), ev(layout.PREEMPTED, 10, 1), started(20, 2)]
    first, second = cost.spans(events, now=ts(30))
    assert first.open is False and second.open is True
    assert cost.run_cost(events, now=ts(30)).running is True
    assert cost.run_cost(events[:2], now=ts(30)).running is False


def test_an_attempt_started_without_a_config_has_an_empty_note():
    events = [{layout.EVENT: layout.STARTED, layout.TIME: ev("x", 0)[layout.TIME], layout.ATTEMPT: 1},
              ev(layout.PREEMPTED, 30, 1)]
    total = cost.run_cost(events)
    assert (total.price_note, total.machine_hours, total.cost_usd) == ("", 0.5, None)
