"""`ops preflight` on AWS: a default route whose target is gone (a blackhole) is no way out.

When a NAT gateway or an internet gateway a route points at is deleted, AWS keeps the route and
reports it with `State: blackhole`; machines behind it reach nothing. moto's EC2 keeps such a
route `active` (it models no blackhole state for VPC route tables), so the client here answers
as AWS does for the targets the test deleted: the same answer, with the state AWS gives.
"""

from __future__ import annotations

import boto3
import pytest

from ops import preflight
from tests.ops.test_preflight import AWS, REGION, aws, settings_of  # noqa: F401 - `aws`: the fixture used here

pytestmark = pytest.mark.usefixtures("aws")

Z = (f"{REGION}a", f"{REGION}b", f"{REGION}c")


class GoneTargets:
    """An EC2 client whose route tables show a route to a deleted target as AWS shows it: a blackhole."""

    def __init__(self, ec2, gone: set[str]) -> None:
        self._ec2, self.gone, self.marked = ec2, gone, 0

    def __getattr__(self, name: str):
        return getattr(self._ec2, name)

    def _mark(self, page: dict) -> dict:
        for table in page.get("RouteTables", []):
            for route in table.get("Routes", []):
                if route.get("NatGatewayId") in self.gone or route.get("GatewayId") in self.gone:
                    route["State"] = "blackhole"
                    self.marked += 1
        return page

    def describe_route_tables(self, **kw) -> dict:
        return self._mark(self._ec2.describe_route_tables(**kw))

    def get_paginator(self, op: str):
        pages = self._ec2.get_paginator(op)
        if op != "describe_route_tables":
            return pages
        outer = self

        class _Pages:
            def paginate(self, **kw):
                return (outer._mark(p) for p in pages.paginate(**kw))

        return _Pages()


def _default_vpc(ec2) -> tuple[str, dict[str, str], str, str]:
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    subnets = {s["AvailabilityZone"]: s["SubnetId"]
               for s in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]}
    (main,) = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                                {"Name": "association.main", "Values": ["true"]}])["RouteTables"]
    (igw,) = ec2.describe_internet_gateways()["InternetGateways"]
    return vpc, subnets, main["RouteTableId"], igw["InternetGatewayId"]


def test_a_main_table_whose_internet_gateway_is_gone_has_no_way_out() -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    _, subnets, main, igw = _default_vpc(ec2)
    client = GoneTargets(ec2, {igw})

    (p,) = preflight.aws_network_problems(settings_of(AWS), client)

    assert client.marked >= 1  # the blackhole route was read
    assert f"route table {main} has no active 0.0.0.0/0 route" in p.what
    assert all(f"{subnets[z]} ({z})" in p.what for z in Z)
    # The same VPC with its gateway in place passes: the state alone decides.
    assert preflight.aws_network_problems(settings_of(AWS), GoneTargets(ec2, set())) == []


def test_a_subnet_behind_a_deleted_nat_gateway_is_named_and_the_others_pass() -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc, subnets, _, _ = _default_vpc(ec2)
    rtb = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    ec2.associate_route_table(RouteTableId=rtb, SubnetId=subnets[Z[1]])
    eip = ec2.allocate_address(Domain="vpc")["AllocationId"]
    nat = ec2.create_nat_gateway(SubnetId=subnets[Z[0]], AllocationId=eip)["NatGateway"]["NatGatewayId"]
    ec2.create_route(RouteTableId=rtb, DestinationCidrBlock="0.0.0.0/0", NatGatewayId=nat)
    assert preflight.aws_network_problems(settings_of(AWS), GoneTargets(ec2, set())) == []
    ec2.delete_nat_gateway(NatGatewayId=nat)
    client = GoneTargets(ec2, {nat})

    (p,) = preflight.aws_network_problems(settings_of(AWS), client)

    assert client.marked == 1
    assert f"{subnets[Z[1]]} ({Z[1]})" in p.what and f"route table {rtb}" in p.what
    assert subnets[Z[0]] not in p.what and subnets[Z[2]] not in p.what
    assert f"to {rtb}" in p.fix and "NAT gateway" in p.fix
