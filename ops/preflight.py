"""`python -m ops preflight --stack NAME`: what would make a real launch fail silently, checked before `pulumi up`.

A `pulumi up` succeeds even when no machine can ever start: the group is created and
keeps retrying, and the run stays NOT STARTED. Preflight asks the cloud, with the
operator's credentials, about what decides that:

AWS
- the vCPU quota of each instance family the stack uses (Service Quotas; spot or
  on-demand as the stack asks): vCPUs per type (EC2's own figures) x `compute.nodes`;
- each instance type offered in the zones the group may use: those of its subnets
  (`compute.subnets`, else the default VPC's), narrowed to `compute.zones`; several machines
  use one zone, the one the program's own `choose_zone` picks;
- a way out to the internet from each of the group's subnets in those zones: a 0.0.0.0/0
  route to a NAT gateway, or to an internet gateway from a subnet that gives public IPs;
- the AMI: `compute.imageId`, else the Deep Learning AMI the group looks up by name;
- the bucket name: free, or already yours (then `storage.adopt: true` is needed), or
  someone else's (then another `storage.bucketName`).

GCP
- the GPU quota of the region for the machines' GPU (for Spot VMs the PREEMPTIBLE_ one when
  the project has any, else the standard one, which Spot VMs then use) and the project's
  GPUS_ALL_REGIONS, for `gpusPerNode` x `nodes` GPUs;
- each machine type (and an N1 machine's GPU) offered in a zone the group may use
  (`compute.zones`, else every zone of the region: the group is given that list);
- the `default` network the machines use: there, with a subnet in the region and a 0.0.0.0/0 route;
- a `gs://` `run.dataUri`: the bucket exists and, unless `run.dataGrant` is false, you may set
  its IAM policy (the stack grants the machines read access there; if not, whether the bucket
  is public, and what to ask its owner);
- the APIs that must be on before the first `pulumi up` (the stack turns on the rest), and the
  Compute Engine API, which every check above reads (off: one line says to turn it on).

A stack of several placements (docs/placements.md) is checked in each of them: the checks above in
the placement's cloud, region and project, but for the bucket and the data, which are home's.

Output: one line per problem, each with its fix; exit 1 when there are problems, 0 when
clean, 2 when the stack's config is invalid (the settings loader's one-line error).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from components import settings as config
from components.project import STACKS_DIR
from ops.cli import EXIT_ERROR, EXIT_FAILED, EXIT_OK

# EC2 vCPU quotas by instance family (Service Quotas, service code "ec2"): the quota
# name, its code for spot requests and for running on-demand instances.
AWS_QUOTAS: dict[str, tuple[str, str, str]] = {
    "g": ("G and VT", "L-3819A6DF", "L-DB2E81BA"),
    "vt": ("G and VT", "L-3819A6DF", "L-DB2E81BA"),
    "p": ("P", "L-7212CCBC", "L-417A185B"),
}

# GCE machine family (or N1 accelerator) -> the GPU quota metric of its GPUs.
GCP_GPU_METRICS: list[tuple[str, str]] = [
    (r"^g2-", "NVIDIA_L4_GPUS"),
    (r"^a2-ultragpu-", "NVIDIA_A100_80GB_GPUS"),
    (r"^a2-", "NVIDIA_A100_GPUS"),
    (r"^a3-megagpu-", "NVIDIA_H100_MEGA_GPUS"),
    (r"^a3-", "NVIDIA_H100_GPUS"),
]
GCP_ACCELERATOR_METRICS = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
    "nvidia-tesla-k80": "NVIDIA_K80_GPUS",
}


@dataclass(frozen=True)
class Problem:
    """One thing that would stop the launch, and what to do about it."""

    what: str
    fix: str

    def line(self) -> str:
        """The problem as the one line preflight prints."""
        return f"{self.what}; fix: {self.fix}"


def _family(instance_type: str) -> str:
    return re.match(r"^[a-z]+", instance_type).group(0)  # type: ignore[union-attr]


def _aws_error(e: Exception) -> str:
    import botocore.exceptions

    if isinstance(e, botocore.exceptions.ClientError):
        err = e.response.get("Error", {})
        return f"{err.get('Code')}: {err.get('Message')}"
    return f"{type(e).__name__}: {e}"


# -- AWS -------------------------------------------------------------------------------


def aws_quota_problems(settings: config.Settings, ec2: Any, quotas: Any) -> list[Problem]:
    """Each family's vCPU quota against the vCPUs the stack may need (largest type x nodes)."""
    c = settings.compute
    answer = ec2.describe_instance_types(InstanceTypes=list(c.instance_types))
    vcpus = {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"]) for t in answer["InstanceTypes"]}
    problems = []
    by_quota: dict[str, list[str]] = {}
    for t in c.instance_types:
        family = _family(t)
        if family not in AWS_QUOTAS:
            continue
        _, spot_code, on_demand_code = AWS_QUOTAS[family]
        by_quota.setdefault(spot_code if c.spot else on_demand_code, []).append(t)
    for code, types in by_quota.items():
        name = AWS_QUOTAS[_family(types[0])][0]
        kind = f"All {name} Spot Instance Requests" if c.spot else f"Running On-Demand {name} instances"
        known = [t for t in types if t in vcpus]
        if not known:
            continue
        biggest = max(known, key=lambda t: vcpus[t])
        need = vcpus[biggest] * c.nodes
        try:
            value = _quota_value(quotas, code)
        except Exception as e:  # noqa: BLE001 - any failure to read is reported, not raised
            problems.append(Problem(f"could not read the EC2 quota '{kind}' ({code}) in {settings.region}: "
                                    f"{_aws_error(e)}", "allow servicequotas:GetServiceQuota to these credentials, "
                                    "or check the quota in the Service Quotas console"))
            continue
        if value < need:
            problems.append(Problem(
                f"EC2 quota '{kind}' ({code}) in {settings.region} is {value:g} vCPUs; the stack needs {need} "
                f"({biggest}: {vcpus[biggest]} vCPUs x {c.nodes} node(s)), so no machine would start",
                f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {code} "
                f"--desired-value {need} --region {settings.region} (new accounts start at 0; allow days)",
            ))
    return problems


def _quota_value(quotas: Any, code: str) -> float:
    try:
        return float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
    except Exception as e:
        # An account that never changed a quota may have no applied value: the default holds.
        if getattr(e, "response", {}).get("Error", {}).get("Code") != "NoSuchResourceException":
            raise
        return float(quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])


def aws_subnets(settings: config.Settings, ec2: Any) -> list[tuple[str, str]]:
    """(subnet id, zone) of the subnets the group may use: compute.subnets, else the default VPC's."""
    if settings.compute.subnets:
        pages = ec2.get_paginator("describe_subnets").paginate(SubnetIds=list(settings.compute.subnets))
    else:
        vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            return []
        pages = ec2.get_paginator("describe_subnets").paginate(
            Filters=[{"Name": "vpc-id", "Values": [vpcs[0]["VpcId"]]}])
    return sorted((s["SubnetId"], s["AvailabilityZone"]) for page in pages for s in page["Subnets"])


def _offerings(ec2: Any, types: list[str], zones: list[str]) -> list[tuple[str, str]]:
    """EC2's (instance type, zone) offerings of these types in these zones."""
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": types}, {"Name": "location", "Values": zones}],
    )
    return [(o["InstanceType"], o["Location"]) for page in pages for o in page["InstanceTypeOfferings"]]


def _group_zones(settings: config.Settings, ec2: Any) -> tuple[list[str], list[tuple[str, str]]]:
    """The zones the group launches in and EC2's offerings of its types there; ValueError when none.

    The zones are those of the group's subnets (narrowed to compute.zones); several machines
    use one, chosen by the program's own `choose_zone`, so this is the zone `pulumi up` picks.
    """
    from components.aws.naming import choose_zone

    c = settings.compute
    subnets = aws_subnets(settings, ec2)
    if not subnets:
        raise ValueError(f"no subnet for the group in {settings.region} ("
                         + ("compute.subnets found none" if c.subnets else "the region has no default VPC")
                         + "); set compute.subnets to subnets of a VPC in this region")
    covered = sorted({zone for _, zone in subnets})
    zones = [z for z in c.zones if z in covered] if c.zones else covered
    if not zones:
        raise ValueError(f"compute.zones {list(c.zones)}: no subnet of the group is in them (the subnets are in "
                         f"{', '.join(covered)}); choose compute.zones your subnets cover, or other subnets")
    offers = _offerings(ec2, list(c.instance_types), zones)
    if c.nodes > 1:
        zones = [choose_zone(subnets, list(c.zones), offers, list(c.instance_types))[0]]
    return zones, [(t, z) for t, z in offers if z in zones]


def aws_zones(settings: config.Settings, ec2: Any) -> list[str]:
    """The zones the group launches in: its subnets' (narrowed to compute.zones); one for several machines."""
    return _group_zones(settings, ec2)[0]


def aws_offering_problems(settings: config.Settings, ec2: Any) -> list[Problem]:
    """Instance types the group's zones do not offer (a type offered nowhere there can never launch)."""
    c = settings.compute
    try:
        zones, offers = _group_zones(settings, ec2)
    except ValueError as e:
        what, _, fix = str(e).partition("; ")
        return [Problem(what, fix)]
    offered: dict[str, set[str]] = {t: set() for t in c.instance_types}
    for itype, zone in offers:
        offered.setdefault(itype, set()).add(zone)
    problems = []
    where = f"zone {zones[0]} (several machines share one zone)" if c.nodes > 1 else f"zones {', '.join(zones)}"
    missing = [t for t in c.instance_types if not offered.get(t)]
    if missing and len(missing) == len(c.instance_types):
        problems.append(Problem(
            f"none of compute.instanceTypes ({', '.join(c.instance_types)}) is offered in {where} of {settings.region}",
            "choose types the region offers (aws ec2 describe-instance-type-offerings --location-type "
            f"availability-zone --region {settings.region}) or other compute.zones",
        ))
    else:
        for t in missing:
            problems.append(Problem(f"{t} is not offered in {where} of {settings.region}",
                                    f"remove {t} from compute.instanceTypes or choose compute.zones that offer it"))
    return problems


def _default_route(table: dict) -> dict | None:
    """The route table's active IPv4 default route (0.0.0.0/0), if any: a blackhole one (its target is gone) is none."""
    for route in table.get("Routes", []):
        if route.get("DestinationCidrBlock") == "0.0.0.0/0" and route.get("State", "active") == "active":
            return route
    return None


def aws_network_problems(settings: config.Settings, ec2: Any) -> list[Problem]:
    """Subnets of the group whose machines could not reach the internet.

    A machine reads its bucket, pulls the image, installs packages and sets its group's size over
    the network; without a way out every boot waits out its bounds, fails the run, and the group
    launches the next machine, each billed, until the runtime cap. A subnet's way out is its route
    table's 0.0.0.0/0 route (the subnet's own table, else its VPC's main one): to a NAT gateway, or
    to an internet gateway for machines with a public IP (the launch template asks none, so the
    subnet must give one: MapPublicIpOnLaunch). Other targets (a transit gateway, a firewall
    appliance, a peering) cannot be judged from here and pass.
    """
    try:
        zones = aws_zones(settings, ec2)
    except ValueError:
        return []  # no subnet, or none in compute.zones: the instance-type check says so
    ids = [sid for sid, zone in aws_subnets(settings, ec2) if zone in zones]
    if not ids:
        return []
    subnets = [s for page in ec2.get_paginator("describe_subnets").paginate(SubnetIds=ids) for s in page["Subnets"]]
    own: dict[str, dict] = {}
    for page in ec2.get_paginator("describe_route_tables").paginate(
            Filters=[{"Name": "association.subnet-id", "Values": ids}]):
        for table in page["RouteTables"]:
            for a in table.get("Associations", []):
                if a.get("SubnetId"):
                    own[a["SubnetId"]] = table
    main: dict[str, dict] = {}
    for vpc in sorted({s["VpcId"] for s in subnets if s["SubnetId"] not in own}):
        tables = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                                    {"Name": "association.main", "Values": ["true"]}])["RouteTables"]
        if tables:
            main[vpc] = tables[0]
    closed: dict[str, list[str]] = {}  # route table -> its subnets without a way out
    private: list[tuple[str, str, str]] = []  # (subnet, zone, internet gateway) for machines without a public IP
    for s in sorted(subnets, key=lambda s: s["SubnetId"]):
        table = own.get(s["SubnetId"]) or main.get(s["VpcId"])
        route = _default_route(table) if table else None
        if route is None:
            closed.setdefault(table["RouteTableId"] if table else "none", []).append(
                f"{s['SubnetId']} ({s['AvailabilityZone']})")
        elif str(route.get("GatewayId", "")).startswith("igw-") and not s.get("MapPublicIpOnLaunch"):
            private.append((s["SubnetId"], s["AvailabilityZone"], route["GatewayId"]))
    where = "compute.subnets" if settings.compute.subnets else "the default VPC's subnet(s)"
    problems = [Problem(
        f"{where} {', '.join(names)} of the group have no route to the internet (route table {rtb} has no "
        "active 0.0.0.0/0 route): every machine would wait out its bounds reaching the bucket and the image, "
        "and the group would launch the next one until the runtime cap",
        f"add a 0.0.0.0/0 route to a NAT gateway (or, for subnets that give public IPs, an internet gateway) "
        f"to {rtb}, or set compute.subnets to subnets that have one")
        for rtb, names in closed.items()]
    problems += [Problem(
        f"subnet {sid} ({zone}) routes to internet gateway {igw} but gives its machines no public IP "
        "(MapPublicIpOnLaunch is off), so they cannot reach the internet through it",
        f"aws ec2 modify-subnet-attribute --subnet-id {sid} --map-public-ip-on-launch, or use subnets "
        "behind a NAT gateway") for sid, zone, igw in private]
    return problems


def aws_image_problems(settings: config.Settings, ec2: Any) -> list[Problem]:
    """The AMI the group would use: compute.imageId, else the Deep Learning AMI found by name."""
    from components.aws.naming import DLAMI_NAME

    image_id = settings.compute.image_id
    if image_id:
        try:
            images = ec2.describe_images(ImageIds=[image_id])["Images"]
        except Exception as e:  # noqa: BLE001 - an unknown id is an error answer, reported as a problem
            images = []
            detail = _aws_error(e)
        else:
            detail = "not found"
        usable = [i for i in images if i.get("State") == "available"]
        if not usable:
            return [Problem(f"compute.imageId {image_id} is not an available AMI in {settings.region} ({detail})",
                            "AMIs are regional: copy it here (aws ec2 copy-image) or use this region's id")]
        return []
    images = ec2.describe_images(Owners=["amazon"], Filters=[
        {"Name": "name", "Values": [DLAMI_NAME]},
        {"Name": "architecture", "Values": ["x86_64"]},
        {"Name": "state", "Values": ["available"]},
    ])["Images"]
    if not images:
        return [Problem(f"no AMI named '{DLAMI_NAME}' from Amazon in {settings.region}",
                        "set compute.imageId to a GPU AMI of this region")]
    return []


def aws_bucket_name(settings: config.Settings, sts: Any) -> str:
    """The bucket the stack would create: storage.bucketName, else the stack's generated name."""
    if settings.storage.bucket_name:
        return settings.storage.bucket_name
    from components.aws.naming import default_bucket_name
    from ops.mockrun import project_name

    account = sts.get_caller_identity()["Account"]
    return default_bucket_name(project=project_name(), stack=settings.stack, account_id=account,
                               region=settings.region)


def aws_bucket_problems(settings: config.Settings, s3: Any, sts: Any) -> list[Problem]:
    """The bucket name must be free (a first up), or yours with storage.adopt (an up after destroy)."""
    import botocore.exceptions

    name = aws_bucket_name(settings, sts)
    adopt = settings.storage.adopt
    try:
        s3.head_bucket(Bucket=name)
        state = "yours"
    except botocore.exceptions.ClientError as e:
        code = str(e.response.get("Error", {}).get("Code"))
        state = {"404": "free", "NoSuchBucket": "free", "403": "taken", "AccessDenied": "taken"}.get(code, "")
        if not state:
            return [Problem(f"could not check bucket {name}: {_aws_error(e)}", "check the credentials and retry")]
    if state == "taken":
        return [Problem(f"bucket {name} belongs to another account (bucket names are global)",
                        "set storage.bucketName to a name of your own")]
    if state == "yours" and not adopt:
        return [Problem(f"bucket {name} already exists in your account (kept by an earlier `pulumi destroy`?); "
                        "creating it again fails", "set storage.adopt: true to take it over with its data")]
    if state == "free" and adopt:
        return [Problem(f"storage.adopt is true but bucket {name} does not exist", "set storage.adopt: false")]
    return []


def check_aws(settings: config.Settings, session: Any = None, *, home: bool = True) -> list[Problem]:
    """Every AWS check; `session` is a boto3 Session (default: the environment's credentials).

    `home=False`: a placement's region, whose run folder is home's bucket: no bucket check there."""
    import boto3

    session = session or boto3.session.Session(region_name=settings.region)
    client = lambda name: session.client(name, region_name=settings.region)  # noqa: E731 - one line, local
    ec2 = client("ec2")
    checks: list[tuple[str, Callable[[], list[Problem]]]] = [
        ("instance types", lambda: aws_offering_problems(settings, ec2)),
        ("network", lambda: aws_network_problems(settings, ec2)),
        ("quotas", lambda: aws_quota_problems(settings, ec2, client("service-quotas"))),
        ("image", lambda: aws_image_problems(settings, ec2)),
    ]
    if home:
        checks.append(("bucket", lambda: aws_bucket_problems(settings, client("s3"), client("sts"))))
    return _run_checks(checks, _aws_error)


# -- GCP -------------------------------------------------------------------------------


class GcpApi(Protocol):
    """The few GCP reads preflight needs (a fake in tests, REST with google-auth for real)."""

    def region_quotas(self, project: str, region: str) -> dict[str, tuple[float, float]]:
        """metric -> (limit, usage) of the region's Compute Engine quotas."""

    def project_quotas(self, project: str) -> dict[str, tuple[float, float]]:
        """metric -> (limit, usage) of the project's global Compute Engine quotas."""

    def enabled_services(self, project: str) -> set[str]:
        """Names of the services (APIs) enabled in the project."""

    def region_zones(self, project: str, region: str) -> list[str]:
        """The region's zone names."""

    def offered(self, project: str, zone: str, kind: str, name: str) -> bool:
        """Whether the zone offers the machine type (kind "machineTypes") or GPU ("acceleratorTypes")."""

    def bucket_permissions(self, bucket: str, permissions: list[str]) -> set[str] | None:
        """Which of `permissions` the caller has on a GCS bucket; None when there is no such bucket."""

    def publicly_readable(self, bucket: str, prefix: str) -> bool:
        """Whether anyone, without credentials, may list the bucket's objects under `prefix`."""

    def network(self, project: str, name: str) -> dict | None:
        """The project's VPC network of that name (Compute Engine's resource); None when there is none."""

    def routes(self, project: str) -> list[dict]:
        """Every route of the project (Compute Engine's resources)."""


COMPUTE_API = "compute.googleapis.com"


class ApiDisabled(RuntimeError):
    """A GCP read refused because its API is off in the project (HTTP 403, reason SERVICE_DISABLED)."""

    def __init__(self, service: str, detail: str) -> None:
        super().__init__(f"{service} is off: {detail}")
        self.service = service


def api_disabled(status: int, doc: Any) -> ApiDisabled | None:
    """The ApiDisabled a GCP error answer stands for, or None when it is another error.

    Google's APIs answer a call to an API that is off with 403 and an ErrorInfo detail whose
    reason is SERVICE_DISABLED and whose metadata names the service (older ones only say
    accessNotConfigured, with the service's name in the message).
    """
    error = doc.get("error") if isinstance(doc, dict) else None
    if status != 403 or not isinstance(error, dict):
        return None
    message = str(error.get("message", ""))
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and detail.get("reason") == "SERVICE_DISABLED":
            service = (detail.get("metadata") or {}).get("service") or ""
            return ApiDisabled(service or "an API", message)
    if any(isinstance(e, dict) and e.get("reason") == "accessNotConfigured" for e in error.get("errors") or []):
        named = re.search(r"[a-z0-9-]+\.googleapis\.com", message)
        return ApiDisabled(named.group(0) if named else "an API", message)
    return None


class RestGcpApi:
    """GcpApi over the public REST endpoints, with Application Default Credentials (google-auth)."""

    def __init__(self, session: Any = None, anonymous: Any = None) -> None:
        if session is None:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
            session = AuthorizedSession(credentials)
        if anonymous is None:
            import requests

            anonymous = requests.Session()
        self._session, self._anonymous = session, anonymous

    def _get(self, url: str, params: dict | None = None, *, absent_ok: bool = False) -> dict | None:
        resp = self._session.get(url, params=params, timeout=30)
        if absent_ok and resp.status_code == 404:
            return None
        if resp.status_code != 200:
            try:
                doc = resp.json()
            except ValueError:
                doc = None
            disabled = api_disabled(resp.status_code, doc)
            if disabled:
                raise disabled
            raise RuntimeError(f"GET {url}: HTTP {resp.status_code} {resp.text[:200]}")
        return resp.json()

    def region_quotas(self, project: str, region: str) -> dict[str, tuple[float, float]]:
        """See GcpApi."""
        doc = self._get(f"https://compute.googleapis.com/compute/v1/projects/{project}/regions/{region}")
        return {q["metric"]: (float(q["limit"]), float(q.get("usage", 0))) for q in doc.get("quotas", [])}

    def project_quotas(self, project: str) -> dict[str, tuple[float, float]]:
        """See GcpApi."""
        doc = self._get(f"https://compute.googleapis.com/compute/v1/projects/{project}")
        return {q["metric"]: (float(q["limit"]), float(q.get("usage", 0))) for q in doc.get("quotas", [])}

    def region_zones(self, project: str, region: str) -> list[str]:
        """See GcpApi."""
        doc = self._get(f"https://compute.googleapis.com/compute/v1/projects/{project}/regions/{region}")
        return sorted(url.rsplit("/", 1)[-1] for url in doc.get("zones", []))

    def offered(self, project: str, zone: str, kind: str, name: str) -> bool:
        """See GcpApi."""
        url = f"https://compute.googleapis.com/compute/v1/projects/{project}/zones/{zone}/{kind}/{name}"
        return self._get(url, absent_ok=True) is not None

    def bucket_permissions(self, bucket: str, permissions: list[str]) -> set[str] | None:
        """See GcpApi (GCS testIamPermissions: the subset of `permissions` the caller has)."""
        doc = self._get(f"https://storage.googleapis.com/storage/v1/b/{bucket}/iam/testPermissions",
                        {"permissions": list(permissions)}, absent_ok=True)
        return None if doc is None else set(doc.get("permissions", []))

    def publicly_readable(self, bucket: str, prefix: str) -> bool:
        """See GcpApi: an object listing asked without credentials."""
        resp = self._anonymous.get(f"https://storage.googleapis.com/storage/v1/b/{bucket}/o",
                                   params={"prefix": prefix, "maxResults": 1}, timeout=30)
        return resp.status_code == 200

    def network(self, project: str, name: str) -> dict | None:
        """See GcpApi."""
        return self._get(f"https://compute.googleapis.com/compute/v1/projects/{project}/global/networks/{name}",
                         absent_ok=True)

    def routes(self, project: str) -> list[dict]:
        """See GcpApi."""
        found: list[dict] = []
        token = None
        while True:
            doc = self._get(f"https://compute.googleapis.com/compute/v1/projects/{project}/global/routes",
                            {"maxResults": 500, **({"pageToken": token} if token else {})})
            found += doc.get("items", [])
            token = doc.get("nextPageToken")
            if not token:
                return found

    def enabled_services(self, project: str) -> set[str]:
        """See GcpApi."""
        names: set[str] = set()
        token = None
        while True:
            params = {"filter": "state:ENABLED", "pageSize": 200, **({"pageToken": token} if token else {})}
            doc = self._get(f"https://serviceusage.googleapis.com/v1/projects/{project}/services", params)
            names |= {s["config"]["name"] for s in doc.get("services", [])}
            token = doc.get("nextPageToken")
            if not token:
                return names


def gcp_gpu_metric(machine_type: str, accelerator: str | None) -> str | None:
    """The quota metric of the GPUs a machine type has (or its N1 accelerator); None when unknown."""
    if machine_type.startswith("n1-"):
        return GCP_ACCELERATOR_METRICS.get(accelerator or "")
    return next((metric for pattern, metric in GCP_GPU_METRICS if re.match(pattern, machine_type)), None)


def gcp_gpu_quota(metric: str, region: dict[str, tuple[float, float]], *, spot: bool) -> str:
    """The region quota the group's GPUs draw on: Spot VMs use the PREEMPTIBLE_ one where the project
    has been granted any, else the standard one (Compute Engine's preemptible-quota rule)."""
    preemptible = f"PREEMPTIBLE_{metric}"
    if spot and region.get(preemptible, (0.0, 0.0))[0] > 0:
        return preemptible
    return metric


def gcp_quota_problems(settings: config.Settings, api: GcpApi) -> list[Problem]:
    """The region's GPU quota for each GPU the stack uses, and the project's all-regions GPU quota."""
    c = settings.compute
    need = c.gpus_per_node * c.nodes
    region = api.region_quotas(settings.project, settings.region)
    problems = []
    metrics = sorted({m for t in c.instance_types if (m := gcp_gpu_metric(t, c.accelerator))})
    for metric in metrics:
        name, note = gcp_gpu_quota(metric, region, spot=c.spot), ""
        if name != f"PREEMPTIBLE_{metric}" and c.spot:
            note = f" (Spot VMs use it while PREEMPTIBLE_{metric} is 0)"
        limit, used = region.get(name, (0.0, 0.0))
        if limit - used < need:
            problems.append(Problem(
                f"GPU quota {name} in {settings.region} is {limit:g}{_in_use(used)}{note}; the stack needs {need} "
                f"({c.gpus_per_node} per node x {c.nodes} node(s)), so no machine would start",
                f"request {need + used:g} in the console (IAM & Admin > Quotas, metric compute.googleapis.com/"
                f"{name.lower()}, region {settings.region})",
            ))
    limit, used = api.project_quotas(settings.project).get("GPUS_ALL_REGIONS", (0.0, 0.0))
    if limit - used < need:
        problems.append(Problem(
            f"GPU quota GPUS_ALL_REGIONS of project {settings.project} is {limit:g}{_in_use(used)}; "
            f"the stack needs {need}",
            f"request {need + used:g} 'GPUs (all regions)' in IAM & Admin > Quotas (new projects start at 0)",
        ))
    return problems


def _in_use(used: float) -> str:
    return f" with {used:g} in use" if used else ""


_GCLOUD_LIST = {"machineTypes": "machine-types", "acceleratorTypes": "accelerator-types"}


def gcp_zones(settings: config.Settings, api: GcpApi) -> list[str]:
    """The zones the group may use, as the program sets them: compute.zones, else every zone of the region."""
    return list(settings.compute.zones) or api.region_zones(settings.project, settings.region)


def gcp_offering_problems(settings: config.Settings, api: GcpApi) -> list[Problem]:
    """Machine types (and an N1 machine's GPU) offered in none of the zones the group may use
    (it picks one zone among them that has the hardware and capacity)."""
    c = settings.compute
    zones = gcp_zones(settings, api)
    wanted = [("machineTypes", t, "compute.instanceTypes") for t in c.instance_types]
    if c.accelerator:
        wanted.append(("acceleratorTypes", c.accelerator, "compute.accelerator"))
    problems = []
    for kind, name, key in wanted:
        if not any(api.offered(settings.project, z, kind, name) for z in zones):
            problems.append(Problem(f"{name} ({key}) is offered in none of the zones {', '.join(zones)}",
                                    f"choose a {key} or compute.zones the region offers "
                                    f"(gcloud compute {_GCLOUD_LIST[kind]} list --filter='name={name}')"))
    return problems


SET_POLICY = "storage.buckets.setIamPolicy"


def gcp_network_problems(settings: config.Settings, api: GcpApi) -> list[Problem]:
    """The `default` network the machines use: it exists, has a subnet in the region, and a 0.0.0.0/0
    route to the internet gateway for the machines (their ephemeral public address reaches the bucket,
    the registry and the package index through it).

    Organizations often create projects without a `default` network (the policy
    `compute.skipDefaultNetworkCreation`): `pulumi up` would then create the bucket and the identity
    and fail at the firewall rules. A route through another next hop (an appliance, a load balancer)
    cannot be judged from here and passes; a route with tags serves only machines with one of them.
    """
    from components.gcp.naming import MACHINE_NETWORK, network_tag
    from ops.mockrun import project_name

    project, region = settings.project, settings.region
    net = api.network(project, MACHINE_NETWORK)
    if net is None:
        return [Problem(f"project {project} has no VPC network named {MACHINE_NETWORK!r}, which the machines and "
                        "their firewall rules use (organizations often skip it: compute.skipDefaultNetworkCreation)",
                        f"gcloud compute networks create {MACHINE_NETWORK} --subnet-mode=auto --project {project}")]
    if not any(f"/regions/{region}/subnetworks/" in url for url in net.get("subnetworks", [])):
        return [Problem(f"network {MACHINE_NETWORK} of project {project} has no subnet in {region}, so no machine "
                        "can start there",
                        f"gcloud compute networks subnets create {MACHINE_NETWORK}-{region} --network "
                        f"{MACHINE_NETWORK} --region {region} --range 10.128.0.0/20 --project {project} "
                        "(a range free in the network)")]
    tag = network_tag(project=project_name(), stack=settings.stack)
    for route in api.routes(project):
        if (str(route.get("network", "")).endswith(f"/global/networks/{MACHINE_NETWORK}")
                and route.get("destRange") == "0.0.0.0/0" and (not route.get("tags") or tag in route["tags"])):
            return []
    return [Problem(f"network {MACHINE_NETWORK} of project {project} has no 0.0.0.0/0 route for the machines: "
                    "they could not reach the bucket, the registry or the package index, and every boot would "
                    "wait out its bounds until the runtime cap",
                    f"gcloud compute routes create {MACHINE_NETWORK}-internet --network {MACHINE_NETWORK} "
                    f"--destination-range 0.0.0.0/0 --next-hop-gateway default-internet-gateway --project {project}")]


def gcp_data_problems(settings: config.Settings, api: GcpApi) -> list[Problem]:
    """A gs:// dataUri: the bucket exists, and with run.dataGrant the deployer may set its IAM policy.

    `pulumi up` grants the machines read access on the data bucket itself; without
    storage.buckets.setIamPolicy there (a public data set of another project, a bucket another
    team owns) the grant fails with 403 after the other resources were made.
    """
    from components.gcp.naming import service_account_id, split_gs_uri
    from ops.mockrun import project_name

    uri = settings.run.data_uri
    if not uri or not uri.startswith("gs://"):
        return []
    bucket, prefix = split_gs_uri(uri)
    granted = api.bucket_permissions(bucket, [SET_POLICY])
    if granted is None:
        return [Problem(f"run.dataUri {uri}: there is no bucket {bucket}", "check run.dataUri")]
    if not settings.run.data_grant or SET_POLICY in granted:
        return []
    account = (f"{service_account_id(project=project_name(), stack=settings.stack)}@{settings.project}"
               ".iam.gserviceaccount.com")
    what = (f"you cannot set the IAM policy of data bucket {bucket} ({SET_POLICY}), so `pulumi up` would fail "
            "granting the machines read access to it (403)")
    if api.publicly_readable(bucket, prefix):
        return [Problem(f"{what}; it is publicly readable, so they need no grant", "set run.dataGrant: false")]
    return [Problem(what, f"ask its owner to grant roles/storage.objectViewer on gs://{bucket} to "
                          f"serviceAccount:{account} and set run.dataGrant: false, or get "
                          "roles/storage.admin on that bucket")]


def gcp_api_problems(settings: config.Settings, enabled: set[str]) -> list[Problem]:
    """The APIs that must be on before the first `pulumi up` (components/gcp/naming.py PREREQUISITE_APIS),
    of the project's `enabled` services."""
    from components.gcp.naming import PREREQUISITE_APIS

    missing = [a for a in PREREQUISITE_APIS if a not in enabled]
    if not missing:
        return []
    return [Problem(f"API(s) {', '.join(missing)} off in project {settings.project}; the stack cannot turn "
                    "on the others without them",
                    f"gcloud services enable {' '.join(missing)} --project {settings.project}")]


def compute_api_problem(settings: config.Settings) -> Problem:
    """The Compute Engine API is off: the quotas and machine types cannot be read until it is on."""
    return Problem(f"the Compute Engine API ({COMPUTE_API}) is off in project {settings.project}, so its GPU "
                   "quotas and machine types cannot be checked (`pulumi up` would turn it on, but a new project's "
                   "GPU quota is 0 until you ask)",
                   f"gcloud services enable {COMPUTE_API} --project {settings.project}, then run preflight again")


def check_gcp(settings: config.Settings, api: GcpApi | None = None, *, home: bool = True) -> list[Problem]:
    """Every GCP check; `api` defaults to the REST client with Application Default Credentials.

    `home=False`: a placement's project and region, whose run and data are home's: no data check there."""
    api = api or RestGcpApi()
    enabled: set[str] = set()

    def apis() -> list[Problem]:
        enabled.update(api.enabled_services(settings.project))
        return gcp_api_problems(settings, enabled)

    def off_api_said(check: Callable[[], list[Problem]]) -> Callable[[], list[Problem]]:
        # A read of an API that is off is no credentials problem: say which API to turn on.
        def run() -> list[Problem]:
            try:
                return check()
            except ApiDisabled as e:
                if e.service == COMPUTE_API:
                    return [compute_api_problem(settings)]
                return [Problem(f"the API {e.service} is off in project {settings.project} ({e})",
                                f"gcloud services enable {e.service} --project {settings.project}, "
                                "then run preflight again")]
        return run

    problems = _run_checks([("APIs", off_api_said(apis))], _gcp_error)
    if enabled and COMPUTE_API not in enabled:
        # Every read below goes to the Compute Engine API: one line says to turn it on.
        return [*problems, compute_api_problem(settings)]
    checks: list[tuple[str, Callable[[], list[Problem]]]] = [
        ("GPU quota", off_api_said(lambda: gcp_quota_problems(settings, api))),
        ("machine types", off_api_said(lambda: gcp_offering_problems(settings, api))),
        ("network", off_api_said(lambda: gcp_network_problems(settings, api))),
    ]
    if home:
        checks.append(("data bucket", off_api_said(lambda: gcp_data_problems(settings, api))))
    for problem in _run_checks(checks, _gcp_error):
        if problem not in problems:  # an API that is off refuses every check the same way: said once
            problems.append(problem)
    return problems


def _gcp_error(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def _run_checks(checks: Iterable[tuple[str, Callable[[], list[Problem]]]],
                describe: Callable[[Exception], str]) -> list[Problem]:
    problems: list[Problem] = []
    for name, check in checks:
        try:
            problems += check()
        except Exception as e:  # noqa: BLE001 - a check that cannot run is itself a problem to report
            problems.append(Problem(f"could not check {name}: {describe(e)}",
                                    "check the credentials (and their region/project) and run preflight again"))
    return problems


def check(settings: config.Settings, *, aws_session: Any = None, gcp_api: GcpApi | None = None) -> list[Problem]:
    """Every check for each placement (home: the stack's own cloud and region), in its cloud, region and
    project: a run moved to a placement whose quota, types, network or image fail would wait there
    as it would at home. A placement's problems start with `placements[i] (cloud region):`."""
    from components.placement import settings_at

    problems: list[Problem] = []
    for i, p in enumerate(settings.placement_list):
        at = settings_at(settings, i)
        found = check_aws(at, aws_session, home=i == 0) if at.cloud == "aws" else check_gcp(at, gcp_api, home=i == 0)
        if i:
            found = [Problem(f"placements[{i}] ({p.cloud} {p.region}): {f.what}", f.fix) for f in found]
        problems += found
    return problems


def cmd_preflight(args: argparse.Namespace, *, aws_session: Any = None, gcp_api: GcpApi | None = None) -> int:
    """`python -m ops preflight`: one line per problem; exit 1 with problems, 0 clean, 2 on bad config."""
    stack_file = Path(args.stacks_dir) / f"Pulumi.{args.stack}.yaml"
    if not stack_file.is_file():
        print(f"ops preflight: no stack file {stack_file}", file=sys.stderr)
        return EXIT_ERROR
    try:
        settings = config.load_settings(config.raw_from_config(config.read_stack_file(stack_file)), stack=args.stack)
    except config.ConfigError as e:
        print(str(e), file=sys.stderr)
        return EXIT_ERROR
    problems = check(settings, aws_session=aws_session, gcp_api=gcp_api)
    for p in problems:
        print(p.line())
    if problems:
        print(f"preflight {args.stack}: {len(problems)} problem(s); `pulumi up` would not start a machine as asked")
        return EXIT_FAILED
    print(f"preflight {args.stack}: ok ({settings.cloud}, {settings.region})")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `preflight` command to `python -m ops`."""
    p = sub.add_parser("preflight", help="check quotas, zones, image, bucket (AWS) or GPU quota, APIs (GCP) first")
    p.add_argument("--stack", required=True, help="stack name: stacks/Pulumi.<NAME>.yaml")
    p.add_argument("--stacks-dir", default=str(STACKS_DIR), help="folder of the stack files (default: %(default)s)")
    p.set_defaults(func=cmd_preflight)
