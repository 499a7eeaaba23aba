"""The decision table (controller/table.py): its rows, the choice between placements, and its object."""

from __future__ import annotations

import json

import pytest

from controller import table
from controller.cost import Estimate, PlacementFacts, RunFacts, estimate
from controller.prices import Quote
from runfolder import layout
from runfolder.storage import open_store

NOW = 1_765_000_000.0


def _e(index: int, cost: float | None, feasible: bool = True, why: str = "") -> Estimate:
    return Estimate(index=index, cost=cost, feasible=feasible, why=why)


def test_the_rows_carry_each_placements_price_age_rate_preemptions_transfer_and_cost():
    run = RunFacts(nodes=1, remaining_steps=40_000, checkpoint_interval_s=1800, checkpoint_bytes=10**9,
                   measured_rates={"A10G": 20_000.0}, now=NOW)
    quotes = [Quote(price=0.4, source="aws", as_of=NOW - 120, score=7),
              Quote(price=None, source="stale", as_of=NOW - 7200, note="aws price of 0.2 is older than 3600 s")]
    estimates = [estimate(run, PlacementFacts(0, price=0.4, gpu="A10G")),
                 estimate(run, PlacementFacts(1, price=None, gpu="L4", restore_per_gb=0.02, writes_per_gb=0.02))]
    home, west = table.rows(["aws us-east-1", "aws us-west-2"], quotes, estimates, now=NOW)
    assert (home.price, home.price_source, home.price_age_s, home.score, home.rate, home.rate_source) == (
        0.4, "aws", 120.0, 7, 20_000.0, "measured")
    assert home.feasible and home.cost == estimates[0].cost and home.transfer_usd == 0.0 and home.why == ""
    assert (west.price, west.price_source, west.price_age_s, west.cost, west.why) == (
        None, "stale", 7200.0, None, "price unknown")
    assert west.rate_source == "scaled from A10G" and west.lam == pytest.approx(1 / 24, abs=1e-6)


@pytest.mark.parametrize(("estimates", "active", "expected"), [
    ([_e(0, 50.0), _e(1, 30.0)], 0, (1, "saves 20.00 USD (40%) over placement 0")),
    ([_e(0, 50.0), _e(1, 46.0)], 0, (0, "placement 1 would save 4.00 USD, under the move threshold (more than 1.00 "
                                        "USD and 10% of 50.00)")),
    ([_e(0, 30.0), _e(1, 50.0)], 0, (0, "the cheapest feasible placement")),
    ([_e(0, None, False, "no capacity for 15 min"), _e(1, 80.0), _e(2, 60.0)], 0,
     (2, "placement 0 is not feasible (no capacity for 15 min): the cheapest feasible one")),
    ([_e(0, None, False, "waiting"), _e(1, None), _e(2, None)], 0,
     (1, "placement 0 is not feasible (waiting): no price is known, the first feasible one in the listed order")),
    ([_e(0, None), _e(1, 10.0)], 0, (0, "staying: without a known cost for both, a price never moves the run")),
    # Before the run has measured a rate (the first launch), no cost is known: it stays, and says that, not "cheapest".
    ([_e(0, None), _e(1, None)], 0, (0, "staying: no feasible placement has a known cost yet (no measured rate)")),
    ([_e(0, None, False), _e(1, None, False)], 0, (None, "no placement is feasible now")),
])
def test_cheapest_moves_only_past_the_threshold_and_always_off_an_infeasible_placement(estimates, active, expected):
    choice = table.choose(estimates, active=active, floor_usd=1.0, fraction=0.1)
    assert (choice.index, choice.reason) == expected


def test_in_order_keeps_the_listed_order_and_a_restart_counts_against_the_saving():
    estimates = [_e(0, None, False), _e(1, 90.0), _e(2, 10.0)]
    assert table.choose(estimates, active=0, policy="inOrder").index == 1
    assert table.choose([_e(0, 50.0), _e(1, 30.0)], active=0, restart_usd=16.0).index == 0
    with pytest.raises(ValueError, match="policy: expected one of cheapest, inOrder, got 'cheap'"):
        table.choose(estimates, active=0, policy="cheap")


def test_each_decision_is_its_own_object_and_the_latest_is_read_back(tmp_path):
    store = open_store(f"file://{tmp_path}")
    assert table.latest(store) is None
    rows = table.rows(["aws us-east-1"], [Quote(price=0.4, source="estimate")], [_e(0, 12.0)], now=NOW)
    first = table.document(rows, table.Choice(0, "the cheapest feasible placement"), now=NOW, active=0,
                           policy="cheapest")
    second = {**first, "reason": "later"}
    assert table.write(store, first, now=NOW) == layout.decision_key(NOW)
    table.write(store, second, now=NOW + 60)
    assert store.list(layout.DECISIONS_PREFIX) == [layout.decision_key(NOW), layout.decision_key(NOW + 60)]
    assert table.latest(store) == second
    assert json.loads(store.get_bytes(layout.decision_key(NOW)))["rows"][0] == {
        "index": 0, "label": "aws us-east-1", "price": 0.4, "price_source": "estimate", "price_age_s": None,
        "score": None, "rate": None, "rate_source": "", "lam": 0.0, "load": 0.0, "transfer_usd": None, "cost": 12.0,
        "hours": None, "feasible": True, "why": "", "work_usd": None, "boot_s": None, "boot_source": ""}
    assert first["time"] == "2025-12-06T05:46:40Z" and first["chosen"] == 0


def test_the_decision_modules_import_no_cloud_client_or_stack_library():
    # The function's package ships controller/ and runfolder/ with tenacity (components/function_package.py):
    # these modules import nothing else at import time; the clouds' clients load only where a price is asked.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = ("import sys; sys.path.insert(0, '.'); import controller.prices, controller.cost, controller.table; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore', 'google', 'yaml', 'pydantic', 'components')))")
    proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=root, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_placements_of_one_cloud_and_region_read_apart_in_the_table():
    assert table.labels([("aws", "us-east-1", None), ("gcp", "us-central1", "proj-a"),
                         ("gcp", "us-central1", "proj-b"), ("gcp", "europe-west4", "proj-a")]) == [
        "aws us-east-1", "gcp us-central1 (proj-a)", "gcp us-central1 (proj-b)", "gcp europe-west4"]
    assert table.labels([("gcp", "us-central1", None), ("gcp", "us-central1", None)]) == [
        "gcp us-central1 (placement 0)", "gcp us-central1 (placement 1)"]
