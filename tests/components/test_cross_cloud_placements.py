"""An AWS-home stack with a GCP placement, under the mocks (`ops synth` of the real `__main__.py`).

The GCP placement's group is made in its own project, through a provider of that project and region,
at size zero, by its own service account; its machines' env file says the run folder is in the home S3
bucket and which AWS role their Google identity assumes for it. That role trusts exactly that service
account (its unique id, as `sub` and `azp`) for exactly the placement's audience, and may do in S3 what
home's machine role may (no more: no image, no group). The home controller reaches the GCP group through
a workload identity pool whose AWS provider admits only the controller function's role, a service
account only that role may impersonate, and a grant on that one group; `controller_config` tells it how.
"""

from __future__ import annotations

import json
from functools import cache

import pytest
import yaml

from components.aws.controller import role_name
from components.aws.federation import GOOGLE, audience
from components.gcp.controller import GROUP_PERMISSIONS
from components.gcp.federation import AWS_ATTRIBUTE_MAPPING
from components.machine import ENV_FILE
from ops import synth
from ops.fakes.common import fake_hex

PROJECT = "my-gpus-42"
RAW = {
    "cloud": "aws", "region": "us-east-1", "run": {"id": "exp-7", "synthetic": True, "steps": 100},
    "placements": [{"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge"]},
                   {"cloud": "aws", "region": "us-west-2", "instanceTypes": ["g5.xlarge"]},
                   {"cloud": "gcp", "region": "us-central1", "project": PROJECT, "instanceTypes": ["g2-standard-4"],
                    "zones": ["us-central1-a"]}],
}
GCE_GROUP = "trainstack-places--exp-7-gpu-p2"
HOME_GROUP = "trainstack-places--exp-7-gpu"
MIG = "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager"


@cache
def synthesized() -> synth.Result:
    return synth.synthesize(RAW, stack="places")


def _unique_id(resource_name: str) -> str:
    """The fake cloud's unique id of a service account (ops/fakes/gcp.py: from the resource's fake hex)."""
    return str(int(fake_hex("gcp:serviceaccount/account:Account", resource_name)[:15], 16))


def _env(r: synth.Result, template: str) -> dict[str, str]:
    (text,) = [f["content"] for f in yaml.safe_load(r.user_data[template])["write_files"] if f["path"] == ENV_FILE]
    return {k: v.strip("'") for k, v in (line.split("=", 1) for line in text.splitlines())}


def _providers(r: synth.Result) -> dict[str, dict]:
    return {x["name"]: x["inputs"] for x in r.resources if x["type"].startswith("pulumi:providers:")}


def test_the_gcp_group_is_in_its_project_at_zero_with_its_own_service_account():
    r = synthesized()
    (mig,) = r.of_type(MIG)
    assert mig["inputs"]["name"] == GCE_GROUP and mig["inputs"]["targetSize"] == 0
    assert mig["inputs"]["distributionPolicyZones"] == ["us-central1-a"]
    provider = _providers(r)[mig["options"]["provider"]]
    assert (provider["project"], provider["region"]) == (PROJECT, "us-central1")
    (template,) = r.of_type(synth.INSTANCE_TEMPLATE)
    (account,) = [a for a in r.of_type("gcp:serviceaccount/account:Account") if a["parent"] == "trainstack-identity-p2"]
    assert account["inputs"]["project"] == PROJECT
    assert template["inputs"]["serviceAccount"]["email"] == f"{account['inputs']['accountId']}@{PROJECT}.iam.gserviceaccount.com"
    # The account may resize its own group and nothing else (the finish step, the runtime cap's job).
    (resize,) = [m for m in r.of_type("gcp:projects/iAMMember:IAMMember") if m["name"] == "trainstack-identity-p2-resize"]
    assert resize["inputs"]["condition"]["expression"] == \
        f'resource.name == "projects/{PROJECT}/regions/us-central1/instanceGroupManagers/{GCE_GROUP}"'
    # Nothing in GCS: the run is in S3.
    assert not [m for m in r.resources if m["type"].startswith("gcp:storage/")]
    # The project's APIs are turned on, the token exchange's among them.
    services = {s["inputs"]["service"] for s in r.of_type("gcp:projects/service:Service")}
    assert {"compute.googleapis.com", "sts.googleapis.com", "iamcredentials.googleapis.com",
            "cloudbilling.googleapis.com"} <= services  # the last for the controller's Spot prices


def test_the_gcp_machines_env_names_the_s3_store_and_the_role_their_token_assumes():
    r = synthesized()
    (template,) = r.of_type(synth.INSTANCE_TEMPLATE)
    env = _env(r, template["name"])
    (role,) = [x for x in r.of_type("aws:iam/role:Role") if x["parent"] == "trainstack-federation-p2"]
    assert env["TRAINSTACK_CLOUD"] == "gcp" and env["TRAINSTACK_REGION"] == "us-central1"
    assert env["TRAINSTACK_RUN_URI"] == r.outputs["runUri"] and env["TRAINSTACK_RUN_URI"].startswith("s3://")
    assert env["TRAINSTACK_GROUP"] == GCE_GROUP
    assert (env["TRAINSTACK_STORE_CLOUD"], env["AWS_DEFAULT_REGION"]) == ("aws", "us-east-1")
    assert "TRAINSTACK_STORE_REGION" not in env  # the region is AWS_DEFAULT_REGION, which the clients read
    # The role's generated name, as the fake cloud makes it (ops/fakes/aws.py).
    generated = f"{role['name']}-{fake_hex('aws:iam/role:Role', role['name'])[:7]}"
    assert env["AWS_ROLE_ARN"] == f"arn:aws:iam::{synth.FAKE_ACCOUNT}:role/{generated}"
    assert env["TRAINSTACK_TOKEN_AUDIENCE"] == audience(GCE_GROUP)
    # The AWS machines' env names no other store.
    for lt in r.of_type(synth.LAUNCH_TEMPLATE):
        assert "TRAINSTACK_STORE_CLOUD" not in _env(r, lt["name"])


def test_the_role_trusts_exactly_that_service_account_and_audience():
    r = synthesized()
    (role,) = [x for x in r.of_type("aws:iam/role:Role") if x["parent"] == "trainstack-federation-p2"]
    trust = json.loads(role["inputs"]["assumeRolePolicy"])
    uid = _unique_id("trainstack-identity-p2-sa")
    assert trust["Statement"] == [{
        "Effect": "Allow", "Principal": {"Federated": GOOGLE}, "Action": "sts:AssumeRoleWithWebIdentity",
        "Condition": {"StringEquals": {"accounts.google.com:sub": uid, "accounts.google.com:aud": uid,
                                       "accounts.google.com:oaud": audience(GCE_GROUP)}}}]
    assert uid.isdigit()


def test_the_role_may_do_in_s3_what_home_machines_may_and_nothing_more():
    r = synthesized()
    (policy,) = [x for x in r.of_type("aws:iam/rolePolicy:RolePolicy") if x["parent"] == "trainstack-federation-p2"]
    home = {s["Sid"]: s for s in json.loads(r.named("trainstack-identity-policy")["inputs"]["policy"])["Statement"]}
    away = {s["Sid"]: s for s in json.loads(policy["inputs"]["policy"])["Statement"]}
    assert away == {sid: s for sid, s in home.items() if all(str(a).startswith("s3:") for a in
                                                             ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]))}
    assert "ReadWriteRun" in away and away["ReadWriteRun"]["Resource"].endswith("/runs/exp-7/*")
    assert not [a for s in away.values() for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
                if not a.startswith("s3:")]
    # Home's role scales the AWS groups only: the GCP group is its own account's.
    scale = home["ScaleOwnGroup"]["Resource"]
    assert len(scale) == 2 and not any(GCE_GROUP in a for a in scale)


def test_the_controller_reaches_the_gcp_group_through_one_pool_one_role_one_account():
    r = synthesized()
    (pool,) = r.of_type("gcp:iam/workloadIdentityPool:WorkloadIdentityPool")
    (provider,) = r.of_type("gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider")
    (controller_role,) = [x for x in r.of_type("aws:iam/role:Role") if x["name"] == "trainstack-controller-role"]
    assert controller_role["inputs"]["name"] == role_name(HOME_GROUP)
    assert pool["inputs"]["project"] == provider["inputs"]["project"] == PROJECT
    assert provider["inputs"]["aws"] == {"accountId": synth.FAKE_ACCOUNT}
    assumed = f"arn:aws:sts::{synth.FAKE_ACCOUNT}:assumed-role/{role_name(HOME_GROUP)}"
    assert provider["inputs"]["attributeCondition"] == f'attribute.aws_role == "{assumed}"'
    assert provider["inputs"]["attributeMapping"] == AWS_ATTRIBUTE_MAPPING
    pool_id = pool["inputs"]["workloadIdentityPoolId"]
    assert 4 <= len(pool_id) <= 32 and not pool_id.startswith("gcp-")
    (impersonate,) = r.of_type("gcp:serviceaccount/iAMMember:IAMMember")
    assert impersonate["inputs"]["role"] == "roles/iam.workloadIdentityUser"
    assert impersonate["inputs"]["member"].startswith("principalSet://iam.googleapis.com/projects/")
    assert impersonate["inputs"]["member"].endswith(f"/workloadIdentityPools/{pool_id}/attribute.aws_role/{assumed}")
    (account,) = [a for a in r.of_type("gcp:serviceaccount/account:Account")
                  if a["parent"] == "trainstack-controller-access-p2"]
    assert impersonate["inputs"]["serviceAccountId"].endswith(f"/serviceAccounts/{account['inputs']['accountId']}"
                                                              f"@{PROJECT}.iam.gserviceaccount.com")
    (group_role,) = [x for x in r.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")
                     if x["parent"] == "trainstack-controller-access-p2"]
    assert group_role["inputs"]["permissions"] == GROUP_PERMISSIONS
    (grant,) = [m for m in r.of_type("gcp:projects/iAMMember:IAMMember") if m["name"] == "trainstack-controller-access-p2-group"]
    assert grant["inputs"]["condition"]["expression"] == \
        f'resource.name == "projects/{PROJECT}/regions/us-central1/instanceGroupManagers/{GCE_GROUP}"'
    # Its AWS grants name the AWS groups only.
    function_policy = json.loads(r.named("trainstack-controller-policy")["inputs"]["policy"])
    assert GCE_GROUP not in json.dumps(function_policy) and f"{HOME_GROUP}-p1" in json.dumps(function_policy)


def test_controller_config_gives_access_to_the_gcp_placement_only():
    r = synthesized()
    config = json.loads(r.outputs["placements"])
    (provider,) = r.of_type("gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider")
    (account,) = [a for a in r.of_type("gcp:serviceaccount/account:Account")
                  if a["parent"] == "trainstack-controller-access-p2"]
    home, west, away = config["placements"]
    assert "access" not in home and "access" not in west
    assert (away["cloud"], away["region"], away["project"], away["group"]) == ("gcp", "us-central1", PROJECT, GCE_GROUP)
    pool_id = provider["inputs"]["workloadIdentityPoolId"]
    assert away["access"]["gcp_audience"].startswith("//iam.googleapis.com/projects/")
    assert away["access"]["gcp_audience"].endswith(f"/locations/global/workloadIdentityPools/{pool_id}/providers/"
                                                   f"{provider['inputs']['workloadIdentityPoolProviderId']}")
    assert away["access"] == {"gcp_audience": away["access"]["gcp_audience"],
                              "service_account": f"{account['inputs']['accountId']}@{PROJECT}.iam.gserviceaccount.com"}


@pytest.mark.parametrize("placements", [RAW["placements"][:2]], ids=["two-aws-regions"])
def test_a_stack_without_a_gcp_placement_makes_none_of_it(placements):
    r = synth.synthesize({**RAW, "placements": placements}, stack="places")
    assert not [x for x in r.resources if x["type"].startswith(("gcp:", "pulumi:providers:gcp"))]
    assert [x for x in r.of_type("aws:iam/role:Role") if x["name"] == "trainstack-controller-role"][0]["inputs"].get(
        "name") is None  # the controller's role keeps its generated name
    assert all("access" not in p for p in json.loads(r.outputs["placements"])["placements"])


def test_controller_config_takes_access_for_exactly_the_placements_on_the_other_cloud():
    from components import placement
    from components.settings import load_settings

    s = load_settings(RAW, stack="places")
    groups = ["a", "b", "c"]
    reach = {"gcp_audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/q",
             "service_account": f"x@{PROJECT}.iam.gserviceaccount.com"}
    config = placement.controller_config(s, "s3://b/runs/exp-7", groups, {2: reach})
    assert [p.get("access") for p in config["placements"]] == [None, None, reach]
    for wrong in ({}, {1: reach}, {1: reach, 2: reach}):
        with pytest.raises(ValueError, match=r"another cloud than home are \[2\]"):
            placement.controller_config(s, "s3://b/runs/exp-7", groups, wrong)


def test_the_controller_takes_the_stacks_configuration_as_it_is():
    """The contract: the document the stack gives the function is one controller/config.py accepts, with the
    GCP placement's access as the stack made it."""
    from controller import config as controller_config

    r = synthesized()
    parsed = controller_config.parse(r.outputs["placements"])
    (provider,) = r.of_type("gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider")
    assert [p.access for p in parsed.placements[:2]] == [None, None]
    assert parsed.placements[2].access == json.loads(r.outputs["placements"])["placements"][2]["access"]
    assert parsed.placements[2].access["gcp_audience"].endswith(
        f"/providers/{provider['inputs']['workloadIdentityPoolProviderId']}")


def test_the_max_price_holds_on_the_aws_placements_and_pulumi_up_says_the_gcp_one_has_none(monkeypatch):
    # GCE's scheduling takes no maximum price: the AWS groups are capped, the GCP placement is named in a
    # warning, and its cost is not estimated below GCE's on-demand ceiling.
    import pulumi

    from components import placement, pricing
    from components.settings import load_settings

    said: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **kw: said.append(message))
    raw = {**RAW, "compute": {"maxPricePerHour": 0.5}}
    r = synth.synthesize(raw, stack="places")

    assert [m for m in said if "maxPricePerHour" in m] == [placement.max_price_warning(2, "us-central1", 0.5)]
    distributions = [g["inputs"]["mixedInstancesPolicy"]["instancesDistribution"]
                     for g in r.of_type("aws:autoscaling/group:Group")]
    assert [d["spotMaxPrice"] for d in distributions] == ["0.5000", "0.5000"]
    (template,) = r.of_type(synth.INSTANCE_TEMPLATE)
    assert template["inputs"]["scheduling"]["provisioningModel"] == "SPOT"
    s = load_settings(raw, stack="places")
    aws_west, gce = (pricing.hourly_cost(placement.settings_at(s, i)) for i in (1, 2))
    assert aws_west.worst_hourly == 0.5
    (g2,) = gce.types
    assert g2.on_demand > 0.5 and gce.worst_hourly == round(g2.on_demand, 6)
