"""The plan `ops synth` ends with, line by line, from figures given here (no Pulumi program run).

`tests/ops/test_ops_synth.py` and `tests/components/test_pricing.py` check the plan of real
stacks through the mock runtime; here each section of `ops/plan.py` gets figures chosen to
reach every branch (a price above and below $10 and $1, one missing, spot from the API or
estimated, a capped maximum price, a placement without a transfer price), and the whole
line is compared: a changed figure, word or alignment is what an operator would misread.
"""

from __future__ import annotations

import pytest

from components.pricing import CheckpointWrites, CostEstimate, ImageCopies, PlacementCost, Transfer, TypePrice
from ops import plan


@pytest.mark.parametrize(("value", "shown"), [
    (None, "unknown"), (1234.5, "$1,234.50"), (10.0, "$10.00"), (9.99949, "$9.999"), (5.5, "$5.500"),
    (1.0, "$1.000"), (0.5, "$0.5"), (0.123456789, "$0.123457"), (0.00001, "$0.00001"), (0.0, "$0"),
])
def test_a_price_per_hour_shows_the_digits_that_matter(value, shown):
    assert plan._money(value) == shown


@pytest.mark.parametrize(("value", "shown"), [(None, "unknown"), (4719.25, "$4,719.25"), (0.004, "$0.00")])
def test_a_total_is_in_cents(value, shown):
    assert plan._total(value) == shown


def test_outputs_holding_a_made_up_value_are_marked():
    mock = {"ami-0fake", "123456789012"}
    assert plan._marked("ami-0fake", mock) == "ami-0fake (mock)"
    assert plan._marked("arn:aws:iam::123456789012:role/x", mock) == "arn:aws:iam::123456789012:role/x (mock)"
    assert plan._marked("s3://mine", mock) == "s3://mine"
    assert plan._marked(["ami-0fake"], mock) == "['ami-0fake'] (mock)"
    assert plan._marked(42, mock) == "42"


def test_a_resource_shows_at_most_two_short_made_up_inputs_in_name_order():
    mock = {"FAKE"}
    inputs = {"zeta": "FAKE-z", "alpha": "FAKE-a", "mid": "FAKE-m", "plain": "mine", "count": 3,
              "long": "FAKE" + "x" * 117, "edge": "FAKE" + "y" * 116}
    assert plan._mock_inputs(inputs, mock) == ["alpha=FAKE-a", "edge=FAKE" + "y" * 116]
    assert plan._mock_inputs(inputs, mock, limit=3) == ["alpha=FAKE-a", "edge=FAKE" + "y" * 116, "mid=FAKE-m"]
    assert plan._mock_inputs({"a": "mine"}, mock) == []


def test_resources_are_counted_by_type_with_three_names_and_the_made_up_inputs():
    resources = [{"type": "aws:s3/bucket:Bucket", "name": f"b{i}", "inputs": {}} for i in range(5)]
    resources += [{"type": "aws:ec2/launchTemplate:LaunchTemplate", "name": "lt",
                   "inputs": {"imageId": "ami-FAKE", "name": "lt"}},
                  {"type": "aws:iam/role:Role", "name": "role"}]
    assert plan.resources_section(resources, {"FAKE"}) == [
        "Resources (7), by type:",
        "   1 x aws:ec2/launchTemplate:LaunchTemplate: lt",
        "         lt: imageId=ami-FAKE (mock)",
        "   1 x aws:iam/role:Role: role",
        "   5 x aws:s3/bucket:Bucket: b0, b1, b2, … (+2)",
    ]
    three = [{"type": "t", "name": n} for n in ("x", "y", "z")]
    assert plan.resources_section(three * 4, set())[1] == "  12 x t: x, y, z, … (+9)"
    assert plan.resources_section(three, set())[1] == "   3 x t: x, y, z"
    assert plan.resources_section([*three, {"type": "t", "name": "w"}], set())[1] == "   4 x t: x, y, z, … (+1)"


def _estimate(**kw) -> CostEstimate:
    base = dict(cloud="aws", region="us-east-1", nodes=2, spot=True, max_runtime_hours=72.0,
                types=[TypePrice("g5.xlarge", 1.006, 0.4024, "estimate"),
                       TypePrice("p4d.24xlarge", 32.7726, 13.11, "api", upper_bound=True)],
                recorded="2026-11-30", source="AWS price list")
    return CostEstimate(**{**base, **kw})


def test_the_cost_of_spot_machines_with_estimated_prices():
    assert plan.cost_section(_estimate(), 8) == [
        "Machines: 2 nodes x 8 GPU, spot, one of: g5.xlarge, p4d.24xlarge",
        "  g5.xlarge     on-demand $1.006/h  spot $0.4024/h (estimate)",
        "  p4d.24xlarge  on-demand $32.77/h (list price from before a price cut: likely lower now)"
        "  spot $13.11/h (price API)",
        "Expected: $0.8048-$26.22/h for 2 nodes (spot: estimated as a fraction of on-demand, no price API answer)",
        "Worst case: $65.55/h (the on-demand price x 2 nodes) until the runtime cap (72 h): $4,719.25",
        "Prices: on-demand list prices recorded 2026-11-30 (AWS price list); not a quote.",
    ]


def test_the_cost_of_one_on_demand_machine():
    est = _estimate(nodes=1, spot=False, max_runtime_hours=10.5, types=[TypePrice("g5.xlarge", 1.006, None, "estimate")])
    assert plan.cost_section(est, 1) == [
        "Machines: 1 node x 1 GPU, on-demand, one of: g5.xlarge",
        "  g5.xlarge  on-demand $1.006/h",
        "Expected: $1.006/h for 1 node",
        "Worst case: $1.006/h (the on-demand price x 1 node) until the runtime cap (10.5 h): $10.56",
        "Prices: on-demand list prices recorded 2026-11-30 (AWS price list); not a quote.",
    ]


def test_the_cost_under_a_maximum_price_from_the_spot_api():
    est = _estimate(types=[TypePrice("g5.xlarge", 1.006, 0.35, "api")], max_price_per_hour=0.5)
    lines = plan.cost_section(est, 1)
    assert lines[1:] == [
        "  g5.xlarge  on-demand $1.006/h  spot $0.35/h (price API)",
        "Expected: $0.7/h for 2 nodes (spot: the cloud's current prices)",
        "Worst case: $1.000/h (your maximum price x 2 nodes) until the runtime cap (72 h): $72.00",
        "Prices: on-demand list prices recorded 2026-11-30 (AWS price list); not a quote.",
    ]
    # On demand, a maximum spot price is no ceiling.
    on_demand = plan.cost_section(_estimate(spot=False, types=[TypePrice("g5.xlarge", 1.006, None, "estimate")],
                                            max_price_per_hour=0.5), 1)
    assert on_demand[3] == "Worst case: $2.012/h (the on-demand price x 2 nodes) until the runtime cap (72 h): $144.86"


def test_every_type_without_a_recorded_price_is_named():
    est = _estimate(types=[TypePrice("g9.huge", None, None, "estimate"), TypePrice("g9.big", None, None, "estimate")],
                    missing=["g9.huge", "g9.big"])
    assert "  no recorded price for g9.huge, g9.big in us-east-1; see components/prices.yaml" in plan.cost_section(est, 1)


def test_placements_and_their_groups_must_pair_up():
    est = _estimate(nodes=1, types=[TypePrice("g5.xlarge", 1.006, 0.4024, "estimate")])
    rows = [_row(0, "us-east-1", Transfer(0.0, "same region"), est), _row(1, "us-west-2", Transfer(0.02, "x"), est)]
    with pytest.raises(ValueError):
        plan.placements_section(rows, ["only-home"], 15, "1 GB", "t")


def test_a_type_without_a_recorded_price_is_named_and_the_worst_case_is_unknown():
    est = _estimate(types=[TypePrice("g5.xlarge", 1.006, 0.4024, "estimate"), TypePrice("g9.huge", None, None,
                                                                                       "estimate")],
                    missing=["g9.huge"])
    assert plan.cost_section(est, 1)[1:6] == [
        "  g5.xlarge  on-demand $1.006/h  spot $0.4024/h (estimate)",
        "  g9.huge    on-demand unknown/h  spot unknown/h (estimate)",
        "  no recorded price for g9.huge in us-east-1; see components/prices.yaml",
        "Expected: $0.8048/h for 2 nodes (spot: estimated as a fraction of on-demand, no price API answer)",
        "Worst case: unknown/h (the on-demand price x 2 nodes) until the runtime cap (72 h): unknown",
    ]


def _row(index: int, region: str, transfer: Transfer, est: CostEstimate, writes=None) -> PlacementCost:
    return PlacementCost(index, est.cloud, region, est, transfer, 2 * 10**9, writes)


def test_each_placement_says_its_group_price_restore_and_checkpoint_writes():
    home = _estimate(nodes=1, types=[TypePrice("g5.xlarge", 1.006, 0.4024, "estimate")])
    west = _estimate(region="us-west-2", nodes=1, types=[TypePrice("g5.xlarge", 1.006, 0.3, "api"),
                                                         TypePrice("g6.xlarge", 0.805, 0.25, "api")])
    od = _estimate(region="eu-west-1", nodes=1, spot=False, types=[TypePrice("g5.xlarge", 1.2, None, "estimate")])
    none = _estimate(region="ap-south-2", nodes=1, types=[TypePrice("g5.xlarge", None, None, "estimate")])
    inter = Transfer(0.02, "inter-region")
    rows = [
        _row(0, "us-east-1", Transfer(0.0, "same region"), home,
             CheckpointWrites(Transfer(0.0, "same region"), 10**9, 600.0)),
        _row(1, "us-west-2", inter, west, CheckpointWrites(inter, 10**9, 600.0)),
        _row(2, "eu-west-1", inter, od, CheckpointWrites(inter, 10**9, None)),
        _row(3, "ap-south-2", Transfer(None, "inter-region"), none,
             CheckpointWrites(Transfer(None, "inter-region"), 10**9, 600.0)),
    ]
    assert plan.placements_section(rows, ["g-east", "g-west", "g-eu", "g-ap"], 15, "2.0 GB", "AWS data transfer") == [
        "Placements: 4, home first; the run moves on after placement.waitMinutes (15) with no training machine "
        "while its group cannot launch",
        "  0 aws us-east-1 (home): group g-east; $0.4024/h spot estimate; restores read the bucket in its own region",
        "  1 aws us-west-2: group g-west; $0.25-$0.3/h spot; each restore reads one checkpoint (2.0 GB) inter-region "
        "at $0.02/GB: $0.04; checkpoint writes: $0.12/h at the 2.0 GB size, one every 600 s inter-region at $0.02/GB",
        "  2 aws eu-west-1: group g-eu; $1.200/h on-demand; each restore reads one checkpoint (2.0 GB) inter-region "
        "at $0.02/GB: $0.04; checkpoint writes: $0.02/GB inter-region (by steps only: no hourly rate)",
        "  3 aws ap-south-2: group g-ap; no recorded price in ap-south-2; restore: no recorded inter-region transfer "
        "price; checkpoint writes: no recorded inter-region transfer price",
        "  Transfer prices: AWS data transfer; not a quote.",
    ]


def test_a_placement_without_writes_says_nothing_of_them():
    est = _estimate(nodes=1, types=[TypePrice("g5.xlarge", 1.006, 0.4024, "estimate")])
    row = _row(1, "us-west-2", Transfer(0.02, "inter-region"), est)
    assert plan.writes_text(row, "1 GB") == ""


@pytest.mark.parametrize(("copies", "lines"), [
    (None, []),
    (ImageCopies(3, None, 0.0, 5), [
        "  Built image: stored in 3 repositories, one in each placement's region; no recorded registry storage "
        "price. Each keeps up to 5 images (image.keepImages); layers they share are stored once. Registry prices: "
        "the table; not a quote."]),
    (ImageCopies(2, 0.1, 0.0, 10), [
        "  Built image: stored in 2 repositories, one in each placement's region; $0.1 per GB-month of compressed "
        "image in each: $0.2 a month per GB of image in all. Each keeps up to 10 images (image.keepImages); layers "
        "they share are stored once. Registry prices: the table; not a quote."]),
    (ImageCopies(2, 0.1, 0.5, 10), [
        "  Built image: stored in 2 repositories, one in each placement's region; $0.1 per GB-month of compressed "
        "image in each: $0.2 a month per GB of image in all (the first 0.5 GB-month is free per billing account). "
        "Each keeps up to 10 images (image.keepImages); layers they share are stored once. Registry prices: the "
        "table; not a quote."]),
])
def test_the_built_images_copies_are_priced_per_gb(copies, lines):
    assert plan.image_copies_lines(copies, "the table") == lines


def test_the_whole_plan_in_order():
    est = _estimate(nodes=1, spot=False, types=[TypePrice("g5.xlarge", 1.006, None, "estimate")])
    resources = [{"type": "aws:s3/bucket:Bucket", "name": "bucket", "inputs": {"arn": "arn:FAKE"}}]
    outputs = {"runUri": "s3://mine/runs/dev", "ami": "ami-FAKE", "groupName": "g"}
    text = plan.render("dev", "aws", "us-east-1", resources, outputs, {"FAKE"}, est, 1, storage=["Storage: s"],
                       placements=["Placements: p"])
    assert text.splitlines() == [
        "Plan for stack dev (aws, us-east-1); offline: values marked (mock) come from the fake cloud, not your account",
        "Resources (1), by type:",
        "   1 x aws:s3/bucket:Bucket: bucket",
        "         bucket: arn=arn:FAKE (mock)",
        "Outputs:",
        "  ami        ami-FAKE (mock)",
        "  groupName  g",
        "  runUri     s3://mine/runs/dev",
        "Machines: 1 node x 1 GPU, on-demand, one of: g5.xlarge",
        "  g5.xlarge  on-demand $1.006/h",
        "Expected: $1.006/h for 1 node",
        "Worst case: $1.006/h (the on-demand price x 1 node) until the runtime cap (72 h): $72.43",
        "Prices: on-demand list prices recorded 2026-11-30 (AWS price list); not a quote.",
        "Placements: p",
        "Storage: s",
    ]
    assert text.endswith("Storage: s\n")
    assert "Outputs:" not in plan.render("dev", "aws", "us-east-1", resources, {}, set(), est, 1)
