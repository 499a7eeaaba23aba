"""The IAM rule (`iam-least-privilege`) line by line: what each AWS statement and GCP project grant
is refused for, in the words a user reads, and what it lets through."""

from __future__ import annotations

import json

import pytest

from policy.rules import UNKNOWN, Context, identity
from tests.policy import resources as R

RULE = "iam-least-privilege"


def _lines(res: list[dict]) -> list[str]:
    out = identity.iam_least_privilege(res, Context(stack=R.STACK, run_id=R.RUN))
    assert {v.rule for v in out} <= {RULE}
    return [f"{v.resource}: {v.message}" for v in out]


def _with_statements(*extra: dict, field: str = "policy", name: str = "dev-identity-policy",
                     doc: dict | None = None) -> list[dict]:
    res = R.aws_stack()
    doc = doc if doc is not None else R.role_policy()
    doc["Statement"] = [*doc["Statement"], *extra]
    R.by_name(res, name)["inputs"][field] = json.dumps(doc)
    return res


def test_the_clean_stacks_grant_nothing_too_wide():
    assert _lines(R.aws_stack()) == [] and _lines(R.gcp_stack()) == []


def test_a_wildcard_action_is_named_with_its_statement_and_sid():
    res = _with_statements({"Sid": "Everything", "Effect": "Allow", "Action": ["s3:GetObject", "ec2:*", "*"],
                            "Resource": f"{R.BUCKET_ARN}/*"})
    assert _lines(res) == ["dev-identity-policy: policy Statement[5] (Everything) allows ec2:*, *; list the actions "
                           "needed"]


def test_a_statement_without_sid_is_named_by_its_place():
    res = _with_statements({"Effect": "Allow", "Action": "s3:*", "Resource": f"{R.BUCKET_ARN}/*"})
    assert _lines(res) == ["dev-identity-policy: policy Statement[5] allows s3:*; list the actions needed"]


@pytest.mark.parametrize("action", ["s3:Get*", "s3:*Object", "ec2:Describe*"])
def test_a_narrower_pattern_is_not_a_wildcard_action(action):
    assert _lines(_with_statements({"Effect": "Allow", "Action": action, "Resource": f"{R.BUCKET_ARN}/*"})) == []


def test_a_wildcard_resource_names_only_the_actions_that_have_resources():
    res = _with_statements({"Sid": "Mixed", "Effect": "Allow", "Resource": ["*"],
                            "Action": ["ec2:DescribeInstances", "s3:GetObject", "cloudwatch:PutMetricData",
                                       "ecr:BatchGetImage"]})
    assert _lines(res) == ["dev-identity-policy: policy Statement[5] (Mixed) grants s3:GetObject, ecr:BatchGetImage on "
                           "Resource '*'; name this stack's ARNs"]
    # Every action without resource-level permission may take "*".
    res = _with_statements({"Effect": "Allow", "Resource": "*", "Action": sorted(identity.WILDCARD_RESOURCE_ACTIONS)})
    assert _lines(res) == []


@pytest.mark.parametrize(("key", "value"), [("NotAction", "iam:*"), ("NotResource", f"{R.BUCKET_ARN}/secret/*")])
def test_not_action_or_not_resource_with_allow_is_refused(key, value):
    st = {"Sid": "Inverse", "Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{R.BUCKET_ARN}/*", key: value}
    assert _lines(_with_statements(st)) == ["dev-identity-policy: policy Statement[5] (Inverse) uses "
                                            "NotAction/NotResource with Allow; list what is allowed"]


def test_deny_statements_may_be_as_wide_as_they_like():
    st = {"Effect": "Deny", "Action": "*", "NotResource": f"{R.BUCKET_ARN}/*", "Resource": "*"}
    assert _lines(_with_statements(st)) == []


def test_a_trust_policy_is_judged_on_who_may_assume_the_role():
    trust = R.trust_policy()
    # A trust statement names no Resource: that is not a wildcard resource.
    assert _lines(_with_statements(field="assumeRolePolicy", name="dev-identity-role", doc=trust)) == []
    anyone = {"Sid": "Open", "Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}
    res = _with_statements(anyone, field="assumeRolePolicy", name="dev-identity-role", doc=R.trust_policy())
    assert _lines(res) == ["dev-identity-role: assumeRolePolicy Statement[1] (Open) lets anyone assume the role; name "
                           "the service"]
    both = {"Effect": "Allow", "Principal": "*", "Action": "sts:*"}
    res = _with_statements(both, field="assumeRolePolicy", name="dev-identity-role", doc=R.trust_policy())
    assert _lines(res) == ["dev-identity-role: assumeRolePolicy Statement[1] allows sts:*; list the actions needed",
                           "dev-identity-role: assumeRolePolicy Statement[1] lets anyone assume the role; name the "
                           "service"]


def test_a_resource_policy_may_name_any_resource_of_its_own():
    # Who may use the bucket is bucket-not-public's business: the identity rule leaves "*" resources alone there.
    st = {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"}, "Action": "s3:GetObject",
          "Resource": "*"}
    assert _lines(_with_statements(st, name="dev-bucket-policy", doc=R.bucket_policy())) == []


def test_a_policy_that_is_not_json_is_said_so_and_the_rest_still_judged():
    res = _with_statements({"Effect": "Allow", "Action": "s3:*", "Resource": f"{R.BUCKET_ARN}/*"})
    R.by_name(res, "dev-identity-role")["inputs"]["assumeRolePolicy"] = "[1, 2]"  # JSON, but not a document
    assert _lines(res) == ["dev-identity-role: assumeRolePolicy is not a JSON policy document",
                           "dev-identity-policy: policy Statement[5] allows s3:*; list the actions needed"]


def test_an_unknown_document_is_not_judged_but_the_known_ones_are():
    res = _with_statements({"Effect": "Allow", "Action": "s3:*", "Resource": f"{R.BUCKET_ARN}/*"})
    R.by_name(res, "dev-identity-role")["inputs"]["assumeRolePolicy"] = UNKNOWN
    assert _lines(res) == ["dev-identity-policy: policy Statement[5] allows s3:*; list the actions needed"]


def _grant(role, condition=None, type_="gcp:projects/iAMMember:IAMMember", name="dev-grant") -> dict:
    return {"type": type_, "name": name, "parent": "dev-identity", "options": {},
            "inputs": {"project": "my-project-123", "role": role, "condition": condition,
                       "member": "serviceAccount:trainstack-dev@p.iam.gserviceaccount.com"}}


@pytest.mark.parametrize("role", identity.GCP_BASIC_ROLES)
@pytest.mark.parametrize("type_", identity.GCP_PROJECT_IAM)
def test_a_basic_role_on_the_project_is_refused_even_under_a_condition(role, type_):
    res = [*R.gcp_stack(), _grant(role, {"title": "t", "expression": "true"}, type_)]
    assert _lines(res) == [f"dev-grant: grants {role} on the whole project; grant a predefined role on the bucket or "
                           "repository instead"]


@pytest.mark.parametrize("role", ["roles/iam.serviceAccountAdmin", "roles/storage.admin"])
def test_an_admin_role_on_the_project_needs_a_condition(role):
    assert _lines([*R.gcp_stack(), _grant(role)]) == [
        f"dev-grant: grants {role} on the whole project without an IAM condition; narrow it to this stack's resources"]
    assert _lines([*R.gcp_stack(), _grant(role, {"title": "own", "expression": "resource.name == 'x'"})]) == []


@pytest.mark.parametrize("role", ["roles/storage.objectViewer", UNKNOWN, None, 3])
def test_a_predefined_role_or_one_not_known_yet_passes(role):
    assert _lines([*R.gcp_stack(), _grant(role)]) == []


def test_every_statement_after_a_skipped_one_is_still_judged():
    # A Deny first, then a wide Allow: the Allow is judged.
    res = _with_statements({"Effect": "Deny", "Action": "s3:DeleteObject", "Resource": f"{R.BUCKET_ARN}/*"},
                           {"Effect": "Allow", "Action": "s3:*", "Resource": f"{R.BUCKET_ARN}/*"})
    assert _lines(res) == ["dev-identity-policy: policy Statement[6] allows s3:*; list the actions needed"]
    # In a resource document, a later statement's wildcard action is refused as in any other.
    ok = {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"}, "Action": "s3:GetObject",
          "Resource": "*"}
    wide = {"Sid": "Wide", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
            "Action": "s3:*", "Resource": f"{R.BUCKET_ARN}/*"}
    res = _with_statements(ok, wide, name="dev-bucket-policy", doc=R.bucket_policy())
    assert _lines(res) == ["dev-bucket-policy: policy Statement[2] (Wide) allows s3:*; list the actions needed"]


def test_a_grant_after_one_not_known_yet_is_still_judged():
    res = [*R.gcp_stack(), _grant(UNKNOWN, name="dev-later"), _grant("roles/editor")]
    assert _lines(res) == ["dev-grant: grants roles/editor on the whole project; grant a predefined role on the "
                           "bucket or repository instead"]


def test_a_signing_key_policy_is_judged_by_its_actions_and_its_resource_star_is_the_key():
    from components.aws.signing_key import key_policy

    ours = json.loads(key_policy(partition="aws", account_id="123456789012", signer_arn="arn:aws:iam::123456789012:role/D"))
    key = {"type": "aws:kms/key:Key", "name": "dev-signing-key", "parent": "dev-signing", "inputs": {"policy": json.dumps(ours)}}
    assert _lines([*R.aws_stack(), key]) == []
    # AWS's default key policy: the account root may do anything with the key, so any IAM policy may grant Sign.
    default = {"Version": "2012-10-17", "Statement": [{"Sid": "EnableIAM", "Effect": "Allow", "Action": "kms:*",
                                                        "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
                                                        "Resource": "*"}]}
    key["inputs"]["policy"] = json.dumps(default)
    assert _lines([*R.aws_stack(), key]) == ["dev-signing-key: policy Statement[0] (EnableIAM) allows kms:*; list the "
                                             "actions needed"]
