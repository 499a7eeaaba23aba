"""The placements' prices (controller/prices.py): EC2's answers through botocore's Stubber (which checks each
request and answer against EC2's service model: moto answers one fixed price and no scores), the Cloud Billing
Catalog's pages against the cloudbilling v1 discovery document, and the cache's ages."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import Stubber

from controller import prices
from controller.prices import GcpMachine, Offer, Quote
from runfolder import layout
from runfolder.storage import open_store

NOW = 1_765_000_000.0
TYPES = ("g5.xlarge", "g6.xlarge")


def _ec2():
    return boto3.client("ec2", region_name="us-west-2", aws_access_key_id="k", aws_secret_access_key="s")


def _entry(instance_type: str, zone: str, price: str, when: float = NOW - 600, product: str = "Linux/UNIX") -> dict:
    return {"AvailabilityZone": zone, "InstanceType": instance_type, "ProductDescription": product,
            "SpotPrice": price, "Timestamp": datetime.fromtimestamp(when, UTC)}


def _history_params(token: str | None = None) -> dict:
    params = {"InstanceTypes": list(TYPES), "ProductDescriptions": ["Linux/UNIX"],
              "StartTime": datetime.fromtimestamp(NOW, UTC)}
    return {**params, "NextToken": token} if token else params


def _score_params(nodes: int = 1) -> dict:
    return {"InstanceTypes": list(TYPES), "TargetCapacity": nodes, "TargetCapacityUnitType": "units",
            "SingleAvailabilityZone": False, "RegionNames": ["us-west-2"]}


def test_each_pool_takes_its_newest_price_across_pages_and_the_median_stands_for_the_group():
    ec2 = _ec2()
    with Stubber(ec2) as stub:
        stub.add_response("describe_spot_price_history", {"NextToken": "p2", "SpotPriceHistory": [
            _entry("g5.xlarge", "us-west-2a", "0.4100"),
            _entry("g5.xlarge", "us-west-2a", "0.9000", when=NOW - 86400),  # older: replaced
            _entry("g5.xlarge", "us-west-2b", "0.5200"),
            _entry("g5.xlarge", "us-west-2a", "0.1000", product="Linux/UNIX (Amazon VPC)"),  # another product
        ]}, _history_params())
        stub.add_response("describe_spot_price_history", {"NextToken": "", "SpotPriceHistory": [
            _entry("g6.xlarge", "us-west-2a", "0.3300"),
            _entry("g6.xlarge", "us-west-2c", "0.6100"),
        ]}, _history_params("p2"))
        stub.add_response("get_spot_placement_scores", {"SpotPlacementScores": [
            {"Region": "us-west-2", "Score": 7}]}, _score_params())
        quote = prices.aws_quote(Offer(1, "aws", "us-west-2", TYPES), ec2=ec2, now=NOW)
        stub.assert_no_pending_responses()
    # Pools 0.33, 0.41, 0.52, 0.61: the lower middle stands for the group, the extremes beside it.
    assert quote == Quote(price=0.41, source="aws", as_of=NOW, low=0.33, high=0.61, pools=4, score=7)


def test_the_placement_zones_narrow_the_pools():
    ec2 = _ec2()
    with Stubber(ec2) as stub:
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
            _entry("g5.xlarge", "us-west-2a", "0.41"), _entry("g5.xlarge", "us-west-2b", "0.20"),
            _entry("g6.xlarge", "us-west-2a", "0.50")]}, _history_params())
        pools = prices.aws_pool_prices(ec2, TYPES, ("us-west-2a",), now=NOW)
    assert pools == {("g5.xlarge", "us-west-2a"): 0.41, ("g6.xlarge", "us-west-2a"): 0.5}


@pytest.mark.parametrize("code", ["UnauthorizedOperation", "AccessDenied", "UnsupportedOperation"])
def test_a_refused_placement_score_is_no_score_and_the_price_stands(code):
    ec2 = _ec2()
    with Stubber(ec2) as stub:
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [_entry("g5.xlarge", "us-west-2a", "0.4")]},
                          _history_params())
        stub.add_client_error("get_spot_placement_scores", service_error_code=code, http_status_code=403,
                              expected_params=_score_params(4))
        quote = prices.aws_quote(Offer(1, "aws", "us-west-2", TYPES, nodes=4), ec2=ec2, now=NOW)
    assert (quote.price, quote.score, quote.note) == (0.4, None, f"placement score refused: {code}")


def test_no_spot_price_or_a_failed_history_is_a_price_error_naming_the_placement():
    ec2 = _ec2()
    with Stubber(ec2) as stub:
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": []}, _history_params())
        stub.add_client_error("describe_spot_price_history", service_error_code="UnauthorizedOperation",
                              http_status_code=403)
        with pytest.raises(prices.PriceError, match=r"placement 2 \(aws us-west-2\): EC2 has no Linux/UNIX spot price"):
            prices.aws_quote(Offer(2, "aws", "us-west-2", TYPES), ec2=ec2, now=NOW)
        with pytest.raises(prices.PriceError, match=r"placement 2 .*DescribeSpotPriceHistory failed"):
            prices.aws_quote(Offer(2, "aws", "us-west-2", TYPES), ec2=ec2, now=NOW)


@pytest.mark.parametrize(("values", "expected"), [
    ([], (None, None, None)), ([0.5], (0.5, 0.5, 0.5)), ([0.3, 0.9], (0.3, 0.3, 0.9)),
    ([0.9, 0.1, 0.5], (0.5, 0.1, 0.9)),
])
def test_the_group_price_is_the_lower_median(values, expected):
    assert prices.group_price(values) == expected


# -- the cache --------------------------------------------------------------------------------------

AWS = Offer(0, "aws", "us-east-1", TYPES)
GCP = Offer(1, "gcp", "us-central1", ("g2-standard-8",), machines=(GcpMachine("g2-standard-8", 8, 32, "nvidia-l4", 1),))


def test_a_refresh_asks_only_what_is_due_and_a_failure_keeps_the_old_quote():
    asked = []

    def fetch(offer):
        asked.append(offer.index)
        if offer.cloud == "gcp":
            raise prices.PriceError("catalog down")
        return Quote(price=0.4, source="aws", as_of=NOW)

    old_gcp = Quote(price=0.3, source="gcp", as_of=NOW - 2 * 86400)
    cached = {AWS.key: Quote(price=0.5, source="aws", as_of=NOW - 599), GCP.key: old_gcp}
    quotes, changed = prices.refresh(cached, [AWS, GCP], now=NOW, fetch=fetch)
    assert asked == [1] and changed  # AWS's is 599 s old (refreshed after 600 s); GCP's is past a day
    assert quotes[AWS.key].price == 0.5 and quotes[GCP.key] == Quote(price=0.3, source="gcp", as_of=NOW - 2 * 86400,
                                                                     note="refresh failed: catalog down")
    quotes, _ = prices.refresh(quotes, [AWS], now=NOW + 1, fetch=fetch)
    assert asked == [1, 0] and quotes[AWS.key] == Quote(price=0.4, source="aws", as_of=NOW)


def test_a_stale_price_is_unknown_and_ranks_after_every_known_one():
    cached = {AWS.key: Quote(price=0.9, source="aws", as_of=NOW - 3599),
              GCP.key: Quote(price=0.2, source="gcp", as_of=NOW - 36 * 86400)}
    aws, gcp = prices.quotes_for(cached, [AWS, GCP], now=NOW, estimates={0: 0.1, 1: 0.1})
    assert (aws.price, aws.source) == (0.9, "aws")
    assert (gcp.price, gcp.source, gcp.as_of) == (None, "stale", NOW - 36 * 86400)
    assert sorted([gcp, aws], key=prices.rank_key) == [aws, gcp]
    # An hour and a second on, AWS's is stale too; Google's 34-day-old price still holds.
    cached[GCP.key] = Quote(price=0.2, source="gcp", as_of=NOW - 34 * 86400)
    aws, gcp = prices.quotes_for(cached, [AWS, GCP], now=NOW + 2, estimates={})
    assert (aws.source, gcp.source, gcp.price) == ("stale", "gcp", 0.2)


def test_with_no_live_price_at_all_the_price_table_stands_in_marked_as_an_estimate():
    cached = {AWS.key: Quote(price=0.9, source="aws", as_of=NOW - 7200)}
    quotes = prices.quotes_for(cached, [AWS, GCP], now=NOW, estimates={0: 0.402, 1: None})
    assert [(q.price, q.source) for q in quotes] == [(0.402, "estimate"), (None, "estimate")]


def test_the_cache_round_trips_through_the_run_folder_and_is_written_only_when_it_changed(tmp_path):
    store = open_store(f"file://{tmp_path}")
    book = prices.PriceBook.open(store)
    assert book.quotes == {}
    book.update([AWS], now=NOW, fetch=lambda o: Quote(price=0.4, source="aws", as_of=NOW, score=None, pools=2))
    written = json.loads(store.get_bytes(layout.PRICES_KEY))
    assert written["version"] == 1 and written["quotes"][AWS.key]["as_of"] == NOW
    (tmp_path / layout.PRICES_KEY).unlink()
    book.update([AWS], now=NOW + 60, fetch=pytest.fail)  # nothing due: nothing asked, nothing written
    assert not (tmp_path / layout.PRICES_KEY).exists()
    store.put_bytes(layout.PRICES_KEY, json.dumps({"version": 1, "quotes": {AWS.key: asdict_quote()}}).encode())
    assert prices.PriceBook.open(store).quotes[AWS.key] == Quote(price=0.4, source="aws", as_of=NOW)
    for junk in (b"not json", b'{"version": 99, "quotes": {}}', b"[]"):
        store.put_bytes(layout.PRICES_KEY, junk)
        assert prices.load(store) == {}


def asdict_quote() -> dict:
    return {"price": 0.4, "source": "aws", "as_of": NOW, "unknown_field_of_a_later_version": 1}
