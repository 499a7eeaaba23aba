"""The security and cost rules every trainstack stack must pass, as plain functions.

A resource is a dict in the shape `ops synth` writes and the policy pack builds from the
engine's view: `{"type": "aws:s3/bucket:Bucket", "name", "parent", "inputs" (camelCase
property names), "options" ({"retainOnDelete", ...})}`. A rule is a function
`rule(resources, ctx) -> list[Violation]`; `RULES` registers each with its id, what it
checks and why. Rules with scope "resource" judge each resource alone (the pack runs them
as resource policies); "stack" rules need several resources at once (a bucket and its
public access block, a group and its schedule).

A value the engine cannot know yet (during `pulumi preview`) arrives as `UNKNOWN`; rules do
not judge such a value, the next preview or `pulumi up` does.

This module uses the standard library only: the policy pack runs it in its own virtualenv.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from policy import iam

UNKNOWN = "<unknown during preview>"

Resource = Mapping[str, Any]


@dataclass(frozen=True)
class Violation:
    """A rule broken by a resource: the rule id, the resource name, what is wrong and the fix."""

    rule: str
    resource: str
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.resource}: {self.message}"


@dataclass(frozen=True)
class Context:
    """What the stack's config says that the resources alone cannot: the user's explicit choices."""

    allowed_ssh_cidrs: tuple[str, ...] = ()
    """access.allowedCidrs: the only sources port 22 may be open to."""
    on_demand: bool = False
    """compute.spot: false was said explicitly, so on-demand machines are intended."""
    keep_bucket: bool = True
    """storage.keepOnDestroy: the bucket must survive `pulumi destroy`."""
    stack: str | None = None
    """When set, the stack tag/label must hold this value."""
    run_id: str | None = None
    """When set, the run tag/label must hold this value."""


def context_from_settings(settings: Any) -> Context:
    """The rule context for a validated `components.settings.Settings`."""
    return Context(
        allowed_ssh_cidrs=tuple(settings.access.allowed_cidrs),
        on_demand=not settings.compute.spot,
        keep_bucket=settings.storage.keep_on_destroy,
        stack=settings.stack,
        run_id=settings.run_id,
    )


def _pick(block: Any, camel: str, snake: str, default: Any) -> Any:
    if not isinstance(block, Mapping):
        return default
    v = block.get(camel, block.get(snake))
    return default if v is None else v


def context_from_config(raw: Mapping[str, Any], stack: str | None) -> Context:
    """The same context from the stack's raw `trainstack:` config, as the policy pack reads it.

    The pack runs without pydantic; the program has validated this config already, so only
    the values (and the defaults of components.settings) are read here.
    """
    run, compute = raw.get("run") or {}, raw.get("compute") or {}
    storage, access = raw.get("storage") or {}, raw.get("access") or {}
    return Context(
        allowed_ssh_cidrs=tuple(_pick(access, "allowedCidrs", "allowed_cidrs", ())),
        on_demand=_pick(compute, "spot", "spot", True) is False,
        keep_bucket=_pick(storage, "keepOnDestroy", "keep_on_destroy", True) is not False,
        stack=stack,
        run_id=_pick(run, "id", "id", "") or stack,
    )


# ----------------------------------------------------------------------------- helpers


def _inputs(r: Resource) -> Mapping[str, Any]:
    return r.get("inputs") or {}


def _get(r: Resource, path: str, default: Any = None) -> Any:
    """inputs[a][b][0][c] for path "a.b.0.c"; default when any step is missing."""
    cur: Any = _inputs(r)
    for part in path.split("."):
        if cur == UNKNOWN:
            return UNKNOWN  # a whole block unknown: so is everything inside it
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return default
        if cur is None:
            return default
    return cur


def _known(v: Any) -> bool:
    return v != UNKNOWN


def _true(v: Any) -> bool:
    """True for true and "true" (EC2 launch templates type some booleans as strings)."""
    return v is True or (isinstance(v, str) and v.lower() == "true")


def _false(v: Any) -> bool:
    return v is False or (isinstance(v, str) and v.lower() == "false")


def _of(resources: Iterable[Resource], *types: str) -> list[Resource]:
    return [r for r in resources if r.get("type") in types]


def _as_list(v: Any) -> list[Any]:
    return iam.as_list(v)


def _keys(r: Resource, *fields: str) -> set[str]:
    """Every string another resource may use to point at `r` (its name, id, given name)."""
    out = {r.get("name"), r.get("id")}
    for f in fields:
        out.add(_inputs(r).get(f))
        out.add((r.get("outputs") or {}).get(f))
    return {k for k in out if isinstance(k, str) and k and k != UNKNOWN}


def _linked(child: Resource, owner: Resource, ref_field: str, owner_fields: tuple[str, ...],
            owners: list[Resource], *, engine_ids: bool = False) -> bool:
    """Whether `child` (a bucket's public access block, a group's schedule) belongs to `owner`.

    By reference when the child's input names the owner. When the reference cannot be read
    (unknown during preview), or, with `engine_ids`, is an id only the engine knows (a mock's
    or the cloud's) matching no owner, by sharing the owner's parent component alone.
    """
    ref = _inputs(child).get(ref_field)
    if isinstance(ref, str) and _known(ref):
        if ref in _keys(owner, *owner_fields):
            return True
        if not engine_ids or any(ref in _keys(o, *owner_fields) for o in owners):
            return False
    siblings = [o for o in owners if o.get("parent") == owner.get("parent")]
    return child.get("parent") is not None and child.get("parent") == owner.get("parent") and len(siblings) == 1


def _json(text: Any) -> Any:
    if isinstance(text, Mapping):
        return text
    if not isinstance(text, str) or not _known(text):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


# ----------------------------------------------------------------------------- buckets

S3_BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
GCS_BUCKETS = ("gcp:storage/bucket:Bucket",)
PUBLIC_ACLS = ("public-read", "public-read-write", "authenticated-read")
PUBLIC_MEMBERS = ("allUsers", "allAuthenticatedUsers")


def _bucket_children(resources: list[Resource], bucket: Resource, *types: str) -> list[Resource]:
    buckets = _of(resources, *S3_BUCKETS)
    return [c for c in _of(resources, *types) if _linked(c, bucket, "bucket", ("bucket", "id"), buckets, engine_ids=True)]


def _bucket_policies(resources: list[Resource], bucket: Resource) -> list[dict[str, Any]]:
    docs = [_json(_inputs(bucket).get("policy"))]
    docs += [_json(_inputs(p).get("policy")) for p in _bucket_children(resources, bucket, "aws:s3/bucketPolicy:BucketPolicy")]
    return [d for d in docs if isinstance(d, dict)]


def _principal_is_anyone(principal: Any) -> bool:
    if principal == "*":
        return True
    if isinstance(principal, Mapping):
        return any("*" in _as_list(v) for v in principal.values())
    return False


def bucket_not_public(resources: list[Resource], ctx: Context) -> list[Violation]:
    """S3: all four public access blocks on, no public ACL, no policy allowing anyone. GCS: uniform
    bucket-level access, public access prevention enforced, no allUsers/allAuthenticatedUsers member."""
    out: list[Violation] = []
    flags = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    for b in _of(resources, *S3_BUCKETS):
        blocks = _bucket_children(resources, b, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
        if not blocks:
            out.append(Violation("bucket-not-public", b["name"], "no BucketPublicAccessBlock; add one with all four flags true"))
        for blk in blocks:
            off = [f for f in flags if _known(_get(blk, f)) and not _true(_get(blk, f))]
            if off:
                out.append(Violation("bucket-not-public", blk["name"], f"{', '.join(off)} not true; set all four flags true"))
        acls = [_inputs(b).get("acl")] + [_inputs(a).get("acl") for a in _bucket_children(resources, b, "aws:s3/bucketAcl:BucketAcl", "aws:s3/bucketAclV2:BucketAclV2")]
        for acl in acls:
            if acl in PUBLIC_ACLS:
                out.append(Violation("bucket-not-public", b["name"], f"ACL {acl!r} makes objects public; use private (the default)"))
        for doc in _bucket_policies(resources, b):
            for st in iam.statements(doc):
                if st.get("Effect") == "Allow" and _principal_is_anyone(st.get("Principal")):
                    out.append(Violation("bucket-not-public", b["name"], "bucket policy allows Principal '*'; name the role instead"))
    for b in _of(resources, *GCS_BUCKETS):
        if not _true(_get(b, "uniformBucketLevelAccess")) and _known(_get(b, "uniformBucketLevelAccess")):
            out.append(Violation("bucket-not-public", b["name"], "uniformBucketLevelAccess not true; set it so no object ACL can make data public"))
        pap = _get(b, "publicAccessPrevention")
        if _known(pap) and pap != "enforced":
            out.append(Violation("bucket-not-public", b["name"], f"publicAccessPrevention is {pap!r}; set 'enforced'"))
    for m in _of(resources, "gcp:storage/bucketIAMMember:BucketIAMMember", "gcp:storage/bucketIAMBinding:BucketIAMBinding"):
        members = _as_list(_get(m, "member")) + _as_list(_get(m, "members"))
        public = [x for x in members if x in PUBLIC_MEMBERS]
        if public:
            out.append(Violation("bucket-not-public", m["name"], f"grants {', '.join(public)}; grant the machines' service account only"))
    return out


def bucket_encrypted(resources: list[Resource], ctx: Context) -> list[Violation]:
    """S3 buckets have default server-side encryption configured (SSE-S3 or KMS)."""
    out: list[Violation] = []
    ok_algorithms = ("AES256", "aws:kms", "aws:kms:dsse")
    for b in _of(resources, *S3_BUCKETS):
        algos = [_get(b, "serverSideEncryptionConfiguration.rule.applyServerSideEncryptionByDefault.sseAlgorithm")]
        for c in _bucket_children(resources, b, "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
                                  "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2"):
            algos += [(_get({"inputs": rule}, "applyServerSideEncryptionByDefault.sseAlgorithm")) for rule in _as_list(_get(c, "rules"))]
        if any(a == UNKNOWN for a in algos):
            continue
        if not any(a in ok_algorithms for a in algos):
            out.append(Violation("bucket-encrypted", b["name"], "no default server-side encryption; add a "
                                 "BucketServerSideEncryptionConfiguration with sseAlgorithm AES256 or aws:kms"))
    return out


def bucket_versioned(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Buckets keep old versions, so an overwritten or deleted checkpoint can be recovered."""
    out: list[Violation] = []
    for b in _of(resources, *S3_BUCKETS):
        states = [("Enabled" if _true(_get(b, "versioning.enabled")) else None)]
        states += [_get(v, "versioningConfiguration.status") for v in _bucket_children(
            resources, b, "aws:s3/bucketVersioning:BucketVersioning", "aws:s3/bucketVersioningV2:BucketVersioningV2")]
        if UNKNOWN not in states and "Enabled" not in states:
            out.append(Violation("bucket-versioned", b["name"], "versioning not enabled; add a BucketVersioning with status Enabled"))
    for b in _of(resources, *GCS_BUCKETS):
        if _known(_get(b, "versioning.enabled")) and not _true(_get(b, "versioning.enabled")):
            out.append(Violation("bucket-versioned", b["name"], "versioning.enabled not true; set it"))
    return out


def _denies_plain_http(st: Mapping[str, Any]) -> bool:
    if st.get("Effect") != "Deny" or not _principal_is_anyone(st.get("Principal")):
        return False
    if not {"s3:*", "*"} & set(_as_list(st.get("Action"))):
        return False
    cond = st.get("Condition") or {}
    secure = (cond.get("Bool") or {}).get("aws:SecureTransport")
    if not any(_false(v) for v in _as_list(secure)):
        return False
    res = _as_list(st.get("Resource"))
    return any(str(x).endswith("/*") for x in res) and any(not str(x).endswith("/*") for x in res)


def bucket_tls_only(resources: list[Resource], ctx: Context) -> list[Violation]:
    """The S3 bucket policy denies every request not made over TLS (aws:SecureTransport false),
    on the bucket and its objects. GCS serves HTTPS only, so it has no such rule."""
    out: list[Violation] = []
    for b in _of(resources, *S3_BUCKETS):
        docs = _bucket_policies(resources, b)
        unknown = _inputs(b).get("policy") == UNKNOWN or any(
            _inputs(p).get("policy") == UNKNOWN for p in _bucket_children(resources, b, "aws:s3/bucketPolicy:BucketPolicy"))
        if unknown:
            continue
        if not any(_denies_plain_http(st) for d in docs for st in iam.statements(d)):
            out.append(Violation("bucket-tls-only", b["name"], "no policy statement denies s3:* when aws:SecureTransport is "
                                 "false on the bucket and bucket/*; add one"))
    return out


def bucket_retained(resources: list[Resource], ctx: Context) -> list[Violation]:
    """The bucket survives `pulumi destroy` (retainOnDelete, no forceDestroy) unless storage.keepOnDestroy is false."""
    if not ctx.keep_bucket:
        return []
    out: list[Violation] = []
    for b in _of(resources, *S3_BUCKETS, *GCS_BUCKETS):
        retain = (b.get("options") or {}).get("retainOnDelete", False)
        if _known(retain) and retain is not True:
            out.append(Violation("bucket-retained", b["name"], "not retainOnDelete; `pulumi destroy` would delete the "
                                 "checkpoints (set storage.keepOnDestroy: false only to mean that)"))
        if _true(_get(b, "forceDestroy")):
            out.append(Violation("bucket-retained", b["name"], "forceDestroy is true; it empties the bucket on delete"))
    return out


def released_on_destroy(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Everything but the bucket and its own settings goes on `pulumi destroy`: machines, groups,
    schedules, roles and repositories are neither retained nor protected."""
    out: list[Violation] = []
    for r in resources:
        if r.get("type", "").startswith(("aws:s3/", "gcp:storage/", "pulumi:")):
            continue
        opts = r.get("options") or {}
        for flag in ("retainOnDelete", "protect"):
            if opts.get(flag) is True:
                out.append(Violation("released-on-destroy", r["name"], f"has {flag}; `pulumi destroy` must release it "
                                     "(only the bucket is kept)"))
    return out


# ----------------------------------------------------------------------------- machines

LAUNCH_TEMPLATES = ("aws:ec2/launchTemplate:LaunchTemplate",)
GCE_TEMPLATES = ("gcp:compute/instanceTemplate:InstanceTemplate", "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate")


def imdsv2_required(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Launch templates require IMDSv2 session tokens with a hop limit of 1, so a request
    forwarded from outside the host (SSRF) cannot read the role's credentials."""
    out: list[Violation] = []
    for lt in _of(resources, *LAUNCH_TEMPLATES, "aws:ec2/instance:Instance"):
        tokens = _get(lt, "metadataOptions.httpTokens")
        hops = _get(lt, "metadataOptions.httpPutResponseHopLimit")
        if _known(tokens) and tokens != "required":
            out.append(Violation("imdsv2-required", lt["name"], f"metadataOptions.httpTokens is {tokens!r}; set 'required'"))
        if _known(hops) and hops not in (1, "1"):
            out.append(Violation("imdsv2-required", lt["name"], f"metadataOptions.httpPutResponseHopLimit is {hops!r}; set 1"))
    return out


def gce_metadata_hardened(resources: list[Resource], ctx: Context) -> list[Violation]:
    """GCE templates keep the legacy metadata endpoints off and Shielded VM's vTPM and
    integrity monitoring on (secure boot is left to the image: NVIDIA drivers must be signed)."""
    out: list[Violation] = []
    for t in _of(resources, *GCE_TEMPLATES):
        if _false(_get(t, "metadata.disable-legacy-endpoints")):
            out.append(Violation("gce-metadata-hardened", t["name"], "metadata disable-legacy-endpoints is false; remove it"))
        for f in ("enableVtpm", "enableIntegrityMonitoring"):
            if _false(_get(t, f"shieldedInstanceConfig.{f}")):
                out.append(Violation("gce-metadata-hardened", t["name"], f"shieldedInstanceConfig.{f} is false; set true"))
    return out


def root_volume_encrypted(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Every EBS volume a launch template defines is encrypted, and it defines the root one
    (otherwise the AMI's default applies). GCE disks are always encrypted at rest."""
    out: list[Violation] = []
    for lt in _of(resources, *LAUNCH_TEMPLATES):
        mappings = _get(lt, "blockDeviceMappings", [])
        if mappings == UNKNOWN:
            continue
        if not mappings:
            out.append(Violation("root-volume-encrypted", lt["name"], "no blockDeviceMappings; define the root volume with ebs.encrypted true"))
        for i, m in enumerate(_as_list(mappings)):
            enc = _get({"inputs": m}, "ebs.encrypted")
            if isinstance(m, Mapping) and "ebs" in m and _known(enc) and not _true(enc):
                out.append(Violation("root-volume-encrypted", lt["name"], f"blockDeviceMappings[{i}].ebs.encrypted is not true; set it"))
    for inst in _of(resources, "aws:ec2/instance:Instance"):
        enc = _get(inst, "rootBlockDevice.encrypted")
        if _known(enc) and not _true(enc):
            out.append(Violation("root-volume-encrypted", inst["name"], "rootBlockDevice.encrypted is not true; set it"))
    return out


# ----------------------------------------------------------------------------- network


@dataclass(frozen=True)
class Ingress:
    """One inbound permission, whatever resource shape declared it."""

    resource: str
    where: str
    protocol: str
    from_port: int | None
    to_port: int | None
    cidrs: tuple[str, ...]
    from_own_group: bool
    unknown: bool = False
    """Some part is unknown during preview: only its known CIDRs are judged."""


def _has_unknown(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(_has_unknown(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_unknown(v) for v in value)
    return value == UNKNOWN


def _ingresses(resources: list[Resource]) -> list[Ingress]:
    out: list[Ingress] = []

    def add(r: Resource, where: str, proto: Any, lo: Any, hi: Any, cidrs: list[Any], own_refs: tuple[Any, ...],
            own: bool) -> None:
        cs = tuple(str(c) for c in cidrs if c and _known(c))
        unknown = _has_unknown([proto, lo, hi, cidrs]) or (not cs and _has_unknown(list(own_refs)))
        out.append(Ingress(r["name"], where, str(proto).lower(), lo if isinstance(lo, int) else None,
                           hi if isinstance(hi, int) else None, cs, own and not cs, unknown))

    for sg in _of(resources, "aws:ec2/securityGroup:SecurityGroup"):
        rules_ = _get(sg, "ingress", [])
        if rules_ == UNKNOWN:
            continue
        for i, rule in enumerate(_as_list(rules_)):
            if not isinstance(rule, Mapping):
                continue
            cidrs = _as_list(rule.get("cidrBlocks")) + _as_list(rule.get("ipv6CidrBlocks"))
            add(sg, f"ingress[{i}]", rule.get("protocol"), rule.get("fromPort"), rule.get("toPort"), cidrs,
                (rule.get("self"), rule.get("securityGroups")), _true(rule.get("self")))
    for r in _of(resources, "aws:ec2/securityGroupRule:SecurityGroupRule"):
        if _get(r, "type") != "ingress":
            continue
        cidrs = _as_list(_get(r, "cidrBlocks")) + _as_list(_get(r, "ipv6CidrBlocks"))
        src, own_sg = _get(r, "sourceSecurityGroupId"), _get(r, "securityGroupId")
        add(r, "rule", _get(r, "protocol"), _get(r, "fromPort"), _get(r, "toPort"), cidrs, (_get(r, "self"), src, own_sg),
            _true(_get(r, "self")) or (src is not None and src == own_sg))
    for r in _of(resources, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"):
        cidrs = [c for c in (_get(r, "cidrIpv4"), _get(r, "cidrIpv6")) if c]
        ref, own_sg = _get(r, "referencedSecurityGroupId"), _get(r, "securityGroupId")
        add(r, "rule", _get(r, "ipProtocol"), _get(r, "fromPort"), _get(r, "toPort"), cidrs, (ref, own_sg),
            ref is not None and ref == own_sg)
    for fw in _of(resources, "gcp:compute/firewall:Firewall"):
        if str(_get(fw, "direction", "INGRESS")).upper() != "INGRESS":
            continue
        cidrs = _as_list(_get(fw, "sourceRanges"))
        src_raw, tgt_raw = _get(fw, "sourceTags"), _get(fw, "targetTags")
        src_tags, tgt_tags = set(map(str, _as_list(src_raw))), set(map(str, _as_list(tgt_raw)))
        allows = _get(fw, "allows", [])
        if allows == UNKNOWN:
            allows = [{"protocol": UNKNOWN}]
        for j, allow in enumerate(_as_list(allows)):
            allow = allow if isinstance(allow, Mapping) else {"protocol": UNKNOWN}
            ports = _as_list(allow.get("ports")) or [None]
            for p in ports:
                lo = hi = UNKNOWN if p == UNKNOWN else None
                if isinstance(p, str) and re.fullmatch(r"\d+(-\d+)?", p):
                    lo, _, h = p.partition("-")
                    lo, hi = int(lo), int(h or lo)
                add(fw, f"allows[{j}]", allow.get("protocol"), lo, hi, cidrs, (src_raw, tgt_raw),
                    bool(src_tags) and src_tags == tgt_tags)
    return out


def _is_world(cidr: str) -> bool:
    try:
        return ipaddress.ip_network(cidr, strict=False).prefixlen == 0
    except ValueError:
        return False


def no_world_ingress(resources: list[Resource], ctx: Context) -> list[Violation]:
    """No inbound rule from 0.0.0.0/0 or ::/0. Fires even when the config says allowWorld: true:
    the config accepts the explicit choice, this rule keeps it visible (README: how to waive it)."""
    return [Violation("no-world-ingress", ing.resource, f"{ing.where} allows {c} (the whole internet); name your own CIDR")
            for ing in _ingresses(resources) for c in ing.cidrs if _is_world(c)]


def _within(cidr: str, allowed: Iterable[str]) -> bool:
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return False
    for a in allowed:
        try:
            an = ipaddress.ip_network(a, strict=False)
        except ValueError:
            continue
        if net.version == an.version and net.subnet_of(an):
            return True
    return False


def ssh_only_from_allowed(resources: list[Resource], ctx: Context) -> list[Violation]:
    """The only inbound traffic from outside the group is TCP port 22 from access.allowedCidrs
    (none by default); machines of the group may reach each other (multi-node training)."""
    out: list[Violation] = []
    for ing in _ingresses(resources):
        if ing.from_own_group or ing.unknown:
            continue
        if not ing.cidrs:
            out.append(Violation("ssh-only-from-allowed", ing.resource, f"{ing.where} allows another source than "
                                 "this group or a CIDR; only port 22 from access.allowedCidrs is allowed"))
            continue
        if ing.protocol not in ("tcp", "6") or ing.from_port != 22 or ing.to_port != 22:
            out.append(Violation("ssh-only-from-allowed", ing.resource, f"{ing.where} opens {ing.protocol} "
                                 f"{ing.from_port}-{ing.to_port}; only TCP 22 may be open"))
        for c in ing.cidrs:
            # The whole internet is no-world-ingress's finding; one cause, one violation.
            if not _is_world(c) and not _within(c, ctx.allowed_ssh_cidrs):
                allowed = ", ".join(ctx.allowed_ssh_cidrs) or "none"
                out.append(Violation("ssh-only-from-allowed", ing.resource, f"{ing.where} allows {c}, not in "
                                     f"access.allowedCidrs ({allowed})"))
    return out


# ----------------------------------------------------------------------------- IAM

# Actions whose API has no resource-level permission, so a statement that grants them must
# name Resource "*". Each entry says why; any other action on "*" is refused.
WILDCARD_RESOURCE_ACTIONS: dict[str, str] = {
    "ecr:GetAuthorizationToken": "ECR issues a registry login token for the whole account; the API takes no resource",
    "autoscaling:DescribeAutoScalingGroups": "Auto Scaling Describe* calls support no resource-level permission",
    "autoscaling:DescribeAutoScalingInstances": "Auto Scaling Describe* calls support no resource-level permission",
    "ec2:DescribeInstances": "EC2 Describe* calls support no resource-level permission",
    "ec2:DescribeTags": "EC2 Describe* calls support no resource-level permission",
    "ec2:DescribeSpotInstanceRequests": "EC2 Describe* calls support no resource-level permission",
    "cloudwatch:PutMetricData": "CloudWatch metrics take no resource; scope with the cloudwatch:namespace condition",
}


def _wildcard_action(a: Any) -> bool:
    return a == "*" or (isinstance(a, str) and a.endswith(":*"))


GCP_PROJECT_IAM = ("gcp:projects/iAMMember:IAMMember", "gcp:projects/iAMBinding:IAMBinding")
GCP_BASIC_ROLES = ("roles/owner", "roles/editor", "roles/viewer")


def _gcp_project_grants(resources: list[Resource]) -> list[Violation]:
    """Project-wide grants: never a basic role; an admin role only under an IAM condition that
    narrows it to this stack's resources (e.g. resource.name of its instance group)."""
    out: list[Violation] = []
    for r in _of(resources, *GCP_PROJECT_IAM):
        role, cond = _get(r, "role"), _get(r, "condition")
        if not isinstance(role, str) or not _known(role):
            continue
        if role in GCP_BASIC_ROLES:
            out.append(Violation("iam-least-privilege", r["name"], f"grants {role} on the whole project; grant "
                                 "a predefined role on the bucket or repository instead"))
        elif "admin" in role.lower() and not cond:
            out.append(Violation("iam-least-privilege", r["name"], f"grants {role} on the whole project without "
                                 "an IAM condition; narrow it to this stack's resources"))
    return out


def iam_least_privilege(resources: list[Resource], ctx: Context) -> list[Violation]:
    """AWS policy documents grant no `*` or `service:*` action, no NotAction/NotResource, and no
    `*` resource except for actions that have no resource-level permission (WILDCARD_RESOURCE_ACTIONS).
    GCP: no basic role, and no project-wide admin role without a condition."""
    out: list[Violation] = _gcp_project_grants(resources)
    for d in iam.policy_documents(resources):
        if d.text == UNKNOWN:
            continue
        where = f"{d.field}"
        try:
            doc = d.parsed()
        except ValueError:
            out.append(Violation("iam-least-privilege", d.resource, f"{where} is not a JSON policy document"))
            continue
        for i, st in enumerate(iam.statements(doc)):
            if st.get("Effect") != "Allow":
                continue
            sid = f"{where} Statement[{i}]" + (f" ({st['Sid']})" if st.get("Sid") else "")
            actions = _as_list(st.get("Action"))
            if "NotAction" in st or "NotResource" in st:
                out.append(Violation("iam-least-privilege", d.resource, f"{sid} uses NotAction/NotResource with Allow; list what is allowed"))
            wild = [a for a in actions if _wildcard_action(a)]
            if wild:
                out.append(Violation("iam-least-privilege", d.resource, f"{sid} allows {', '.join(wild)}; list the actions needed"))
            if d.kind == "trust":
                if _principal_is_anyone(st.get("Principal")):
                    out.append(Violation("iam-least-privilege", d.resource, f"{sid} lets anyone assume the role; name the service"))
                continue
            if d.kind == "resource":
                continue  # who may use a bucket is bucket-not-public's business; resources are the bucket's own
            if "*" in _as_list(st.get("Resource")):
                unjustified = [a for a in actions if a not in WILDCARD_RESOURCE_ACTIONS]
                if unjustified:
                    out.append(Violation("iam-least-privilege", d.resource, f"{sid} grants {', '.join(unjustified)} on "
                                         "Resource '*'; name this stack's ARNs"))
    return out


# ----------------------------------------------------------------------------- image and secrets

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def image_problem(ref: str) -> str | None:
    """Why an image reference is not pinned, or None when it is (repo:tag or repo@sha256:…)."""
    if "@" in ref:
        digest = ref.rsplit("@", 1)[1]
        return None if _DIGEST.fullmatch(digest) else f"digest {digest!r} is not sha256:<64 hex>"
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return "no tag or digest (docker would pull latest); pin a tag such as 2.21.0-gpu"
    tag = last.rsplit(":", 1)[1]
    if not _TAG.fullmatch(tag):
        return f"tag {tag!r} is not a docker tag"
    if "latest" in tag.lower():
        return f"tag {tag!r} moves under a running job; pin a version tag or a digest"
    return None


def user_data_texts(resources: list[Resource]) -> list[tuple[Resource, str]]:
    """The user data each machine template boots with, decoded (launch templates hold base64, maybe gzipped)."""
    out: list[tuple[Resource, str]] = []
    for lt in _of(resources, *LAUNCH_TEMPLATES, "aws:ec2/instance:Instance"):
        ud = _get(lt, "userData")
        if isinstance(ud, str) and _known(ud):
            try:
                raw = base64.b64decode(ud, validate=True)
                # cloud-init takes gzipped user data (EC2's 16 KiB limit makes it necessary)
                text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8")
            except (binascii.Error, ValueError):
                text = ud
            out.append((lt, text))
    for t in _of(resources, *GCE_TEMPLATES):
        for k in ("user-data", "startup-script"):
            ud = _get(t, f"metadata.{k}")
            if isinstance(ud, str) and _known(ud):
                out.append((t, ud))
        ud = _get(t, "metadataStartupScript")
        if isinstance(ud, str) and _known(ud):
            out.append((t, ud))
    return out


_IMAGE_LINE = re.compile(r"^\s*TRAINSTACK_IMAGE=['\"]?([^'\"\s]*)['\"]?\s*$", re.M)


def image_pinned(resources: list[Resource], ctx: Context) -> list[Violation]:
    """The image every machine runs (TRAINSTACK_IMAGE in its user data's env file) is pinned
    by tag or digest, never `latest`: a moving image changes a running job under it."""
    out: list[Violation] = []
    for r, text in user_data_texts(resources):
        refs = _IMAGE_LINE.findall(text)
        if not refs:
            out.append(Violation("image-pinned", r["name"], "user data sets no TRAINSTACK_IMAGE; render it with components.userdata"))
        for ref in refs:
            problem = image_problem(ref) if ref else "empty image reference"
            if problem:
                out.append(Violation("image-pinned", r["name"], f"TRAINSTACK_IMAGE={ref}: {problem}"))
    for repo in _of(resources, "aws:ecr/repository:Repository"):
        if _known(_get(repo, "imageTagMutability")) and _get(repo, "imageTagMutability") != "IMMUTABLE":
            out.append(Violation("image-pinned", repo["name"], "imageTagMutability is not IMMUTABLE; a pushed tag could be replaced"))
    return out


SECRET_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an AWS access key id", re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b")),
    ("a private key block", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("an AWS secret access key", re.compile(r"aws_secret_access_key\s*[=:]", re.I)),
    ("a GCP service account key", re.compile(r"\"private_key(_id)?\"\s*:")),
)


def secret_kind(text: str) -> str | None:
    """What kind of secret `text` holds, or None."""
    for kind, pat in SECRET_PATTERNS:
        if pat.search(text):
            return kind
    return None


def _strings(value: Any, path: str = "") -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")


def no_secrets(resources: list[Resource], ctx: Context) -> list[Violation]:
    """No credential in user data or any other input (AWS keys, private keys, service account
    JSON): instances read user data unauthenticated from the metadata service, and inputs land
    in the state file. The machines get credentials from their role / service account."""
    out: list[Violation] = []
    for r, text in user_data_texts(resources):
        kind = secret_kind(text)
        if kind:
            out.append(Violation("no-secrets", r["name"], f"user data holds {kind}; the machine's role gives it credentials"))
    for r in resources:
        for path, text in _strings(_inputs(r)):
            if path == "userData":
                continue
            kind = secret_kind(text)
            if kind:
                out.append(Violation("no-secrets", r["name"], f"input {path} holds {kind}; remove it"))
    return out


# ----------------------------------------------------------------------------- cost

ASGS = ("aws:autoscaling/group:Group",)
MIGS = ("gcp:compute/instanceGroupManager:InstanceGroupManager", "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager")


def _asg_is_spot(g: Resource, resources: list[Resource]) -> bool | None:
    dist = _get(g, "mixedInstancesPolicy.instancesDistribution")
    if dist == UNKNOWN:
        return None
    if isinstance(dist, Mapping):
        pct = dist.get("onDemandPercentageAboveBaseCapacity", 100)
        base = dist.get("onDemandBaseCapacity", 0)
        if not (_known(pct) and _known(base)):
            return None
        return pct == 0 and base == 0
    templates = _of(resources, *LAUNCH_TEMPLATES)
    market = [_get(t, "instanceMarketOptions.marketType") for t in templates]
    return bool(market) and all(m == "spot" for m in market)


def _stops_group(s: Resource, g: Resource) -> bool:
    desired, low = _get(s, "desiredCapacity"), _get(s, "minSize")
    return desired == 0 and (low == 0 or _get(g, "minSize") == 0)


def spot_with_runtime_cap(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Groups run spot machines unless compute.spot: false was said, and the cloud itself stops
    them after compute.maxRuntimeHours (a scheduled scale to zero / a max run duration)."""
    out: list[Violation] = []
    groups = _of(resources, *ASGS)
    for g in groups:
        spot = _asg_is_spot(g, resources)
        if spot is False and not ctx.on_demand:
            out.append(Violation("spot-with-runtime-cap", g["name"], "runs on-demand machines; use 0% on-demand "
                                 "(spot) or say compute.spot: false"))
        schedules = [s for s in _of(resources, "aws:autoscaling/schedule:Schedule")
                     if _linked(s, g, "autoscalingGroupName", ("name",), groups)]
        if any(UNKNOWN in (_get(s, "desiredCapacity"), _get(s, "minSize")) for s in schedules):
            continue
        if not any(_stops_group(s, g) for s in schedules):
            out.append(Violation("spot-with-runtime-cap", g["name"], "no scheduled action sets the group to zero at "
                                 "launch + compute.maxRuntimeHours; add an autoscaling Schedule with desiredCapacity 0, minSize 0"))
    templates = _of(resources, *GCE_TEMPLATES)
    if _of(resources, *MIGS):
        for t in templates:
            model = _get(t, "scheduling.provisioningModel")
            spot = model == "SPOT" or _true(_get(t, "scheduling.preemptible"))
            if _known(model) and not spot and not ctx.on_demand:
                out.append(Violation("spot-with-runtime-cap", t["name"], "scheduling is not SPOT; set provisioningModel "
                                     "SPOT or say compute.spot: false"))
            secs = _get(t, "scheduling.maxRunDuration.seconds")
            if _known(secs) and not (isinstance(secs, int | str) and str(secs).isdigit() and int(secs) > 0):
                out.append(Violation("spot-with-runtime-cap", t["name"], "no scheduling.maxRunDuration; set it to "
                                     "compute.maxRuntimeHours so GCE stops the machines"))
    return out


# ----------------------------------------------------------------------------- tags

# Resource types that take tags (AWS) or labels (GCP) and that a trainstack stack creates.
# Any other resource whose inputs carry tags/labels is checked too.
TAGGABLE = frozenset({
    "aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2", "aws:iam/role:Role", "aws:iam/policy:Policy",
    "aws:iam/instanceProfile:InstanceProfile", "aws:ecr/repository:Repository",
    "aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/securityGroup:SecurityGroup",
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", "aws:autoscaling/group:Group",
    "aws:ec2/instance:Instance", "aws:scheduler/scheduleGroup:ScheduleGroup",
    "gcp:storage/bucket:Bucket", "gcp:compute/instanceTemplate:InstanceTemplate",
    "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate",
})
# A docker-build image is no cloud resource: its `tags` are image tags (repo:tag), and
# what it costs is storage in the repository, which carries the stack and run tags.
IMAGE_BUILDS = ("docker-build:",)
STACK_TAG = re.compile(r"^trainstack[:_-]stack$")
RUN_TAG = re.compile(r"^trainstack[:_-]run$")


def _tag_map(r: Resource) -> dict[str, Any] | None:
    """The resource's tags/labels as a dict (ASG tags are a list of key/value), or None if unknown."""
    if r.get("type") == "aws:autoscaling/group:Group":
        tags = _get(r, "tags", [])
        if _has_unknown(tags):
            return None
        return {t.get("key"): t.get("value") for t in _as_list(tags) if isinstance(t, Mapping)}
    for key in ("tags", "labels"):
        v = _inputs(r).get(key)
        if v == UNKNOWN:
            return None
        if isinstance(v, Mapping):
            return dict(v)
    return {}


def _tag_problem(tags: Mapping[str, Any], ctx: Context, *, labels: bool = False) -> str | None:
    """What the stack/run tags lack; GCP labels hold values lowercased, so they compare so."""
    missing = []
    for pat, want, what in ((STACK_TAG, ctx.stack, "stack"), (RUN_TAG, ctx.run_id, "run")):
        vals = [v for k, v in tags.items() if isinstance(k, str) and pat.match(k)]
        if not vals or any(not _known(v) for v in vals):
            if not vals:
                missing.append(f"trainstack-{what}")
            continue
        have = str(vals[0]).lower() if labels else str(vals[0])
        if want is not None and have != (want.lower() if labels else want):
            missing.append(f"trainstack-{what}={want} (has {vals[0]!r})")
    return ", ".join(missing) or None


def tagged(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Every taggable resource carries the stack and run tags (labels on GCP), so a bill or a
    console search finds everything a run created; launch templates pass them to instances and volumes."""
    out: list[Violation] = []
    for r in resources:
        inputs = _inputs(r)
        if r.get("type", "").startswith(IMAGE_BUILDS):
            continue
        if r.get("type") not in TAGGABLE and "tags" not in inputs and "labels" not in inputs:
            continue
        tags = _tag_map(r)
        if tags is None:
            continue
        problem = _tag_problem(tags, ctx, labels=r.get("type", "").startswith("gcp:"))
        if problem:
            out.append(Violation("tagged", r["name"], f"missing tag(s) {problem}; tag it from the one tags function"))
        if r.get("type") in LAUNCH_TEMPLATES:
            specs = _get(r, "tagSpecifications", [])
            if _has_unknown(specs):
                continue
            by_type = {s.get("resourceType"): s.get("tags") or {} for s in _as_list(specs) if isinstance(s, Mapping)}
            for rt in ("instance", "volume"):
                p = _tag_problem(by_type.get(rt, {}), ctx) if rt in by_type else "all"
                if p:
                    out.append(Violation("tagged", r["name"], f"tagSpecifications for {rt} lack {p}; "
                                         "machines and disks must carry the stack and run tags"))
    return out


# ----------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Rule:
    """A rule: its id, what it checks, why, the function, and whether it judges one resource or the stack."""

    id: str
    description: str
    why: str
    check: Callable[[list[Resource], Context], list[Violation]] = field(repr=False)
    scope: str = "stack"


RULES: tuple[Rule, ...] = (
    Rule("bucket-not-public", "Buckets block all public access (S3 public access block, no public ACL or "
         "policy; GCS uniform access, public access prevention enforced).",
         "The bucket holds the user's data and models.", bucket_not_public),
    Rule("bucket-encrypted", "S3 buckets have default server-side encryption configured.",
         "Data at rest is encrypted by a setting the stack owns, not by an account default.", bucket_encrypted),
    Rule("bucket-versioned", "Buckets keep noncurrent versions.",
         "An overwritten or deleted checkpoint can be recovered.", bucket_versioned),
    Rule("bucket-tls-only", "The S3 bucket policy denies requests without TLS.",
         "Checkpoints and data never travel in clear text.", bucket_tls_only),
    Rule("bucket-retained", "The bucket survives `pulumi destroy` unless storage.keepOnDestroy is false.",
         "Destroying compute must not destroy the results.", bucket_retained),
    Rule("released-on-destroy", "Everything but the bucket is neither retained nor protected.",
         "`pulumi destroy` must stop every cost; only the data stays.", released_on_destroy, "resource"),
    Rule("imdsv2-required", "Launch templates require IMDSv2 tokens with hop limit 1.",
         "Stops SSRF and containers on a bridge network from reading the role's credentials.", imdsv2_required, "resource"),
    Rule("gce-metadata-hardened", "GCE templates keep legacy metadata endpoints off and vTPM/integrity monitoring on.",
         "The GCP counterpart of IMDSv2 and a verified boot chain.", gce_metadata_hardened, "resource"),
    Rule("root-volume-encrypted", "Launch templates define an encrypted root volume.",
         "The disk holds the data set and checkpoints in flight.", root_volume_encrypted, "resource"),
    Rule("no-world-ingress", "No inbound rule from 0.0.0.0/0 or ::/0.",
         "A training machine needs no inbound traffic; SSH goes to named CIDRs.", no_world_ingress, "resource"),
    Rule("ssh-only-from-allowed", "Inbound traffic is only TCP 22 from access.allowedCidrs (and within the group).",
         "Nothing else listens for the outside world.", ssh_only_from_allowed, "resource"),
    Rule("iam-least-privilege", "IAM policies grant no `*` action and no `*` resource except where the API needs it.",
         "A stolen machine credential reaches this stack's bucket, repository and group only.", iam_least_privilege, "resource"),
    Rule("image-pinned", "Machines run an image pinned by tag or digest (never latest); ECR tags are immutable.",
         "A moving image would change a running job; a resumed run must run the same code.", image_pinned, "resource"),
    Rule("no-secrets", "No credentials in user data or any resource input.",
         "User data is readable from the instance without auth and inputs are kept in the state.", no_secrets, "resource"),
    Rule("spot-with-runtime-cap", "Groups run spot unless on-demand is explicit, and the cloud stops them after the runtime cap.",
         "A forgotten run must not bill GPUs forever.", spot_with_runtime_cap),
    Rule("tagged", "Every taggable resource carries the stack and run tags/labels.",
         "Cost and cleanup are found by tag.", tagged, "resource"),
)
RULES_BY_ID: dict[str, Rule] = {r.id: r for r in RULES}


def check(resources: Iterable[Resource], ctx: Context | None = None, rules: Iterable[Rule] = RULES) -> list[Violation]:
    """Every violation of `rules` (all by default) in `resources`."""
    res = list(resources)
    ctx = ctx or Context()
    return [v for rule in rules for v in rule.check(res, ctx)]
