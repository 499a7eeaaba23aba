"""SpotGroup: firewall rules, instance template and regional managed instance group of GPU VMs.

The group is what survives preemption: it keeps `nodes` Spot VMs, recreating any that
GCE takes back, choosing among the ranked machine types (instance flexibility) in one
zone that has capacity: of `compute.zones`, else of every zone of the region. The zones are
set on the group explicitly (GCE would otherwise pick three of a larger region's zones), and
only when it is created: GCE cannot change a group's zones, so a new `run.id` (a new group)
takes a changed `compute.zones`. The machine resizes its group to zero when the run
ends, so Pulumi ignores the target size after creation. The runtime cap is enforced by
the cloud twice: each VM has a max run duration, and a Cloud Scheduler job resizes the
group to zero at first launch + maxRuntimeHours (a recreated VM's duration starts afresh;
the job's time does not). Several machines of a series that allows it share a compact
placement policy, and reach each other (and only each other) on every port.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

from components.gcp.naming import MACHINE_NETWORK
from components.settings import Settings

# Canonical's Ubuntu 22.04 with the NVIDIA driver: it runs cloud-init from the
# `user-data` metadata key, as the AWS machines do.
IMAGE_PROJECT = "ubuntu-os-accelerator-images"
IMAGE_FAMILY = "ubuntu-accelerator-2204-amd64-with-nvidia-550"
NETWORK = f"global/networks/{MACHINE_NETWORK}"
# Machine series a compact placement policy accepts (Google's placement-policy
# restrictions: A2, C2, C2D, G2, N2, N2D), of those that carry GPUs. A3 High (8 GPUs) wants
# a MIG workload policy instead; N1 (T4, V100) has no compact placement.
COMPACT_SERIES = frozenset({"a2", "g2"})


@dataclass(kw_only=True)
class SpotGroupArgs:
    """Inputs of a SpotGroup."""

    group_name: str
    """The instance group's name, fixed in advance (the machines' env file holds it)."""
    gcp_project: str
    """The GCP project of every resource."""
    region: str
    """The group's region."""
    instance_types: list[str]
    """Machine types in order of preference."""
    network_tag: str
    """The tag the firewall rules select these machines by."""
    service_account_email: pulumi.Input[str]
    """The machines' service account."""
    user_data: pulumi.Input[str]
    """The #cloud-config document."""
    nodes: int = 1
    """Machines in the group."""
    size: int | None = None
    """Machines the group is created with; None: `nodes`. A placement waiting its turn starts at 0; the
    controller sets it later, and a later `pulumi up` leaves whatever size it set."""
    firewalls: bool = True
    """Make the firewall rules for the network tag; False where another group of the stack already has
    (they are the project's, for every region: one set serves every placement of the project)."""
    gpus_per_node: int = 1
    """GPUs per machine (N1 machines get this many accelerators)."""
    accelerator: str | None = None
    """GPU type for N1 machines (e.g. nvidia-tesla-t4); None for machines with built-in GPUs."""
    spot: bool = True
    """Spot VMs; False gives standard (on-demand) VMs."""
    max_runtime_hours: float = 24
    """The cap: VMs stop after this long, and the group goes to zero this long after the first `pulumi up`."""
    root_disk_gb: int = 200
    """Size of the boot disk."""
    image_id: str | None = None
    """Boot image; None looks up Ubuntu 22.04 with the NVIDIA driver."""
    zones: list[str] = field(default_factory=list)
    """Zones the group may use; empty: every zone of the region (looked up at `pulumi up`)."""
    allowed_cidrs: list[str] = field(default_factory=list)
    """CIDRs allowed to TCP 22; empty: nothing inbound at all."""
    ssh_public_key: str | None = None
    """OpenSSH public key for the `ubuntu` user; None: no key."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels for the template and its VMs."""
    wait_for: list[pulumi.Resource] = field(default_factory=list)
    """Resources the group must wait for before creating VMs (e.g. the IAM grants)."""


def spot_group_args(settings: Settings, *, group_name: str, size: int | None, firewalls: bool, network_tag: str,
                    service_account_email: pulumi.Input[str], user_data: pulumi.Input[str], labels: dict[str, str],
                    wait_for: list[pulumi.Resource]) -> SpotGroupArgs:
    """The Args of a placement's group from the stack's settings moved to it (its project, region, types, zones
    and compute) and what the stack made for its machines (their account, user data and what they wait for)."""
    c = settings.compute
    return SpotGroupArgs(
        group_name=group_name, gcp_project=settings.project, region=settings.region,
        instance_types=list(c.instance_types), network_tag=network_tag, service_account_email=service_account_email,
        user_data=user_data, nodes=c.nodes, size=size, firewalls=firewalls, gpus_per_node=c.gpus_per_node,
        accelerator=c.accelerator, spot=c.spot, max_runtime_hours=c.max_runtime_hours, root_disk_gb=c.root_disk_gb,
        image_id=c.image_id, zones=list(c.zones), allowed_cidrs=list(settings.access.allowed_cidrs),
        ssh_public_key=settings.access.ssh_public_key, labels=labels, wait_for=wait_for,
    )


def compact_placement(instance_types: list[str], nodes: int) -> bool:
    """Whether the group's machines get a compact placement policy: several machines, and
    every type the group may choose from of a series that supports it."""
    return nodes > 1 and all(t.split("-", 1)[0] in COMPACT_SERIES for t in instance_types)


def no_compact_reason(instance_types: list[str], nodes: int) -> str | None:
    """Why several machines get no compact placement (said at `pulumi up`); None when they get it or are one."""
    if nodes <= 1 or compact_placement(instance_types, nodes):
        return None
    other = sorted({t.split("-", 1)[0] for t in instance_types} - COMPACT_SERIES)
    return (f"compute.instanceTypes {instance_types}: no compact placement for {nodes} machines, because the "
            f"{', '.join(s.upper() for s in other)} series does not take a compact placement policy in a managed "
            f"group (supported here: {', '.join(sorted(s.upper() for s in COMPACT_SERIES))}). The machines still "
            "run in one zone, placed wherever Compute Engine has room; choose A2 or G2 types for lower latency")


def cap_cron(hours: float, now: dt.datetime | None = None) -> str:
    """The cap as a Cloud Scheduler cron (minute hour day month), UTC.

    Cron has no year: the job would fire again a year later, which only resizes an
    already empty group to zero.
    """
    at = (now or dt.datetime.now(dt.UTC)) + dt.timedelta(hours=hours)
    # Round up to the next minute so the cap is never earlier than promised.
    if at.second or at.microsecond:
        at = at.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    return f"{at.minute} {at.hour} {at.day} {at.month} *"


def _scheduling(args: SpotGroupArgs) -> gcp.compute.InstanceTemplateSchedulingArgs:
    """Spot (deleted when preempted) or standard machines, each stopped by GCE at the runtime cap."""
    cap_seconds = int(args.max_runtime_hours * 3600)
    if args.spot:
        scheduling = gcp.compute.InstanceTemplateSchedulingArgs(
            provisioning_model="SPOT",
            preemptible=True,
            automatic_restart=False,
            on_host_maintenance="TERMINATE",
            instance_termination_action="DELETE",
            max_run_duration=gcp.compute.InstanceTemplateSchedulingMaxRunDurationArgs(seconds=cap_seconds),
        )
    else:
        scheduling = gcp.compute.InstanceTemplateSchedulingArgs(
            provisioning_model="STANDARD",
            preemptible=False,
            automatic_restart=True,
            on_host_maintenance="TERMINATE",  # GPUs cannot live-migrate
            instance_termination_action="DELETE",
            max_run_duration=gcp.compute.InstanceTemplateSchedulingMaxRunDurationArgs(seconds=cap_seconds),
        )
    return scheduling


class SpotGroup(pulumi.ComponentResource):
    """GPU VMs kept at `nodes` by a regional managed instance group, Spot by default."""

    template: gcp.compute.InstanceTemplate
    group: gcp.compute.RegionInstanceGroupManager
    group_name: pulumi.Output[str]

    def __init__(self, name: str, args: SpotGroupArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:SpotGroup", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        if args.firewalls:
            self._firewalls(name, args, child)

        self.placement: gcp.compute.ResourcePolicy | None = None
        self.template = self._template(name, args, child)
        self.group = self._group(name, args)
        self._runtime_cap(name, args)
        self.group_name = self.group.name
        self.register_outputs({"group_name": self.group_name})

    def _template(self, name: str, args: SpotGroupArgs, child: pulumi.ResourceOptions) -> gcp.compute.InstanceTemplate:
        """The machines' template (image, GPUs, user data, account, scheduling), and with several machines of a
        type that takes one, a compact placement policy."""
        if args.image_id:
            source_image: pulumi.Input[str] = args.image_id
        else:
            source_image = gcp.compute.get_image_output(
                family=IMAGE_FAMILY, project=IMAGE_PROJECT, opts=pulumi.InvokeOptions(parent=self)
            ).self_link

        metadata: dict[str, pulumi.Input[str]] = {
            "user-data": args.user_data,
            "block-project-ssh-keys": "true",
            "disable-legacy-endpoints": "true",
        }
        if args.ssh_public_key:
            metadata["ssh-keys"] = f"ubuntu:{args.ssh_public_key}"
        scheduling = _scheduling(args)
        reason = no_compact_reason(args.instance_types, args.nodes)
        if reason:
            pulumi.log.warn(reason, resource=self)
        if compact_placement(args.instance_types, args.nodes):
            # Several machines train as one: placed close together (lower latency between
            # them). The group already keeps them in one zone (ANY_SINGLE_ZONE), which a
            # compact policy requires; it takes no vm_count, which would make the policy
            # work only when exactly that many VMs are created at once (not so for a VM
            # recreated after preemption).
            self.placement = gcp.compute.ResourcePolicy(
                f"{name}-placement",
                name=f"{args.group_name}-place",
                region=args.region,
                description="trainstack: training peers placed close together",
                group_placement_policy=gcp.compute.ResourcePolicyGroupPlacementPolicyArgs(collocation="COLLOCATED"),
                opts=child,
            )
        return gcp.compute.InstanceTemplate(
            f"{name}-template",
            name_prefix=f"{args.group_name[:36]}-",
            description="trainstack GPU machine",
            machine_type=args.instance_types[0],
            disks=[
                gcp.compute.InstanceTemplateDiskArgs(
                    boot=True, auto_delete=True, source_image=source_image,
                    disk_size_gb=args.root_disk_gb, disk_type="pd-balanced",
                )
            ],
            guest_accelerators=[
                gcp.compute.InstanceTemplateGuestAcceleratorArgs(type=args.accelerator, count=args.gpus_per_node)
            ] if args.accelerator else None,
            network_interfaces=[
                gcp.compute.InstanceTemplateNetworkInterfaceArgs(
                    network=NETWORK,
                    # An ephemeral public address for image and package pulls; the
                    # firewall rules below keep everything inbound out.
                    access_configs=[gcp.compute.InstanceTemplateNetworkInterfaceAccessConfigArgs()],
                )
            ],
            metadata=metadata,
            scheduling=scheduling,
            service_account=gcp.compute.InstanceTemplateServiceAccountArgs(
                email=args.service_account_email,
                # What the account may do is decided by its IAM grants, not by scopes.
                scopes=["https://www.googleapis.com/auth/cloud-platform"],
            ),
            shielded_instance_config=gcp.compute.InstanceTemplateShieldedInstanceConfigArgs(
                # Secure boot stays off: the image's NVIDIA kernel modules are not signed by Google.
                enable_secure_boot=False, enable_vtpm=True, enable_integrity_monitoring=True,
            ),
            tags=[args.network_tag],
            # One policy at most (a single value in this SDK); instance properties name
            # their resource policies by name, not URL.
            resource_policies=self.placement.name if self.placement else None,
            labels=args.labels,
            # A template cannot change in place: a new one (name_prefix gives it a new name)
            # is made first, the group (which refers to it) switches to it, and only then
            # does the old one go — Pulumi's create-before-delete, so never deleteBeforeReplace.
            opts=child,
        )

    def _group(self, name: str, args: SpotGroupArgs) -> gcp.compute.RegionInstanceGroupManager:
        """The regional managed instance group: its machines in one zone, of the listed types by rank."""
        flexibility = None
        if len(args.instance_types) > 1:
            flexibility = gcp.compute.RegionInstanceGroupManagerInstanceFlexibilityPolicyArgs(
                instance_selections=[
                    gcp.compute.RegionInstanceGroupManagerInstanceFlexibilityPolicyInstanceSelectionArgs(
                        name=f"rank-{rank}", rank=rank, machine_types=[t],
                    )
                    for rank, t in enumerate(args.instance_types, start=1)
                ]
            )
        return gcp.compute.RegionInstanceGroupManager(
            f"{name}-mig",
            name=args.group_name,
            region=args.region,
            base_instance_name=args.group_name[:54],
            versions=[gcp.compute.RegionInstanceGroupManagerVersionArgs(
                name="trainer", instance_template=self.template.self_link_unique,
            )],
            target_size=args.nodes if args.size is None else args.size,
            # Without a list GCE uses three of the region's zones when it has more, which
            # ops preflight could not know; with every zone named, a zone that has the GPU is never left out.
            distribution_policy_zones=list(args.zones) or gcp.compute.get_zones_output(
                project=args.gcp_project, region=args.region, opts=pulumi.InvokeOptions(parent=self)).names,
            # All workers in one zone (fast links between them), whichever has capacity.
            distribution_policy_target_shape="ANY_SINGLE_ZONE",
            instance_flexibility_policy=flexibility,
            # A preempted VM is recreated ("repaired") from the configuration it was created
            # with unless told otherwise: after a `pulumi up` that changed the code or the
            # image, replacements would still run the old ones (from a template that may be
            # deleted by then). YES: every repair uses the group's current template.
            instance_lifecycle_policy=gcp.compute.RegionInstanceGroupManagerInstanceLifecyclePolicyArgs(
                force_update_on_repair="YES", default_action_on_failure="REPAIR",
            ),
            update_policy=gcp.compute.RegionInstanceGroupManagerUpdatePolicyArgs(
                # No proactive rollout: a running job is never replaced by a template change;
                # new VMs (after preemption) get the new template.
                type="OPPORTUNISTIC", minimal_action="REPLACE", instance_redistribution_type="NONE",
            ),
            wait_for_instances=False,
            # The machine sets the size to 0 when the run is done, and the placement controller
            # moves the run between groups; a later `pulumi up` must undo neither.
            # Zones are chosen when the group is created (GCE cannot change them): a group made
            # before the list was set keeps the zones it has instead of being replaced mid-run.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["targetSize", "distributionPolicyZones"],
                                        depends_on=args.wait_for),
        )

    def _runtime_cap(self, name: str, args: SpotGroupArgs) -> None:
        """A Cloud Scheduler job that resizes the group to zero at the runtime cap."""
        group_path = f"projects/{args.gcp_project}/regions/{args.region}/instanceGroupManagers/{args.group_name}"
        # The cloud's own deadline. The schedule is computed at each `pulumi up` and
        # ignored after creation, so a later `up` does not push the deadline back.
        gcp.cloudscheduler.Job(
            f"{name}-runtime-cap",
            name=f"{args.group_name}-runtime-cap",
            region=args.region,
            description="trainstack: resize the group to zero at the runtime cap",
            schedule=cap_cron(args.max_runtime_hours),
            time_zone="Etc/UTC",
            http_target=gcp.cloudscheduler.JobHttpTargetArgs(
                http_method="POST",
                uri=f"https://compute.googleapis.com/compute/v1/{group_path}/resize?size=0",
                oauth_token=gcp.cloudscheduler.JobHttpTargetOauthTokenArgs(
                    service_account_email=args.service_account_email,
                    scope="https://www.googleapis.com/auth/cloud-platform",
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["schedule"], depends_on=[self.group]),
        )

    def _firewalls(self, name: str, args: SpotGroupArgs, child: pulumi.ResourceOptions) -> None:
        # The default network lets SSH in from anywhere (default-allow-ssh) and lets every
        # VM of the network in; this rule shuts all of that out for our machines, and the
        # narrower allows below (higher priority) let back in only what the stack names.
        gcp.compute.Firewall(
            f"{name}-deny-inbound",
            network=NETWORK,
            direction="INGRESS",
            priority=1000,
            source_ranges=["0.0.0.0/0"],
            denies=[gcp.compute.FirewallDenyArgs(protocol="all")],
            target_tags=[args.network_tag],
            description="trainstack: nothing inbound unless allowed below",
            opts=child,
        )
        if args.allowed_cidrs:
            gcp.compute.Firewall(
                f"{name}-ssh",
                network=NETWORK,
                direction="INGRESS",
                priority=900,
                source_ranges=list(args.allowed_cidrs),
                allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])],
                target_tags=[args.network_tag],
                description="trainstack: SSH from access.allowedCidrs",
                opts=child,
            )
        if args.nodes > 1:
            gcp.compute.Firewall(
                f"{name}-workers",
                network=NETWORK,
                direction="INGRESS",
                priority=900,
                source_tags=[args.network_tag],
                target_tags=[args.network_tag],
                # Every port: TF's gRPC servers listen on WORKER_PORTS (components/machine.py),
                # but NCCL's collectives connect on ephemeral ports it cannot be pinned to.
                allows=[gcp.compute.FirewallAllowArgs(protocol="all")],
                description="trainstack: training peers reach each other (members only)",
                opts=child,
            )
