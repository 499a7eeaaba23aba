"""`python -m ops preflight` on AWS: each of the group's subnets needs a way out to the internet.

Against moto's EC2, with the default VPC made as AWS makes it (`default_vpc_as_on_aws`: an internet
gateway, the main route table's 0.0.0.0/0 route to it, subnets that give public IPs).
"""

from __future__ import annotations

import boto3
import pytest

from ops import preflight
from tests.ops.test_preflight import (
    AWS,
    ENOUGH,
    REGION,
    FakeQuotas,
    Session,
    aws,  # noqa: F401 - the fixture every test here uses
    settings_of,
)

pytestmark = pytest.mark.usefixtures("aws")

Z = (f"{REGION}a", f"{REGION}b", f"{REGION}c")


def _ec2():
    return boto3.client("ec2", region_name=REGION)


def _default_vpc() -> tuple[str, dict[str, str], str, str]:
    """The default VPC's id, its subnets by zone, its main route table and internet gateway."""
    ec2 = _ec2()
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    subnets = {s["AvailabilityZone"]: s["SubnetId"]
               for s in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]}
    (main,) = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                                {"Name": "association.main", "Values": ["true"]}])["RouteTables"]
    (igw,) = ec2.describe_internet_gateways()["InternetGateways"]
    return vpc, subnets, main["RouteTableId"], igw["InternetGatewayId"]


def _own_table(vpc: str, subnet: str) -> str:
    """A route table of its own for `subnet`, with only the VPC's local route."""
    ec2 = _ec2()
    rtb = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    ec2.associate_route_table(RouteTableId=rtb, SubnetId=subnet)
    return rtb


def _nat(subnet: str) -> str:
    ec2 = _ec2()
    eip = ec2.allocate_address(Domain="vpc")["AllocationId"]
    return ec2.create_nat_gateway(SubnetId=subnet, AllocationId=eip)["NatGateway"]["NatGatewayId"]


def test_the_default_vpc_as_aws_makes_it_has_a_way_out() -> None:
    _, subnets, _, _ = _default_vpc()
    assert sorted(subnets) == list(Z)  # three subnets were read, one per zone
    assert preflight.aws_network_problems(settings_of(AWS), _ec2()) == []


def test_a_main_table_without_a_default_route_names_every_subnet_that_uses_it() -> None:
    _, subnets, main, _ = _default_vpc()
    _ec2().delete_route(RouteTableId=main, DestinationCidrBlock="0.0.0.0/0")
    (p,) = preflight.aws_network_problems(settings_of(AWS), _ec2())
    names = ", ".join(f"{subnets[z]} ({z})" for z in sorted(Z, key=lambda z: subnets[z]))
    assert p.what.startswith(f"the default VPC's subnet(s) {names} of the group have no route to the internet "
                             f"(route table {main} has no active 0.0.0.0/0 route)")
    assert f"to {main}" in p.fix and "NAT gateway" in p.fix and "\n" not in p.line()
    # The whole preflight reports it: the check is one of its checks.
    assert p in preflight.check(settings_of(AWS), aws_session=Session(FakeQuotas(ENOUGH)))


def test_a_subnet_s_own_table_decides_for_it_and_a_nat_route_is_a_way_out() -> None:
    vpc, subnets, _, _ = _default_vpc()
    rtb = _own_table(vpc, subnets[Z[1]])
    (p,) = preflight.aws_network_problems(settings_of(AWS), _ec2())
    assert f"{subnets[Z[1]]} ({Z[1]})" in p.what and f"route table {rtb}" in p.what
    assert subnets[Z[0]] not in p.what and subnets[Z[2]] not in p.what  # the main table's igw route serves those
    # Only the group's zones count: a subnet outside compute.zones is none of its business.
    assert preflight.aws_network_problems(settings_of(AWS, compute={"zones": [Z[0], Z[2]]}), _ec2()) == []
    _ec2().create_route(RouteTableId=rtb, DestinationCidrBlock="0.0.0.0/0", NatGatewayId=_nat(subnets[Z[0]]))
    assert preflight.aws_network_problems(settings_of(AWS), _ec2()) == []


def test_an_internet_gateway_needs_subnets_that_give_public_ips() -> None:
    _, subnets, _, igw = _default_vpc()
    _ec2().modify_subnet_attribute(SubnetId=subnets[Z[2]], MapPublicIpOnLaunch={"Value": False})
    (p,) = preflight.aws_network_problems(settings_of(AWS), _ec2())
    assert p.what.startswith(f"subnet {subnets[Z[2]]} ({Z[2]}) routes to internet gateway {igw} but gives its "
                             "machines no public IP")
    assert p.fix.startswith(f"aws ec2 modify-subnet-attribute --subnet-id {subnets[Z[2]]} --map-public-ip-on-launch")


def test_compute_subnets_of_a_private_vpc_are_named_as_the_stack_names_them() -> None:
    ec2 = _ec2()
    vpc = ec2.create_vpc(CidrBlock="10.8.0.0/16")["Vpc"]["VpcId"]
    a = ec2.create_subnet(VpcId=vpc, CidrBlock="10.8.1.0/24", AvailabilityZone=Z[0])["Subnet"]["SubnetId"]
    b = ec2.create_subnet(VpcId=vpc, CidrBlock="10.8.2.0/24", AvailabilityZone=Z[1])["Subnet"]["SubnetId"]
    s = settings_of(AWS, compute={"subnets": [a, b]})
    problems = preflight.aws_network_problems(s, ec2)
    assert [p.what.split(" of the group")[0] for p in problems] == [
        f"compute.subnets {', '.join(f'{i} ({z})' for i, z in sorted([(a, Z[0]), (b, Z[1])]))}"]
    # Several machines use one zone (the one `pulumi up` picks): only its subnet is checked.
    (one,) = preflight.aws_network_problems(settings_of(AWS, compute={"subnets": [a, b], "nodes": 2,
                                                                     "instanceTypes": ["g5.xlarge"]}), ec2)
    assert one.what.count("subnet-") == 1


@pytest.mark.parametrize("target", ["transit gateway", "network interface"])
def test_a_way_out_this_check_cannot_judge_passes(target: str) -> None:
    vpc, subnets, main, _ = _default_vpc()
    ec2 = _ec2()
    ec2.delete_route(RouteTableId=main, DestinationCidrBlock="0.0.0.0/0")
    if target == "transit gateway":
        tgw = ec2.create_transit_gateway()["TransitGateway"]["TransitGatewayId"]
        ec2.create_route(RouteTableId=main, DestinationCidrBlock="0.0.0.0/0", TransitGatewayId=tgw)
    else:
        eni = ec2.create_network_interface(SubnetId=subnets[Z[0]])["NetworkInterface"]["NetworkInterfaceId"]
        ec2.create_route(RouteTableId=main, DestinationCidrBlock="0.0.0.0/0", NetworkInterfaceId=eni)
    assert preflight.aws_network_problems(settings_of(AWS), ec2) == []


def test_each_placement_is_checked_in_its_own_region_and_only_home_for_the_bucket() -> None:
    # us-west-2's default VPC is moto's own (no gateway): the move there would wait, so preflight says so.
    s = settings_of({**AWS, "placements": [{"cloud": "aws", "region": REGION, "instanceTypes": ["g5.xlarge"]},
                                           {"cloud": "aws", "region": "us-west-2", "instanceTypes": ["g5.xlarge"]}]},
                    compute={"instanceTypes": ["g5.xlarge"]})
    quotas = FakeQuotas(ENOUGH)
    asked: list[str] = []

    class Regional(Session):
        def client(self, name: str, region_name: str | None = None):
            asked.append(f"{name} {region_name}")
            return super().client(name, region_name)

    problems = preflight.check(s, aws_session=Regional(quotas))
    (p,) = [p for p in problems if "route to the internet" in p.what]
    assert p.what.startswith("placements[1] (aws us-west-2): the default VPC's subnet(s) subnet-")
    assert quotas.asked == ["L-3819A6DF", "L-3819A6DF"]  # home's quota, then the placement's
    assert [a for a in asked if a.startswith("s3 ")] == [f"s3 {REGION}"]  # the bucket: home's only
    assert "ec2 us-west-2" in asked


def test_a_gcp_placement_of_an_aws_home_is_checked_in_its_project() -> None:
    from tests.ops.test_preflight import GCP_OK, FakeGcp

    s = settings_of({**AWS, "placements": [
        {"cloud": "aws", "region": REGION, "instanceTypes": ["g5.xlarge"]},
        {"cloud": "gcp", "region": "us-central1", "project": "my-gpus-42", "instanceTypes": ["g2-standard-4"]}]},
        compute={"instanceTypes": ["g5.xlarge"]})
    api = FakeGcp(**{**GCP_OK, "region": {}})  # no L4 quota in the placement's region
    problems = preflight.check(s, aws_session=Session(FakeQuotas(ENOUGH)), gcp_api=api)
    assert api.calls[:2] == ["services my-gpus-42", "region my-gpus-42 us-central1"]
    (p,) = [p for p in problems if p.what.startswith("placements[1]")]  # home's: its AMI, which moto lacks
    assert p.what.startswith("placements[1] (gcp us-central1): GPU quota NVIDIA_L4_GPUS in us-central1 is 0")


def _gcp_problems(**fake) -> list:
    from tests.ops.test_preflight import GCP, GCP_OK, FakeGcp

    api = FakeGcp(**GCP_OK)
    for name, value in fake.items():
        setattr(api, name, value)
    return [p for p in preflight.check(settings_of(GCP), gcp_api=api) if "network" in p.what]


def test_a_gcp_project_without_the_default_network_is_told_how_to_make_it() -> None:
    assert _gcp_problems() == []  # the default network as a new project has it
    (p,) = _gcp_problems(networks={})
    assert p.what.startswith("project my-project has no VPC network named 'default'")
    assert p.fix == "gcloud compute networks create default --subnet-mode=auto --project my-project"


def test_a_custom_mode_default_network_needs_a_subnet_in_the_region() -> None:
    elsewhere = {"default": {"autoCreateSubnetworks": False, "subnetworks": [
        "https://www.googleapis.com/compute/v1/projects/p/regions/europe-west4/subnetworks/eu"]}}
    (p,) = _gcp_problems(networks=elsewhere)
    assert p.what == "network default of project my-project has no subnet in us-central1, so no machine can start there"


def test_the_machines_need_a_route_out_that_applies_to_them() -> None:
    from components.gcp.naming import network_tag
    from ops.mockrun import project_name

    route = {"network": "https://www.googleapis.com/compute/v1/projects/my-project/global/networks/default",
             "destRange": "0.0.0.0/0", "nextHopGateway": ".../global/gateways/default-internet-gateway"}
    other_net = {**route, "network": ".../global/networks/vpc-2"}
    (p,) = _gcp_problems(route_list=[other_net, {**route, "destRange": "10.0.0.0/8"}])
    assert p.what.startswith("network default of project my-project has no 0.0.0.0/0 route for the machines")
    assert "--next-hop-gateway default-internet-gateway" in p.fix
    # A route for other machines' tags does not serve ours; one for our tag does.
    assert len(_gcp_problems(route_list=[{**route, "tags": ["bastion"]}])) == 1
    tag = network_tag(project=project_name(), stack="unit")
    assert _gcp_problems(route_list=[{**route, "tags": ["bastion", tag]}]) == []
