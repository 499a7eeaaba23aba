"""The test evaluator (tests/iam/policy_eval.py) against AWS's documented evaluation rules."""

from __future__ import annotations

import pytest

from tests.iam.policy_eval import Decision, Request, UnsupportedPolicy, condition_holds, evaluate, wildcard_match

BUCKET = "arn:aws:s3:::b"


def doc(*statements: dict) -> dict:
    return {"Version": "2012-10-17", "Statement": list(statements)}


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("arn:aws:s3:::b/runs/x/*", "arn:aws:s3:::b/runs/x/a/b", True),  # '*' crosses '/'
        ("arn:aws:s3:::b/runs/x/*", "arn:aws:s3:::b/runs/xy/a", False),
        ("arn:aws:s3:::b/runs/x/*", "arn:aws:s3:::b/runs/x", False),
        ("a?c", "abc", True),
        ("a?c", "ac", False),
        ("a.c", "abc", False),  # regex characters are literal
        ("a[b]c", "abc", False),
        ("autoScalingGroup:*:autoScalingGroupName/g", "autoScalingGroup:u-1:autoScalingGroupName/g", True),
        ("autoScalingGroup:*:autoScalingGroupName/g", "autoScalingGroup:u-1:autoScalingGroupName/g2", False),
    ],
)
def test_wildcards(pattern: str, value: str, expected: bool) -> None:
    assert wildcard_match(pattern, value) is expected


def test_actions_ignore_case_resources_do_not() -> None:
    d = doc({"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{BUCKET}/Key"})
    assert evaluate([d], Request("S3:getobject", f"{BUCKET}/Key")) is Decision.ALLOW
    assert evaluate([d], Request("s3:GetObject", f"{BUCKET}/key")) is Decision.IMPLICIT_DENY


def test_explicit_deny_wins_over_allow_in_any_document() -> None:
    allow = doc({"Effect": "Allow", "Action": "s3:*", "Resource": "*"})
    deny = doc({"Effect": "Deny", "Action": "s3:DeleteObject", "Resource": f"{BUCKET}/*"})
    assert evaluate([allow, deny], Request("s3:DeleteObject", f"{BUCKET}/k")) is Decision.EXPLICIT_DENY
    assert evaluate([allow, deny], Request("s3:GetObject", f"{BUCKET}/k")) is Decision.ALLOW
    assert evaluate([deny], Request("s3:GetObject", f"{BUCKET}/k")) is Decision.IMPLICIT_DENY


def test_not_action_and_not_resource() -> None:
    d = doc({"Effect": "Allow", "NotAction": "iam:*", "NotResource": f"{BUCKET}/secret"})
    assert evaluate([d], Request("s3:GetObject", f"{BUCKET}/k")) is Decision.ALLOW
    assert evaluate([d], Request("iam:CreateUser", "*")) is Decision.IMPLICIT_DENY
    assert evaluate([d], Request("s3:GetObject", f"{BUCKET}/secret")) is Decision.IMPLICIT_DENY


SCALE_TO_ZERO = doc(
    {
        "Effect": "Allow",
        "Action": "autoscaling:UpdateAutoScalingGroup",
        "Resource": "*",
        "Condition": {"NumericEquals": {"autoscaling:MinSize": "0", "autoscaling:MaxSize": "0"}},
    }
)


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({"autoscaling:MinSize": "0", "autoscaling:MaxSize": "0"}, Decision.ALLOW),
        ({"autoscaling:MinSize": "0.0", "autoscaling:MaxSize": "0"}, Decision.ALLOW),  # numbers, not strings
        ({"autoscaling:MinSize": "0", "autoscaling:MaxSize": "4"}, Decision.IMPLICIT_DENY),
        ({"autoscaling:MinSize": "1", "autoscaling:MaxSize": "0"}, Decision.IMPLICIT_DENY),
        ({"autoscaling:MinSize": "0"}, Decision.IMPLICIT_DENY),  # a missing key fails a positive operator
        ({}, Decision.IMPLICIT_DENY),
        ({"autoscaling:minsize": "0", "AUTOSCALING:MAXSIZE": "0"}, Decision.ALLOW),  # key names ignore case
    ],
)
def test_numeric_conditions_all_keys_must_hold(context: dict, expected: Decision) -> None:
    assert evaluate([SCALE_TO_ZERO], Request("autoscaling:UpdateAutoScalingGroup", "arn:x", context)) is expected


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [("runs/x", True), ("runs/x/", True), ("runs/x/ckpt/a", True), ("runs/xy", False), ("runs/", False), (None, False)],
)
def test_string_like_any_of_the_values(prefix: str | None, expected: bool) -> None:
    context = {} if prefix is None else {"s3:prefix": prefix}
    assert condition_holds("StringLike", "s3:prefix", ["runs/x", "runs/x/*"], context) is expected


def test_negated_operators_and_if_exists_on_missing_keys() -> None:
    assert condition_holds("StringNotEquals", "k", "a", {}) is True
    assert condition_holds("StringNotEquals", "k", ["a", "b"], {"k": "b"}) is False
    assert condition_holds("StringNotEquals", "k", ["a", "b"], {"k": "c"}) is True
    assert condition_holds("NumericLessThanEqualsIfExists", "k", "3", {}) is True
    assert condition_holds("NumericLessThanEqualsIfExists", "k", "3", {"k": "4"}) is False
    assert condition_holds("NumericLessThanEquals", "k", "3", {}) is False
    assert condition_holds("NumericGreaterThan", "k", "3", {"k": "not a number"}) is False


def test_unknown_operators_and_shapes_are_refused_not_guessed() -> None:
    with pytest.raises(UnsupportedPolicy):
        condition_holds("DateLessThan", "aws:CurrentTime", "2030-01-01", {"aws:CurrentTime": "x"})
    with pytest.raises(UnsupportedPolicy):
        condition_holds("ForAnyValue:StringEquals", "k", "a", {"k": "a"})
    with pytest.raises(UnsupportedPolicy):
        evaluate([doc({"Effect": "Allow", "Action": "*", "Resource": "*", "Principal": "*"})], Request("s3:GetObject", "*"))
    with pytest.raises(UnsupportedPolicy):
        evaluate([doc({"Effect": "Permit", "Action": "*", "Resource": "*"})], Request("s3:GetObject", "*"))


# -- trust policies of federated principals ----------------------------------------------------------

GOOGLE = "accounts.google.com"
WEB = "sts:AssumeRoleWithWebIdentity"


def trusting(*conditions: dict, effect: str = "Allow", principal: object = None) -> dict:
    return doc(*[{"Effect": effect, "Principal": principal or {"Federated": GOOGLE}, "Action": WEB,
                  **({"Condition": c} if c else {})} for c in conditions or ({},)])


def test_trust_allows_the_federated_principal_whose_conditions_hold() -> None:
    from tests.iam.policy_eval import evaluate_trust

    policy = trusting({"StringEquals": {f"{GOOGLE}:sub": "123", f"{GOOGLE}:oaud": "a"}})
    ok = {f"{GOOGLE}:sub": "123", f"{GOOGLE}:oaud": "a"}
    assert evaluate_trust(policy, federated=GOOGLE, action=WEB, context=ok) is Decision.ALLOW
    assert evaluate_trust(policy, federated=GOOGLE, action=WEB, context={**ok, f"{GOOGLE}:sub": "124"}) \
        is Decision.IMPLICIT_DENY
    # A missing key makes StringEquals false.
    assert evaluate_trust(policy, federated=GOOGLE, action=WEB, context={f"{GOOGLE}:sub": "123"}) \
        is Decision.IMPLICIT_DENY
    assert evaluate_trust(policy, federated="graph.facebook.com", action=WEB, context=ok) is Decision.IMPLICIT_DENY
    assert evaluate_trust(policy, federated=GOOGLE, action="sts:AssumeRole", context=ok) is Decision.IMPLICIT_DENY


def test_trust_deny_wins_and_other_principals_are_refused() -> None:
    from tests.iam.policy_eval import evaluate_trust

    both = doc(*trusting({})["Statement"], *trusting({}, effect="Deny")["Statement"])
    assert evaluate_trust(both, federated=GOOGLE, action=WEB, context={}) is Decision.EXPLICIT_DENY
    with pytest.raises(UnsupportedPolicy):
        evaluate_trust(trusting({}, principal={"Service": "ec2.amazonaws.com"}), federated=GOOGLE, action=WEB,
                       context={})


def test_google_condition_keys_are_not_the_claims_of_the_same_name() -> None:
    from tests.iam.policy_eval import google_token_context

    assert google_token_context({"sub": "1", "azp": "2", "aud": "x"}) == {
        f"{GOOGLE}:sub": "1", f"{GOOGLE}:aud": "2", f"{GOOGLE}:oaud": "x"}
    # A token without azp: :aud is its aud.
    assert google_token_context({"sub": "1", "aud": "x"})[f"{GOOGLE}:aud"] == "x"
