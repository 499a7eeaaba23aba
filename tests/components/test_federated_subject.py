"""Every workload identity pool provider maps a `google.subject` Google's STS accepts (127 bytes at most).

Both directions of federation into GCP: an AWS home's controller function reaching a GCP placement's group
(its role is named after the stack), and a GCP home's AWS placement's machines reaching home's bucket. The
stacks are synthesized with the longest names the naming takes (a 100-character stack, Pulumi's longest, and a
63-character run id, the settings' longest), and each provider's subject is worked out from its own mapping for the longest ARN a
session of the role its condition admits can present (the longest partition, a 64-character session name: a
Lambda's session is its function's name). `ops synth` prints the same figure and refuses a stack over it.
"""

from __future__ import annotations

import argparse
from functools import cache

import pytest
import yaml

from components.gcp import federation
from ops import synth

LONGEST_STACK = "s" * 100
RUN = {"id": "r" * 63, "synthetic": True, "steps": 100}
STACKS = {
    "aws-home-gcp-placement": {
        "cloud": "aws", "region": "us-east-1", "run": RUN,
        "placements": [{"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge"]},
                       {"cloud": "gcp", "region": "us-central1", "project": "my-gpus-42",
                        "instanceTypes": ["g2-standard-4"]}],
    },
    "gcp-home-aws-placement": {
        "cloud": "gcp", "region": "us-central1", "project": "my-proj-123", "run": RUN,
        "placements": [{"cloud": "gcp", "region": "us-central1", "project": "my-proj-123",
                        "instanceTypes": ["g2-standard-4"]},
                       {"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g6.xlarge"]}],
    },
}
# The provider each direction makes: the AWS controller's, and the AWS machines'.
PROVIDERS = {"aws-home-gcp-placement": "trainstack-controller-access-p1-provider",
             "gcp-home-aws-placement": "trainstack-machine-access-p1-provider"}


@cache
def synthesized(key: str) -> synth.Result:
    return synth.synthesize(STACKS[key], stack=LONGEST_STACK)


@pytest.mark.parametrize("key", sorted(STACKS))
def test_every_pool_providers_subject_fits_for_the_longest_names(key):
    r = synthesized(key)
    subjects = synth.federated_subjects(r)
    assert [name for name, _ in subjects] == [PROVIDERS[key]]
    assert all(size <= federation.SUBJECT_MAX_BYTES for _, size in subjects), subjects
    assert synth.subject_problem(subjects) is None
    # The default mapping (the whole ARN, session and all) would be refused for the controller's role.
    (provider,) = r.of_type(synth.POOL_PROVIDER)
    role = provider["inputs"]["attributeCondition"].split("assumed-role/")[1].rstrip('"')
    whole_arn = {"google.subject": "assertion.arn"}
    if key == "aws-home-gcp-placement":
        assert len(role) == 64  # the controller's role: named after the 100-character stack, at IAM's longest
        assert federation.subject_bytes_worst_case(role, whole_arn) > federation.SUBJECT_MAX_BYTES


def test_the_subject_is_the_role_the_condition_and_the_bindings_name():
    """The subject is `attribute.aws_role`'s value: the grants (a principal set of that attribute) still match."""
    r = synthesized("aws-home-gcp-placement")
    (provider,) = r.of_type(synth.POOL_PROVIDER)
    mapping = provider["inputs"]["attributeMapping"]
    assert mapping["google.subject"] == mapping["attribute.aws_role"] == federation.AWS_ROLE_EXPRESSION
    role_arn = provider["inputs"]["attributeCondition"].split('"')[1]
    session = f"{role_arn}/{'f' * 64}"
    assert federation.mapped_subject(session) == role_arn
    assert federation.mapped_subject(session, {"google.subject": mapping["attribute.aws_role"]}) == role_arn
    (impersonate,) = [m for m in r.of_type("gcp:serviceaccount/iAMMember:IAMMember")
                      if m["name"] == "trainstack-controller-access-p1-impersonate"]
    assert impersonate["inputs"]["member"].endswith(f"/attribute.aws_role/{role_arn}")
    assert "/subject/" not in impersonate["inputs"]["member"]


def test_any_iam_role_fits_in_any_partition():
    """IAM role names take 64 characters: the subject is at most 110 bytes, whatever the stack's names."""
    assert federation.subject_bytes_worst_case("r" * 64) == 110
    assert federation.mapped_subject("arn:aws:iam::123456789012:user/me") == "arn:aws:iam::123456789012:user/me"
    with pytest.raises(ValueError, match="unsupported CEL"):
        federation.mapped_subject("arn:aws:sts::1:assumed-role/r/s", {"google.subject": "assertion.account"})


def _cmd(tmp_path, key: str, capsys) -> tuple[int, str, str]:
    stacks = tmp_path / "stacks"
    stacks.mkdir(exist_ok=True)
    (stacks / f"Pulumi.{LONGEST_STACK}.yaml").write_text(yaml.safe_dump(
        {"config": {f"trainstack:{k}": v for k, v in STACKS[key].items()}}))
    args = argparse.Namespace(stack=LONGEST_STACK, out=str(tmp_path / "out"), stacks_dir=str(stacks), offline=True)
    code = synth.cmd_synth(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ops_synth_prints_each_subjects_worst_case(tmp_path, capsys):
    code, out, err = _cmd(tmp_path, "aws-home-gcp-placement", capsys)
    assert code == 0, err
    assert "trainstack-controller-access-p1-provider: google.subject at most 110 of 127 bytes" in out


def test_ops_synth_refuses_a_subject_google_would_refuse(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(federation.AWS_ATTRIBUTE_MAPPING, "google.subject", "assertion.arn")
    code, out, err = _cmd(tmp_path, "aws-home-gcp-placement", capsys)
    assert code == 2 and not (tmp_path / "out").exists()
    assert len(err.strip().splitlines()) == 1
    assert "trainstack-controller-access-p1-provider maps a federated google.subject of up to 175 bytes" in err
