"""Finding a stack's run and machines: its outputs (through the pulumi CLI) and its running instances.

``stack_outputs`` asks the real ``pulumi`` CLI (``pulumi stack output --json``), so the
operator sees what ``pulumi up`` recorded, whichever backend holds the state. Machines are
found by their group: on AWS with boto3 (``ec2.describe_instances`` filtered by the tag
the Auto Scaling group puts on each instance), on GCP with the ``gcloud`` CLI (instances
of the managed group carry its base name). The cloud is read from the run URI's scheme.

Also holds the command-line options every machine-facing command shares (``--stack`` /
``--host`` / ``--user`` / ``--key``…) so ``logs`` and ``tunnel`` read them the same way.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from components.project import PLACEMENTS_OUTPUT, ROOT

PULUMI_TIMEOUT_S = 120
GCLOUD_TIMEOUT_S = 120
ASG_TAG = "aws:autoscaling:groupName"
# GCE names managed instances "<base>-<4 characters>"; the base is the group name cut to 54.
GCE_BASE_LEN = 54


class HostsError(Exception):
    """Finding the run or its machines failed; the message says what to do."""


@dataclass(frozen=True)
class Host:
    """One running machine of a stack."""

    name: str
    public_ip: str | None
    private_ip: str | None
    launched: str = ""
    zone: str = ""

    def address(self, *, private: bool = False) -> str:
        """The address to SSH to: the public IP, or the private one when asked (VPN, bastion)."""
        ip = self.private_ip if private else self.public_ip
        if not ip:
            which = "private" if private else "public"
            hint = "" if private else "; reach it over a VPN with --private"
            raise HostsError(f"machine {self.name} has no {which} IP{hint}")
        return ip


def _run_cli(argv: list[str], what: str, timeout_s: int, *, cwd: Path | str | None = None) -> subprocess.CompletedProcess:
    """Run an operator's CLI (pulumi, gcloud) within a bound; its failure is one line with its last words."""
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise HostsError(f"{what} took over {timeout_s} s; try again") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise HostsError(f"{what} failed: {last}")
    return proc


def stack_outputs(stack: str, *, cwd: Path | str = ROOT) -> dict:
    """The stack's outputs from ``pulumi stack output --json --stack STACK`` (run in the project folder)."""
    exe = shutil.which("pulumi")
    if exe is None:
        raise HostsError(
            "the pulumi CLI is not on PATH, so --stack cannot be resolved; "
            "install it (https://www.pulumi.com/docs/install/) or pass --run-uri / --host"
        )
    proc = _run_cli([exe, "stack", "output", "--json", "--stack", stack], f"pulumi stack output --stack {stack}",
                    PULUMI_TIMEOUT_S, cwd=cwd)
    try:
        outputs = json.loads(proc.stdout or "{}")
    except ValueError:
        raise HostsError(f"pulumi stack output --stack {stack} did not print JSON") from None
    if not isinstance(outputs, dict):
        raise HostsError(f"pulumi stack output --stack {stack} printed {type(outputs).__name__}, not an object")
    return outputs


def require_output(outputs: dict, key: str, stack: str) -> str:
    """One output by name, or an error saying the stack has not been deployed with it."""
    value = outputs.get(key)
    if not isinstance(value, str) or not value:
        raise HostsError(f"stack {stack} has no {key} output; run `pulumi up` for it first")
    return value


def run_uri_for_stack(stack: str) -> str:
    """The run URI the stack trains into (its ``runUri`` output)."""
    return require_output(stack_outputs(stack), "runUri", stack)


def cloud_of(run_uri: str) -> str:
    """``aws`` or ``gcp``, from the run URI's scheme."""
    scheme = run_uri.split("://", 1)[0].lower()
    clouds = {"s3": "aws", "gs": "gcp"}
    if scheme not in clouds:
        raise HostsError(f"run URI {run_uri!r} is not on a cloud (s3:// or gs://): no machines to find")
    return clouds[scheme]


def aws_hosts(group: str, region: str | None = None) -> list[Host]:
    """Running EC2 instances of the Auto Scaling group ``group``, oldest first."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    ec2 = boto3.session.Session().client("ec2", region_name=region)
    filters = [
        {"Name": f"tag:{ASG_TAG}", "Values": [group]},
        {"Name": "instance-state-name", "Values": ["running"]},
    ]
    hosts = []
    try:
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page.get("Reservations", []):
                for inst in reservation.get("Instances", []):
                    hosts.append(
                        Host(
                            name=inst["InstanceId"],
                            public_ip=inst.get("PublicIpAddress"),
                            private_ip=inst.get("PrivateIpAddress"),
                            launched=str(inst.get("LaunchTime", "")),
                            zone=inst.get("Placement", {}).get("AvailabilityZone", ""),
                        )
                    )
    except (BotoCoreError, ClientError) as e:
        raise HostsError(f"cannot list the instances of {group}: {e}") from None
    return sorted(hosts, key=lambda h: (h.launched, h.name))


def _project_flag(project: str | None) -> list[str]:
    # gcloud otherwise reads its own configured project, which need not be the stack's.
    return ["--project", project] if project else []


def gcp_hosts(group: str, region: str | None = None, project: str | None = None) -> list[Host]:
    """Running GCE instances of the managed instance group ``group`` (via ``gcloud``), oldest first.
    ``project``: the stack's project (its ``project`` output), not the one gcloud is set to."""
    # The stack has no GCE client library among its dependencies; the operator's gcloud
    # is already authenticated for the project, as pulumi itself is.
    exe = shutil.which("gcloud")
    if exe is None:
        raise HostsError("the gcloud CLI is not on PATH, so the stack's machines cannot be listed; pass --host")
    base = re.escape(group[:GCE_BASE_LEN])
    flt = f"name~'^{base}-[a-z0-9]{{4}}$' AND status=RUNNING"
    if region:
        flt += f" AND zone~'/zones/{re.escape(region)}-'"
    proc = _run_cli([exe, "compute", "instances", "list", *_project_flag(project), "--format=json",
                     f"--filter={flt}"], "gcloud compute instances list", GCLOUD_TIMEOUT_S)
    hosts = []
    for inst in json.loads(proc.stdout or "[]"):
        nic = (inst.get("networkInterfaces") or [{}])[0]
        nat = next((a.get("natIP") for a in nic.get("accessConfigs") or [] if a.get("natIP")), None)
        hosts.append(
            Host(
                name=inst["name"],
                public_ip=nat,
                private_ip=nic.get("networkIP"),
                launched=inst.get("creationTimestamp", ""),
                zone=str(inst.get("zone", "")).rsplit("/", 1)[-1],
            )
        )
    return sorted(hosts, key=lambda h: (h.launched, h.name))


@dataclass(frozen=True)
class GroupState:
    """What the stack's group is doing: machines running, asked for, and why launches failed."""

    running: int
    desired: int | None
    launch_failures: tuple[str, ...] = ()  # one line each, newest first


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def aws_group_state(group: str, region: str | None = None, *, client=None, limit: int = 3) -> GroupState:
    """The Auto Scaling group's size and its failed launches since the last successful one."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    asg = client or boto3.session.Session().client("autoscaling", region_name=region)
    try:
        found = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
        activities = asg.describe_scaling_activities(AutoScalingGroupName=group, MaxRecords=20)["Activities"]
    except (BotoCoreError, ClientError) as e:
        raise HostsError(f"cannot read the group {group}: {e}") from None
    if not found:
        raise HostsError(f"no Auto Scaling group {group} (was the stack destroyed?)")
    running = sum(1 for i in found[0].get("Instances", []) if i.get("LifecycleState") == "InService")
    failures = []
    for a in sorted(activities, key=lambda a: a.get("StartTime") or 0, reverse=True):
        if a.get("StatusCode") == "Successful" and "Launching" in str(a.get("Description", "")):
            break  # older failures were overcome by this launch
        if a.get("StatusCode") in ("Failed", "Cancelled"):
            when = a.get("StartTime")
            stamp = f"{when:%H:%M} " if hasattr(when, "strftime") else ""
            failures.append(stamp + _one_line(a.get("StatusMessage") or a.get("Description") or "launch failed"))
    return GroupState(running=running, desired=found[0].get("DesiredCapacity"), launch_failures=tuple(failures[:limit]))


def gcp_group_state(group: str, region: str | None = None, *, project: str | None = None, limit: int = 3) -> GroupState:
    """The managed instance group's running machines, target size and latest errors (``gcloud``)."""
    exe = shutil.which("gcloud")
    if exe is None:
        raise HostsError("the gcloud CLI is not on PATH, so the stack's group cannot be read")
    where = (["--region", region] if region else []) + _project_flag(project)

    def call(*argv: str) -> object:
        try:
            proc = subprocess.run([exe, "compute", "instance-groups", "managed", *argv, group, *where,
                                   "--format=json"], capture_output=True, text=True, timeout=GCLOUD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise HostsError(f"gcloud compute instance-groups managed {argv[0]} took over {GCLOUD_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            raise HostsError(f"gcloud compute instance-groups managed {argv[0]} {group} failed: {last}")
        return json.loads(proc.stdout or "null")

    described = call("describe") or {}
    errors = call("list-errors", f"--limit={limit}") or []
    failures = []
    for e in errors if isinstance(errors, list) else []:
        err = e.get("error") or {}
        stamp = str(e.get("timestamp", ""))[11:16]
        failures.append(f"{stamp + ' ' if stamp else ''}{_one_line(err.get('code', '') + ': ' + err.get('message', ''))}")
    return GroupState(running=len(gcp_hosts(group, region, project)), desired=described.get("targetSize"),
                      launch_failures=tuple(failures[:limit]))


@functools.lru_cache(maxsize=8)
def _outputs_once(stack: str) -> dict:
    # `status --watch` reads the group at every refresh; the outputs do not change meanwhile.
    return stack_outputs(stack)


def stack_group_state(stack: str) -> GroupState:
    """The deployed stack's group (see :class:`GroupState`)."""
    outputs = _outputs_once(stack)
    cloud = cloud_of(require_output(outputs, "runUri", stack))
    for output, what in (("sagemakerJob", "a SageMaker training job"), ("vertexJob", "a Vertex AI custom job")):
        if outputs.get(output):
            # A managed stack has no group; its job is found through the run folder once submitted.
            raise HostsError(f"stack {stack} runs as {what}, not submitted yet: python -m ops start --stack {stack}")
    group = require_output(outputs, "groupName", stack)
    region = outputs.get("region") or None
    if cloud == "aws":
        return aws_group_state(group, region)
    return gcp_group_state(group, region, project=outputs.get("project"))


def placement_group_state(stack: str, index: int) -> GroupState:
    """The group of placement ``index`` of a stack with several (its ``placements`` output): after a
    move the run trains there, not in the stack's home group."""
    from controller.config import ConfigError, parse

    value = _outputs_once(stack).get(PLACEMENTS_OUTPUT)
    try:
        config = parse(value if isinstance(value, str) else json.dumps(value))
        p = config.placements[index]
    except (ConfigError, IndexError) as e:
        raise HostsError(f"stack {stack}'s placements output has no placement {index}: {e}") from None
    if p.cloud == "aws":
        return aws_group_state(p.group, p.region)
    return gcp_group_state(p.group, p.region, project=p.project)


def stack_hosts(stack: str) -> list[Host]:
    """The running machines of a deployed stack, oldest first (its group and region from the outputs)."""
    outputs = stack_outputs(stack)
    cloud = cloud_of(require_output(outputs, "runUri", stack))
    group = require_output(outputs, "groupName", stack)
    region = outputs.get("region") or None
    return aws_hosts(group, region) if cloud == "aws" else gcp_hosts(group, region, outputs.get("project"))


# -- command-line options shared by the commands that reach a machine ------------------


def add_machine_args(parser: argparse.ArgumentParser, *, extra_source: bool = False) -> None:
    """``--stack``/``--host`` and the SSH options, for commands that reach a machine.

    ``extra_source`` adds ``--run-uri`` as a third choice, for commands that can also read the bucket.
    """
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--stack", help="stack name: its running machines are found from its outputs")
    where.add_argument("--host", help="address of the machine to reach (skips the lookup)")
    if extra_source:
        where.add_argument("--run-uri", help="the run's URI (s3://, gs://, file://), for --from-bucket")
    parser.add_argument("--user", default="ubuntu", help="SSH user (default: %(default)s)")
    parser.add_argument("--key", help="SSH private key file (default: ssh-agent and ~/.ssh/id_*)")
    parser.add_argument("--port", type=int, default=22, help="SSH port (default: %(default)s)")
    parser.add_argument("--private", action="store_true", help="use the machines' private IPs (VPN, bastion)")
    parser.add_argument(
        "--accept-new-host-key",
        action="store_true",
        help="trust a machine not yet in ~/.ssh/known_hosts and save its key there (a changed key is still refused)",
    )


def machine_addresses(args: argparse.Namespace) -> list[str]:
    """The addresses the command should reach: ``--host``, or every running machine of ``--stack``."""
    if args.host:
        return [args.host]
    hosts = stack_hosts(args.stack)
    if not hosts:
        raise HostsError(f"stack {args.stack} has no running machine (the run may be finished or waiting for spot)")
    return [h.address(private=args.private) for h in hosts]

