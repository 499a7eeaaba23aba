"""Run component code under the Pulumi SDK's mocks and see every registration as the
engine would receive it, options included (the import id, retainOnDelete, dependsOn).

`ops synth` runs the whole program and records the options operators read; this harness
builds any component directly (e.g. a TrainingStack with Args the stack files cannot
express yet) and keeps the raw requests' options. The fake lookups answer just enough
for both clouds' stacks.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc

from ops.fakes.common import RANDOM_ID, fake_hex, random_id

ACCOUNT = "123456789012"


class FakeClouds(pulumi.runtime.Mocks):
    """Resource ids and lookups, well-formed and obviously fake."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        inputs = dict(args.inputs)
        rid = inputs.get("bucket") or inputs.get("name") or f"{args.name}-id"
        out = dict(inputs)
        if args.typ == "aws:s3/bucket:Bucket":
            out.update(arn=f"arn:aws:s3:::{rid}", bucket=rid)
        if args.typ == "gcp:serviceaccount/account:Account":
            out.update(email=f"{inputs.get('accountId')}@p.iam.gserviceaccount.com")
        if args.typ == RANDOM_ID:
            # Bytes from the name: the same on every run, as state keeps them between `up`s.
            rid, extra = random_id(inputs, fake_hex(args.typ, args.name))
            out.update(extra)
        return rid, out

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        answers: dict[str, dict[str, Any]] = {
            "aws:index/getCallerIdentity:getCallerIdentity": {"accountId": ACCOUNT, "arn": "arn:aws:iam::x:user/u",
                                                              "id": ACCOUNT, "userId": "AIDA"},
            "aws:index/getPartition:getPartition": {"partition": "aws", "id": "aws", "dnsSuffix": "amazonaws.com"},
            "aws:ec2/getAmi:getAmi": {"id": "ami-0fake", "rootDeviceName": "/dev/sda1"},
            "aws:ec2/getVpc:getVpc": {"id": "vpc-0fake"},
            "aws:ec2/getSubnets:getSubnets": {"id": "x", "ids": ["subnet-a", "subnet-b"]},
            # subnet-a is in zone-a, subnet-b in zone-b.
            "aws:ec2/getSubnet:getSubnet": {"id": args.args.get("id"), "vpcId": "vpc-0fake",
                                            "availabilityZone": f"zone-{str(args.args.get('id'))[-1]}"},
            "gcp:compute/getImage:getImage": {"id": "img", "selfLink": "https://compute/img"},
            "gcp:compute/getZones:getZones": {"id": "r", "names": ["zone-a", "zone-b", "zone-c", "zone-f"]},
            "aws:index/getAvailabilityZones:getAvailabilityZones": {"id": "r", "names": ["zone-a", "zone-b"],
                                                                     "zoneIds": ["z1", "z2"]},
        }
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            # Every type asked for, in both fake zones.
            types = [v for f in args.args.get("filters") or [] for v in f.get("values", [])]
            return {"id": "r", "instanceTypes": types * 2, "locations": ["zone-a"] * len(types) + ["zone-b"] * len(types),
                    "locationTypes": ["availability-zone"] * (2 * len(types))}
        if args.token not in answers:
            raise NotImplementedError(f"no fake answer for {args.token}")
        return answers[args.token]


def registrations(build: Callable[[], Any], mocks: pulumi.runtime.Mocks | None = None) -> list[dict[str, Any]]:
    """Call `build()` under mocks and return each registration: type, name, inputs, options."""
    records: list[dict[str, Any]] = []

    class Monitor(pulumi_mocks.MockMonitor):
        def RegisterResource(self, request):  # noqa: N802 - gRPC method name
            records.append({
                "type": request.type,
                "name": request.name,
                "inputs": rpc.deserialize_properties(request.object),
                "importId": request.importId,
                "retainOnDelete": bool(request.retainOnDelete),
                "ignoreChanges": list(request.ignoreChanges),
                "dependsOn": [d.split("::")[-1] for d in request.dependencies],
            })
            return super().RegisterResource(request)

    def run() -> None:
        fake = mocks or FakeClouds()
        pulumi.runtime.set_mocks(fake, project="trainstack", stack="unit", preview=False, monitor=Monitor(fake))

        @pulumi.runtime.test
        def built():
            return build()

        built()

    # The SDK keeps its runtime in context variables: a copy leaves the caller's untouched.
    contextvars.copy_context().run(run)
    assert records, "nothing was registered"
    return records
