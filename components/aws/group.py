"""SpotGroup: the security group, launch template and Auto Scaling group of GPU machines.

The group is what survives spot preemption: it keeps `nodes` machines, replacing any
that AWS takes back, across the ordered instance types and the subnets of several zones.
Capacity rebalancing is off: it would start a replacement on every rebalance
recommendation and terminate the training machine once the new one passes its EC2
health check (long before it can train), with two machines writing one run meanwhile;
the real two-minute notice is enough for one training job. Several machines train as
one: they share a cluster placement group in one zone and reach each other (and only each
other) on every port. The machine
scales the group to zero when the run ends, so Pulumi ignores the desired capacity after
creation. A scheduled action enforces the runtime cap from the cloud side, even if a
machine hangs and never runs its own finish step.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from components import userdata
from components.aws.naming import DLAMI_NAME, choose_zone
from components.settings import Settings


@dataclass(kw_only=True)
class SpotGroupArgs:
    """Inputs of a SpotGroup."""

    group_name: str
    """The Auto Scaling group's name, fixed in advance (the machines' env file holds it)."""
    instance_types: list[str]
    """Instance types in order of preference."""
    nodes: int = 1
    """Machines in the group."""
    size: int | None = None
    """Machines the group is created with; None: `nodes`. A placement waiting its turn starts at 0; the
    controller sets it later, and a later `pulumi up` leaves whatever size it set."""
    spot: bool = True
    """Spot capacity; False gives on-demand."""
    max_price_per_hour: float | None = None
    """Highest spot price per machine-hour (USD); None: the on-demand price."""
    max_runtime_hours: float = 24
    """The scheduled action sets the group to zero this long after the first `pulumi up`."""
    root_disk_gb: int = 200
    """Size of the encrypted gp3 root volume."""
    image_id: str | None = None
    """AMI id; None looks up the newest AWS Deep Learning Base GPU AMI (Ubuntu 22.04)."""
    subnets: list[str] = field(default_factory=list)
    """Subnets to spread over; empty: the default VPC's subnets."""
    zones: list[str] = field(default_factory=list)
    """Only subnets in these zones; empty: every zone the subnets cover. Several machines use one (choose_zone)."""
    allowed_cidrs: list[str] = field(default_factory=list)
    """CIDRs allowed to TCP 22; empty: no inbound rule at all."""
    ssh_public_key: str | None = None
    """OpenSSH public key installed for the default user; None: no key pair."""
    instance_profile_arn: pulumi.Input[str]
    """The machines' instance profile."""
    user_data: pulumi.Input[str]
    """The #cloud-config document (plain text; encoded here)."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags for every resource, and for the machines and their volumes."""
    wait_for: list[pulumi.Resource] = field(default_factory=list)
    """Resources the group must wait for before launching machines (e.g. the role's policy)."""


def spot_group_args(settings: Settings, *, group_name: str, size: int | None, instance_profile_arn: pulumi.Input[str],
                    user_data: pulumi.Input[str], tags: dict[str, str],
                    wait_for: list[pulumi.Resource]) -> SpotGroupArgs:
    """The Args of a placement's group from the stack's settings moved to it (its types, zones, subnets and
    compute) and what the stack made for its machines (their profile, user data and what they wait for)."""
    c = settings.compute
    return SpotGroupArgs(
        group_name=group_name, instance_types=list(c.instance_types), nodes=c.nodes, size=size, spot=c.spot,
        max_price_per_hour=c.max_price_per_hour, max_runtime_hours=c.max_runtime_hours, root_disk_gb=c.root_disk_gb,
        image_id=c.image_id, subnets=list(c.subnets), zones=list(c.zones),
        allowed_cidrs=list(settings.access.allowed_cidrs), ssh_public_key=settings.access.ssh_public_key,
        instance_profile_arn=instance_profile_arn, user_data=user_data, tags=tags, wait_for=wait_for,
    )


def _ami(args: SpotGroupArgs, invoke: pulumi.InvokeOptions) -> pulumi.Output:
    """The machines' image: `image_id`, else the newest Deep Learning AMI."""
    if args.image_id:
        ami = aws.ec2.get_ami_output(
            filters=[aws.ec2.GetAmiFilterArgs(name="image-id", values=[args.image_id])],
            opts=invoke,
        )
    else:
        ami = aws.ec2.get_ami_output(
            most_recent=True,
            owners=["amazon"],
            filters=[
                aws.ec2.GetAmiFilterArgs(name="name", values=[DLAMI_NAME]),
                aws.ec2.GetAmiFilterArgs(name="architecture", values=["x86_64"]),
                aws.ec2.GetAmiFilterArgs(name="state", values=["available"]),
            ],
            opts=invoke,
        )
    return ami


def cap_time(hours: float, now: dt.datetime | None = None) -> str:
    """The runtime cap as the RFC 3339 UTC time the scheduled action takes."""
    start = (now or dt.datetime.now(dt.UTC)) + dt.timedelta(hours=hours)
    return start.strftime("%Y-%m-%dT%H:%M:%SZ")


class SpotGroup(pulumi.ComponentResource):
    """GPU machines kept at `nodes` by an Auto Scaling group, spot by default."""

    security_group: aws.ec2.SecurityGroup
    launch_template: aws.ec2.LaunchTemplate
    group: aws.autoscaling.Group
    schedule: aws.autoscaling.Schedule
    group_name: pulumi.Output[str]
    image_id: pulumi.Output[str]

    def __init__(self, name: str, args: SpotGroupArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:aws:SpotGroup", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOptions(parent=self)

        self.placement_group: aws.ec2.PlacementGroup | None = None
        self.zone: pulumi.Output[str] | None = None
        """The one zone of several machines (None for one machine)."""
        vpc_id, subnet_ids = self._network(name, args)

        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            description="trainstack GPU machines",
            vpc_id=vpc_id,
            ingress=self._ingress(args),
            # Open egress: the machines pull images, packages and reach S3/ECR endpoints.
            egress=[
                aws.ec2.SecurityGroupEgressArgs(
                    protocol="-1", from_port=0, to_port=0,
                    cidr_blocks=["0.0.0.0/0"], ipv6_cidr_blocks=["::/0"],
                    description="image pulls, S3, ECR",
                )
            ],
            tags=args.tags,
            opts=child,
        )

        ami = _ami(args, invoke)
        self.image_id = ami.id

        self.launch_template = self._launch_template(name, args, ami)

        self.group = self._group(name, args, subnet_ids)

        # The cloud's own deadline: at first launch + maxRuntimeHours the group goes to
        # zero even if a machine hangs. startTime is computed at each `pulumi up`; it is
        # ignored after creation so a later `up` (e.g. to change the trainer) does not
        # push the deadline back and silently extend the budget. To move the cap on
        # purpose, replace this resource (`pulumi up --replace <its URN>`).
        self.schedule = aws.autoscaling.Schedule(
            f"{name}-runtime-cap",
            scheduled_action_name=f"{args.group_name}-runtime-cap",
            autoscaling_group_name=self.group.name,
            min_size=0,
            max_size=0,
            desired_capacity=0,
            start_time=cap_time(args.max_runtime_hours),
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["startTime"]),
        )
        self.group_name = self.group.name
        self.register_outputs({"group_name": self.group_name, "image_id": self.image_id})

    def _group(self, name: str, args: SpotGroupArgs, subnet_ids: pulumi.Input[list[str]]) -> aws.autoscaling.Group:
        """The Auto Scaling group: spot (or on-demand) machines of the listed types, from the launch template."""
        return aws.autoscaling.Group(
            f"{name}-asg",
            name=args.group_name,
            min_size=0,
            max_size=args.nodes,
            desired_capacity=args.nodes if args.size is None else args.size,
            # Off: see the module docstring (replace on the interruption notice only).
            capacity_rebalance=False,
            vpc_zone_identifiers=subnet_ids,
            placement_group=self.placement_group.name if self.placement_group else None,
            mixed_instances_policy=aws.autoscaling.GroupMixedInstancesPolicyArgs(
                instances_distribution=self._distribution(args),
                launch_template=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs(
                    launch_template_specification=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs(
                        launch_template_id=self.launch_template.id,
                        version=self.launch_template.latest_version.apply(str),
                    ),
                    overrides=[
                        aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs(instance_type=t)
                        for t in args.instance_types
                    ],
                ),
            ),
            # Spot capacity may take a while; `pulumi up` returns at once and the group
            # keeps trying.
            wait_for_capacity_timeout="0",
            tags=[
                aws.autoscaling.GroupTagArgs(key=k, value=v, propagate_at_launch=False)
                for k, v in sorted(args.tags.items())
            ],
            # The machine sets desired capacity to 0 when the run is done, and the placement
            # controller moves the run between groups; a later `pulumi up` must undo neither.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["desiredCapacity"], depends_on=args.wait_for),
        )

    def _network(self, name: str, args: SpotGroupArgs) -> tuple[pulumi.Output[str], pulumi.Input[list[str]]]:
        """The group's VPC and subnets (with several machines, those of one zone, in a cluster placement group)."""
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOptions(parent=self)
        if args.subnets:
            vpc_id = aws.ec2.get_subnet_output(id=args.subnets[0], opts=invoke).vpc_id
            within = aws.ec2.GetSubnetsFilterArgs(name="subnet-id", values=args.subnets)
        else:
            vpc_id = aws.ec2.get_vpc_output(default=True, opts=invoke).id
            within = aws.ec2.GetSubnetsFilterArgs(name="vpc-id", values=[vpc_id])
        subnet_ids: pulumi.Input[list[str]]
        if args.nodes > 1:
            # Several machines train as one: a cluster placement group puts them on one
            # low-latency network segment, which exists in one zone only, so the group keeps
            # its subnets of one zone: chosen by choose_zone among the zones those subnets
            # cover (a zone without a subnet could launch nothing).
            ids = aws.ec2.get_subnets_output(filters=[within], opts=invoke).ids
            pairs = ids.apply(lambda found: pulumi.Output.all(*[
                aws.ec2.get_subnet_output(id=i, opts=invoke).availability_zone for i in found or []
            ]).apply(lambda zs, found=found: list(zip(found or [], zs, strict=True))))
            offers = aws.ec2.get_instance_type_offerings_output(
                location_type="availability-zone",
                filters=[aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=args.instance_types)],
                opts=invoke,
            )
            types, zones = list(args.instance_types), list(args.zones)
            chosen = pulumi.Output.all(pairs, offers.instance_types, offers.locations).apply(
                lambda a: choose_zone(a[0], zones, list(zip(a[1] or [], a[2] or [], strict=False)), types))
            self.zone = chosen.apply(lambda c: c[0])
            subnet_ids = chosen.apply(lambda c: c[1])
            self.placement_group = aws.ec2.PlacementGroup(
                # Placement group names take at most 255 characters.
                f"{name}-placement", name=f"{args.group_name[:245]}-placement", strategy="cluster", tags=args.tags,
                opts=child,
            )
        elif args.subnets and not args.zones:
            subnet_ids = args.subnets
        else:
            filters = [within]
            if args.zones:
                filters.append(aws.ec2.GetSubnetsFilterArgs(name="availability-zone", values=args.zones))
            subnet_ids = aws.ec2.get_subnets_output(filters=filters, opts=invoke).ids
        return vpc_id, subnet_ids

    def _launch_template(self, name: str, args: SpotGroupArgs, ami: aws.ec2.AwaitableGetAmiResult,
                         ) -> aws.ec2.LaunchTemplate:
        """The machines' launch template: the image, the role, the user data, IMDSv2 and the root disk."""
        child = pulumi.ResourceOptions(parent=self)
        key_name = None
        if args.ssh_public_key:
            key_name = aws.ec2.KeyPair(
                f"{name}-key", public_key=args.ssh_public_key, tags=args.tags, opts=child
            ).key_name

        return aws.ec2.LaunchTemplate(
            f"{name}-lt",
            description="trainstack GPU machine",
            image_id=ami.id,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=args.instance_profile_arn),
            vpc_security_group_ids=[self.security_group.id],
            key_name=key_name,
            user_data=pulumi.Output.from_input(args.user_data).apply(userdata.encode_user_data),
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",  # IMDSv2 only
                # Hop limit 1: containers behind a bridge cannot reach the role's
                # credentials; the trainer container uses --network host.
                http_put_response_hop_limit=1,
                instance_metadata_tags="enabled",
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=ami.root_device_name,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_type="gp3",
                        volume_size=args.root_disk_gb,
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            # The machine powers off when the run ends: terminate, so no stopped volume bills on.
            instance_initiated_shutdown_behavior="terminate",
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=args.tags)
                for kind in ("instance", "volume")
            ],
            update_default_version=True,
            tags=args.tags,
            opts=child,
        )

    def _ingress(self, args: SpotGroupArgs) -> list[aws.ec2.SecurityGroupIngressArgs]:
        rules = []
        v4 = [c for c in args.allowed_cidrs if ":" not in c]
        v6 = [c for c in args.allowed_cidrs if ":" in c]
        if v4 or v6:
            rules.append(
                aws.ec2.SecurityGroupIngressArgs(
                    protocol="tcp", from_port=22, to_port=22,
                    cidr_blocks=v4 or None, ipv6_cidr_blocks=v6 or None,
                    description="SSH from access.allowedCidrs",
                )
            )
        if args.nodes > 1:
            # Members only (the group's own security group), every port: TF's gRPC servers
            # listen on WORKER_PORTS (components/machine.py), but NCCL's collectives connect on ephemeral ports
            # (it cannot be pinned to a range), and EFA needs all traffic between members.
            rules.append(
                aws.ec2.SecurityGroupIngressArgs(
                    protocol="-1", from_port=0, to_port=0,
                    self=True, description="training peers: TF gRPC, NCCL, EFA (members only)",
                )
            )
        return rules

    @staticmethod
    def _distribution(args: SpotGroupArgs) -> aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs:
        if not args.spot:
            return aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
                on_demand_base_capacity=0,
                on_demand_percentage_above_base_capacity=100,
                # On-demand follows the listed order of instance types.
                on_demand_allocation_strategy="prioritized",
            )
        return aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
            on_demand_base_capacity=0,
            on_demand_percentage_above_base_capacity=0,
            spot_allocation_strategy="price-capacity-optimized",
            spot_max_price=f"{args.max_price_per_hour:.4f}" if args.max_price_per_hour else None,
        )
