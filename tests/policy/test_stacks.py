"""Every stack in stacks/ (and config variants) goes through `ops synth`, every rule and parliament: all clean.

The synth output is also broken on purpose, one property at a time, to prove the rules read
the shape synth really writes (a rule that never matches a real resource would pass vacuously).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from components import registry
from components.settings import load_settings, load_stack_file, raw_from_stack_file
from components.userdata import decode_user_data, encode_user_data
from ops import synth
from policy import iam, rules

STACKS = sorted(Path(synth.STACKS_DIR).glob("Pulumi.*.yaml"))
STACK_NAMES = [p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in STACKS]

# Config variants that switch on what the stack files leave off: SSH access, several
# nodes (worker ingress), Jupyter on the machines, on-demand, a bucket that may go, a digest-pinned image, the
# trainer image built and pushed to the stack's repository.
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDvFv4rG7bz4VPf5QO3VqlZl8s3oxXUA6dMu5O3wYp8N me@laptop"
VARIANTS = {
    "ssh-multinode": {"access": {"sshPublicKey": KEY, "allowedCidrs": ["203.0.113.0/24", "2001:db8::/48"]},
                      "compute": {"instanceTypes": ["g5.12xlarge"], "gpusPerNode": 4, "nodes": 2}},
    "on-demand-disposable": {"compute": {"spot": False}, "storage": {"keepOnDestroy": False},
                             "image": {"tag": "2.21.0-gpu", "digest": "sha256:" + "ab" * 32}},
    "image-build": {"image": {"build": True}},
    "ssh-jupyter": {"access": {"sshPublicKey": KEY, "allowedCidrs": ["203.0.113.7/32"], "jupyter": True}},
    # An AWS home with a GCP placement: its group, service accounts and roles in its project, the role its
    # machines assume with their Google identity, the controller's workload identity pool.
    "gcp-placement": {"placements": [
        {"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge", "g6.xlarge", "g4dn.xlarge"]},
        {"cloud": "gcp", "region": "us-central1", "project": "my-gpus-42", "instanceTypes": ["g2-standard-4"]}]},
}


@pytest.fixture(scope="module")
def synthesized() -> dict[str, tuple[synth.Result, rules.Context]]:
    """Each stack file and variant synthesized once for the module (about 2 s each)."""
    out = {}
    for name, path in zip(STACK_NAMES, STACKS, strict=True):
        out[name] = (synth.synthesize(path), rules.context_from_settings(load_stack_file(path)))
    base = raw_from_stack_file(synth.STACKS_DIR / "Pulumi.dev.yaml")
    for name, change in VARIANTS.items():
        raw = copy.deepcopy(base)
        for block, values in change.items():
            raw[block] = {**raw.get(block, {}), **values} if isinstance(values, dict) else values
        out[name] = (synth.synthesize(raw, stack=name), rules.context_from_settings(load_settings(raw, stack=name)))
    return out


ALL = STACK_NAMES + list(VARIANTS)


# parliament findings accepted by name: (resource name without the stack prefix, issue) ->
# why, with the same justification in a comment next to the statement in the component.
# Empty: every document the stacks produce passes parliament as it is.
ALLOWED_FINDINGS: dict[tuple[str, str], str] = {
    ("pods-role", "UNKNOWN_FEDERATION_SOURCE"): "parliament 1.6.4 knows no IAM OIDC provider as a federation source; "
                                                "EKS IRSA's trust names the cluster's, as AWS documents it",
}


def test_stacks_exist():
    assert {"dev", "large"} <= set(STACK_NAMES)


@pytest.mark.parametrize("stack", ALL)
def test_stack_is_clean_under_every_rule(synthesized, stack):
    result, ctx = synthesized[stack]
    custom = [r for r in result.resources if r["options"].get("custom")]
    assert len(custom) >= 8, "synth registered too few resources for a whole stack"
    assert rules.check(result.resources, ctx) == []


def test_jupyter_variant_really_installs_jupyter_and_opens_no_other_port(synthesized):
    result, _ = synthesized["ssh-jupyter"]
    [text] = result.user_data.values()
    assert "/opt/trainstack/bin/jupyter.sh" in text and "trainstack-jupyter.service" in text
    # Jupyter is reached through SSH only: the security group's ingress is port 22 alone.
    groups = [r for r in result.resources if r["type"] == "aws:ec2/securityGroup:SecurityGroup"]
    rules_in = [r for r in result.resources if r["type"] == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"]
    ports = {(i.get("fromPort"), i.get("toPort")) for g in groups for i in g["inputs"].get("ingress", [])}
    ports |= {(r["inputs"].get("fromPort"), r["inputs"].get("toPort")) for r in rules_in}
    assert ports == {(22, 22)}, ports


@pytest.mark.parametrize("stack", ALL)
def test_stack_policies_pass_parliament(synthesized, stack):
    result, _ = synthesized[stack]
    docs = iam.policy_documents(result.resources)
    if not any(r["type"].startswith("aws:") for r in result.resources):
        assert docs == []  # a GCP stack: IAM bindings, no AWS policy documents
        return
    # the role's trust policy, its permissions and the TLS-only bucket policy, at least; a GCP home's AWS
    # placement has roles and no S3 bucket (the run folder is in GCS), so no bucket policy
    in_s3 = any(r["type"] == "aws:s3/bucket:Bucket" for r in result.resources)
    # a stack that builds its image holds the key policy of the key that signs it
    signs = any(r["type"] == "aws:kms/key:Key" for r in result.resources)
    assert {d.kind for d in docs} == {"trust", "identity", *(["resource"] if in_s3 else []), *(["key"] if signs else [])}
    assert len(docs) >= (3 if in_s3 else 4)
    findings = [f for f in iam.lint(docs) if (f.resource.split("-", 1)[-1], f.issue) not in ALLOWED_FINDINGS]
    assert findings == [], [str(f) for f in findings]


def test_variants_exercise_what_they_switch_on(synthesized):
    """The variants really produce SSH and worker ingress, on-demand, a disposable bucket."""
    res, _ = synthesized["ssh-multinode"]
    sg = next(r for r in res.resources if r["type"] == "aws:ec2/securityGroup:SecurityGroup")
    ingress = sg["inputs"]["ingress"]
    assert any(i.get("fromPort") == 22 for i in ingress) and any(i.get("self") for i in ingress)
    res, ctx = synthesized["on-demand-disposable"]
    assert ctx.on_demand and not ctx.keep_bucket
    asg = next(r for r in res.resources if r["type"] == "aws:autoscaling/group:Group")
    dist = asg["inputs"]["mixedInstancesPolicy"]["instancesDistribution"]
    assert dist.get("onDemandPercentageAboveBaseCapacity") == 100
    bucket = next(r for r in res.resources if r["type"] == "aws:s3/bucket:Bucket")
    assert bucket["options"]["retainOnDelete"] is False


def _one(resources: list[dict], type_: str) -> dict:
    found = [r for r in resources if r["type"] == type_]
    assert len(found) == 1, type_
    return found[0]


def _statement_edit(resources: list[dict], type_: str, i: int, **kv) -> None:
    r = _one(resources, type_)
    doc = json.loads(r["inputs"]["policy"])
    doc["Statement"][i].update(kv)
    r["inputs"]["policy"] = json.dumps(doc)


def _replace_image(resources: list[dict], image: str) -> None:
    lt = _one(resources, "aws:ec2/launchTemplate:LaunchTemplate")
    text = decode_user_data(lt["inputs"]["userData"])
    pinned = f"tensorflow/tensorflow@{registry.stand_in('tensorflow/tensorflow', '2.21.0-gpu')}"
    assert f"TRAINSTACK_IMAGE='{pinned}'" in text
    text = text.replace(pinned, image)
    lt["inputs"]["userData"] = encode_user_data(text)


BREAKS = {
    "bucket-not-public": lambda rs: rs.remove(_one(rs, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")),
    "bucket-encrypted": lambda rs: rs.remove(_one(rs, "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")),
    "bucket-versioned": lambda rs: rs.remove(_one(rs, "aws:s3/bucketVersioning:BucketVersioning")),
    "bucket-tls-only": lambda rs: rs.remove(_one(rs, "aws:s3/bucketPolicy:BucketPolicy")),
    "bucket-retained": lambda rs: _one(rs, "aws:s3/bucket:Bucket")["options"].update(retainOnDelete=False),
    "released-on-destroy": lambda rs: _one(rs, "aws:autoscaling/schedule:Schedule")["options"].update(retainOnDelete=True),
    "imdsv2-required": lambda rs: _one(rs, "aws:ec2/launchTemplate:LaunchTemplate")["inputs"]["metadataOptions"].update(httpTokens="optional"),
    "root-volume-encrypted": lambda rs: _one(rs, "aws:ec2/launchTemplate:LaunchTemplate")["inputs"]["blockDeviceMappings"][0]["ebs"].update(encrypted="false"),
    "no-world-ingress": lambda rs: _one(rs, "aws:ec2/securityGroup:SecurityGroup")["inputs"]["ingress"].append(
        {"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}),
    "ssh-only-from-allowed": lambda rs: _one(rs, "aws:ec2/securityGroup:SecurityGroup")["inputs"]["ingress"].append(
        {"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["198.51.100.0/24"]}),
    "iam-least-privilege": lambda rs: _statement_edit(rs, "aws:iam/rolePolicy:RolePolicy", 0, Resource="*"),
    "image-pinned": lambda rs: _replace_image(rs, "tensorflow/tensorflow:latest-gpu"),
    # A signing key beside machines whose user data holds no public key (as if the stack signed and forgot them).
    "image-verified": lambda rs: rs.append({"type": "aws:kms/key:Key", "name": "trainstack-signing-key",
                                            "parent": "trainstack-signing", "options": {"custom": True},
                                            "inputs": {"keyUsage": "SIGN_VERIFY",
                                                       "tags": dict(_one(rs, "aws:s3/bucket:Bucket")["inputs"]["tags"])}}),
    "no-secrets": lambda rs: _one(rs, "aws:s3/bucket:Bucket")["inputs"]["tags"].update(key="AKIAIOSFODNN7EXAMPLE"),
    "spot-with-runtime-cap": lambda rs: rs.remove(_one(rs, "aws:autoscaling/schedule:Schedule")),
    "tagged": lambda rs: _one(rs, "aws:iam/role:Role")["inputs"].update(tags={}),
}


@pytest.mark.parametrize("rule", sorted(BREAKS))
def test_rule_reads_the_real_synth_shape(synthesized, rule):
    result, ctx = synthesized["dev"]
    resources = copy.deepcopy(result.resources)
    BREAKS[rule](resources)
    fired = rules.check(resources, ctx)
    assert {v.rule for v in fired} == {rule}, [str(v) for v in fired]


def test_a_stack_that_signs_its_image_gives_every_machine_the_key_and_the_rule_sees_one_without(synthesized):
    result, ctx = synthesized["image-build"]
    resources = copy.deepcopy(result.resources)
    assert resources and _one(resources, "aws:kms/key:Key")
    assert [str(v) for v in rules.check(resources, ctx, [rules.RULES_BY_ID["image-verified"]])] == []
    lt = _one(resources, "aws:ec2/launchTemplate:LaunchTemplate")
    text = decode_user_data(lt["inputs"]["userData"])
    lt["inputs"]["userData"] = encode_user_data("".join(
        line for line in text.splitlines(keepends=True) if "TRAINSTACK_IMAGE_PUBLIC_KEY=" not in line))
    assert {v.rule for v in rules.check(resources, ctx)} == {"image-verified"}


def test_every_aws_rule_is_broken_on_real_output():
    aws_rules = {r.id for r in rules.RULES} - {"gce-metadata-hardened"}
    assert aws_rules == set(BREAKS)


def test_parliament_finds_what_it_should():
    """The lint is live: a wildcard resource, a misspelt action and a broken trust policy are reported."""
    def doc(kind: str, text: str) -> iam.PolicyDocument:
        return iam.PolicyDocument("r", "policy", kind, text)

    bad = doc("identity", json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"},
        {"Effect": "Allow", "Action": "s3:GetObjekt", "Resource": "arn:aws:s3:::b/*"}]}))
    issues = [f.issue for f in iam.lint([bad, doc("trust", '{"Version": "2012-10-17", "Statement": [')])]
    assert sorted(issues) == ["MALFORMED_JSON", "RESOURCE_STAR", "UNKNOWN_ACTION"]


def _pulumi_takes_tags(type_token: str) -> bool:
    """Whether pulumi-aws's resource for this type token has a `tags` input."""
    import importlib

    module_path, name = type_token.split(":")[1], type_token.split(":")[2]
    import keyword

    module_name = module_path.split("/")[0]
    # A module named by a Python keyword takes a trailing underscore (aws:lambda -> pulumi_aws.lambda_).
    module = importlib.import_module(f"pulumi_aws.{module_name}{'_' if keyword.iskeyword(module_name) else ''}")
    args = getattr(module, f"{name}Args", None)
    assert args is not None, f"pulumi_aws has no {name}Args for {type_token}"
    return isinstance(getattr(args, "tags", None), property)


def test_tag_rule_sees_every_taggable_resource(synthesized):
    """Whatever a stack creates that AWS can tag is judged by the tagged rule."""
    checked = 0
    for result, _ in synthesized.values():
        for r in result.resources:
            if not r["type"].startswith("aws:") or not r["options"].get("custom"):
                continue
            if _pulumi_takes_tags(r["type"]):
                assert r["type"] in rules.TAGGABLE or "tags" in r["inputs"], r["type"]
                checked += 1
    assert checked >= 8


@pytest.mark.parametrize("stack", ALL)
def test_stack_outputs_hold_no_secret(synthesized, stack):
    result, _ = synthesized[stack]
    texts = [v for v in json.dumps(result.outputs).split('"') if v]
    assert len(result.outputs) >= 3 and texts
    assert [t for t in texts if rules.secret_kind(t)] == []
