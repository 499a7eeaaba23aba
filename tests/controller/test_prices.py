"""The placements' prices (controller/prices.py): EC2's answers through botocore's Stubber (which checks each
request and answer against EC2's service model: moto answers one fixed price and no scores), the Cloud Billing
Catalog's pages against the cloudbilling v1 discovery document, and the cache's ages."""

from __future__ import annotations

import json
import zlib
from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import Stubber

from controller import prices
from controller.prices import GcpMachine, Offer, Quote
from runfolder import layout
from runfolder.storage import open_store
from tests.fixtures import discovery

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
            _entry("g5.xlarge", "us-west-2a", "0.1000", product="SUSE Linux"),  # another operating system
        ]}, _history_params())
        stub.add_response("describe_spot_price_history", {"NextToken": "", "SpotPriceHistory": [
            _entry("g6.xlarge", "us-west-2a", "0.3300"),
            _entry("g6.xlarge", "us-west-2c", "0.6100", product="Linux/UNIX (Amazon VPC)"),  # an older account's name
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


# -- GCP: the Cloud Billing Catalog ------------------------------------------------------------------

def _document() -> dict:
    return discovery.document("cloudbilling", "v1")


_valid = discovery.invalid


def _sku(description: str, usage_unit: str, units: str, nanos: int, *, regions=("us-central1",),
         usage_type: str = "Preemptible", group: str = "CPU", older: tuple[str, int] | None = None) -> dict:
    def info(u: str, n: int, effective: str) -> dict:
        return {"effectiveTime": effective, "summary": "", "currencyConversionRate": 1,
                "pricingExpression": {"usageUnit": usage_unit, "displayQuantity": 1, "usageUnitDescription": usage_unit,
                                      "baseUnit": "s", "baseUnitConversionFactor": 3600,
                                      "tieredRates": [{"startUsageAmount": 0,
                                                       "unitPrice": {"currencyCode": "USD", "units": u, "nanos": n}}]}}

    sku_id = f"{zlib.crc32(f'{description}{usage_unit}'.encode()):012d}"
    return {"name": f"{prices.COMPUTE_SERVICE}/skus/{sku_id}", "skuId": sku_id, "description": description,
            "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                         "resourceGroup": group, "usageType": usage_type},
            "serviceRegions": list(regions), "serviceProviderName": "Google",
            "geoTaxonomy": {"type": "REGIONAL" if len(regions) == 1 else "MULTI_REGIONAL", "regions": list(regions)},
            "pricingInfo": ([info(*older, "2026-10-01T07:00:00Z")] if older else [])
            + [info(units, nanos, "2026-11-01T07:00:00Z")]}


# Two pages as the catalog answers them: the SKUs of a g2-standard-8 (8 vCPUs, 32 GiB, one L4) in us-central1
# among others that must not count.
PAGES = [
    {"skus": [
        _sku("Spot Preemptible G2 Instance Core running in Americas", "h", "0", 9_290_000),
        _sku("G2 Instance Core running in Americas", "h", "0", 24_988_000, usage_type="OnDemand"),
        _sku("Spot Preemptible G2 Instance Core running in Belgium", "h", "0", 5_000_000, regions=("europe-west1",)),
        _sku("Spot Preemptible G2 Custom Instance Core running in Americas", "h", "0", 1_000_000),
        _sku("Reserved G2 Instance Core running in Americas", "h", "0", 1_000_000),
        _sku("Spot Preemptible G2 Instance Ram running in Americas", "GiBy.h", "0", 1_088_000, group="RAM",
             older=("0", 2_000_000)),
        _sku("Spot Preemptible N1 Predefined Instance Core running in Americas", "h", "0", 7_000_000),
    ], "nextPageToken": "page-2"},
    {"skus": [
        _sku("Spot Preemptible Nvidia L4 GPU running in Americas", "h", "0", 224_000_000, group="GPU"),
        _sku("Spot Preemptible Nvidia L4 GPU running in Americas", "GiBy.h", "9", 0, group="GPU"),  # not per hour
        _sku("Nvidia H100 80GB Mega GPU attached to Spot Preemptible VMs running in Americas", "h", "2", 500_000_000,
             group="GPU"),
        _sku("Spot Preemptible A3Plus Instance Core running in Americas", "h", "0", 30_000_000),
        _sku("Spot Preemptible A3Plus Instance Ram running in Americas", "GiBy.h", "0", 3_000_000, group="RAM"),
    ], "nextPageToken": ""},
]
G2 = GcpMachine("g2-standard-8", 8, 32, "nvidia-l4", 1)


def test_the_catalog_pages_are_in_the_documented_shape():
    doc = _document()
    assert doc["resources"]["services"]["resources"]["skus"]["methods"]["list"]["path"] == "v1/{+parent}/skus"
    errors = [e for i, page in enumerate(PAGES) for e in _valid(page, {"$ref": "ListSkusResponse"}, doc["schemas"],
                                                                   f"page{i}")]
    assert errors == []
    assert _valid({"skus": [{"skuid": "x"}]}, {"$ref": "ListSkusResponse"}, doc["schemas"], "p")  # the check bites


def test_a_machines_spot_price_is_its_cores_ram_and_gpus_from_the_newest_pricing_in_its_region():
    by_region = prices.gcp_sku_prices(iter(PAGES), ["us-central1", "europe-west1", "us-east4"])
    found = by_region["us-central1"]
    assert found == {("core", "g2"): 0.00929, ("ram", "g2"): 0.001088, ("core", "n1"): 0.007,
                     ("gpu", "nvidia-l4"): 0.224, ("gpu", "nvidia-h100-mega-80gb"): 2.5,
                     ("core", "a3plus"): 0.03, ("ram", "a3plus"): 0.003}
    assert prices.gcp_machine_price(found, G2) == round(8 * 0.00929 + 32 * 0.001088 + 0.224, 6)
    assert prices.gcp_machine_price(found, GcpMachine("a3-megagpu-8g", 208, 1872, "nvidia-h100-mega-80gb", 8)) \
        == round(208 * 0.03 + 1872 * 0.003 + 8 * 2.5, 6)
    assert prices.gcp_machine_price(found, GcpMachine("n1-standard-8", 8, 30, "nvidia-tesla-t4", 1)) is None  # no RAM
    assert (by_region["europe-west1"], by_region["us-east4"]) == ({("core", "g2"): 0.005}, {})


def test_the_controllers_requests_are_the_discovery_documents_and_its_pages_follow_the_token():
    from googleapiclient.discovery import build
    from googleapiclient.http import HttpMockSequence

    http = HttpMockSequence([({"status": "200"}, json.dumps(page)) for page in PAGES])
    service = build("cloudbilling", "v1", http=http, static_discovery=True)

    class Session:
        """What gcp_http_get sends (a requests session), answered by the discovery client's own call."""

        def __init__(self):
            self.sent = []

        def get(self, url, params, timeout):
            import requests

            self.sent.append(requests.Request("GET", url, params=params).prepare().url)
            assert url == f"{prices.BILLING_API}/{prices.COMPUTE_SERVICE}/skus" and timeout == prices.GCP_TIMEOUT_S
            body = service.services().skus().list(parent=prices.COMPUTE_SERVICE, pageSize=int(params["pageSize"]),
                                                  pageToken=params.get("pageToken")).execute()

            class Answer:
                status_code, text = 200, ""

                @staticmethod
                def json():
                    return body

            return Answer()

    session = Session()
    pages = prices.gcp_catalog_pages(prices.gcp_http_get(session))
    found = prices.gcp_sku_prices(pages, ["us-central1"])["us-central1"]
    quote = prices.gcp_quote(Offer(1, "gcp", "us-central1", ("g2-standard-8",), machines=(G2,)), prices=found, now=NOW)
    # The discovery client adds alt=json, the REST default (JSON answers) that the controller leaves implicit.
    assert [uri.replace("%2F", "/").replace("&alt=json", "") for uri, *_ in http.request_sequence] == session.sent
    assert session.sent == [f"{prices.BILLING_API}/{prices.COMPUTE_SERVICE}/skus?pageSize=5000",
                            f"{prices.BILLING_API}/{prices.COMPUTE_SERVICE}/skus?pageSize=5000&pageToken=page-2"]
    assert quote == Quote(price=round(8 * 0.00929 + 32 * 0.001088 + 0.224, 6), source="gcp", as_of=NOW,
                          low=0.333136, high=0.333136, pools=1)


def test_a_token_that_never_ends_is_bounded_and_a_refusal_is_an_error():
    with pytest.raises(prices.PriceError, match="more than 3 pages"):
        list(prices.gcp_catalog_pages(lambda url, params: {"skus": [], "nextPageToken": "again"}, max_pages=3))

    class Refused:
        status_code, text = 403, "Cloud Billing API has not been used in project 1 before or it is disabled"

    class Session:
        def get(self, url, params, timeout):
            return Refused()

    with pytest.raises(prices.PriceError, match="HTTP 403: Cloud Billing API has not been used"):
        list(prices.gcp_catalog_pages(prices.gcp_http_get(Session())))
    with pytest.raises(prices.PriceError, match=r"placement 1 \(gcp us-east4\): the catalog has no Spot price"):
        prices.gcp_quote(Offer(1, "gcp", "us-east4", ("g2-standard-8",), machines=(G2,)), prices={}, now=NOW)


def test_a_tick_reads_the_catalog_once_for_every_gcp_region_and_asks_ec2_as_the_placements_identity():
    from controller.config import Placement

    placements = {0: Placement(0, "aws", "us-east-1", "g0"), 1: Placement(1, "gcp", "us-central1", "g1", "p"),
                  2: Placement(2, "gcp", "europe-west1", "g2", "p")}
    ec2 = _ec2()

    class Clouds:
        sessions: list[int] = []

        def ec2(self, p):
            assert p is placements[0]
            return ec2

        def gcp_session(self, p):
            self.sessions.append(p.index)

            class Session:
                pages = iter(PAGES)

                def get(self, url, params, timeout):
                    class Answer:
                        status_code, text = 200, ""
                        body = next(Session.pages)

                        def json(self):
                            return self.body

                    return Answer()

            return Session()

    clouds = Clouds()
    fetch = prices.live_fetch(clouds, placements, now=NOW)
    g2 = (G2,)
    with Stubber(ec2) as stub:
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [_entry("g5.xlarge", "us-east-1a", "0.4")]},
                          {**_history_params(), "InstanceTypes": ["g5.xlarge"]})
        stub.add_client_error("get_spot_placement_scores", service_error_code="UnauthorizedOperation")
        quotes = [fetch(Offer(0, "aws", "us-east-1", ("g5.xlarge",))),
                  fetch(Offer(1, "gcp", "us-central1", ("g2-standard-8",), machines=g2))]
        # Europe's pages have a core price only: read in the same pass, no price.
        with pytest.raises(prices.PriceError, match=r"placement 2 \(gcp europe-west1\)"):
            fetch(Offer(2, "gcp", "europe-west1", ("g2-standard-8",), machines=g2))
    assert clouds.sessions == [1]  # one catalog read (two pages) for both GCP regions
    assert [(q.source, q.price) for q in quotes] == [("aws", 0.4), ("gcp", 0.333136)]


def test_a_refresh_stops_asking_when_the_ticks_time_for_prices_is_spent():
    clock = [0.0]
    out_of_time = prices.time_budget(10, clock=lambda: clock[0])
    asked = []

    def fetch(offer):
        asked.append(offer.index)
        clock[0] += 6  # each answer takes 6 s
        return Quote(price=0.1, source=offer.cloud, as_of=NOW)

    offers = [AWS, GCP, Offer(2, "aws", "us-west-2", TYPES)]
    quotes, changed = prices.refresh({}, offers, now=NOW, fetch=fetch, out_of_time=out_of_time)
    assert asked == [0, 1] and changed and offers[2].key not in quotes  # the third waits for a later tick
    # The catalog stops between pages, too.
    clock[0] = 0.0
    pages = prices.gcp_catalog_pages(lambda url, params: (clock.__setitem__(0, clock[0] + 6), PAGES[0])[1],
                                     out_of_time=prices.time_budget(10, clock=lambda: clock[0]))
    with pytest.raises(prices.PriceError, match="ran out after 2 pages"):
        list(pages)


def test_ec2s_price_calls_never_hold_a_tick_for_long(monkeypatch):
    from controller.clouds import AwsGroups, Clouds
    from controller.config import Placement

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    client = Clouds(aws=AwsGroups()).ec2(Placement(1, "aws", "us-west-2", "g1"))
    config = client.meta.config
    assert (client.meta.region_name, config.retries["total_max_attempts"], config.connect_timeout, config.read_timeout) == (
        "us-west-2", 2, 5, 10)
