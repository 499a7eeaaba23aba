"""`ops preflight`'s image-signing key check: with `image.build`, whether the deployer may create, read and delete
the stack's KMS key and sign with it.

AWS: the caller (STS GetCallerIdentity; an assumed role's session maps to its role, whose path IAM GetRole gives)
simulated with IAM SimulatePrincipalPolicy. moto simulates no policy: real botocore clients with `Stubber`, which
checks each request and each answer against the service models. GCP: Cloud Resource Manager's
projects.testIamPermissions, through a fake `GcpApi` and the REST client against answers of the documented shape.
"""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from components import settings as config
from components.gcp.naming import PREREQUISITE_APIS
from ops import preflight
from ops.preflight import aws as preflight_aws
from ops.preflight import gcp as preflight_gcp
from ops.preflight.gcp_api import ApiDisabled, RestGcpApi

REGION = "eu-west-1"
ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/ci/deployer"
SESSION = f"arn:aws:sts::{ACCOUNT}:assumed-role/deployer/pulumi-up-1"
KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/*"
AWS = {"cloud": "aws", "region": REGION, "run": {"id": "exp-7", "synthetic": True, "steps": 100},
       "compute": {"instanceTypes": ["g5.xlarge"]}}


def aws_settings(build: bool = True) -> config.Settings:
    return config.load_settings({**AWS, "image": {"build": build}}, stack="unit")


def client(name: str):
    return boto3.client(name, region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")


def results(actions: tuple[str, ...], resource: str, decisions: dict[str, str]) -> dict:
    return {"EvaluationResults": [{"EvalActionName": a, "EvalResourceName": resource,
                                   "EvalDecision": decisions.get(a, "allowed")} for a in actions],
            "IsTruncated": False}


def stubbed(decisions: dict[str, str], caller: str = SESSION, principal: str = ROLE) -> tuple[object, object, list]:
    """STS and IAM clients answering the check's calls in order: who the caller is, its role (for a session), and
    the three simulations (created, key, signer actions), each action `allowed` unless `decisions` says."""
    sts, iam = client("sts"), client("iam")
    stubs = [Stubber(sts), Stubber(iam)]
    stubs[0].add_response("get_caller_identity", {"UserId": "AROAEXAMPLEROLEID1:pulumi-up-1", "Account": ACCOUNT,
                                                  "Arn": caller}, {})
    if ":assumed-role/" in caller:
        stubs[1].add_response("get_role", {"Role": {
            "Path": "/ci/", "RoleName": "deployer", "RoleId": "AROAEXAMPLEROLEID1", "Arn": ROLE,
            "CreateDate": "2026-01-01T00:00:00Z"}}, {"RoleName": "deployer"})
    for actions, resource in ((preflight_aws.SIGNING_CREATE_ACTIONS, "*"), (preflight_aws.SIGNING_KEY_ACTIONS, KEY),
                              (preflight_aws.SIGNING_SIGNER_ACTIONS, KEY)):
        stubs[1].add_response("simulate_principal_policy", results(actions, resource, decisions), {
            "PolicySourceArn": principal, "ActionNames": list(actions), "ResourceArns": [resource]})
    for stub in stubs:
        stub.activate()
    return sts, iam, stubs


ADMINISTERED = sorted(set(preflight_aws.SIGNING_CREATE_ACTIONS + preflight_aws.SIGNING_KEY_ACTIONS))


@pytest.mark.parametrize("action", ADMINISTERED)
@pytest.mark.parametrize("decision", ["implicitDeny", "explicitDeny"])
def test_each_action_the_key_needs_that_iam_refuses_is_named_with_the_statement_to_add(action, decision) -> None:
    sts, iam, stubs = stubbed({action: decision})
    (p,) = preflight_aws.aws_signing_key_problems(aws_settings(), sts, iam)
    for stub in stubs:
        stub.assert_no_pending_responses()
    assert p.what == (f"image.build: the image-signing KMS key in {REGION}: {ROLE} may not {action} (its IAM "
                      "policies, simulated), so `pulumi up` would fail at the key after the bucket, repository and "
                      "image exist (or `pulumi destroy` at its deletion)")
    assert p.fix == (f"add to {ROLE}'s IAM policy the statement "
                     f'{{"Effect": "Allow", "Action": ["{action}"], "Resource": "*"}}')


def test_a_deployer_allowed_everything_is_clean_and_every_action_was_simulated() -> None:
    sts, iam, stubs = stubbed({})
    assert preflight_aws.aws_signing_key_problems(aws_settings(), sts, iam) == []
    for stub in stubs:
        stub.assert_no_pending_responses()  # the role's path read, and all three simulations made


def test_sign_left_to_the_key_policy_passes_but_an_explicit_deny_of_it_does_not() -> None:
    # The key's own policy grants Sign and GetPublicKey: IAM's silence (implicitDeny) is expected.
    sts, iam, _ = stubbed({"kms:Sign": "implicitDeny", "kms:GetPublicKey": "implicitDeny"})
    assert preflight_aws.aws_signing_key_problems(aws_settings(), sts, iam) == []
    sts, iam, _ = stubbed({"kms:Sign": "explicitDeny"})
    (p,) = preflight_aws.aws_signing_key_problems(aws_settings(), sts, iam)
    assert p.what.startswith(f"image.build: the image-signing KMS key in {REGION}: {ROLE} is denied kms:Sign by its "
                             "IAM policies or the organization's SCPs")


def test_sign_an_organization_s_scp_withholds_is_named() -> None:
    # The simulator says an SCP's refusal as AllowedByOrganizations false; no key policy overrides it.
    sts, iam = client("sts"), client("iam")
    with Stubber(sts) as s, Stubber(iam) as i:
        user = f"arn:aws:iam::{ACCOUNT}:user/alice"
        s.add_response("get_caller_identity", {"UserId": "AIDAEXAMPLEUSERID1", "Account": ACCOUNT, "Arn": user}, {})
        for actions in (preflight_aws.SIGNING_CREATE_ACTIONS, preflight_aws.SIGNING_KEY_ACTIONS):
            i.add_response("simulate_principal_policy", results(actions, KEY, {}))
        scp = results(preflight_aws.SIGNING_SIGNER_ACTIONS, KEY, {"kms:Sign": "implicitDeny"})
        scp["EvaluationResults"][1]["OrganizationsDecisionDetail"] = {"AllowedByOrganizations": False}
        i.add_response("simulate_principal_policy", scp)
        (p,) = preflight_aws.aws_signing_key_problems(aws_settings(), sts, iam)
    assert p.what.startswith(f"image.build: the image-signing KMS key in {REGION}: {user} is denied kms:Sign by its "
                             "IAM policies or the organization's SCPs")


def test_an_assumed_role_session_is_simulated_as_its_role_with_its_path() -> None:
    # The session ARN has no path (role/ci/deployer shows as assumed-role/deployer): GetRole gives the role's ARN,
    # and the Stubber checks every simulation names it.
    assert preflight_aws.aws_deployer_arn(SESSION, stubbed({})[1]) == ROLE


def test_a_user_is_simulated_as_itself_and_root_is_not_simulated() -> None:
    user = f"arn:aws:iam::{ACCOUNT}:user/ops/alice"
    sts, iam, stubs = stubbed({"kms:CreateKey": "implicitDeny"}, caller=user, principal=user)
    (p,) = preflight_aws.aws_signing_key_problems(aws_settings(), sts, iam)
    assert p.what.startswith(f"image.build: the image-signing KMS key in {REGION}: {user} may not kms:CreateKey")
    sts, iam = client("sts"), client("iam")
    stub = Stubber(sts)
    stub.add_response("get_caller_identity", {"UserId": ACCOUNT, "Account": ACCOUNT,
                                              "Arn": f"arn:aws:iam::{ACCOUNT}:root"}, {})
    stub.activate()
    Stubber(iam).activate()  # any IAM call fails the test
    assert preflight_aws.aws_signing_key_problems(aws_settings(), sts, iam) == []
    stub.assert_no_pending_responses()


def test_a_refused_simulation_is_said_as_not_checked() -> None:
    sts, iam = client("sts"), client("iam")
    with Stubber(sts) as s, Stubber(iam) as i:
        s.add_response("get_caller_identity", {"UserId": "AROAEXAMPLEROLEID1:x", "Account": ACCOUNT, "Arn": SESSION}, {})
        i.add_response("get_role", {"Role": {"Path": "/ci/", "RoleName": "deployer", "RoleId": "AROAEXAMPLEROLEID1",
                                             "Arn": ROLE, "CreateDate": "2026-01-01T00:00:00Z"}}, {"RoleName": "deployer"})
        i.add_client_error("simulate_principal_policy", "AccessDenied", "not authorized to perform: "
                           "iam:SimulatePrincipalPolicy", 403)
        (p,) = preflight_aws.aws_signing_key_problems(aws_settings(), sts, iam)
    assert p.what.startswith(f"image.build: the image-signing KMS key in {REGION}: could not check what {ROLE} may "
                             "do with it (iam:SimulatePrincipalPolicy refused: AccessDenied: ")
    assert p.what.endswith("it was not checked")
    assert p.fix.startswith(f"allow iam:SimulatePrincipalPolicy on {ROLE} to these credentials, or make sure it may "
                            "kms:CreateKey, kms:TagResource, kms:DescribeKey")


def test_without_image_build_no_kms_question_is_asked() -> None:
    sts, iam = client("sts"), client("iam")
    with Stubber(sts), Stubber(iam):  # no answer queued: any call fails the test
        assert preflight_aws.aws_signing_key_problems(aws_settings(build=False), sts, iam) == []


class Recording:
    """A boto3 session that records which clients the checks make; every call on them fails (a problem each)."""

    def __init__(self) -> None:
        self.made: list[str] = []

    def client(self, name: str, region_name: str | None = None):
        self.made.append(name)
        return object()


@pytest.mark.parametrize("build", [True, False])
def test_the_groups_check_the_key_only_when_they_build(build: bool) -> None:
    session = Recording()
    problems = preflight_aws.check_aws(aws_settings(build), session)
    assert ("iam" in session.made) is build
    assert any(p.what.startswith("could not check image signing key: ") for p in problems) is build


GCP = {"cloud": "gcp", "region": "us-central1", "project": "my-project",
       "run": {"id": "exp-7", "synthetic": True, "steps": 100},
       "compute": {"instanceTypes": ["g2-standard-4"], "zones": ["us-central1-a"]}}


def gcp_settings(build: bool = True) -> config.Settings:
    return config.load_settings({**GCP, "image": {"build": build}}, stack="unit")


class Permissions:
    """The GCP read the check makes: which of the asked permissions the caller holds on the project."""

    def __init__(self, held: set[str]) -> None:
        self.held, self.asked = held, []

    def project_permissions(self, project: str, permissions: list[str]) -> set[str]:
        self.asked.append((project, list(permissions)))
        return self.held & set(permissions)


@pytest.mark.parametrize("permission", preflight_gcp.SIGNING_PERMISSIONS)
def test_each_cloud_kms_permission_the_key_needs_that_the_project_withholds_is_named(permission: str) -> None:
    api = Permissions(set(preflight_gcp.SIGNING_PERMISSIONS) - {permission})
    (p,) = preflight_gcp.gcp_signing_key_problems(gcp_settings(), api)
    assert api.asked == [("my-project", list(preflight_gcp.SIGNING_PERMISSIONS))]
    assert p.what == (f"image.build: you may not {permission} in project my-project (testIamPermissions), so "
                      "`pulumi up` would fail at the image-signing key after the bucket, repository and image exist "
                      "(or `pulumi destroy` at its version)")
    assert p.fix.startswith("gcloud projects add-iam-policy-binding my-project --member=")
    assert "--role=roles/cloudkms.admin" in p.fix


def test_every_permission_held_is_clean_and_signing_is_left_to_the_key_s_own_grant() -> None:
    api = Permissions(set(preflight_gcp.SIGNING_PERMISSIONS))
    assert preflight_gcp.gcp_signing_key_problems(gcp_settings(), api) == []
    # The stack grants the deployer signer and publicKeyViewer on the key: not asked of the project.
    assert not {"cloudkms.cryptoKeyVersions.useToSign", "cloudkms.cryptoKeyVersions.viewPublicKey"} & set(
        api.asked[0][1])


class GcpReads(Permissions):
    """Every GCP read of the groups' checks answered clean, and the permissions held as said."""

    def enabled_services(self, project: str) -> set[str]:
        return {*PREREQUISITE_APIS, "compute.googleapis.com"}

    def region_quotas(self, project: str, region: str) -> dict[str, tuple[float, float]]:
        return {"PREEMPTIBLE_NVIDIA_L4_GPUS": (8.0, 0.0)}

    def project_quotas(self, project: str) -> dict[str, tuple[float, float]]:
        return {"GPUS_ALL_REGIONS": (8.0, 0.0)}

    def offered(self, project: str, zone: str, kind: str, name: str) -> bool:
        return True

    def network(self, project: str, name: str) -> dict | None:
        return {"subnetworks": [f"https://www.googleapis.com/compute/v1/projects/{project}/regions/us-central1/"
                                "subnetworks/default"]}

    def routes(self, project: str) -> list[dict]:
        return [{"network": f"https://www.googleapis.com/compute/v1/projects/{project}/global/networks/default",
                 "destRange": "0.0.0.0/0"}]


@pytest.mark.parametrize("build", [True, False])
def test_the_groups_ask_cloud_kms_permissions_only_when_they_build(build: bool) -> None:
    api = GcpReads(set())
    problems = preflight.check(gcp_settings(build), gcp_api=api)
    assert bool(api.asked) is build
    assert [p.what.split(" in project")[0] for p in problems] == (
        [f"image.build: you may not {', '.join(preflight_gcp.SIGNING_PERMISSIONS)}"] if build else [])


def test_a_vertex_stack_asks_them_too() -> None:
    from tests.ops.test_preflight_vertex import FakeVertexGcp, stack

    class Withheld(FakeVertexGcp):
        def project_permissions(self, project: str, permissions: list[str]) -> set[str]:
            return set(permissions) - {"cloudkms.keyRings.create"}

    api = Withheld({"aiplatform.googleapis.com/custom_model_training_preemptible_nvidia_l4_gpus": {"": 8.0}})
    (p,) = preflight.check(stack(), gcp_api=api)
    assert p.what.startswith("image.build: you may not cloudkms.keyRings.create in project my-training-project")


class Answer:
    def __init__(self, status: int, doc: dict) -> None:
        self.status_code, self._doc, self.text = status, doc, str(doc)

    def json(self) -> dict:
        return self._doc


class PostSession:
    """google-auth's AuthorizedSession for one POST: records it, gives `answer`."""

    def __init__(self, answer: Answer) -> None:
        self.answer, self.posted = answer, []

    def post(self, url: str, json: dict | None = None, timeout: float = 0) -> Answer:
        self.posted.append((url, json))
        return self.answer


def test_the_rest_client_asks_cloud_resource_manager_s_test_iam_permissions() -> None:
    url = "https://cloudresourcemanager.googleapis.com/v1/projects/p:testIamPermissions"
    session = PostSession(Answer(200, {"permissions": ["cloudkms.keyRings.create"]}))
    asked = ["cloudkms.keyRings.create", "cloudkms.cryptoKeys.create"]
    assert RestGcpApi(session, anonymous=object()).project_permissions("p", asked) == {"cloudkms.keyRings.create"}
    assert session.posted == [(url, {"permissions": asked})]
    # None held: the answer leaves the field out (proto3 JSON).
    assert RestGcpApi(PostSession(Answer(200, {})), anonymous=object()).project_permissions("p", asked) == set()
    off = PostSession(Answer(403, {"error": {"code": 403, "message": "Cloud Resource Manager API has not been used",
                                             "details": [{"reason": "SERVICE_DISABLED", "metadata": {
                                                 "service": "cloudresourcemanager.googleapis.com"}}]}}))
    with pytest.raises(ApiDisabled) as e:
        RestGcpApi(off, anonymous=object()).project_permissions("p", asked)
    assert e.value.service == "cloudresourcemanager.googleapis.com"
