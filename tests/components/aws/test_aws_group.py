"""SpotGroup: hardened launch template, spot mixed-instances group, the cloud's runtime cap."""

import base64
import datetime as dt
import gzip

import pytest

from components.aws.group import cap_time
from components.aws.naming import DLAMI_NAME, choose_zone
from ops.fakes.common import fake_hex
from tests.components.aws.helpers import SSH_KEY, one, synth_raw

LT = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"
SG = "aws:ec2/securityGroup:SecurityGroup"
SCHEDULE = "aws:autoscaling/schedule:Schedule"
PLACEMENT = "aws:ec2/placementGroup:PlacementGroup"


def test_launch_template_requires_imdsv2_and_encrypts_gp3_root():
    r = synth_raw({"compute": {"rootDiskGb": 321}})
    lt = one(r, LT)["inputs"]
    assert lt["metadataOptions"] == {
        "httpEndpoint": "enabled", "httpTokens": "required",
        "httpPutResponseHopLimit": 1, "instanceMetadataTags": "enabled",
    }
    (disk,) = lt["blockDeviceMappings"]
    assert disk["deviceName"] == "/dev/sda1"  # the AMI's root device, from the lookup
    assert disk["ebs"] == {"volumeType": "gp3", "volumeSize": 321, "encrypted": "true", "deleteOnTermination": "true"}
    assert lt["iamInstanceProfile"]["arn"].startswith("arn:aws:iam::123456789012:instance-profile/trainstack-identity-profile")
    assert lt["instanceInitiatedShutdownBehavior"] == "terminate"
    assert sorted(t["resourceType"] for t in lt["tagSpecifications"]) == ["instance", "volume"]
    assert lt["imageId"] == "ami-0123456789abcdef0"
    assert "keyName" not in lt


def test_user_data_is_the_rendered_cloud_config_for_this_run():
    r = synth_raw({"storage": {"bucketName": "ud-bucket"}, "run": {"id": "ud-run"}})
    lt = one(r, LT)
    raw = base64.b64decode(lt["inputs"]["userData"])
    assert raw[:2] == b"\x1f\x8b", "user data is gzipped: EC2 takes at most 16 KiB"
    assert len(raw) <= 16 * 1024
    text = gzip.decompress(raw).decode()
    assert text == r.user_data[lt["name"]]
    assert text.startswith("#cloud-config\n")
    assert "TRAINSTACK_RUN_URI='s3://ud-bucket/runs/ud-run'" in text
    assert f"TRAINSTACK_GROUP='{r.outputs['groupName']}'" in text
    assert f"TRAINSTACK_CODE_URI='{r.outputs['codeUri']}'" in text
    assert "TRAINSTACK_MAX_RUNTIME_S='21600'" in text


def test_ami_lookup_uses_the_dlami_filters_or_the_configured_image():
    r = synth_raw()
    (lookup,) = [i for i in r.invokes if i["token"] == "aws:ec2/getAmi:getAmi"]
    filters = {f["name"]: f["values"] for f in lookup["args"]["filters"]}
    assert filters["name"] == [DLAMI_NAME]
    assert lookup["args"]["owners"] == ["amazon"] and lookup["args"]["mostRecent"] is True
    own = synth_raw({"compute": {"imageId": "ami-0fedcba9876543210"}})
    (lookup,) = [i for i in own.invokes if i["token"] == "aws:ec2/getAmi:getAmi"]
    assert lookup["args"]["filters"] == [{"name": "image-id", "values": ["ami-0fedcba9876543210"]}]
    assert one(own, LT)["inputs"]["imageId"] == "ami-0fedcba9876543210"


def test_no_inbound_rule_by_default_and_egress_open():
    sg = one(synth_raw(), SG)["inputs"]
    assert sg.get("ingress", []) == []
    assert [e["cidrBlocks"] for e in sg["egress"]] == [["0.0.0.0/0"]]
    assert sg["vpcId"] == "vpc-0123456789abcdef0"


def test_ssh_only_from_the_configured_cidrs():
    r = synth_raw({"access": {"sshPublicKey": SSH_KEY, "allowedCidrs": ["203.0.113.0/24", "2001:db8::/48"]}})
    (rule,) = one(r, SG)["inputs"]["ingress"]
    assert (rule["protocol"], rule["fromPort"], rule["toPort"]) == ("tcp", 22, 22)
    assert rule["cidrBlocks"] == ["203.0.113.0/24"]
    assert rule["ipv6CidrBlocks"] == ["2001:db8::/48"]
    key = one(r, "aws:ec2/keyPair:KeyPair")
    assert key["inputs"]["publicKey"] == SSH_KEY
    lt = one(r, LT)
    assert lt["inputs"]["keyName"].startswith(key["name"])
    assert key["name"] in lt["options"]["dependsOn"]


def test_several_nodes_reach_each_other_on_every_port_and_nobody_else_does():
    # Members only (self); every port, since NCCL's collectives use ephemeral ports.
    r = synth_raw({"compute": {"nodes": 3, "instanceTypes": ["g5.xlarge"]}})
    rules = one(r, SG)["inputs"]["ingress"]
    assert len(rules) == 1
    (rule,) = rules
    assert rule["self"] is True
    assert (rule["protocol"], rule["fromPort"], rule["toPort"]) == ("-1", 0, 0)
    assert "cidrBlocks" not in rule and "ipv6CidrBlocks" not in rule and "securityGroups" not in rule


def test_one_machine_has_no_placement_group_and_spreads_over_zones():
    r = synth_raw()
    assert r.of_type(PLACEMENT) == []
    assert "placementGroup" not in one(r, ASG)["inputs"]


def _subnet_of(zone: str) -> str:
    return f"subnet-{fake_hex(zone)}"  # the synth fakes' default-VPC subnet of that zone


def test_several_machines_share_a_cluster_placement_group_in_one_zone():
    r = synth_raw({"compute": {"nodes": 2, "instanceTypes": ["g5.xlarge"], "zones": ["eu-west-1b", "eu-west-1c"]}},
                  stack="multi")
    pg = one(r, PLACEMENT)
    assert pg["inputs"]["strategy"] == "cluster"
    assert pg["inputs"]["name"] == f"{r.outputs['groupName']}-placement"
    asg = one(r, ASG)
    assert asg["inputs"]["placementGroup"] == pg["inputs"]["name"]
    assert pg["name"] in asg["options"]["dependsOn"]
    # A cluster placement group cannot span zones: the group's subnets are those of one zone.
    (lookup,) = [i for i in r.invokes if i["token"] == "aws:ec2/getSubnets:getSubnets"]
    assert lookup["args"]["filters"] == [{"name": "vpc-id", "values": ["vpc-0123456789abcdef0"]}]
    assert asg["inputs"]["vpcZoneIdentifiers"] == [_subnet_of("eu-west-1b")]


def test_several_machines_without_zones_use_the_first_zone_of_their_subnets():
    r = synth_raw({"compute": {"nodes": 2, "instanceTypes": ["g5.xlarge"]}})
    # No region-wide zone list: the candidates are the zones the subnets cover.
    assert not [i for i in r.invokes if i["token"] == "aws:index/getAvailabilityZones:getAvailabilityZones"]
    asked = sorted(i["args"]["id"] for i in r.invokes if i["token"] == "aws:ec2/getSubnet:getSubnet")
    assert asked == sorted(_subnet_of(z) for z in ("eu-west-1a", "eu-west-1b", "eu-west-1c"))
    assert one(r, ASG)["inputs"]["vpcZoneIdentifiers"] == [_subnet_of("eu-west-1a")]


def _offerings_lookup(r) -> dict:
    (lookup,) = [i for i in r.invokes if i["token"] == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings"]
    return lookup["args"]


@pytest.mark.parametrize("zones", [None, ["eu-west-1a", "eu-west-1c"]], ids=["subnet-zones", "compute-zones"])
def test_several_machines_get_the_first_zone_that_offers_their_instance_types(zones):
    # The synth fakes offer P5 everywhere but the region's first zone (as scarce types are).
    compute = {"nodes": 2, "instanceTypes": ["p5.48xlarge"], "gpusPerNode": 8, **({"zones": zones} if zones else {})}
    r = synth_raw({"compute": compute}, stack="multi")
    args = _offerings_lookup(r)
    assert args["locationType"] == "availability-zone"
    assert args["filters"] == [{"name": "instance-type", "values": ["p5.48xlarge"]}]
    chosen = "eu-west-1b" if zones is None else "eu-west-1c"
    assert one(r, ASG)["inputs"]["vpcZoneIdentifiers"] == [_subnet_of(chosen)]


def test_one_machine_looks_up_no_offerings():
    assert not [i for i in synth_raw().invokes if "getInstanceTypeOfferings" in i["token"]]


SUBNETS = [("s-1", "z-a"), ("s-2", "z-b"), ("s-3", "z-b")]


@pytest.mark.parametrize("subnets, zones, offerings, types, chosen", [
    # Every type in both: the first zone, with every subnet of it.
    (SUBNETS, [], [("g5", "z-a"), ("g6", "z-a"), ("g5", "z-b"), ("g6", "z-b")], ["g5", "g6"], ("z-a", ["s-1"])),
    # Only z-b offers both.
    (SUBNETS, [], [("g5", "z-a"), ("g5", "z-b"), ("g6", "z-b")], ["g5", "g6"], ("z-b", ["s-2", "s-3"])),
    # None offers both: the zone of the preferred (first) type wins over the zone order.
    (SUBNETS, [], [("g6", "z-a"), ("g5", "z-b")], ["g5", "g6"], ("z-b", ["s-2", "s-3"])),
    # compute.zones orders the candidates.
    (SUBNETS, ["z-b", "z-a"], [("g5", "z-a"), ("g5", "z-b")], ["g5"], ("z-b", ["s-2", "s-3"])),
    # A zone the subnets do not cover is never chosen, however well it is offered.
    ([("s-1", "z-c")], [], [("g5", "z-a"), ("g5", "z-c")], ["g5"], ("z-c", ["s-1"])),
    ([("s-1", "z-c")], ["z-a", "z-c"], [("g5", "z-a"), ("g5", "z-c")], ["g5"], ("z-c", ["s-1"])),
])
def test_choose_zone(subnets, zones, offerings, types, chosen):
    assert choose_zone(subnets, zones, offerings, types) == chosen


def test_choose_zone_refuses_when_no_zone_of_the_subnets_can_launch():
    with pytest.raises(ValueError, match=r"no zone of the group's subnets \(z-a\) offers any of them.*describe-instance"):
        choose_zone([("s-1", "z-a")], [], [("g5", "z-x")], ["g5"])
    with pytest.raises(ValueError, match=r"^compute.zones \['z-b'\]: no subnet of the group is in these zones "
                                         r"\(subnets: s-1 \(z-a\)\)"):
        choose_zone([("s-1", "z-a")], ["z-b"], [("g5", "z-b")], ["g5"])
    with pytest.raises(ValueError, match=r"^compute.subnets: the group has no subnet"):
        choose_zone([], [], [("g5", "z-a")], ["g5"])


def test_several_machines_on_own_subnets_keep_those_of_one_zone():
    # The synth fakes put subnet-…1 in the second zone and subnet-…2 in the third.
    chosen = ["subnet-0123456789abcdef1", "subnet-0123456789abcdef2"]
    r = synth_raw({"compute": {"nodes": 2, "instanceTypes": ["g5.xlarge"], "subnets": chosen, "zones": ["eu-west-1c"]}})
    (lookup,) = [i for i in r.invokes if i["token"] == "aws:ec2/getSubnets:getSubnets"]
    assert lookup["args"]["filters"] == [{"name": "subnet-id", "values": chosen}]
    assert one(r, ASG)["inputs"]["vpcZoneIdentifiers"] == ["subnet-0123456789abcdef2"]


def test_several_machines_launch_where_their_subnets_are_not_in_the_regions_first_zone():
    # Own subnets in the region's last zone only: the old choice (the region's first zone that
    # offers the types) left the group without a subnet.
    mine = ["subnet-0123456789abcdef2"]
    r = synth_raw({"compute": {"nodes": 2, "instanceTypes": ["g5.xlarge"], "subnets": mine}})
    assert one(r, ASG)["inputs"]["vpcZoneIdentifiers"] == mine


def test_group_is_spot_price_capacity_optimized_over_the_ordered_types():
    r = synth_raw({"compute": {"instanceTypes": ["g5.2xlarge", "g5.xlarge", "g5.4xlarge"], "nodes": 2}})
    asg = one(r, ASG)
    inputs = asg["inputs"]
    assert (inputs["minSize"], inputs["maxSize"], inputs["desiredCapacity"]) == (0, 2, 2)
    # Off: a rebalance recommendation must not replace the training machine.
    assert inputs["capacityRebalance"] is False
    dist = inputs["mixedInstancesPolicy"]["instancesDistribution"]
    assert dist == {
        "onDemandBaseCapacity": 0, "onDemandPercentageAboveBaseCapacity": 0,
        "spotAllocationStrategy": "price-capacity-optimized",
    }
    template = inputs["mixedInstancesPolicy"]["launchTemplate"]
    assert [o["instanceType"] for o in template["overrides"]] == ["g5.2xlarge", "g5.xlarge", "g5.4xlarge"]
    assert template["launchTemplateSpecification"]["launchTemplateId"].startswith("lt-")
    assert asg["options"]["ignoreChanges"] == ["desiredCapacity"]
    assert "trainstack-identity-policy" in asg["options"]["dependsOn"]
    assert inputs["waitForCapacityTimeout"] == "0"


def test_spread_over_the_default_vpcs_subnets_or_the_chosen_zones_or_subnets():
    default = one(synth_raw(), ASG)["inputs"]["vpcZoneIdentifiers"]
    assert len(default) == 3 and all(s.startswith("subnet-") for s in default)
    zoned = synth_raw({"compute": {"zones": ["eu-west-1a", "eu-west-1c"]}})
    (lookup,) = [i for i in zoned.invokes if i["token"] == "aws:ec2/getSubnets:getSubnets"]
    filters = {f["name"]: f["values"] for f in lookup["args"]["filters"]}
    assert filters == {"vpc-id": ["vpc-0123456789abcdef0"], "availability-zone": ["eu-west-1a", "eu-west-1c"]}
    assert len(one(zoned, ASG)["inputs"]["vpcZoneIdentifiers"]) == 2
    chosen = ["subnet-0123456789abcdef1", "subnet-0123456789abcdef2"]
    own = synth_raw({"compute": {"subnets": chosen}})
    assert one(own, ASG)["inputs"]["vpcZoneIdentifiers"] == chosen
    tokens = [i["token"] for i in own.invokes]
    assert "aws:ec2/getSubnets:getSubnets" not in tokens and "aws:ec2/getSubnet:getSubnet" in tokens


def test_spot_false_is_all_on_demand():
    dist = one(synth_raw({"compute": {"spot": False}}), ASG)["inputs"]["mixedInstancesPolicy"]["instancesDistribution"]
    assert dist["onDemandPercentageAboveBaseCapacity"] == 100
    assert dist["onDemandBaseCapacity"] == 0
    assert "spotAllocationStrategy" not in dist and "spotMaxPrice" not in dist


def test_max_price_is_passed_to_spot():
    dist = one(synth_raw({"compute": {"maxPricePerHour": 0.75}}), ASG)["inputs"]["mixedInstancesPolicy"]["instancesDistribution"]
    assert dist["spotMaxPrice"] == "0.7500"


def test_runtime_cap_schedule_at_launch_plus_cap_and_not_moved_by_later_ups():
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    r = synth_raw({"compute": {"maxRuntimeHours": 7.5}}, stack="capped")
    after = dt.datetime.now(dt.UTC)
    schedule = one(r, SCHEDULE)
    inputs = schedule["inputs"]
    assert (inputs["minSize"], inputs["maxSize"], inputs["desiredCapacity"]) == (0, 0, 0)
    assert inputs["autoscalingGroupName"] == "trainstack-capped--exp-7-gpu"
    start = dt.datetime.strptime(inputs["startTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    cap = dt.timedelta(hours=7.5)
    assert before + cap <= start <= after + cap
    assert schedule["options"]["ignoreChanges"] == ["startTime"]
    assert cap_time(1, now=dt.datetime(2030, 1, 1, tzinfo=dt.UTC)) == "2030-01-01T01:00:00Z"


@pytest.mark.parametrize(
    ("overrides", "count"),
    [({}, 18), ({"access": {"sshPublicKey": SSH_KEY}}, 19), ({"image": {"build": True}}, 18)],
)
def test_lookups_and_resources_go_through_the_stacks_provider(overrides, count):
    r = synth_raw(overrides)
    # docker-build's image (image.build) is built by its own provider, not in a region; its scan gate is a
    # dynamic resource (components/scan_gate.py), and so is its signature (components/image_signature.py), run by
    # the program's own dynamic provider. A build stack has its signing key (components/aws/signing_key.py).
    custom = [x for x in r.resources if x["options"]["custom"]
              and not x["type"].startswith(("pulumi:providers:", "docker-build:", "pulumi-python:dynamic:"))]
    assert len(custom) == count
    assert {x["options"]["provider"] for x in custom} == {"trainstack-aws"}
    assert len(r.invokes) >= 4
    assert {i["provider"] for i in r.invokes} == {"trainstack-aws"}
    provider = one(r, "pulumi:providers:aws")
    assert provider["inputs"]["region"] == "eu-west-1"
