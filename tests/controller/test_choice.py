"""The tick acting on ``placement.choose`` (controller/choice.py, controller/tick.py's ``_by_price``): where a
failure move goes, when a move for price happens, what is never stopped for price, and that a broken price API
leaves the tick's other duties done. Function level: a run folder on disk, groups in memory, EC2's answers
through botocore's Stubber (checked against the service model)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from controller import choice, table
from controller import record as records
from controller.config import parse
from controller.decide import MOVE, STAY, GroupState, LaunchFailure
from controller.prices import Quote, live_fetch
from controller.record import iso
from controller.tick import tick
from runfolder import layout
from runfolder.lease import LeaseRecord
from runfolder.storage import open_store
from tests.controller.helpers import FakeGroups

NOW = 1_800_000_000.0
NO_CAPACITY = "We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested."
REGIONS = ("us-east-1", "us-west-2", "eu-west-1")


def _config(tmp_path: Path, n: int = 3):
    return parse({"run_uri": f"file://{tmp_path}/runs/r", "nodes": 1, "wait_minutes": 15, "placements": [
        {"cloud": "aws", "region": REGIONS[i], "project": None, "group": f"g{i}"} for i in range(n)]})


def _row(gpu: str = "A10G", estimate: float = 0.4, **more) -> dict:
    return {"instance_types": ["g5.xlarge"], "zones": [], "gpu": gpu, "estimate_per_hour": estimate,
            "restore_per_gb": 0.02, "writes_per_gb": 0.02, "max_price_per_hour": None, **more}


def _inputs(config, *, policy: str = "cheapest", rebalance: bool = False, rows=None) -> choice.Inputs:
    return choice.parse_inputs({"policy": policy, "rebalance": rebalance, "move_floor_usd": 1.0,
                                "move_fraction": 0.1, "steps": 100_000, "checkpoint_every_s": 600,
                                "placements": rows or [_row() for _ in config.placements]}, config)


def _run(store, *, step: int, beat: float, held_until: float | None = None, progress_step: int | None = None):
    """A run that trained at home at 20,000 steps an hour up to ``step`` (committed), its last sign at ``beat``;
    ``held_until``: a trainer holds the lease until then (else it was released)."""
    start = beat - 3600
    events = [{"event": "started", "time": iso(start), "attempt": 1, "config": {"placement": "aws us-east-1"}},
              {"event": "checkpoint", "time": iso(start + 60), "step": step - 20_000, "bytes": 10**9},
              {"event": "checkpoint", "time": iso(start + 3660), "step": step, "bytes": 10**9}]
    store.put_bytes(layout.EVENTS_KEY, "".join(json.dumps(e) + "\n" for e in events).encode())
    store.put_bytes(layout.committed_key(step), b"{}")
    store.put_bytes(layout.PROGRESS_KEY, json.dumps({"step": progress_step or step, "total": 100_000,
                                                     "updated": iso(beat)}).encode())
    store.put_bytes(layout.LEASE_KEY, LeaseRecord(
        holder="i-0aaa/1", token="t", epoch=1, ttl_s=60.0, expires=held_until or beat + 60,
        released=held_until is None, nonce="n").dump())


class Prices:
    """The clouds' quotes, by placement index; counts the fetches."""

    def __init__(self, by_index: dict[int, float], *, fails: bool = False) -> None:
        self.by_index, self.fails, self.asked = by_index, fails, []

    def __call__(self):
        if self.fails:
            raise RuntimeError("the price API is down")

        def fetch(offer):
            self.asked.append(offer.index)
            return Quote(price=self.by_index[offer.index], source="aws", as_of=NOW)

        return fetch


def _groups(config, *, home: GroupState):
    others = GroupState(running=0, desired=0)
    return FakeGroups({p.group: home.desired if p.index == 0 else 0 for p in config.placements},
                      state=lambda p: home if p.index == 0 else others)


def _failing_home(config):
    return _groups(config, home=GroupState(running=0, desired=1, failures=(LaunchFailure(NOW - 60, NO_CAPACITY),)))


def _tables(store) -> list[dict]:
    return [json.loads(store.get_bytes(k)) for k in sorted(store.list(layout.DECISIONS_PREFIX))]


@pytest.mark.parametrize(("policy", "to"), [("cheapest", 2), ("inOrder", 1)])
def test_a_failure_move_goes_to_the_cheapest_allowed_placement_or_in_order(tmp_path, policy, to):
    config = _config(tmp_path)
    store = open_store(config.run_uri)
    _run(store, step=20_000, beat=NOW - 16 * 60)
    prices = Prices({0: 1.0, 1: 1.2, 2: 0.5})

    result = tick(config, _failing_home(config), NOW, store=store, inputs=_inputs(config, policy=policy),
                  prices=prices)

    assert result.action == MOVE and result.move["to"] == to, result
    rec, _ = records.read(store)
    assert rec.active == to and str(0) in rec.failed_at  # a failure move marks home failed, as before
    if policy == "inOrder":  # today's behaviour exactly: no price asked, no table
        assert prices.asked == [] and _tables(store) == []
        return
    (doc,) = _tables(store)
    assert (doc["policy"], doc["active"], doc["chosen"]) == ("cheapest", 0, 2)
    assert [r["feasible"] for r in doc["rows"]] == [False, True, True] and doc["rows"][2]["cost"] < doc["rows"][1]["cost"]
    assert "capacity" in doc["rows"][0]["why"] and doc["rows"][2]["price_source"] == "aws"
    assert json.loads(store.get_bytes(layout.PRICES_KEY))["quotes"]  # the cache written beside it


def test_without_the_stacks_inputs_the_tick_keeps_the_listed_order(tmp_path):
    config = _config(tmp_path)
    store = open_store(config.run_uri)
    _run(store, step=20_000, beat=NOW - 16 * 60)
    assert choice.load_inputs(config, tmp_path / "absent.json") == choice.Inputs()

    result = tick(config, _failing_home(config), NOW, store=store, inputs=choice.Inputs(), prices=Prices({}))

    assert result.move["to"] == 1 and _tables(store) == []


@pytest.mark.parametrize(("west", "moves"), [(0.5, True), (0.95, False)])
def test_at_a_preemption_the_run_moves_for_price_only_past_the_threshold(tmp_path, west, moves):
    config = _config(tmp_path, 2)
    store = open_store(config.run_uri)
    _run(store, step=20_000, beat=NOW - 120)  # preempted two minutes ago: its lease released, its group relaunching
    groups = _groups(config, home=GroupState(running=0, desired=1))

    result = tick(config, groups, NOW, store=store, inputs=_inputs(config), prices=Prices({0: 1.0, 1: west}))

    (doc,) = _tables(store)
    home, other = doc["rows"]
    assert home["cost"] > other["cost"]  # west is cheaper either way
    if moves:
        assert result.action == MOVE and result.move["to"] == 1 and result.reason.startswith(choice.PRICE_REASON)
        rec, _ = records.read(store)
        assert rec.active == 1 and rec.failed_at == {}  # a price move fails nobody
        assert doc["chosen"] == 1 and home["cost"] - other["cost"] > max(1.0, 0.1 * home["cost"])
        assert groups.sizes == {"g0": 0, "g1": 1}
    else:
        assert result.action == STAY and doc["chosen"] == 0 and "under the move threshold" in doc["reason"]
        assert groups.sizes == {"g0": 1, "g1": 0}
    again = tick(config, groups, NOW + 60, store=store, inputs=_inputs(config), prices=Prices({0: 1.0, 1: west}))
    assert again.action == STAY and len(_tables(store)) == 1  # the same decision is not written each minute


def test_a_training_machine_is_never_stopped_for_price(tmp_path):
    config = _config(tmp_path, 2)
    store = open_store(config.run_uri)
    _run(store, step=20_000, beat=NOW - 30, held_until=NOW + 60)  # a trainer holds the lease
    groups = _groups(config, home=GroupState(running=1, desired=1, machines=("i-1",)))
    prices = Prices({0: 1.0, 1: 0.1})

    result = tick(config, groups, NOW, store=store, inputs=_inputs(config), prices=prices)

    assert result.action == STAY and groups.sizes == {"g0": 1, "g1": 0}
    assert prices.asked == [] and _tables(store) == []  # not a decision point: nothing priced


@pytest.mark.parametrize(("progress_step", "moves"), [(20_000, True), (25_000, False)])
def test_rebalance_moves_a_training_run_only_right_after_a_commit(tmp_path, progress_step, moves):
    config = _config(tmp_path, 2)
    store = open_store(config.run_uri)
    # 5,000 steps since the commit at 20,000 steps an hour: 15 minutes of steps a move would throw away.
    _run(store, step=20_000, beat=NOW - 30, held_until=NOW + 60, progress_step=progress_step)
    groups = _groups(config, home=GroupState(running=1, desired=1, machines=("i-1",)))

    result = tick(config, groups, NOW, store=store, inputs=_inputs(config, rebalance=True),
                  prices=Prices({0: 1.0, 1: 0.1}))

    assert (result.action == MOVE) is moves, result
    (doc,) = _tables(store)
    assert doc["chosen"] == (1 if moves else 0)
    if moves:
        assert doc["move"]["restart_usd"] > 0  # the new boot counted against the saving
    else:
        assert "waits for the next commit" in doc["reason"]


@pytest.mark.parametrize("where", ["api", "cache"])
def test_a_broken_price_api_never_stops_the_ticks_other_duties(tmp_path, where):
    config = _config(tmp_path)
    store = open_store(config.run_uri)
    _run(store, step=20_000, beat=NOW - 16 * 60)
    prices = Prices({}, fails=True)
    if where == "cache":  # the cache unreadable as a document: read as empty, the API then asked
        store.put_bytes(layout.PRICES_KEY, b"{not json")
        prices = Prices({0: 1.0, 1: 1.2, 2: 0.5})
    result = tick(config, _failing_home(config), NOW, store=store, inputs=_inputs(config), prices=prices)
    assert result.action == MOVE and result.move["to"] == (1 if where == "api" else 2)
    if where == "api":
        assert "the price API is down" in result.price and "price" in result.to_json()

    # A restart (the home group zeroed from outside) while the price API fails: the other duties are done.
    config = _config(tmp_path / "b")
    store = open_store(config.run_uri)
    _run(store, step=20_000, beat=NOW - 120)
    groups = _groups(config, home=GroupState(running=0, desired=0))
    groups.sizes["g2"] = 1
    result = tick(config, groups, NOW, store=store, inputs=_inputs(config), prices=Prices({}, fails=True))
    assert result.action == STAY and "the price API is down" in result.price
    assert groups.sizes == {"g0": 1, "g1": 0, "g2": 0}  # home sized back, the stray group zeroed


def test_a_placement_that_would_miss_the_deadline_is_never_chosen(tmp_path):
    config = _config(tmp_path)
    store = open_store(config.run_uri)
    _run(store, step=20_000, beat=NOW - 16 * 60)
    # 80,000 steps left: 4 h on an A10G, 8.8 h on a T4 (2.2 times slower). A deadline in 6 h.
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) + 6 * 3600}\n".encode())
    rows = [_row(), _row(), _row(gpu="T4")]

    result = tick(config, _failing_home(config), NOW, store=store, inputs=_inputs(config, rows=rows),
                  prices=Prices({0: 1.0, 1: 1.2, 2: 0.2}))

    assert result.move["to"] == 1
    (doc,) = _tables(store)
    assert doc["rows"][2]["feasible"] is False and "after the deadline" in doc["rows"][2]["why"]


def test_ec2s_answers_price_the_placements_through_the_service_model(tmp_path):
    config = _config(tmp_path, 2)
    store = open_store(config.run_uri)
    _run(store, step=20_000, beat=NOW - 120)
    groups = _groups(config, home=GroupState(running=0, desired=1))
    clients = {r: boto3.client("ec2", region_name=r, aws_access_key_id="k", aws_secret_access_key="s")
               for r in REGIONS[:2]}

    class Clouds:
        def ec2(self, p):
            return clients[p.region]

    stubs = [Stubber(clients[r]) for r in REGIONS[:2]]
    for stub, (region, price) in zip(stubs, (("us-east-1", "1.0"), ("us-west-2", "0.4")), strict=True):
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [{
            "AvailabilityZone": f"{region}a", "InstanceType": "g5.xlarge", "ProductDescription": "Linux/UNIX",
            "SpotPrice": price, "Timestamp": datetime.fromtimestamp(NOW - 60, UTC)}]},
            {"InstanceTypes": ["g5.xlarge"], "ProductDescriptions": ["Linux/UNIX"],
             "StartTime": datetime.fromtimestamp(NOW, UTC)})
        stub.add_client_error("get_spot_placement_scores", service_error_code="UnauthorizedOperation")
        stub.activate()
    placements = {p.index: p for p in config.placements}

    result = tick(config, groups, NOW, store=store, inputs=_inputs(config),
                  prices=lambda: live_fetch(Clouds(), placements, now=NOW))

    for stub in stubs:
        stub.assert_no_pending_responses()
    assert result.move["to"] == 1
    (doc,) = _tables(store)
    assert [(r["price"], r["price_source"], r["price_age_s"]) for r in doc["rows"]] == [
        (1.0, "aws", 0.0), (0.4, "aws", 0.0)]


def test_bad_inputs_are_refused_naming_the_key(tmp_path):
    config = _config(tmp_path, 2)
    good = {"placements": [_row(), _row()]}
    assert choice.parse_inputs(good, config).policy == table.CHEAPEST
    for bad, key in [({**good, "policy": "cheap"}, "policy"), ({**good, "placements": [_row()]}, "placements"),
                     ({**good, "move_fraction": 2}, "move_fraction"), ({**good, "rebalance": "yes"}, "rebalance"),
                     ({**good, "placements": [_row(), {**_row(), "instance_types": []}]},
                      r"placements\[1\]\.pricing\.instance_types")]:
        with pytest.raises(choice.InputsError, match=rf"^decision\.json: {key}"):
            choice.parse_inputs(bad, config)
    path = tmp_path / "decision.json"
    path.write_text("{")
    with pytest.raises(choice.InputsError, match=r"^decision\.json: not JSON"):
        choice.load_inputs(config, path)


def test_the_runs_history_gives_each_placements_rate_preemptions_and_machine_hours():
    config = parse({"run_uri": "file:///x", "nodes": 2, "wait_minutes": 15, "placements": [
        {"cloud": "aws", "region": r, "project": None, "group": f"g{i}"} for i, r in enumerate(REGIONS[:2])]})
    t = NOW
    events = [{"event": "started", "time": iso(t)},  # no placement named: home
              {"event": "data_staged", "time": iso(t + 60), "files": 3, "bytes": 900},
              {"event": "checkpoint", "time": iso(t + 600), "step": 100, "bytes": 5},
              {"event": "checkpoint", "time": iso(t + 1200), "step": 300, "bytes": 7},
              {"event": "preempted", "time": iso(t + 1800), "step": 300},
              {"event": "started", "time": iso(t + 3600), "config": {"placement": "aws us-west-2"}},
              {"event": "data_staged", "time": iso(t + 3660), "files": 4, "bytes": 1200},
              {"event": "checkpoint", "time": iso(t + 4200), "step": 400},
              {"event": "checkpoint", "time": iso(t + 7800), "step": 1400}]
    h = choice.history(events, config.placements, config.nodes)
    assert h.rate(0) == pytest.approx(200 / (600 / 3600)) and h.rate(1) == pytest.approx(1000.0)
    assert (h.tallies[0].preemptions, h.tallies[1].preemptions) == (1, 0)
    assert h.tallies[0].machine_hours == pytest.approx(2 * 0.5) and h.tallies[1].machine_hours == pytest.approx(2 * 4200 / 3600)
    assert h.checkpoint_bytes == 7 and h.checkpoint_interval_s == 3600
    assert h.data_bytes == 1200  # the newest staging's: what a machine stages at its next start
    assert choice.history(events[:1], config.placements, config.nodes).data_bytes is None  # synthetic: none


ACCESS = {"gcp_audience": "//iam.googleapis.com/projects/123/locations/global/workloadIdentityPools/pool/providers/aws-home",
          "service_account": "trainstack@my-proj.iam.gserviceaccount.com"}


def _boot_events(t: float) -> list[dict]:
    """Home (aws us-east-1) preempted twice, each time replaced by its own group (boots of 400 and 800 s, notice to
    ``resumed``), then a move to a GCP placement whose first attempt has no boot to measure (no notice before it)."""
    return [
        {"event": "started", "time": iso(t), "config": {"placement": "aws us-east-1"}},
        {"event": "checkpoint", "time": iso(t + 600), "step": 100},
        {"event": "checkpoint", "time": iso(t + 1200), "step": 300},
        {"event": "checkpoint", "time": iso(t + 1290), "step": 310},  # the commit the notice asked for
        {"event": "preempted", "time": iso(t + 1300), "step": 310},
        {"event": "started", "time": iso(t + 1600), "config": {"placement": "aws us-east-1"}},
        {"event": "resumed", "time": iso(t + 1700), "step": 310},
        {"event": "checkpoint", "time": iso(t + 2300), "step": 510},
        {"event": "preempted", "time": iso(t + 2400), "step": 510},
        {"event": "started", "time": iso(t + 3000), "config": {"placement": "aws us-east-1"}},
        {"event": "resumed", "time": iso(t + 3200), "step": 510},
        {"event": "preempted", "time": iso(t + 3300), "step": 510},
        {"event": "started", "time": iso(t + 4000), "config": {"placement": "gcp us-central1"}},
        {"event": "resumed", "time": iso(t + 4100), "step": 510},
    ]


def test_the_runs_history_measures_each_clouds_replacement_boot_from_notice_to_resume():
    config = parse({"run_uri": "file:///x", "nodes": 1, "wait_minutes": 15, "placements": [
        {"cloud": "aws", "region": "us-east-1", "project": None, "group": "g0"},
        {"cloud": "gcp", "region": "us-central1", "project": "p", "group": "g1", "access": ACCESS}]})
    h = choice.history(_boot_events(NOW), config.placements, config.nodes)
    # 1300 -> 1700 and 2400 -> 3200 at home; the move to GCP is no replacement by a group: not a boot.
    assert h.boots == {"aws": (400.0, 800.0)} and h.boot_s("aws") == 400.0 and h.boot_s("gcp") is None
    # The rate: 200 steps in 600 s, and 200 from the resume in 600 s; not the notice's commit (10 steps in 90 s).
    assert h.rate(0) == pytest.approx(400 / (1200 / 3600))
    assert h.checkpoint_interval_s == 600  # neither the resume's gap nor the notice's commit is the cadence
    inputs = choice.Inputs(boot_s={"aws": 600.0, "gcp": 900.0})
    assert choice.boot_for(h, inputs, "aws") == (400.0, "measured")
    assert choice.boot_for(h, inputs, "gcp") == (900.0, "prior")


def test_each_row_says_which_boot_it_used_and_l_charges_a_full_boot_though_this_ones_is_partly_paid(tmp_path):
    config = parse({"run_uri": f"file://{tmp_path}/runs/r", "nodes": 1, "wait_minutes": 15, "placements": [
        {"cloud": "aws", "region": "us-east-1", "project": None, "group": "g0"},
        {"cloud": "gcp", "region": "us-central1", "project": "p", "group": "g1", "access": ACCESS}]})
    store = open_store(config.run_uri)
    store.put_bytes(layout.EVENTS_KEY, "".join(json.dumps(e) + "\n" for e in _boot_events(NOW - 7200)).encode())
    inputs = choice.parse_inputs({"policy": "cheapest", "steps": 100_000, "checkpoint_every_s": 600,
                                  "boot_s": {"aws": 600, "gcp": 900}, "placements": [_row(), _row(gpu="L4")]}, config)
    quotes = [Quote(price=1.0, source="aws", as_of=NOW), Quote(price=1.0, source="gcp", as_of=NOW)]

    def table(booted_s):
        return choice.price_tables(config, inputs, store, quotes, active=0, now=NOW, allowed={}, committed=510,
                                   progress_step=510, total=100_000, deadline=None, running_active=False,
                                   booted_s=booted_s, restart=False).doc["rows"]

    fresh, booting = table(None), table(300.0)
    assert [(r["boot_s"], r["boot_source"]) for r in fresh] == [(400.0, "measured"), (900.0, "prior")]
    # A replacement 300 s into its 400 s boot: the rest of it is what this restart still pays, but each preemption
    # to come costs a whole boot, so the load is the same.
    assert booting[0]["load"] == fresh[0]["load"] and booting[0]["hours"] < fresh[0]["hours"]
    assert booting[0]["hours"] == pytest.approx(fresh[0]["hours"] - 300 / 3600, abs=1e-3)


def test_a_restart_never_moves_for_price_to_an_unknown_cost_but_leaves_a_placement_that_cannot_finish(tmp_path):
    config = _config(tmp_path, 3)
    store = open_store(config.run_uri)
    _run(store, step=20_000, beat=NOW - 120)
    # Home is over its maximum price; 1 has no rate figure for its GPU (unknown cost); 2 over its maximum too.
    rows = [_row(max_price_per_hour=2.0), _row(gpu="Z9"), _row(max_price_per_hour=0.3)]
    groups = _groups(config, home=GroupState(running=0, desired=1))
    result = tick(config, groups, NOW, store=store, inputs=_inputs(config, rows=rows),
                  prices=Prices({0: 3.0, 1: 0.1, 2: 0.5}))
    assert result.action == STAY and groups.sizes["g0"] == 1
    (doc,) = _tables(store)
    assert doc["chosen"] == 0 and "without a known cost there" in doc["reason"]
    assert doc["rows"][1]["cost"] is None and doc["rows"][1]["feasible"] and doc["rows"][2]["feasible"] is False

    # Home over its own maximum price now: the run leaves it for the placement of known cost that can finish.
    config = _config(tmp_path / "b", 3)
    store = open_store(config.run_uri)
    _run(store, step=20_000, beat=NOW - 120)
    rows = [_row(max_price_per_hour=2.0), _row(gpu="Z9"), _row()]
    result = tick(config, _groups(config, home=GroupState(running=0, desired=1)), NOW, store=store,
                  inputs=_inputs(config, rows=rows), prices=Prices({0: 3.0, 1: 0.1, 2: 2.5}))
    assert result.action == MOVE and result.move["to"] == 2, result


def test_the_handler_ticks_with_the_inputs_in_its_package(tmp_path, monkeypatch):
    from controller import handler

    config_doc = {"run_uri": f"file://{tmp_path}/runs/r", "nodes": 1, "wait_minutes": 15, "placements": [
        {"cloud": "aws", "region": r, "project": None, "group": f"g{i}"} for i, r in enumerate(REGIONS[:2])]}
    monkeypatch.setenv("TRAINSTACK_PLACEMENTS", json.dumps(config_doc))
    path = tmp_path / "decision.json"
    path.write_text(json.dumps({"policy": "cheapest", "placements": [_row(), _row()]}))
    monkeypatch.setattr(choice, "INPUTS_FILE", path)
    seen = {}

    def fake_tick(config, clouds, now, *, clock, inputs, prices):
        seen.update(inputs=inputs, prices=prices)
        return type("R", (), {"to_json": lambda self: {"action": "stay"}})()

    monkeypatch.setattr(handler, "tick", fake_tick)
    monkeypatch.setattr(handler, "Clouds", lambda: object())
    assert handler.handler() == {"action": "stay"}
    assert seen["inputs"].cheapest and callable(seen["prices"])

    path.write_text(json.dumps({"policy": "cheap", "placements": [_row(), _row()]}))
    assert handler.main() == 2


def test_a_stale_price_ranks_after_every_known_one_and_the_table_says_its_age(tmp_path):
    from controller import prices as price_cache
    from controller.prices import Offer

    config = _config(tmp_path)
    store = open_store(config.run_uri)
    _run(store, step=20_000, beat=NOW - 16 * 60)
    inputs = _inputs(config)
    offers = [Offer(p.index, p.cloud, p.region, ("g5.xlarge",)) for p in config.placements]
    # Placement 2's price is the cheapest but two hours old (AWS's go stale after one); its refresh fails.
    cached = {offers[0].key: Quote(1.0, "aws", as_of=NOW - 60), offers[1].key: Quote(1.2, "aws", as_of=NOW - 60),
              offers[2].key: Quote(0.1, "aws", as_of=NOW - 7200)}
    store.put_bytes(layout.PRICES_KEY, price_cache.dump(cached))

    def prices():
        def fetch(offer):
            raise price_cache.PriceError(f"placement {offer.index}: throttled")
        return fetch

    result = tick(config, _failing_home(config), NOW, store=store, inputs=inputs, prices=prices)

    assert result.move["to"] == 1  # the known price, not the stale cheap one
    (doc,) = _tables(store)
    stale = doc["rows"][2]
    assert (stale["price"], stale["price_source"], stale["price_age_s"], stale["cost"]) == (None, "stale", 7200.0, None)
    assert doc["rows"][1]["price_age_s"] == 60.0
