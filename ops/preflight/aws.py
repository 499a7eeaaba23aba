"""Preflight on AWS: vCPU quotas, instance types in the group's zones, the subnets' way out, the AMI, the bucket.

Each check reads the account with the operator's credentials (boto3) and returns `Problem`s;
`check_aws` runs them all for one region. What each check asks is in `ops.preflight`'s docstring.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from components import settings as config
from ops.preflight.common import NoCredentials, Problem, run_checks

# EC2 vCPU quotas by instance family (Service Quotas, service code "ec2"): the quota
# name, its code for spot requests and for running on-demand instances.
AWS_QUOTAS: dict[str, tuple[str, str, str]] = {
    "g": ("G and VT", "L-3819A6DF", "L-DB2E81BA"),
    "vt": ("G and VT", "L-3819A6DF", "L-DB2E81BA"),
    "p": ("P", "L-7212CCBC", "L-417A185B"),
}


def _family(instance_type: str) -> str:
    return re.match(r"^[a-z]+", instance_type).group(0)  # type: ignore[union-attr]


def _aws_error(e: Exception) -> str:
    import botocore.exceptions

    if isinstance(e, botocore.exceptions.ClientError):
        err = e.response.get("Error", {})
        return f"{err.get('Code')}: {err.get('Message')}"
    return f"{type(e).__name__}: {e}"


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


# Lambda keeps this much of an account's concurrency unreserved, and refuses any reservation that would leave
# less (an account whose limit is 10, common for new ones, can reserve nothing). The account's limit is the
# Service Quotas quota "Concurrent executions" (L-B99A9384).
LAMBDA_UNRESERVED_MINIMUM = 100
LAMBDA_CONCURRENCY_QUOTA = "L-B99A9384"


def aws_controller_function(settings: config.Settings) -> str:
    """The name of the placement controller's function the stack would create at home."""
    from components.aws.controller import function_name
    from components.aws.naming import group_name
    from ops.mockrun import project_name

    return function_name(group_name(project=project_name(), stack=settings.stack, run_id=settings.run_id))


def aws_lambda_concurrency_problems(settings: config.Settings, lam: Any) -> list[Problem]:
    """With `placement.reserveConcurrency` (and a controller: two placements or more), room in the account to
    reserve the controller's executions: Lambda's GetAccountSettings, and the function's own reservation when an
    earlier `pulumi up` made it (it is already out of the unreserved count, and is kept, not added)."""
    from components.aws.controller import CONCURRENCY

    if not settings.placement.reserve_concurrency or len(settings.placement_list) < 2:
        return []
    limit = lam.get_account_settings()["AccountLimit"]
    total, unreserved = int(limit["ConcurrentExecutions"]), int(limit["UnreservedConcurrentExecutions"])
    name = aws_controller_function(settings)
    try:
        held = int(lam.get_function_concurrency(FunctionName=name).get("ReservedConcurrentExecutions") or 0)
    except lam.exceptions.ResourceNotFoundException:
        held = 0  # a first `pulumi up`: the function does not exist yet
    left = unreserved + held - CONCURRENCY
    if left >= LAMBDA_UNRESERVED_MINIMUM:
        return []
    return [Problem(
        f"placement.reserveConcurrency: reserving {CONCURRENCY} of the account's Lambda concurrency in "
        f"{settings.region} for {name} would leave {left} unreserved (the account's limit is {total}, {unreserved} "
        f"unreserved now), and Lambda keeps at least {LAMBDA_UNRESERVED_MINIMUM}: `pulumi up` would fail at the "
        "controller's function",
        "set placement.reserveConcurrency: false (the default: a tick delivered twice is safe, placement.json's "
        "writes are conditional), or ask for a higher limit: aws service-quotas request-service-quota-increase "
        f"--service-code lambda --quota-code {LAMBDA_CONCURRENCY_QUOTA} --desired-value "
        f"{max(total, 0) + LAMBDA_UNRESERVED_MINIMUM - left} --region {settings.region}")]


# What `pulumi up` and `pulumi destroy` ask KMS about the image-signing key (components/aws/signing_key.py) under
# the deployer's IAM policies: pulumi_aws's kms.Key creates it with its policy and tags (CreateKey, TagResource; KMS
# refuses a policy that would lock its creator out, so PutKeyPolicy too), reads it back on every up (DescribeKey,
# GetKeyPolicy, GetKeyRotationStatus, ListResourceTags), changes its policy or tags, and schedules its deletion on
# destroy. The stack makes no alias. CreateKey's resource is "*" (there is no key yet); the others' is the key.
SIGNING_CREATE_ACTIONS = ("kms:CreateKey", "kms:TagResource")
SIGNING_KEY_ACTIONS = ("kms:DescribeKey", "kms:GetKeyPolicy", "kms:GetKeyRotationStatus", "kms:ListResourceTags",
                       "kms:PutKeyPolicy", "kms:TagResource", "kms:UntagResource", "kms:ScheduleKeyDeletion")
# Sign and GetPublicKey (ImageSignature, at `pulumi up`) are granted by the key's own policy, which names the
# deployer's role: the simulator evaluates a resource policy only for an IAM user caller (CallerArn), so for them
# only what no key policy can override is a problem: an explicit deny, or the organization's SCPs.
SIGNING_SIGNER_ACTIONS = ("kms:GetPublicKey", "kms:Sign")


def aws_deployer_arn(caller_arn: str, iam: Any) -> str | None:
    """The IAM principal whose policies decide what `caller_arn` (STS GetCallerIdentity's) may do: an assumed
    role's session maps to its role, with the path GetRole gives (a session ARN leaves it out); a user is itself;
    None for the account's root, which IAM policies do not limit."""
    kind = caller_arn.split(":", 5)[-1]
    if kind == "root":
        return None
    if kind.startswith("assumed-role/"):
        return iam.get_role(RoleName=kind.split("/")[1])["Role"]["Arn"]
    return caller_arn


def _denied(results: list[dict], *, signer: bool) -> list[str]:
    """The actions of `results` (SimulatePrincipalPolicy's) that would be refused; for the signer's, only a refusal
    no key policy overrides."""
    def refused(r: dict) -> bool:
        if (r.get("OrganizationsDecisionDetail") or {}).get("AllowedByOrganizations") is False:
            return True
        return r["EvalDecision"] == "explicitDeny" if signer else r["EvalDecision"] != "allowed"
    return sorted({r["EvalActionName"] for r in results if refused(r)})


def _simulate(iam: Any, principal: str, actions: tuple[str, ...], resource: str) -> list[dict]:
    pages = iam.get_paginator("simulate_principal_policy").paginate(
        PolicySourceArn=principal, ActionNames=list(actions), ResourceArns=[resource])
    return [r for page in pages for r in page["EvaluationResults"]]


def aws_signing_key_problems(settings: config.Settings, sts: Any, iam: Any) -> list[Problem]:
    """With `image.build`, whether the identity running `pulumi up` may create, read, change and delete the
    image-signing KMS key and sign with it: its IAM policies simulated (IAM SimulatePrincipalPolicy) for the
    actions the key's resource makes. A refused simulation is said as not checked."""
    import botocore.exceptions

    if not settings.image.build:
        return []
    caller = sts.get_caller_identity()
    partition, account = caller["Arn"].split(":")[1], caller["Account"]
    where = f"image.build: the image-signing KMS key in {settings.region}"
    try:
        principal = aws_deployer_arn(caller["Arn"], iam)
    except botocore.exceptions.ClientError as e:
        return [Problem(f"{where}: could not read the role of {caller['Arn']} (iam:GetRole: {_aws_error(e)}); "
                        "`pulumi up` reads it too, to name the role in the key's policy",
                        "allow iam:GetRole on that role to it")]
    if principal is None:
        return []
    if not principal.startswith(f"arn:{partition}:iam::"):
        return [Problem(f"{where}: could not check what {principal} may do (IAM simulates only users and roles)",
                        f"make sure it may {', '.join(SIGNING_CREATE_ACTIONS + SIGNING_KEY_ACTIONS)}, or deploy "
                        "as a role or user")]
    key = f"arn:{partition}:kms:{settings.region}:{account}:key/*"  # the key's id is not known before CreateKey
    try:
        missing = sorted(set(_denied(_simulate(iam, principal, SIGNING_CREATE_ACTIONS, "*"), signer=False)
                             + _denied(_simulate(iam, principal, SIGNING_KEY_ACTIONS, key), signer=False)))
        blocked = _denied(_simulate(iam, principal, SIGNING_SIGNER_ACTIONS, key), signer=True)
    except botocore.exceptions.ClientError as e:
        if e.response.get("Error", {}).get("Code") not in ("AccessDenied", "AccessDeniedException"):
            raise
        return [Problem(f"{where}: could not check what {principal} may do with it (iam:SimulatePrincipalPolicy "
                        f"refused: {_aws_error(e)}); it was not checked",
                        f"allow iam:SimulatePrincipalPolicy on {principal} to these credentials, or make sure it "
                        f"may {', '.join(SIGNING_CREATE_ACTIONS + SIGNING_KEY_ACTIONS)} (Resource \"*\")")]
    problems = []
    if missing:
        statement = json.dumps({"Effect": "Allow", "Action": missing, "Resource": "*"})
        problems.append(Problem(
            f"{where}: {principal} may not {', '.join(missing)} (its IAM policies, simulated), so `pulumi up` would "
            "fail at the key after the bucket, repository and image exist (or `pulumi destroy` at its deletion)",
            f"add to {principal}'s IAM policy the statement {statement}"))
    if blocked:
        problems.append(Problem(
            f"{where}: {principal} is denied {', '.join(blocked)} by its IAM policies or the organization's SCPs, "
            "which the key's own policy cannot override, so `pulumi up` could not sign the image",
            f"remove that deny for {', '.join(blocked)} on this account's KMS keys"))
    return problems


def _usable_credentials(session: Any) -> None:
    """Raise `NoCredentials` when the session finds no credentials, or finds some it cannot load
    (an expired SSO token, a failing `credential_process`): every check would fail alike."""
    import botocore.exceptions

    try:
        credentials = session.get_credentials()
        if credentials is not None:
            credentials.get_frozen_credentials()  # loads what is deferred (SSO, a role to assume)
    except botocore.exceptions.BotoCoreError as e:
        raise NoCredentials("AWS", f"{type(e).__name__}: {e}", "run `aws sso login` or `aws configure` for this "
                            "profile (AWS_PROFILE)") from e
    if credentials is None:
        raise NoCredentials("AWS", "environment variables, AWS_PROFILE, ~/.aws/credentials and ~/.aws/config, "
                            "an instance or container role", "run `aws configure` or `aws sso login` "
                            "(or set AWS_PROFILE)")


def aws_session(settings: config.Settings, session: Any = None) -> Any:
    """`session`, else a boto3 Session of the environment's credentials in the stack's region; `NoCredentials`
    when it finds none, or none it can load."""
    import boto3
    import botocore.exceptions

    try:
        session = session or boto3.session.Session(region_name=settings.region)
    except botocore.exceptions.ProfileNotFound as e:
        raise NoCredentials("AWS", str(e), "name a profile of ~/.aws/config in AWS_PROFILE, or unset it") from e
    if getattr(session, "get_credentials", None) is not None:
        _usable_credentials(session)
    return session


def check_aws(settings: config.Settings, session: Any = None, *, home: bool = True) -> list[Problem]:
    """Every AWS check; `session` is a boto3 Session (default: the environment's credentials).

    `home=False`: a placement's region, whose run folder is home's bucket: no bucket check there."""
    session = aws_session(settings, session)
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
        if settings.placement.reserve_concurrency and len(settings.placement_list) > 1:
            checks.append(("Lambda concurrency", lambda: aws_lambda_concurrency_problems(settings, client("lambda"))))
        if settings.image.build:
            checks.append(("image signing key", lambda: aws_signing_key_problems(settings, client("sts"), client("iam"))))
    return run_checks(checks, _aws_error)
