"""`ops preflight`'s AWS checks, each line compared whole, over an EC2 client answered from tables.

`tests/ops/test_preflight.py` and `test_preflight_network.py` ask moto; here `TableEc2` answers
EC2's reads from lists the test gives (every page of a paginated read holds one item, as a
long answer would come), and records what each call asked, so each problem's line and fix,
each boundary (a quota one vCPU short and exactly met, one node and two, a route's state) and
the arguments of every read are pinned, in milliseconds and without moto.
"""

from __future__ import annotations

from types import SimpleNamespace

import botocore.exceptions
import pytest

from components.aws.naming import DLAMI_NAME, default_bucket_name
from ops.mockrun import project_name
from ops.preflight import aws

REGION = "eu-west-1"
A, B, C = (f"{REGION}{z}" for z in "abc")


def settings(*, region: str = REGION, bucket: str | None = None, adopt: bool = False, **compute) -> SimpleNamespace:
    """What the AWS checks read of the settings (the loader's own checks are not what is tested here)."""
    c = {"instance_types": ("g5.xlarge",), "spot": True, "nodes": 1, "subnets": (), "zones": (), "image_id": None,
         **compute}
    return SimpleNamespace(region=region, stack="unit", compute=SimpleNamespace(**c),
                           storage=SimpleNamespace(bucket_name=bucket, adopt=adopt),
                           placement=SimpleNamespace(reserve_concurrency=False), placement_list=[None],
                           image=SimpleNamespace(build=False))


def client_error(code: str, message: str, op: str = "Op") -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError({"Error": {"Code": code, "Message": message}}, op)


def subnet(sid: str, zone: str, vpc: str = "vpc-1", public: bool | None = True) -> dict:
    s = {"SubnetId": sid, "AvailabilityZone": zone, "VpcId": vpc}
    if public is not None:
        s["MapPublicIpOnLaunch"] = public
    return s


def table(rtb: str, vpc: str = "vpc-1", *, subnets: tuple[str, ...] = (), main: bool = False,
          routes: tuple[dict, ...] = ()) -> dict:
    assoc = [{"SubnetId": s} for s in subnets] + ([{"Main": True}] if main else [])
    return {"RouteTableId": rtb, "VpcId": vpc, "Associations": assoc, "Routes": list(routes)}


LOCAL = {"DestinationCidrBlock": "172.31.0.0/16", "GatewayId": "local", "State": "active"}
IGW = {"DestinationCidrBlock": "0.0.0.0/0", "GatewayId": "igw-1", "State": "active"}
NAT = {"DestinationCidrBlock": "0.0.0.0/0", "NatGatewayId": "nat-1", "State": "active"}


class TableEc2:
    """EC2's reads answered from the test's tables; `calls` holds (operation, arguments) of each read."""

    def __init__(self, *, vcpus: dict[str, int] | None = None, vpcs: tuple[str, ...] = ("vpc-1",),
                 subnets: list[dict] | None = None, offerings: list[tuple[str, str]] | None = None,
                 tables: list[dict] | None = None, images: dict[str, str] | None = None,
                 images_error: Exception | None = None) -> None:
        self.vcpus = vcpus or {}
        self.vpcs = list(vpcs)
        self.subnets = subnets if subnets is not None else [subnet("subnet-a", A), subnet("subnet-b", B)]
        self.offerings = offerings if offerings is not None else [
            (t, s["AvailabilityZone"]) for t in ("g5.xlarge", "g4dn.xlarge") for s in self.subnets]
        self.tables = tables if tables is not None else [table("rtb-main", main=True, routes=(LOCAL, IGW))]
        self.images, self.images_error = images or {}, images_error
        self.calls: list[tuple[str, dict]] = []

    def describe_instance_types(self, **kw) -> dict:
        self.calls.append(("describe_instance_types", kw))
        return {"InstanceTypes": [{"InstanceType": t, "VCpuInfo": {"DefaultVCpus": self.vcpus[t]}}
                                  for t in kw["InstanceTypes"] if t in self.vcpus]}

    def describe_vpcs(self, **kw) -> dict:
        self.calls.append(("describe_vpcs", kw))
        return {"Vpcs": [{"VpcId": v, "IsDefault": True} for v in self.vpcs]}

    def describe_route_tables(self, **kw) -> dict:
        self.calls.append(("describe_route_tables", kw))
        f = {x["Name"]: x["Values"] for x in kw["Filters"]}
        return {"RouteTables": [t for t in self.tables if t["VpcId"] in f["vpc-id"]
                                and any(a.get("Main") for a in t["Associations"])]}

    def describe_images(self, **kw) -> dict:
        self.calls.append(("describe_images", kw))
        if self.images_error:
            raise self.images_error
        return {"Images": [{"ImageId": i, "State": state} for i, state in self.images.items()]}

    def _pages(self, op: str, kw: dict) -> list[dict]:
        f = {x["Name"]: x["Values"] for x in kw.get("Filters", [])}
        if op == "describe_subnets":
            found = [s for s in self.subnets if ("SubnetIds" not in kw or s["SubnetId"] in kw["SubnetIds"])
                     and ("vpc-id" not in f or s["VpcId"] in f["vpc-id"])]
            return [{"Subnets": [s]} for s in found]
        if op == "describe_instance_type_offerings":
            return [{"InstanceTypeOfferings": [{"InstanceType": t, "Location": z}]} for t, z in self.offerings
                    if t in f["instance-type"] and z in f["location"]]
        assert op == "describe_route_tables"
        return [{"RouteTables": [t]} for t in self.tables
                if any(a.get("SubnetId") in f["association.subnet-id"] for a in t["Associations"])]

    def get_paginator(self, op: str):
        ec2 = self

        class Pages:
            def paginate(self, **kw):
                ec2.calls.append((op, kw))
                return ec2._pages(op, kw)

        return Pages()

    def asked(self, op: str) -> list[dict]:
        return [kw for name, kw in self.calls if name == op]


class Quotas:
    """Service Quotas: `applied` and `defaults` by code; a value that is an exception is raised."""

    def __init__(self, applied: dict | None = None, defaults: dict | None = None) -> None:
        self.applied, self.defaults = applied or {}, defaults or {}
        self.calls: list[tuple[str, str, str]] = []

    def _answer(self, op: str, values: dict, ServiceCode: str, QuotaCode: str) -> dict:  # noqa: N803
        self.calls.append((op, ServiceCode, QuotaCode))
        value = values.get(QuotaCode, client_error("NoSuchResourceException", "no such quota", op))
        if isinstance(value, Exception):
            raise value
        return {"Quota": {"QuotaCode": QuotaCode, "Value": value}}

    def get_service_quota(self, **kw) -> dict:
        return self._answer("applied", self.applied, **kw)

    def get_aws_default_service_quota(self, **kw) -> dict:
        return self._answer("default", self.defaults, **kw)


VCPUS = {"g5.xlarge": 4, "g5.2xlarge": 8, "g4dn.xlarge": 4, "vt1.3xlarge": 12, "p4d.24xlarge": 96,
         "p5.48xlarge": 192, "inf2.xlarge": 4}
SPOT_G = "All G and VT Spot Instance Requests"


def quota_lines(quotas: Quotas, **compute) -> list[str]:
    ec2 = TableEc2(vcpus=VCPUS)
    return [p.line() for p in aws.aws_quota_problems(settings(**compute), ec2, quotas)]


def short(kind: str, code: str, value: str, need: int, biggest: str, vcpus: int, nodes: int) -> str:
    return (f"EC2 quota '{kind}' ({code}) in {REGION} is {value} vCPUs; the stack needs {need} ({biggest}: {vcpus} "
            f"vCPUs x {nodes} node(s)), so no machine would start; fix: aws service-quotas "
            f"request-service-quota-increase --service-code ec2 --quota-code {code} --desired-value {need} "
            f"--region {REGION} (new accounts start at 0; allow days)")


def test_a_quota_one_vcpu_short_is_its_whole_line_and_one_met_exactly_is_none():
    quotas = Quotas({"L-3819A6DF": 7})
    assert quota_lines(quotas, instance_types=("g5.xlarge",), nodes=2) == [
        short(SPOT_G, "L-3819A6DF", "7", 8, "g5.xlarge", 4, 2)]
    assert quotas.calls == [("applied", "ec2", "L-3819A6DF")]
    assert quota_lines(Quotas({"L-3819A6DF": 8}), instance_types=("g5.xlarge",), nodes=2) == []
    # A fractional value prints as it is; the on-demand quota has its own name and code.
    assert quota_lines(Quotas({"L-DB2E81BA": 3.5}), spot=False) == [
        short("Running On-Demand G and VT instances", "L-DB2E81BA", "3.5", 4, "g5.xlarge", 4, 1)]


def test_the_largest_type_of_a_quota_counts_and_each_family_s_quota_is_its_own_line():
    ec2 = TableEc2(vcpus=VCPUS)
    types = ("g5.xlarge", "p4d.24xlarge", "vt1.3xlarge", "g5.2xlarge", "inf2.xlarge")
    quotas = Quotas({"L-3819A6DF": 0, "L-7212CCBC": 0})
    lines = [p.line() for p in aws.aws_quota_problems(settings(instance_types=types, nodes=3), ec2, quotas)]
    # G and VT share one quota: the largest of the four, vt1.3xlarge; inf2 has no GPU quota here.
    assert lines == [short(SPOT_G, "L-3819A6DF", "0", 36, "vt1.3xlarge", 12, 3),
                     short("All P Spot Instance Requests", "L-7212CCBC", "0", 288, "p4d.24xlarge", 96, 3)]
    assert ec2.asked("describe_instance_types") == [{"InstanceTypes": list(types)}]
    assert quotas.calls == [("applied", "ec2", "L-3819A6DF"), ("applied", "ec2", "L-7212CCBC")]


def test_the_largest_type_is_the_one_with_most_vcpus_not_the_first_or_last():
    ec2 = TableEc2(vcpus={"g5.xlarge": 4, "g5.2xlarge": 8, "g4dn.xlarge": 2})
    (p,) = aws.aws_quota_problems(settings(instance_types=("g5.xlarge", "g5.2xlarge", "g4dn.xlarge")), ec2,
                                  Quotas({"L-3819A6DF": 7}))
    assert "the stack needs 8 (g5.2xlarge: 8 vCPUs x 1 node(s))" in p.what


def test_types_ec2_does_not_know_are_left_to_the_offering_check():
    quotas = Quotas({"L-3819A6DF": 0})
    # Only g5.48xlarge is unknown to EC2: no quota is read for it.
    assert quota_lines(quotas, instance_types=("g5.48xlarge",)) == []
    assert quotas.calls == []
    # A known type beside it is still checked, against its own vCPUs.
    assert quota_lines(quotas, instance_types=("g5.48xlarge", "g5.xlarge")) == [
        short(SPOT_G, "L-3819A6DF", "0", 4, "g5.xlarge", 4, 1)]


def test_an_account_that_never_set_a_quota_is_checked_against_its_default():
    quotas = Quotas(defaults={"L-3819A6DF": 2})
    assert quota_lines(quotas) == [short(SPOT_G, "L-3819A6DF", "2", 4, "g5.xlarge", 4, 1)]
    assert quotas.calls == [("applied", "ec2", "L-3819A6DF"), ("default", "ec2", "L-3819A6DF")]
    assert quota_lines(Quotas(defaults={"L-3819A6DF": 4})) == []


READ_FIX = "allow servicequotas:GetServiceQuota to these credentials, or check the quota in the Service Quotas console"


@pytest.mark.parametrize(("error", "said"), [
    (client_error("AccessDeniedException", "not authorized"), "AccessDeniedException: not authorized"),
    (RuntimeError("endpoint unreachable"), "RuntimeError: endpoint unreachable"),
])
def test_a_quota_that_cannot_be_read_is_named_with_the_error_and_no_default_is_asked(error, said):
    quotas = Quotas({"L-3819A6DF": error}, defaults={"L-3819A6DF": 64})
    assert quota_lines(quotas) == [
        f"could not read the EC2 quota '{SPOT_G}' (L-3819A6DF) in {REGION}: {said}; fix: {READ_FIX}"]
    assert quotas.calls == [("applied", "ec2", "L-3819A6DF")]  # only a missing applied value falls back


def test_a_quota_without_an_applied_value_or_a_default_cannot_be_read():
    assert quota_lines(Quotas(), spot=False) == [
        "could not read the EC2 quota 'Running On-Demand G and VT instances' (L-DB2E81BA) in eu-west-1: "
        f"NoSuchResourceException: no such quota; fix: {READ_FIX}"]


def test_an_aws_error_is_its_code_and_message_and_any_other_its_type():
    assert aws._aws_error(client_error("Throttling", "slow down")) == "Throttling: slow down"
    assert aws._aws_error(botocore.exceptions.ClientError({}, "Op")) == "None: None"
    assert aws._aws_error(ValueError("bad")) == "ValueError: bad"


def test_the_group_s_subnets_are_its_own_or_the_default_vpc_s_sorted():
    ec2 = TableEc2(vpcs=("vpc-9",), subnets=[subnet("subnet-c", C, "vpc-9"), subnet("subnet-a", A, "vpc-9"),
                                             subnet("subnet-x", B, "vpc-2")])
    assert aws.aws_subnets(settings(), ec2) == [("subnet-a", A), ("subnet-c", C)]
    assert ec2.calls == [("describe_vpcs", {"Filters": [{"Name": "is-default", "Values": ["true"]}]}),
                         ("describe_subnets", {"Filters": [{"Name": "vpc-id", "Values": ["vpc-9"]}]})]
    ec2.calls.clear()
    assert aws.aws_subnets(settings(subnets=("subnet-x", "subnet-c")), ec2) == [("subnet-c", C), ("subnet-x", B)]
    assert ec2.calls == [("describe_subnets", {"SubnetIds": ["subnet-x", "subnet-c"]})]
    assert aws.aws_subnets(settings(), TableEc2(vpcs=())) == []


OFFER_FIX = ("choose types the region offers (aws ec2 describe-instance-type-offerings --location-type "
             f"availability-zone --region {REGION}) or other compute.zones")


def offering_lines(ec2: TableEc2, **compute) -> list[str]:
    return [p.line() for p in aws.aws_offering_problems(settings(**compute), ec2)]


def test_the_offerings_are_asked_for_the_group_s_types_in_its_zones():
    ec2 = TableEc2(subnets=[subnet("subnet-c", C), subnet("subnet-a", A)])
    assert aws.aws_zones(settings(instance_types=("g5.xlarge", "g4dn.xlarge")), ec2) == [A, C]
    assert ec2.asked("describe_instance_type_offerings") == [{"LocationType": "availability-zone", "Filters": [
        {"Name": "instance-type", "Values": ["g5.xlarge", "g4dn.xlarge"]}, {"Name": "location", "Values": [A, C]}]}]


def test_compute_zones_narrow_the_group_s_zones_in_their_own_order():
    ec2 = TableEc2(subnets=[subnet("subnet-a", A), subnet("subnet-b", B), subnet("subnet-c", C)])
    assert aws.aws_zones(settings(zones=(C, "eu-west-1d", A)), ec2) == [C, A]
    # Two machines or more share one zone: the program's choice, the first of compute.zones offering the types.
    assert aws.aws_zones(settings(zones=(C, A), nodes=2), ec2) == [C]
    assert aws.aws_zones(settings(nodes=2), ec2) == [A]


def test_a_type_missing_in_some_zones_is_named_and_one_offered_in_one_zone_is_enough():
    ec2 = TableEc2(subnets=[subnet("subnet-a", A), subnet("subnet-b", B)],
                   offerings=[("g5.xlarge", A), ("g5.xlarge", B), ("g4dn.xlarge", B), ("g6.xlarge", C),
                              ("p5.48xlarge", A)])
    assert offering_lines(ec2, instance_types=("g6.xlarge", "g5.xlarge", "g4dn.xlarge", "g6e.xlarge")) == [
        f"g6.xlarge is not offered in zones {A}, {B} of {REGION}; fix: remove g6.xlarge from compute.instanceTypes "
        "or choose compute.zones that offer it",
        f"g6e.xlarge is not offered in zones {A}, {B} of {REGION}; fix: remove g6e.xlarge from "
        "compute.instanceTypes or choose compute.zones that offer it"]
    assert offering_lines(ec2, instance_types=("g4dn.xlarge",)) == []


def test_no_type_offered_in_the_group_s_zones_is_one_line():
    ec2 = TableEc2(subnets=[subnet("subnet-a", A), subnet("subnet-b", B)], offerings=[("g6.xlarge", C)])
    assert offering_lines(ec2, instance_types=("g6.xlarge", "g6e.xlarge")) == [
        f"none of compute.instanceTypes (g6.xlarge, g6e.xlarge) is offered in zones {A}, {B} of {REGION}; "
        f"fix: {OFFER_FIX}"]


def test_several_machines_are_checked_in_the_one_zone_they_share():
    ec2 = TableEc2(subnets=[subnet("subnet-a", A), subnet("subnet-b", B)],
                   offerings=[("g5.xlarge", A), ("g5.xlarge", B), ("g4dn.xlarge", B)])
    # A offers g5 only (the preferred type): the program picks B, where both are offered.
    assert offering_lines(ec2, instance_types=("g5.xlarge", "g4dn.xlarge"), nodes=2) == []
    ec2 = TableEc2(subnets=[subnet("subnet-a", A), subnet("subnet-b", B)],
                   offerings=[("g5.xlarge", A), ("g4dn.xlarge", B)])
    assert offering_lines(ec2, instance_types=("g5.xlarge", "g4dn.xlarge"), nodes=2) == [
        f"g4dn.xlarge is not offered in zone {A} (several machines share one zone) of {REGION}; fix: remove "
        "g4dn.xlarge from compute.instanceTypes or choose compute.zones that offer it"]
    # One machine may launch in either zone: both types are offered somewhere there.
    assert offering_lines(ec2, instance_types=("g5.xlarge", "g4dn.xlarge"), nodes=1) == []


@pytest.mark.parametrize(("compute", "vpcs", "line"), [
    ({"subnets": ("subnet-gone",)}, ("vpc-1",),
     f"no subnet for the group in {REGION} (compute.subnets found none); "
     "fix: set compute.subnets to subnets of a VPC in this region"),
    ({}, (), f"no subnet for the group in {REGION} (the region has no default VPC); "
     "fix: set compute.subnets to subnets of a VPC in this region"),
    ({"zones": ("eu-west-1d", "eu-west-1e")}, ("vpc-1",),
     f"compute.zones ['eu-west-1d', 'eu-west-1e']: no subnet of the group is in them (the subnets are in {A}, {B}); "
     "fix: choose compute.zones your subnets cover, or other subnets"),
])
def test_a_group_with_no_subnet_to_launch_in_is_one_line_and_the_network_check_leaves_it_there(compute, vpcs, line):
    ec2 = TableEc2(vpcs=vpcs)
    assert offering_lines(ec2, **compute) == [line]
    assert aws.aws_network_problems(settings(**compute), ec2) == []


def test_the_default_route_is_the_first_active_ipv4_one():
    other = {"DestinationCidrBlock": "10.0.0.0/8", "GatewayId": "igw-0", "State": "active"}
    gone = {**IGW, "GatewayId": "igw-gone", "State": "blackhole"}
    no_state = {"DestinationCidrBlock": "0.0.0.0/0", "GatewayId": "igw-2"}
    assert aws._default_route({"Routes": [other, gone, no_state, IGW]}) is no_state
    assert aws._default_route({"Routes": [other, gone]}) is None
    assert aws._default_route({}) is None


CLOSED_FIX = ("add a 0.0.0.0/0 route to a NAT gateway (or, for subnets that give public IPs, an internet gateway) "
              "to {rtb}, or set compute.subnets to subnets that have one")


def closed(where: str, names: str, rtb: str) -> str:
    return (f"{where} {names} of the group have no route to the internet (route table {rtb} has no active 0.0.0.0/0 "
            "route): every machine would wait out its bounds reaching the bucket and the image, and the group would "
            f"launch the next one until the runtime cap; fix: {CLOSED_FIX.format(rtb=rtb)}")


def private(sid: str, zone: str, igw: str) -> str:
    return (f"subnet {sid} ({zone}) routes to internet gateway {igw} but gives its machines no public IP "
            "(MapPublicIpOnLaunch is off), so they cannot reach the internet through it; fix: aws ec2 "
            f"modify-subnet-attribute --subnet-id {sid} --map-public-ip-on-launch, or use subnets behind a NAT gateway")


def network_lines(ec2: TableEc2, **compute) -> list[str]:
    return [p.line() for p in aws.aws_network_problems(settings(**compute), ec2)]


def test_each_subnet_s_own_table_decides_for_it_and_the_rest_use_their_vpc_s_main_table():
    subnets = [subnet("subnet-c", C, "vpc-2"), subnet("subnet-a", A), subnet("subnet-b", B, public=False),
               subnet("subnet-d", A, "vpc-3")]
    tables = [table("rtb-main1", main=True, routes=(LOCAL,)),
              table("rtb-nat", subnets=("subnet-b",), routes=(LOCAL, NAT)),
              table("rtb-main2", "vpc-2", main=True, routes=(LOCAL, IGW)),
              table("rtb-main3", "vpc-3", main=True, routes=(LOCAL,)),
              table("rtb-other", "vpc-3", subnets=("subnet-elsewhere",), routes=(IGW,))]
    ec2 = TableEc2(subnets=subnets, tables=tables)
    ids = ["subnet-a", "subnet-b", "subnet-c", "subnet-d"]
    assert network_lines(ec2, subnets=tuple(ids)) == [
        closed("compute.subnets", f"subnet-a ({A})", "rtb-main1"), closed("compute.subnets", f"subnet-d ({A})",
                                                                         "rtb-main3")]
    assert ec2.asked("describe_route_tables") == [
        {"Filters": [{"Name": "association.subnet-id", "Values": ids}]},
        *({"Filters": [{"Name": "vpc-id", "Values": [v]}, {"Name": "association.main", "Values": ["true"]}]}
          for v in ("vpc-1", "vpc-2", "vpc-3"))]  # only the VPCs of subnets without a table of their own
    assert ec2.asked("describe_subnets")[-1] == {"SubnetIds": ids}


def test_subnets_that_share_a_closed_table_are_one_line_in_order_and_a_vpc_without_a_main_table_is_none():
    subnets = [subnet("subnet-b", B), subnet("subnet-a", A), subnet("subnet-c", C, "vpc-2")]
    ec2 = TableEc2(subnets=subnets, tables=[table("rtb-main1", main=True, routes=(LOCAL,))])
    assert network_lines(ec2) == [
        closed("the default VPC's subnet(s)", f"subnet-a ({A}), subnet-b ({B})", "rtb-main1")]
    # subnet-c's VPC has no main table: its subnets have no way out, in "route table none".
    assert network_lines(ec2, subnets=("subnet-a", "subnet-b", "subnet-c")) == [
        closed("compute.subnets", f"subnet-a ({A}), subnet-b ({B})", "rtb-main1"),
        closed("compute.subnets", f"subnet-c ({C})", "none")]


def test_a_blackhole_default_route_is_no_way_out_and_an_active_one_after_it_is():
    gone = {**IGW, "State": "blackhole"}
    ec2 = TableEc2(subnets=[subnet("subnet-a", A)], tables=[table("rtb-1", subnets=("subnet-a",), routes=(gone,))])
    assert network_lines(ec2) == [closed("the default VPC's subnet(s)", f"subnet-a ({A})", "rtb-1")]
    ec2.tables[0]["Routes"].append(NAT)
    assert network_lines(ec2) == []


@pytest.mark.parametrize("public", [False, None])
def test_an_internet_gateway_needs_subnets_that_give_public_ips(public):
    subnets = [subnet("subnet-b", B, public=public), subnet("subnet-a", A, public=public),
               subnet("subnet-c", C, public=True)]
    ec2 = TableEc2(subnets=subnets, tables=[table("rtb-main", main=True, routes=(LOCAL, IGW))])
    assert network_lines(ec2) == [private("subnet-a", A, "igw-1"), private("subnet-b", B, "igw-1")]


def test_a_nat_route_or_another_target_needs_no_public_ip():
    tgw = {"DestinationCidrBlock": "0.0.0.0/0", "TransitGatewayId": "tgw-1", "State": "active"}
    vgw = {"DestinationCidrBlock": "0.0.0.0/0", "GatewayId": "vgw-1", "State": "active"}
    for route in (NAT, tgw, vgw):
        ec2 = TableEc2(subnets=[subnet("subnet-a", A, public=False)],
                       tables=[table("rtb-main", main=True, routes=(route,))])
        assert network_lines(ec2) == [], route


def test_several_machines_check_only_the_subnets_of_their_zone():
    subnets = [subnet("subnet-a", A, public=False), subnet("subnet-b", B, public=False),
               subnet("subnet-b2", B, public=False)]
    ec2 = TableEc2(subnets=subnets, offerings=[("g5.xlarge", B)])
    assert network_lines(ec2, nodes=2) == [private("subnet-b", B, "igw-1"), private("subnet-b2", B, "igw-1")]


IMAGE_FIX = "AMIs are regional: copy it here (aws ec2 copy-image) or use this region's id"


def test_the_image_id_must_be_an_available_ami_of_the_region():
    ec2 = TableEc2(images={"ami-1": "available"})
    assert aws.aws_image_problems(settings(image_id="ami-1"), ec2) == []
    assert ec2.calls == [("describe_images", {"ImageIds": ["ami-1"]})]
    pending = TableEc2(images={"ami-1": "pending"})
    assert [p.line() for p in aws.aws_image_problems(settings(image_id="ami-1"), pending)] == [
        f"compute.imageId ami-1 is not an available AMI in {REGION} (not found); fix: {IMAGE_FIX}"]
    unknown = TableEc2(images_error=client_error("InvalidAMIID.NotFound", "The image id '[ami-2]' does not exist"))
    assert [p.line() for p in aws.aws_image_problems(settings(image_id="ami-2"), unknown)] == [
        f"compute.imageId ami-2 is not an available AMI in {REGION} (InvalidAMIID.NotFound: The image id '[ami-2]' "
        f"does not exist); fix: {IMAGE_FIX}"]


def test_without_an_image_id_the_deep_learning_ami_is_looked_up_by_the_group_s_own_filter():
    ec2 = TableEc2()
    assert [p.line() for p in aws.aws_image_problems(settings(), ec2)] == [
        f"no AMI named '{DLAMI_NAME}' from Amazon in {REGION}; fix: set compute.imageId to a GPU AMI of this region"]
    assert ec2.calls == [("describe_images", {"Owners": ["amazon"], "Filters": [
        {"Name": "name", "Values": [DLAMI_NAME]}, {"Name": "architecture", "Values": ["x86_64"]},
        {"Name": "state", "Values": ["available"]}]})]
    assert aws.aws_image_problems(settings(), TableEc2(images={"ami-dl": "available"})) == []


class Sts:
    def __init__(self) -> None:
        self.asked = 0

    def get_caller_identity(self) -> dict:
        self.asked += 1
        return {"Account": "123456789012"}


class S3:
    """head_bucket answers `error` (a ClientError) or, without one, the bucket is yours."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.asked = error, []

    def head_bucket(self, Bucket: str) -> None:  # noqa: N803 - boto3's name
        self.asked.append(Bucket)
        if self.error:
            raise self.error


def test_the_bucket_is_storage_bucket_name_else_the_stack_s_generated_name():
    sts = Sts()
    assert aws.aws_bucket_name(settings(bucket="my-bucket"), sts) == "my-bucket"
    assert sts.asked == 0
    assert aws.aws_bucket_name(settings(region="us-east-2"), sts) == default_bucket_name(
        project=project_name(), stack="unit", account_id="123456789012", region="us-east-2")
    assert sts.asked == 1


@pytest.mark.parametrize(("code", "adopt", "line"), [
    (None, False, "bucket b-1 already exists in your account (kept by an earlier `pulumi destroy`?); creating it "
                  "again fails; fix: set storage.adopt: true to take it over with its data"),
    (None, True, None),
    ("404", False, None),
    ("NoSuchBucket", False, None),
    ("404", True, "storage.adopt is true but bucket b-1 does not exist; fix: set storage.adopt: false"),
    ("NoSuchBucket", True, "storage.adopt is true but bucket b-1 does not exist; fix: set storage.adopt: false"),
    ("403", False, "bucket b-1 belongs to another account (bucket names are global); "
                   "fix: set storage.bucketName to a name of your own"),
    ("AccessDenied", True, "bucket b-1 belongs to another account (bucket names are global); "
                           "fix: set storage.bucketName to a name of your own"),
    ("500", True, "could not check bucket b-1: 500: Internal Error; fix: check the credentials and retry"),
])
def test_the_bucket_is_free_yours_to_adopt_or_taken(code, adopt, line):
    s3 = S3(client_error(code, "Internal Error" if code == "500" else "x", "HeadBucket") if code else None)
    problems = aws.aws_bucket_problems(settings(bucket="b-1", adopt=adopt), s3, None)
    assert [p.line() for p in problems] == ([line] if line else [])
    assert s3.asked == ["b-1"]


class Session:
    """A boto3 session handing out the test's clients; `asked` holds (service, region) of each client."""

    def __init__(self, **clients) -> None:
        self.clients, self.asked = clients, []

    def client(self, name: str, region_name: str | None = None):
        self.asked.append((name, region_name))
        return self.clients[name.replace("-", "_")]


def test_every_check_runs_in_the_settings_region_and_home_alone_checks_the_bucket():
    class BrokenEc2(TableEc2):
        def describe_vpcs(self, **kw):
            raise client_error("UnauthorizedOperation", "You are not authorized to perform this operation.")

    ec2 = BrokenEc2(vcpus=VCPUS)
    session = Session(ec2=ec2, service_quotas=Quotas({"L-3819A6DF": 0}), s3=S3(client_error("403", "Forbidden")),
                      sts=Sts())
    lines = [p.line() for p in aws.check_aws(settings(region="us-east-2"), session)]
    unauthorized = ("UnauthorizedOperation: You are not authorized to perform this operation.; fix: check the "
                    "credentials (and their region/project) and run preflight again")
    assert lines == [
        # The zones and subnets cannot be read: the offering check fails as a whole, the network check too.
        f"could not check instance types: {unauthorized}", f"could not check network: {unauthorized}",
        short(SPOT_G, "L-3819A6DF", "0", 4, "g5.xlarge", 4, 1).replace(REGION, "us-east-2"),
        f"no AMI named '{DLAMI_NAME}' from Amazon in us-east-2; fix: set compute.imageId to a GPU AMI of this region",
        f"bucket {aws.aws_bucket_name(settings(region='us-east-2'), Sts())} belongs to another account (bucket names "
        "are global); fix: set storage.bucketName to a name of your own"]
    assert session.asked == [("ec2", "us-east-2"), ("service-quotas", "us-east-2"), ("s3", "us-east-2"),
                             ("sts", "us-east-2")]
    session.asked.clear()
    placement = [p.what for p in aws.check_aws(settings(region="us-east-2"), session, home=False)]
    assert len(placement) == 4 and not any("bucket" in w for w in placement)
    assert ("s3", "us-east-2") not in session.asked


def test_without_a_session_the_environment_s_credentials_are_used_in_the_settings_region(monkeypatch):
    import boto3

    made = []

    def session(**kw):
        made.append(kw)
        return Session(ec2=TableEc2(vcpus=VCPUS, images={"ami-dl": "available"}),
                       service_quotas=Quotas({"L-3819A6DF": 4}), s3=S3(), sts=Sts())

    monkeypatch.setattr(boto3.session, "Session", session)
    assert aws.check_aws(settings(region="us-east-2", bucket="b-1", adopt=True)) == []
    assert made == [{"region_name": "us-east-2"}]



def test_a_quota_left_out_unknown_or_unreadable_does_not_stop_the_next_one():
    ec2 = TableEc2(vcpus=VCPUS)
    # inf2 has no GPU quota here, g5.48xlarge is unknown to EC2: each is passed over, not the end of the check.
    assert [p.line() for p in aws.aws_quota_problems(settings(instance_types=("inf2.xlarge", "g5.48xlarge",
                                                                              "p4d.24xlarge")),
                                                     ec2, Quotas({"L-7212CCBC": 95}))] == [
        short("All P Spot Instance Requests", "L-7212CCBC", "95", 96, "p4d.24xlarge", 96, 1)]
    quotas = Quotas({"L-3819A6DF": client_error("AccessDeniedException", "no"), "L-7212CCBC": 0})
    assert quota_lines(quotas, instance_types=("g5.xlarge", "p4d.24xlarge")) == [
        f"could not read the EC2 quota '{SPOT_G}' (L-3819A6DF) in {REGION}: AccessDeniedException: no; fix: {READ_FIX}",
        short("All P Spot Instance Requests", "L-7212CCBC", "0", 96, "p4d.24xlarge", 96, 1)]


def test_an_s3_error_without_a_code_is_reported_not_raised():
    (p,) = aws.aws_bucket_problems(settings(bucket="b-1"), S3(botocore.exceptions.ClientError({}, "HeadBucket")), None)
    assert p.line() == "could not check bucket b-1: None: None; fix: check the credentials and retry"


def test_each_check_that_cannot_run_is_named():
    class Broken:
        def __getattr__(self, name):
            def fail(*args, **kw):
                raise client_error("AccessDenied", f"{name} denied")
            return fail

    broken = Broken()
    session = Session(ec2=broken, service_quotas=broken, s3=broken, sts=broken)
    fix = "check the credentials (and their region/project) and run preflight again"
    assert [p.line() for p in aws.check_aws(settings(), session)] == [
        f"could not check {name}: AccessDenied: {op} denied; fix: {fix}"
        for name, op in (("instance types", "describe_vpcs"), ("network", "describe_vpcs"),
                         ("quotas", "describe_instance_types"), ("image", "describe_images"),
                         ("bucket", "get_caller_identity"))]
