"""The run's first launch with ``placement.choose: cheapest`` (controller/tick.py's ``_first_launch``): every group
starts at zero, and the first tick that sees a run not started launches it where its decision table says, writing
the table; a second tick, a finished run, a failing tick and a refused launch each do what any tick does.
Function level: a run folder on disk, groups in memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller import choice
from controller import record as records
from controller.clouds import CloudError
from controller.config import parse
from controller.decide import FINISH, MOVE, STAY, GroupState, LaunchFailure
from controller.prices import Quote
from controller.record import iso
from controller.tick import LAUNCH, tick
from runfolder import layout
from runfolder.storage import open_store
from tests.controller.helpers import FakeGroups

NOW = 1_800_000_000.0
NO_CAPACITY = "We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested."
REGIONS = ("us-east-1", "us-west-2", "eu-west-1")


def _config(tmp_path: Path, n: int = 3):
    return parse({"run_uri": f"file://{tmp_path}/runs/r", "nodes": 2, "wait_minutes": 15,
                  "max_runtime_s": 24 * 3600, "placements": [
                      {"cloud": "aws", "region": REGIONS[i], "project": None, "group": f"g{i}"} for i in range(n)]})


def _inputs(config, *, policy: str = "cheapest", max_prices=None, gpus=None) -> choice.Inputs:
    rows = [{"instance_types": ["g5.xlarge"], "zones": [], "gpu": (gpus or {}).get(i, "A10G"), "estimate_per_hour": 0.4,
             "restore_per_gb": 0.02, "writes_per_gb": 0.02, "max_price_per_hour": (max_prices or {}).get(i)}
            for i in range(len(config.placements))]
    return choice.parse_inputs({"policy": policy, "steps": 100_000, "checkpoint_every_s": 600,
                                "placements": rows}, config)


class Groups(FakeGroups):
    """Groups in memory whose state follows their size; ``refuse``: placements whose calls fail; ``failures``:
    launch failures by placement."""

    def __init__(self, config, sizes=None, *, refuse=(), failures=None) -> None:
        super().__init__(sizes or {p.group: 0 for p in config.placements}, state=self._read)
        self.refuse, self.failures = set(refuse), failures or {}

    def _read(self, p) -> GroupState:
        if p.index in self.refuse:
            raise CloudError(f"{p.group}: AccessDenied")
        return GroupState(running=0, desired=self.sizes[p.group], failures=self.failures.get(p.index, ()))

    def desired(self, p) -> int:
        if p.index in self.refuse:
            raise CloudError(f"{p.group}: AccessDenied")
        return super().desired(p)


def _prices(by_index: dict[int, float]):
    def make():
        return lambda offer: Quote(price=by_index[offer.index], source="aws", as_of=NOW)
    return make


def _tables(store) -> list[dict]:
    return [json.loads(store.get_bytes(k)) for k in sorted(store.list(layout.DECISIONS_PREFIX))]


def test_the_first_tick_launches_a_run_not_started_where_its_table_says_and_writes_the_table(tmp_path):
    config = _config(tmp_path)
    store = open_store(config.run_uri)
    groups = Groups(config)
    # Home's price is above its maximum; no rate is measured yet, so no E: the least price per unit of GPU work
    # decides, and placement 2's cheaper L4 does less work an hour than placement 1's A10G for its price.
    inputs = _inputs(config, max_prices={0: 0.5}, gpus={2: "L4"})
    prices = _prices({0: 0.6, 1: 0.4, 2: 0.36})

    result = tick(config, groups, NOW, store=store, inputs=inputs, prices=prices)

    assert result.action == LAUNCH and "the first launch" in result.reason, result
    assert groups.sizes == {"g0": 0, "g1": 2, "g2": 0} and groups.calls == [("g1", 2)]
    rec, _ = records.read(store)
    assert (rec.active, rec.since, rec.moves, rec.failed_at) == (1, iso(NOW), [], {})  # a launch, not a move
    (doc,) = _tables(store)
    assert doc["first_launch"] is True and doc["chosen"] == 1 and doc["active"] is None
    assert [r["feasible"] for r in doc["rows"]] == [False, True, True] and "above the maximum" in doc["rows"][0]["why"]
    assert [r["price"] for r in doc["rows"]] == [0.6, 0.4, 0.36] and all(r["cost"] is None for r in doc["rows"])
    assert doc["rows"][1]["work_usd"] < doc["rows"][2]["work_usd"] and "least price per unit" in doc["reason"]

    again = tick(config, groups, NOW + 60, store=store, inputs=inputs, prices=prices)
    assert again.action == STAY and groups.calls == [("g1", 2)] and len(_tables(store)) == 1  # launched once


def test_the_first_launch_goes_where_the_same_gpu_is_cheapest_with_no_move_threshold(tmp_path):
    config = _config(tmp_path)
    store = open_store(config.run_uri)
    groups = Groups(config)

    # 3 % cheaper than home: below any move threshold, but nothing runs yet, so nothing is moved.
    result = tick(config, groups, NOW, store=store, inputs=_inputs(config), prices=_prices({0: 1.0, 1: 0.97, 2: 1.2}))

    assert result.action == LAUNCH and groups.sizes == {"g0": 0, "g1": 2, "g2": 0}
    assert _tables(store)[0]["chosen"] == 1


def test_with_no_throughput_figure_the_first_launch_takes_the_listed_orders_first_feasible(tmp_path):
    config = _config(tmp_path)
    store = open_store(config.run_uri)
    groups = Groups(config)
    inputs = _inputs(config, gpus={i: "a GPU of no table" for i in range(3)})

    result = tick(config, groups, NOW, store=store, inputs=inputs, prices=_prices({0: 0.9, 1: 0.4, 2: 0.3}))

    assert result.action == LAUNCH and groups.sizes == {"g0": 2, "g1": 0, "g2": 0}
    (doc,) = _tables(store)
    assert doc["chosen"] == 0 and "the first feasible one in the listed order" in doc["reason"]


@pytest.mark.parametrize("why", ["in-order", "started", "sized", "finished"])
def test_only_a_cheapest_run_not_started_with_every_group_at_zero_is_launched_by_the_first_tick(tmp_path, why):
    config = _config(tmp_path)
    store = open_store(config.run_uri)
    inputs = _inputs(config, policy="inOrder" if why == "in-order" else "cheapest", max_prices={0: 0.5})
    groups = Groups(config, {"g0": 2 if why == "sized" else 0, "g1": 0, "g2": 0})
    if why == "started":  # a machine has booted (an event) and holds no lease now
        store.put_bytes(layout.EVENTS_KEY, (json.dumps({"event": "started", "time": iso(NOW - 120), "attempt": 1})
                                            + "\n").encode())
    if why == "finished":
        store.put_bytes(layout.COMPLETE, b"{}")

    result = tick(config, groups, NOW, store=store, inputs=inputs, prices=_prices({0: 0.9, 1: 0.4, 2: 0.3}))

    assert result.action != LAUNCH, result
    assert not any(t.get("first_launch") for t in _tables(store))
    if why == "finished":  # never relaunched
        assert result.action == FINISH and groups.calls == []
    elif why == "sized":  # home already sized (a stack deployed before, a person): the tick goes on as any tick
        assert groups.sizes["g0"] == 2
    else:  # the listed order's home, sized up as any tick puts the active group back to nodes
        assert groups.sizes == {"g0": 2, "g1": 0, "g2": 0} and records.read(store)[0].since is None


def test_a_group_that_cannot_be_read_holds_the_first_launch_to_the_next_tick(tmp_path):
    config = _config(tmp_path)
    store = open_store(config.run_uri)
    groups = Groups(config, refuse={0})  # home's group not made yet, say
    inputs = _inputs(config, max_prices={0: 0.5})
    prices = _prices({0: 0.9, 1: 0.3, 2: 0.4})

    with pytest.raises(CloudError) as raised:
        tick(config, groups, NOW, store=store, inputs=inputs, prices=prices)

    assert raised.value.result.action == STAY and "waits for every group" in raised.value.result.reason
    assert groups.calls == [] and _tables(store) == [] and records.read(store)[1] is not None  # `broken` noted
    groups.refuse.clear()
    result = tick(config, groups, NOW + 60, store=store, inputs=inputs, prices=prices)
    assert result.action == LAUNCH and groups.sizes == {"g0": 0, "g1": 2, "g2": 0}


def test_a_failing_price_decision_launches_the_listed_orders_first_placement(tmp_path):
    config = _config(tmp_path)
    store = open_store(config.run_uri)
    groups = Groups(config)

    def broken():
        raise RuntimeError("the price API is down")

    result = tick(config, groups, NOW, store=store, inputs=_inputs(config, max_prices={0: 0.5}), prices=broken)

    # No table can be priced: the run is launched all the same, in the listed order's first placement.
    assert result.action == LAUNCH and groups.sizes["g0"] == 2


def test_the_chosen_placement_refusing_capacity_moves_the_run_by_the_failed_launch_rules(tmp_path):
    config = _config(tmp_path)
    store = open_store(config.run_uri)
    groups = Groups(config)
    inputs = _inputs(config, max_prices={0: 0.5})
    prices = _prices({0: 0.9, 1: 0.3, 2: 0.4})
    assert tick(config, groups, NOW, store=store, inputs=inputs, prices=prices).action == LAUNCH
    groups.failures[1] = (LaunchFailure(NOW + 30, NO_CAPACITY),)

    assert tick(config, groups, NOW + 10 * 60, store=store, inputs=inputs, prices=prices).action == STAY
    result = tick(config, groups, NOW + 16 * 60, store=store, inputs=inputs, prices=prices)

    assert result.action == MOVE and result.move["from"] == 1 and result.move["to"] == 2, result
    assert groups.sizes == {"g0": 0, "g1": 0, "g2": 2}
    assert "1" in records.read(store)[0].failed_at
