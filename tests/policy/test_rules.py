"""Each rule fires on a resource that breaks it, and stays quiet on the clean stacks."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from policy import rules
from policy.rules import UNKNOWN, Context
from tests.policy import resources as R


def _set(name: str, path: str, value) -> Callable[[list[dict]], None]:
    """A mutation: set inputs.<path> of resource `name` (path parts split on '.')."""

    def mutate(res: list[dict]) -> None:
        cur = R.by_name(res, name)["inputs"]
        parts = path.split(".")
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        if isinstance(cur, list):
            cur[int(parts[-1])] = value
        else:
            cur[parts[-1]] = value

    return mutate


def _drop(name: str) -> Callable[[list[dict]], None]:
    def mutate(res: list[dict]) -> None:
        res.remove(R.by_name(res, name))

    return mutate


def _add(resource: dict) -> Callable[[list[dict]], None]:
    def mutate(res: list[dict]) -> None:
        res.append(resource)

    return mutate


def _opt(name: str, key: str, value) -> Callable[[list[dict]], None]:
    def mutate(res: list[dict]) -> None:
        R.by_name(res, name)["options"][key] = value

    return mutate


def _policy(name: str, field: str, edit: Callable[[dict], None]) -> Callable[[list[dict]], None]:
    def mutate(res: list[dict]) -> None:
        r = R.by_name(res, name)
        doc = json.loads(r["inputs"][field])
        edit(doc)
        r["inputs"][field] = json.dumps(doc)

    return mutate


def _user_data(text: str) -> Callable[[list[dict]], None]:
    return _set("dev-group-lt", "userData", base64.b64encode(text.encode()).decode())


def _stmt(i: int, **kv) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        doc["Statement"][i].update(kv)

    return edit


def _append_stmt(st: dict) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        doc["Statement"].append(st)

    return edit


LT, SG, ASG, B = "dev-group-lt", "dev-group-sg", "dev-group-asg", "dev-bucket"
SSH_EVERYWHERE = {"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}

# (case id, rule id, resource that must be named, message fragment, mutation, cloud)
AWS_BREAKS: list[tuple[str, str, str, str, Callable[[list[dict]], None]]] = [
    ("no-public-access-block", "bucket-not-public", B, "no BucketPublicAccessBlock", _drop("dev-bucket-public-access")),
    ("public-acls-allowed", "bucket-not-public", "dev-bucket-public-access", "blockPublicAcls",
     _set("dev-bucket-public-access", "blockPublicAcls", False)),
    ("restrict-off", "bucket-not-public", "dev-bucket-public-access", "restrictPublicBuckets",
     _set("dev-bucket-public-access", "restrictPublicBuckets", False)),
    ("public-read-acl", "bucket-not-public", B, "public-read", _set(B, "acl", "public-read")),
    ("policy-allows-anyone", "bucket-not-public", B, "Principal '*'",
     _policy("dev-bucket-policy", "policy", _append_stmt(
         {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "s3:GetObject", "Resource": f"{R.BUCKET_ARN}/*"}))),
    ("no-encryption", "bucket-encrypted", B, "no default server-side encryption", _drop("dev-bucket-encryption")),
    ("bad-algorithm", "bucket-encrypted", B, "sseAlgorithm",
     _set("dev-bucket-encryption", "rules.0.applyServerSideEncryptionByDefault.sseAlgorithm", "none")),
    ("no-versioning", "bucket-versioned", B, "versioning not enabled", _drop("dev-bucket-versioning")),
    ("versioning-suspended", "bucket-versioned", B, "versioning not enabled",
     _set("dev-bucket-versioning", "versioningConfiguration.status", "Suspended")),
    ("no-bucket-policy", "bucket-tls-only", B, "aws:SecureTransport", _drop("dev-bucket-policy")),
    ("tls-deny-allows", "bucket-tls-only", B, "aws:SecureTransport",
     _policy("dev-bucket-policy", "policy", _stmt(0, Condition={"Bool": {"aws:SecureTransport": "true"}}))),
    ("tls-deny-objects-only", "bucket-tls-only", B, "bucket/*",
     _policy("dev-bucket-policy", "policy", _stmt(0, Resource=f"{R.BUCKET_ARN}/*"))),
    ("not-retained", "bucket-retained", B, "retainOnDelete", _opt(B, "retainOnDelete", False)),
    ("force-destroy", "bucket-retained", B, "forceDestroy", _set(B, "forceDestroy", True)),
    ("group-retained", "released-on-destroy", ASG, "retainOnDelete", _opt(ASG, "retainOnDelete", True)),
    ("role-protected", "released-on-destroy", "dev-identity-role", "protect", _opt("dev-identity-role", "protect", True)),
    ("imds-optional", "imdsv2-required", LT, "httpTokens", _set(LT, "metadataOptions.httpTokens", "optional")),
    ("imds-hops", "imdsv2-required", LT, "HopLimit", _set(LT, "metadataOptions.httpPutResponseHopLimit", 2)),
    ("root-unencrypted", "root-volume-encrypted", LT, "encrypted", _set(LT, "blockDeviceMappings.0.ebs.encrypted", "false")),
    ("no-root-mapping", "root-volume-encrypted", LT, "no blockDeviceMappings", _set(LT, "blockDeviceMappings", [])),
    ("egress-as-ingress-world-v6", "no-world-ingress", SG, "::/0",
     _set(SG, "ingress", [{"protocol": "tcp", "fromPort": 22, "toPort": 22, "ipv6CidrBlocks": ["::/0"]}])),
    ("ingress-rule-world", "no-world-ingress", "dev-open", "0.0.0.0/0",
     _add({"type": "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "name": "dev-open", "parent": "dev-group",
           "inputs": {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": "0.0.0.0/0", "tags": dict(R.TAGS)},
           "options": {}})),
    ("sg-rule-world", "no-world-ingress", "dev-open-rule", "0.0.0.0/0",
     _add({"type": "aws:ec2/securityGroupRule:SecurityGroupRule", "name": "dev-open-rule", "parent": "dev-group",
           "inputs": {"type": "ingress", "protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]},
           "options": {}})),
    ("ssh-unconfigured", "ssh-only-from-allowed", SG, "not in access.allowedCidrs",
     _set(SG, "ingress", [{"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["198.51.100.7/32"]}])),
    ("https-open", "ssh-only-from-allowed", SG, "only TCP 22",
     _set(SG, "ingress", [{"protocol": "tcp", "fromPort": 443, "toPort": 443, "cidrBlocks": ["203.0.113.0/24"]}])),
    ("other-group-source", "ssh-only-from-allowed", SG, "another source",
     _set(SG, "ingress", [{"protocol": "tcp", "fromPort": 22, "toPort": 22, "securityGroups": ["sg-0abc"]}])),
    ("star-action", "iam-least-privilege", "dev-identity-policy", "allows *",
     _policy("dev-identity-policy", "policy", _stmt(1, Action="*"))),
    ("service-star-action", "iam-least-privilege", "dev-identity-policy", "s3:*",
     _policy("dev-identity-policy", "policy", _stmt(1, Action="s3:*"))),
    ("star-resource", "iam-least-privilege", "dev-identity-policy", "Resource '*'",
     _policy("dev-identity-policy", "policy", _stmt(1, Resource="*"))),
    ("star-resource-mixed", "iam-least-privilege", "dev-identity-policy", "ecr:BatchGetImage",
     _policy("dev-identity-policy", "policy", _stmt(2, Action=["ecr:GetAuthorizationToken", "ecr:BatchGetImage"]))),
    ("not-action", "iam-least-privilege", "dev-identity-policy", "NotAction",
     _policy("dev-identity-policy", "policy", _append_stmt({"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}))),
    ("trust-anyone", "iam-least-privilege", "dev-identity-role", "anyone",
     _policy("dev-identity-role", "assumeRolePolicy", _stmt(0, Principal={"AWS": "*"}))),
    ("not-json", "iam-least-privilege", "dev-identity-policy", "not a JSON", _set("dev-identity-policy", "policy", "{oops")),
    ("latest", "image-pinned", LT, "moves", _user_data(R.user_data("tensorflow/tensorflow:latest"))),
    ("latest-gpu", "image-pinned", LT, "moves", _user_data(R.user_data("tensorflow/tensorflow:latest-gpu"))),
    ("untagged", "image-pinned", LT, "no tag or digest", _user_data(R.user_data("tensorflow/tensorflow"))),
    ("registry-port-untagged", "image-pinned", LT, "no tag or digest", _user_data(R.user_data("reg.example:5000/tf"))),
    ("bad-digest", "image-pinned", LT, "sha256", _user_data(R.user_data("tensorflow/tensorflow@sha256:abc"))),
    ("no-image-line", "image-pinned", LT, "no TRAINSTACK_IMAGE", _user_data("#cloud-config\n")),
    ("mutable-ecr", "image-pinned", "dev-repo", "IMMUTABLE", _set("dev-repo", "imageTagMutability", "MUTABLE")),
    ("signed-image-no-key", "image-verified", LT, "sets no TRAINSTACK_IMAGE_PUBLIC_KEY", _add(R._r(
        "aws:kms/key:Key", "dev-signing-key", "dev-signing",
        {"keyUsage": "SIGN_VERIFY", "customerMasterKeySpec": "ECC_NIST_P256", "tags": dict(R.TAGS)}))),
    ("aws-key-in-user-data", "no-secrets", LT, "AWS access key id",
     _user_data(R.user_data(extra="AWS_ACCESS_KEY_ID='AKIAIOSFODNN7EXAMPLE'\n"))),
    ("secret-key-in-user-data", "no-secrets", LT, "AWS secret access key",
     _user_data(R.user_data(extra="aws_secret_access_key = wJalrXUtnFEMI/K7MDENG\n"))),
    ("private-key-in-user-data", "no-secrets", LT, "private key",
     _user_data(R.user_data(extra="-----BEGIN OPENSSH PRIVATE KEY-----\n"))),
    ("sa-json-in-tag", "no-secrets", B, "GCP service account key",
     _set(B, "tags.note", '{"type": "service_account", "private_key": "x"}')),
    ("on-demand-unasked", "spot-with-runtime-cap", ASG, "on-demand",
     _set(ASG, "mixedInstancesPolicy.instancesDistribution.onDemandPercentageAboveBaseCapacity", 100)),
    ("no-cap", "spot-with-runtime-cap", ASG, "no scheduled action", _drop("dev-group-runtime-cap")),
    ("cap-not-zero", "spot-with-runtime-cap", ASG, "no scheduled action", _set("dev-group-runtime-cap", "desiredCapacity", 1)),
    ("cap-other-group", "spot-with-runtime-cap", ASG, "no scheduled action",
     _set("dev-group-runtime-cap", "autoscalingGroupName", "someone-elses-group")),
    ("untagged-bucket", "tagged", B, "trainstack-stack", _set(B, "tags", {"trainstack-run": R.RUN})),
    ("no-run-tag-role", "tagged", "dev-identity-role", "trainstack-run", _set("dev-identity-role", "tags", {"trainstack-stack": "dev"})),
    ("asg-untagged", "tagged", ASG, "trainstack-stack", _set(ASG, "tags", [])),
    ("volumes-untagged", "tagged", LT, "volume", _set(LT, "tagSpecifications", [{"resourceType": "instance", "tags": dict(R.TAGS)}])),
    ("untyped-taggable", "tagged", "dev-extra", "trainstack-stack",
     _add({"type": "aws:sns/topic:Topic", "name": "dev-extra", "parent": None, "inputs": {"tags": {}}, "options": {}})),
]

GCP_BREAKS: list[tuple[str, str, str, str, Callable[[list[dict]], None]]] = [
    ("gcs-not-uniform", "bucket-not-public", "dev-bucket", "uniformBucketLevelAccess",
     _set("dev-bucket", "uniformBucketLevelAccess", False)),
    ("gcs-pap-inherited", "bucket-not-public", "dev-bucket", "publicAccessPrevention",
     _set("dev-bucket", "publicAccessPrevention", "inherited")),
    ("gcs-all-users", "bucket-not-public", "dev-bucket-sa", "allUsers", _set("dev-bucket-sa", "member", "allUsers")),
    ("gcs-unversioned", "bucket-versioned", "dev-bucket", "versioning", _set("dev-bucket", "versioning", {"enabled": False})),
    ("gcs-not-retained", "bucket-retained", "dev-bucket", "retainOnDelete", _opt("dev-bucket", "retainOnDelete", False)),
    ("gce-legacy-metadata", "gce-metadata-hardened", "dev-group-tpl", "disable-legacy-endpoints",
     _set("dev-group-tpl", "metadata.disable-legacy-endpoints", "false")),
    ("gce-no-vtpm", "gce-metadata-hardened", "dev-group-tpl", "enableVtpm", _set("dev-group-tpl", "shieldedInstanceConfig.enableVtpm", False)),
    ("gce-world", "no-world-ingress", "dev-ssh", "0.0.0.0/0",
     _add({"type": "gcp:compute/firewall:Firewall", "name": "dev-ssh", "parent": "dev-group",
           "inputs": {"sourceRanges": ["0.0.0.0/0"], "allows": [{"protocol": "tcp", "ports": ["22"]}]}, "options": {}})),
    ("gce-not-spot", "spot-with-runtime-cap", "dev-group-tpl", "SPOT",
     _set("dev-group-tpl", "scheduling", {"provisioningModel": "STANDARD", "maxRunDuration": {"seconds": 3600}})),
    ("gce-no-cap", "spot-with-runtime-cap", "dev-group-tpl", "maxRunDuration",
     _set("dev-group-tpl", "scheduling", {"provisioningModel": "SPOT"})),
    ("gce-latest", "image-pinned", "dev-group-tpl", "moves",
     _set("dev-group-tpl", "metadata.user-data", R.user_data("gcr.io/x/tf:latest"))),
    ("signed-image-no-key", "image-verified", "dev-group-tpl", "sets no TRAINSTACK_IMAGE_PUBLIC_KEY", _add(R._r(
        "gcp:kms/cryptoKey:CryptoKey", "dev-signing-key", "dev-signing",
        {"purpose": "ASYMMETRIC_SIGN", "labels": {k: v.lower() for k, v in R.TAGS.items()}}))),
    ("gcp-editor", "iam-least-privilege", "dev-identity-resize", "roles/editor",
     _set("dev-identity-resize", "role", "roles/editor")),
    ("gcp-admin-unconditioned", "iam-least-privilege", "dev-identity-resize", "without an IAM condition",
     _set("dev-identity-resize", "condition", None)),
    ("gce-unlabelled", "tagged", "dev-group-tpl", "trainstack-run", _set("dev-group-tpl", "labels", {"trainstack-stack": "dev"})),
]


def test_clean_aws_stack_passes_every_rule():
    res = R.aws_stack()
    assert len(res) == 13
    assert rules.check(res, Context(stack=R.STACK, run_id=R.RUN)) == []


def test_clean_aws_variants_pass():
    """SSH from a configured CIDR and worker traffic inside the group are allowed."""
    res = R.aws_stack(ssh_cidrs=["203.0.113.0/24"], nodes=2)
    ingress = R.by_name(res, SG)["inputs"]["ingress"]
    assert len(ingress) == 2
    assert rules.check(res, Context(allowed_ssh_cidrs=("203.0.113.0/24",))) == []
    # a narrower CIDR inside the allowed one is fine too
    ingress[0]["cidrBlocks"] = ["203.0.113.7/32"]
    assert rules.check(res, Context(allowed_ssh_cidrs=("203.0.113.0/24",))) == []


def test_clean_gcp_stack_passes_every_rule():
    res = R.gcp_stack()
    assert rules.check(res, Context(stack=R.STACK, run_id=R.RUN)) == []


def _fired(res: list[dict], ctx: Context | None = None) -> list[rules.Violation]:
    return rules.check(res, ctx or Context(stack=R.STACK, run_id=R.RUN))


@pytest.mark.parametrize(("case", "rule", "resource", "fragment", "mutate"), AWS_BREAKS, ids=[c[0] for c in AWS_BREAKS])
def test_rule_fires_on_broken_aws_resource(case, rule, resource, fragment, mutate):
    res = R.aws_stack()
    mutate(res)
    fired = _fired(res)
    assert {v.rule for v in fired} == {rule}, [str(v) for v in fired]
    assert any(v.resource == resource and fragment in v.message for v in fired), [str(v) for v in fired]


@pytest.mark.parametrize(("case", "rule", "resource", "fragment", "mutate"), GCP_BREAKS, ids=[c[0] for c in GCP_BREAKS])
def test_rule_fires_on_broken_gcp_resource(case, rule, resource, fragment, mutate):
    res = R.gcp_stack()
    mutate(res)
    fired = _fired(res)
    assert {v.rule for v in fired} == {rule}, [str(v) for v in fired]
    assert any(v.resource == resource and fragment in v.message for v in fired), [str(v) for v in fired]


def test_every_rule_is_proven_to_fire():
    proven = {c[1] for c in AWS_BREAKS + GCP_BREAKS}
    registered = {r.id for r in rules.RULES}
    assert registered - proven == set(), "rules without a firing test"
    assert proven <= registered
    assert len(registered) == len(rules.RULES) >= 15


def test_registry_entries_are_documented():
    for r in rules.RULES:
        assert r.id and r.description.endswith(".") and r.why.endswith("."), r.id
        assert r.scope in ("resource", "stack")
        assert r.check.__doc__, r.id
    assert len(rules.RULES_BY_ID) == len(rules.RULES)


def test_wildcard_resource_allowances_carry_a_reason():
    assert "ecr:GetAuthorizationToken" in rules.WILDCARD_RESOURCE_ACTIONS
    for action, why in rules.WILDCARD_RESOURCE_ACTIONS.items():
        assert ":" in action and "*" not in action and len(why) > 20, action


def test_world_ssh_fires_even_when_the_config_allows_world():
    """allowWorld: true is accepted by config, and still shows up under no-world-ingress."""
    res = R.aws_stack(ssh_cidrs=["0.0.0.0/0"])
    fired = _fired(res, Context(allowed_ssh_cidrs=("0.0.0.0/0",)))
    assert [v.rule for v in fired] == ["no-world-ingress"]


def test_on_demand_is_fine_when_said_explicitly():
    res = R.aws_stack()
    _set(ASG, "mixedInstancesPolicy.instancesDistribution.onDemandPercentageAboveBaseCapacity", 100)(res)
    assert [v.rule for v in _fired(res)] == ["spot-with-runtime-cap"]
    assert _fired(res, Context(on_demand=True)) == []


def test_bucket_may_go_when_the_stack_says_so():
    res = R.aws_stack()
    _opt(B, "retainOnDelete", False)(res)
    _set(B, "forceDestroy", True)(res)
    assert {v.rule for v in _fired(res)} == {"bucket-retained"}
    assert _fired(res, Context(keep_bucket=False)) == []


def test_tag_values_must_match_the_stack_when_known():
    res = R.aws_stack()
    fired = _fired(res, Context(stack="prod", run_id=R.RUN))
    assert fired and {v.rule for v in fired} == {"tagged"}
    assert all("trainstack-stack=prod" in v.message for v in fired)


def test_unknown_values_are_not_judged():
    """During preview an unknown value is neither passed nor failed: the next preview judges it."""
    res = R.aws_stack()
    _set(LT, "metadataOptions.httpTokens", UNKNOWN)(res)
    _set("dev-bucket-policy", "policy", UNKNOWN)(res)
    _set("dev-identity-policy", "policy", UNKNOWN)(res)
    _set(B, "tags", UNKNOWN)(res)
    # sub-resources whose bucket id is unknown still link to the bucket of the same component
    for name in ("dev-bucket-public-access", "dev-bucket-versioning", "dev-bucket-encryption"):
        _set(name, "bucket", UNKNOWN)(res)
    assert _fired(res) == []


def test_sub_resources_link_by_id_the_engine_assigned():
    """A bucket id from mocks or the cloud (not the name) still ties the settings to the bucket."""
    res = R.aws_stack()
    for name in ("dev-bucket-public-access", "dev-bucket-versioning", "dev-bucket-encryption", "dev-bucket-policy"):
        _set(name, "bucket", "dev-bucket_id")(res)
    R.by_name(res, B)["id"] = "dev-bucket_id"
    assert _fired(res) == []
    # and a second bucket does not borrow the first one's settings
    res.append({"type": "aws:s3/bucket:Bucket", "name": "other", "parent": None, "id": "other_id",
                "inputs": {"bucket": "other-b", "tags": dict(R.TAGS)}, "options": {"retainOnDelete": True}})
    fired = {v.rule for v in _fired(res) if v.resource == "other"}
    assert fired == {"bucket-not-public", "bucket-encrypted", "bucket-versioned", "bucket-tls-only"}


@pytest.mark.parametrize(("ref", "ok"), [
    ("tensorflow/tensorflow:2.21.0-gpu", True),
    ("123456789012.dkr.ecr.us-east-1.amazonaws.com/trainstack/dev@sha256:" + "a" * 64, True),
    ("reg.example:5000/tf:1.0", True),
    ("reg.example:5000/tf", False),
    ("tf:LATEST", False),
    ("tf@sha256:" + "A" * 64, False),
])
def test_image_problem(ref, ok):
    assert (rules.image_problem(ref) is None) is ok


def test_readme_lists_every_rule():
    readme = (Path(__file__).resolve().parents[2] / "policy" / "README.md").read_text()
    rows = [line.split("|")[1].strip().strip("`") for line in readme.splitlines() if line.startswith("| `")]
    assert rows == [r.id for r in rules.RULES]


# Inputs whose unknown value changes what another resource refers to: the engine makes the
# reference unknown too, which test_unknown_values_are_not_judged covers.
_REFERENCED = {("dev-group-asg", "name")}


def _every_input(cloud: str) -> list[tuple[str, str, str]]:
    stack = R.aws_stack(ssh_cidrs=["203.0.113.0/24"], nodes=2) if cloud == "aws" else R.gcp_stack()
    return [(cloud, r["name"], k) for r in stack for k in r["inputs"] if (r["name"], k) not in _REFERENCED]


def _nested_paths(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nested_paths(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nested_paths(v, f"{path}.{i}" if path else str(i))
    if path:
        yield path


@pytest.mark.parametrize(("cloud", "resource", "key"), _every_input("aws") + _every_input("gcp"))
def test_any_unknown_input_is_not_a_violation(cloud, resource, key):
    """Each input, and each value nested in it, unknown in turn: no rule fires on what it cannot see."""
    def fresh():
        return R.aws_stack(ssh_cidrs=["203.0.113.0/24"], nodes=2) if cloud == "aws" else R.gcp_stack()

    ctx = Context(stack=R.STACK, run_id=R.RUN, allowed_ssh_cidrs=("203.0.113.0/24",))
    value = R.by_name(fresh(), resource)["inputs"][key]
    paths = [key] + [f"{key}.{p}" for p in _nested_paths(value) if isinstance(value, dict | list)]
    for path in paths:
        res = fresh()
        _set(resource, path, UNKNOWN)(res)
        assert rules.check(res, ctx) == [], path
    assert len(paths) >= 1


def test_gcp_labels_compare_lowercased():
    res = R.gcp_stack()
    assert rules.check(res, Context(stack="DEV", run_id="Dev")) == []
    assert {v.rule for v in rules.check(res, Context(stack="prod", run_id="dev"))} == {"tagged"}
    # AWS tags keep their case
    assert {v.rule for v in rules.check(R.aws_stack(), Context(stack="DEV", run_id="dev"))} == {"tagged"}


def test_pack_manifest_points_at_its_own_virtualenv():
    import yaml

    pack_dir = Path(__file__).resolve().parents[2] / "policy"
    manifest = yaml.safe_load((pack_dir / "PulumiPolicy.yaml").read_text())
    assert manifest["runtime"]["name"] == "python" and manifest["version"]
    venv = (pack_dir / manifest["runtime"]["options"]["virtualenv"]).resolve()
    assert venv == pack_dir.parent / ".venv-policy"
    reqs = (pack_dir / "requirements.txt").read_text().split()
    assert "pulumi-policy==1.21.0" in reqs


def test_a_signed_images_machines_that_hold_the_key_pass():
    key = R._r("aws:kms/key:Key", "dev-signing-key", "dev-signing", {"keyUsage": "SIGN_VERIFY", "tags": dict(R.TAGS)})
    res = [*R.aws_stack(), key]
    (lt,) = [r for r in res if r["name"] == LT]
    lt["inputs"]["userData"] = R.user_data(extra="TRAINSTACK_IMAGE_PUBLIC_KEY='MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE'\n")
    assert [str(v) for v in _fired(res)] == []
