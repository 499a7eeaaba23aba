"""Fake AWS for `ops synth`: resource outputs and lookups with well-formed, obviously fake values.

Ids and ARNs follow AWS's shapes (so the program's string handling is exercised) and name
the fake account 123456789012; the AMI lookup answers with the default AMI's name.
"""

from __future__ import annotations

import base64
from typing import Any

from ops.fakes.common import fake_hex

FAKE_ACCOUNT = "123456789012"
FAKE_AMI = "ami-0123456789abcdef0"
FAKE_VPC = "vpc-0123456789abcdef0"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"


def resource(t: str, name: str, inputs: dict[str, Any], h: str, region: str) -> tuple[str, dict[str, Any]]:
    """The fake id and the outputs beyond the inputs of one `aws:` resource; `h` is its fake hex."""
    arn = f"arn:aws:{{svc}}:{region}:{FAKE_ACCOUNT}:"
    rid = f"{name}-{h[:7]}"
    extra: dict[str, Any] = {}
    if t == "aws:s3/bucket:Bucket":
        bucket = inputs.get("bucket") or rid
        rid = bucket
        extra.update(bucket=bucket, arn=f"arn:aws:s3:::{bucket}", region=region)
    elif t in ("aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile"):
        kind = "role" if t.endswith(":Role") else "instance-profile"
        n = inputs.get("name") or rid
        rid = n
        extra.update(name=n, arn=f"arn:aws:iam::{FAKE_ACCOUNT}:{kind}/{n}", uniqueId=f"AROA{h[:16].upper()}")
    elif t == "aws:ecr/repository:Repository":
        n = inputs.get("name") or rid
        rid = n
        extra.update(
            name=n,
            arn=arn.format(svc="ecr") + f"repository/{n}",
            repositoryUrl=f"{FAKE_ACCOUNT}.dkr.ecr.{region}.amazonaws.com/{n}",
            registryId=FAKE_ACCOUNT,
        )
    elif t == "aws:kms/key:Key":
        # KMS names a key by a UUID.
        rid = f"{h[:8]}-{h[8:12]}-4{h[12:15]}-8{h[15:17]}0-{(h * 2)[:12]}"
        extra.update(arn=arn.format(svc="kms") + f"key/{rid}", keyId=rid)
    elif t == LAUNCH_TEMPLATE:
        rid = f"lt-{h}"
        extra.update(arn=arn.format(svc="ec2") + f"launch-template/{rid}", latestVersion=1, defaultVersion=1)
    elif t == "aws:ec2/securityGroup:SecurityGroup":
        rid = f"sg-{h}"
        extra.update(arn=arn.format(svc="ec2") + f"security-group/{rid}", name=rid)
    elif t == "aws:ec2/keyPair:KeyPair":
        rid = inputs.get("keyName") or rid
        extra.update(keyName=rid, arn=arn.format(svc="ec2") + f"key-pair/{rid}")
    elif t == "aws:autoscaling/group:Group":
        n = inputs.get("name") or rid
        rid = n
        uuid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-0000-{fake_hex(name, n=12)}"
        extra.update(name=n, arn=arn.format(svc="autoscaling") + f"autoScalingGroup:{uuid}:autoScalingGroupName/{n}")
    elif t == "aws:cloudwatch/logGroup:LogGroup":
        rid = inputs.get("name") or rid
        extra.update(name=rid, arn=arn.format(svc="logs") + f"log-group:{rid}")
    elif t == "aws:lambda/function:Function":
        rid = inputs.get("name") or rid
        extra.update(name=rid, arn=arn.format(svc="lambda") + f"function:{rid}", version="$LATEST")
        extra["invokeArn"] = f"arn:aws:apigateway:{region}:lambda:path/2015-03-31/functions/{extra['arn']}/invocations"
    elif t == "aws:scheduler/schedule:Schedule":
        rid = inputs.get("name") or rid
        extra.update(name=rid, arn=arn.format(svc="scheduler") + f"schedule/default/{rid}")
    elif t == "aws:s3/bucketObjectv2:BucketObjectv2":
        extra.update(versionId=h, etag=h)
    return rid, extra


def subnet_zone(subnet_id: str, zones: list[str]) -> str:
    """The fake zone of a subnet: the default VPC's own subnets are named after their zone; any
    other id is in the zone its last hex digit picks (…0: the first, …1: the second, …2: the third)."""
    for z in zones:
        if subnet_id == f"subnet-{fake_hex(z)}":
            return z
    return zones[int(subnet_id[-1], 16) % len(zones)]


def call(fn: str, a: dict[str, Any], region: str) -> dict[str, Any] | None:
    """The fake answer to one `aws:` lookup, or None when there is none."""
    zones = [f"{region}{z}" for z in "abc"]
    if fn == "aws:ec2/getAmi:getAmi":
        wanted = [v for f in a.get("filters") or [] if f.get("name") == "image-id" for v in f.get("values", [])]
        ami = wanted[0] if wanted else FAKE_AMI
        return {
            "id": ami, "imageId": ami, "architecture": "x86_64", "rootDeviceName": "/dev/sda1",
            "name": "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20260101 (fake)",
            "ownerId": "898082745236", "state": "available", "virtualizationType": "hvm",
        }
    if fn == "aws:ec2/getVpc:getVpc":
        return {"id": FAKE_VPC, "default": True, "cidrBlock": "172.31.0.0/16", "state": "available"}
    if fn == "aws:ec2/getSubnets:getSubnets":
        # The default VPC has one subnet per zone; named subnets (a subnet-id filter) are kept,
        # each in the zone subnet_zone gives it; an availability-zone filter narrows either.
        filters = {f.get("name"): list(f.get("values", [])) for f in a.get("filters") or []}
        ids = filters.get("subnet-id") or [f"subnet-{fake_hex(z)}" for z in zones]
        wanted = filters.get("availability-zone") or zones
        return {"id": region, "ids": [i for i in ids if subnet_zone(i, zones) in wanted], "filters": a.get("filters")}
    if fn == "aws:ec2/getSubnet:getSubnet":
        return {"id": a.get("id"), "vpcId": FAKE_VPC, "availabilityZone": subnet_zone(str(a.get("id")), zones)}
    if fn == "aws:index/getCallerIdentity:getCallerIdentity":
        return {
            "accountId": FAKE_ACCOUNT, "id": FAKE_ACCOUNT,
            "arn": f"arn:aws:iam::{FAKE_ACCOUNT}:user/synth", "userId": "AIDAFAKEFAKEFAKEFAKE",
        }
    if fn == "aws:iam/getSessionContext:getSessionContext":
        # An assumed role's session ARN gives its role; any other ARN (the fake caller is a user) is its own issuer.
        arn = str(a.get("arn"))
        issuer, session = arn, ""
        if ":assumed-role/" in arn:
            head, _, rest = arn.partition(":assumed-role/")
            role, _, session = rest.partition("/")
            issuer = head.replace(":sts::", ":iam::") + f":role/{role}"
        return {"id": arn, "arn": arn, "issuerArn": issuer, "issuerId": "", "issuerName": issuer.rsplit("/", 1)[-1],
                "sessionName": session}
    if fn == "aws:index/getPartition:getPartition":
        return {"id": "aws", "partition": "aws", "dnsSuffix": "amazonaws.com", "reverseDnsPrefix": "com.amazonaws"}
    if fn == "aws:index/getRegion:getRegion":
        return {"id": region, "name": region, "region": region,
                "endpoint": f"ec2.{region}.amazonaws.com"}
    if fn == "aws:ecr/getAuthorizationToken:getAuthorizationToken":
        registry = a.get("registryId") or FAKE_ACCOUNT
        # A token is for one region's registry: another region answers another.
        password = f"fake-ecr-token-{fake_hex(fn, registry, region, n=32)}"
        return {
            "id": region, "registryId": registry, "region": region, "userName": "AWS",
            "password": password, "authorizationToken": base64.b64encode(f"AWS:{password}".encode()).decode(),
            "proxyEndpoint": f"https://{registry}.dkr.ecr.{region}.amazonaws.com",
            "expiresAt": "2030-01-01T12:00:00Z",
        }
    if fn == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
        # Every type in every zone, except P5 (scarce in reality too): not in the first zone.
        types = [v for f in a.get("filters") or [] if f.get("name") == "instance-type" for v in f.get("values", [])]
        pairs = [(t, z) for t in types for z in zones if not (t.startswith("p5.") and z == zones[0])]
        return {"id": region, "instanceTypes": [t for t, _ in pairs], "locations": [z for _, z in pairs],
                "locationTypes": ["availability-zone"] * len(pairs), "locationType": a.get("locationType")}
    if fn == "aws:index/getAvailabilityZones:getAvailabilityZones":
        return {"id": region, "names": zones, "zoneIds": [f"use1-az{i}" for i in range(1, 4)]}
    return None
