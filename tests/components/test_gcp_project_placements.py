"""A GCP home with a placement in another GCP project, under the mocks (`ops synth` of the real `__main__.py`).

GPU quota is per project: the placement's group, its machines' service account, their custom roles, the
firewall rules for the machines' tag and the project's APIs are made in the placement's project through a
provider of that project. The account is that project's (GCE refuses another project's account by the
default organization policy), and home grants it on its own bucket directly what it grants its own machines:
no federation, both sides are Google identities. Home's controller reads and resizes that one group through a
role made in that project; home's machine account has nothing there.

The grants are also evaluated (`_allows`): the CEL conditions the stack writes, read clause by clause.
"""

from __future__ import annotations

import re
from functools import cache

from components.gcp.controller import GROUP_PERMISSIONS
from components.gcp.identity import OPERATION_PERMISSIONS, RESIZE_PERMISSIONS
from components.gcp.naming import APIS
from ops import synth
from policy import rules

HOME, OTHER = "my-project-123", "my-other-1"
DATA = "gs://team-data/train/"
RAW = {
    "cloud": "gcp", "region": "us-central1", "project": HOME,
    "run": {"id": "exp-7", "dataUri": DATA, "steps": 100},
    "placements": [{"cloud": "gcp", "region": "us-central1", "project": HOME, "instanceTypes": ["g2-standard-4"]},
                   {"cloud": "gcp", "region": "europe-west4", "project": HOME, "instanceTypes": ["g2-standard-4"]},
                   {"cloud": "gcp", "region": "us-east4", "project": OTHER, "instanceTypes": ["g2-standard-4"]}],
}
HOME_GROUP = "trainstack-places--exp-7-gpu"
GROUPS = [(HOME, "us-central1", HOME_GROUP), (HOME, "europe-west4", f"{HOME_GROUP}-p1"),
          (OTHER, "us-east4", f"{HOME_GROUP}-p2")]
MIG = "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager"
ACCOUNT = "gcp:serviceaccount/account:Account"
PROJECT_GRANT = "gcp:projects/iAMMember:IAMMember"
BUCKET_GRANT = "gcp:storage/bucketIAMMember:BucketIAMMember"
CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"


@cache
def synthesized() -> synth.Result:
    return synth.synthesize(RAW, stack="places")


def _providers(r: synth.Result) -> dict[str, dict]:
    return {x["name"]: x["inputs"] for x in r.resources if x["type"].startswith("pulumi:providers:")}


def _project_of(r: synth.Result, rec: dict) -> str:
    """The project a resource is made in: its own `project` input, else its provider's."""
    return rec["inputs"].get("project") or _providers(r)[rec["options"]["provider"]]["project"]


def _account(r: synth.Result, component: str) -> str:
    """The IAM member of the service account `{component}-sa`."""
    account = r.named(f"{component}-sa")
    assert account["type"] == ACCOUNT
    return f"serviceAccount:{account['inputs']['accountId']}@{_project_of(r, account)}.iam.gserviceaccount.com"


# -- the grants, evaluated -----------------------------------------------------------------------------

# The predefined roles the stack grants on buckets, with the object permissions that matter here.
PREDEFINED = {
    "roles/storage.objectUser": {"storage.objects.get", "storage.objects.list", "storage.objects.create",
                                 "storage.objects.delete"},
    "roles/storage.objectViewer": {"storage.objects.get", "storage.objects.list"},
    "roles/storage.objectCreator": {"storage.objects.create"},
}
_CLAUSE = re.compile(r'resource\.(?:type == "(?P<type>[^"]*)"|name == "(?P<name>[^"]*)"'
                     r'|name\.startsWith\("(?P<prefix>[^"]*)"\))')


def _holds(condition: dict | None, resource_type: str, resource_name: str) -> bool:
    """A condition of the shape the stack writes (clauses on resource.type and resource.name joined by ||);
    any other shape fails the test rather than being half-read."""
    if not condition:
        return True
    held = False
    for clause in condition["expression"].split(" || "):
        m = _CLAUSE.fullmatch(clause)
        assert m, f"a condition clause this test does not read: {clause!r}"
        held |= (m["type"] == resource_type or m["name"] == resource_name
                 or (m["prefix"] is not None and resource_name.startswith(m["prefix"])))
    return held


def _permissions(r: synth.Result, role: str) -> set[str]:
    if role in PREDEFINED:
        return PREDEFINED[role]
    (custom,) = [c for c in r.of_type(CUSTOM_ROLE)
                 if role == f"projects/{c['inputs']['project']}/roles/{c['inputs']['roleId']}"]
    return set(custom["inputs"]["permissions"])


def _allows(r: synth.Result, member: str, permission: str, *, bucket: str | None = None, key: str = "",
            group: tuple[str, str, str] | None = None) -> bool:
    """Whether the stack's grants give `member` `permission` on object `key` of `bucket`, or on the
    managed instance group (project, region, name)."""
    if bucket is not None:
        grants = [g for g in r.of_type(BUCKET_GRANT) if g["inputs"]["bucket"] == bucket]
        target = ("storage.googleapis.com/Object", f"projects/_/buckets/{bucket}/objects/{key}")
    else:
        project, region, name = group
        grants = [g for g in r.of_type(PROJECT_GRANT) if g["inputs"]["project"] == project]
        target = ("compute.googleapis.com/InstanceGroupManager",
                  f"projects/{project}/regions/{region}/instanceGroupManagers/{name}")
    return any(g["inputs"]["member"] == member and permission in _permissions(r, g["inputs"]["role"])
               and _holds(g["inputs"].get("condition"), *target) for g in grants)


# -- the tests -----------------------------------------------------------------------------------------


def test_the_group_its_account_roles_firewalls_and_apis_are_made_in_the_other_project_through_its_provider():
    r = synthesized()
    providers = _providers(r)
    (mig,) = [m for m in r.of_type(MIG) if m["name"] == "trainstack-group-p2-mig"]
    assert mig["inputs"]["name"] == f"{HOME_GROUP}-p2" and mig["inputs"]["targetSize"] == 0
    assert providers[mig["options"]["provider"]] == {"project": OTHER, "region": "us-east4"}
    (template,) = [t for t in r.of_type(synth.INSTANCE_TEMPLATE) if t["parent"] == "trainstack-group-p2"]
    member = _account(r, "trainstack-identity-p2")
    assert member.endswith(f"@{OTHER}.iam.gserviceaccount.com")
    assert f"serviceAccount:{template['inputs']['serviceAccount']['email']}" == member
    # The account, its custom roles and their grants: each made in the other project, through its provider.
    made = [x for x in r.resources if x["parent"] == "trainstack-identity-p2" and x["type"].startswith("gcp:")
            and not x["type"].startswith("gcp:storage/")]
    assert sorted(x["type"] for x in made) == sorted([ACCOUNT] + [CUSTOM_ROLE, PROJECT_GRANT] * 2)
    for x in made:
        assert x["inputs"]["project"] == OTHER and x["options"]["provider"] == "trainstack-gcp-p2", x["name"]
    roles = {x["inputs"]["title"]: x["inputs"]["permissions"] for x in made if x["type"] == CUSTOM_ROLE}
    assert sorted(roles.values()) == sorted([RESIZE_PERMISSIONS, OPERATION_PERMISSIONS])
    # Firewall rules for the tag: home's project has them once (its first group), the other project once.
    firewalls = {f["parent"]: _project_of(r, f) for f in r.of_type("gcp:compute/firewall:Firewall")}
    assert firewalls == {"trainstack-group": HOME, "trainstack-group-p2": OTHER}
    (rule,) = [f for f in r.of_type("gcp:compute/firewall:Firewall") if f["parent"] == "trainstack-group-p2"]
    assert rule["inputs"]["network"] == "global/networks/default" and rule["inputs"]["targetTags"] == ["trainstack-places"]
    # The other project's APIs, the stack's own list, through a provider of that project; destroy leaves them on.
    services = [s for s in r.of_type("gcp:projects/service:Service") if s["inputs"]["project"] == OTHER]
    assert sorted(s["inputs"]["service"] for s in services) == sorted(APIS)
    for s in services:
        assert providers[s["options"]["provider"]]["project"] == OTHER
        assert s["inputs"]["disableOnDestroy"] is False
    # What is made in that project waits for them.
    assert set(r.named("trainstack-gcp-p2")["options"]["dependsOn"]) == {s["name"] for s in services}


def test_the_accounts_grants_on_home_bucket_are_those_of_home_machines():
    r = synthesized()
    bucket = r.outputs["bucketName"]
    home, away = _account(r, "trainstack-identity"), _account(r, "trainstack-identity-p2")

    def storage(parent: str) -> dict[str, tuple]:
        return {g["name"].removeprefix(parent): (g["inputs"]["bucket"], g["inputs"]["role"], g["inputs"].get("condition"))
                for g in r.of_type(BUCKET_GRANT) if g["parent"] == parent}

    assert storage("trainstack-identity-p2") == storage("trainstack-identity")
    assert sorted(storage("trainstack-identity-p2")) == ["-cache-read", "-cache-write", "-code-read", "-data-read",
                                                         "-run-objects"]
    assert {g["inputs"]["member"] for g in r.of_type(BUCKET_GRANT) if g["parent"] == "trainstack-identity-p2"} == {away}
    (run,) = [g for g in r.of_type(BUCKET_GRANT) if g["name"] == "trainstack-identity-p2-run-objects"]
    assert run["inputs"]["bucket"] == bucket
    assert run["inputs"]["condition"]["expression"].endswith(
        f'startsWith("projects/_/buckets/{bucket}/objects/runs/exp-7/")')
    # No image pull: a placement in another project runs a public image (a built one is refused).
    assert not [g for g in r.of_type("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")
                if g["inputs"]["member"] == away]
    assert [g for g in r.of_type("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")
            if g["inputs"]["member"] == home]


def test_the_placements_account_reaches_this_run_and_its_own_group_only():
    r = synthesized()
    bucket, away = r.outputs["bucketName"], _account(r, "trainstack-identity-p2")
    for permission in ("storage.objects.get", "storage.objects.create", "storage.objects.delete"):
        assert _allows(r, away, permission, bucket=bucket, key="runs/exp-7/checkpoints/ckpt-100/COMMITTED")
        assert not _allows(r, away, permission, bucket=bucket, key="runs/exp-8/checkpoints/ckpt-100/COMMITTED")
    assert _allows(r, away, "storage.objects.get", bucket=bucket, key="code/trainer.tar.gz")
    assert not _allows(r, away, "storage.objects.create", bucket=bucket, key="code/trainer.tar.gz")
    assert _allows(r, away, "storage.objects.create", bucket=bucket, key="cache/pip.tar")
    assert not _allows(r, away, "storage.objects.delete", bucket=bucket, key="cache/pip.tar")
    assert _allows(r, away, "storage.objects.get", bucket="team-data", key="train/part-0.tfrecord")
    own, home_groups = GROUPS[2], GROUPS[:2]
    for permission in RESIZE_PERMISSIONS:
        assert _allows(r, away, permission, group=own)
        for g in home_groups:
            assert not _allows(r, away, permission, group=g)
    # The same group's name in another project is not its group.
    assert not _allows(r, away, "compute.instanceGroupManagers.update", group=(HOME, *own[1:]))


def test_home_machine_account_has_nothing_in_the_other_project():
    r = synthesized()
    home = _account(r, "trainstack-identity")
    bindings = [g for g in r.resources if g["type"].startswith("gcp:") and g["inputs"].get("member") == home]
    assert len(bindings) >= 8  # the bucket, the repository and the project grants were all read
    assert {_project_of(r, g) for g in bindings} == {HOME}
    assert not [g for g in bindings if OTHER in str(g["inputs"]) or f"{HOME_GROUP}-p2" in str(g["inputs"])]
    for g in GROUPS[:2]:
        assert _allows(r, home, "compute.instanceGroupManagers.update", group=g)
    assert not _allows(r, home, "compute.instanceGroupManagers.update", group=GROUPS[2])


def test_the_controller_reads_and_resizes_the_other_group_through_a_role_made_there():
    r = synthesized()
    controller = _account(r, "trainstack-controller")
    assert controller.endswith(f"@{HOME}.iam.gserviceaccount.com")
    (grant,) = [g for g in r.of_type(PROJECT_GRANT) if g["parent"] == "trainstack-controller" and _project_of(r, g) == OTHER]
    assert grant["options"]["provider"] == "trainstack-gcp-p2" and grant["inputs"]["member"] == controller
    assert grant["inputs"]["condition"]["expression"] == \
        f'resource.name == "projects/{OTHER}/regions/us-east4/instanceGroupManagers/{HOME_GROUP}-p2"'
    (role,) = [c for c in r.of_type(CUSTOM_ROLE) if c["parent"] == "trainstack-controller" and _project_of(r, c) == OTHER]
    assert role["options"]["provider"] == "trainstack-gcp-p2" and role["inputs"]["permissions"] == GROUP_PERMISSIONS
    for group in GROUPS:
        for permission in GROUP_PERMISSIONS:
            assert _allows(r, controller, permission, group=group), (group, permission)
    # Home's grant names home's groups only; the function waits for both.
    (home_grant,) = [g for g in r.of_type(PROJECT_GRANT) if g["name"] == "trainstack-controller-groups"]
    assert OTHER not in home_grant["inputs"]["condition"]["expression"]
    assert {grant["name"], home_grant["name"]} <= set(r.named("trainstack-controller-function")["options"]["dependsOn"])
    # Its configuration names the group in its project, reached with the function's own identity.
    import json
    away = json.loads(r.outputs["placements"])["placements"][2]
    assert away == {"cloud": "gcp", "region": "us-east4", "project": OTHER, "group": f"{HOME_GROUP}-p2"}


def test_the_stack_is_clean_under_every_policy_rule():
    from components.settings import load_settings

    r = synthesized()
    assert len([x for x in r.resources if x["options"].get("custom")]) >= 60
    assert rules.check(r.resources, rules.context_from_settings(load_settings(RAW, stack="places"))) == []


def test_preflight_checks_the_placement_in_its_own_project():
    from components.settings import load_settings
    from ops import preflight
    from tests.ops.test_preflight import GCP_OK, FakeGcp

    class NoQuotaAway(FakeGcp):
        def region_quotas(self, project: str, region: str) -> dict[str, tuple[float, float]]:
            return {} if project == OTHER else super().region_quotas(project, region)

    raw = {**RAW, "run": {"id": "exp-7", "synthetic": True, "steps": 100}}
    api = NoQuotaAway(**GCP_OK)
    problems = preflight.check(load_settings(raw, stack="places"), gcp_api=api)
    away = [c for c in api.calls if OTHER in c]
    assert away[:1] == [f"services {OTHER}"] and f"network {OTHER} default" in away, api.calls
    (p,) = problems
    assert p.what.startswith("placements[2] (gcp us-east4): GPU quota NVIDIA_L4_GPUS in us-east4 is 0"), p.what


def test_two_placements_in_one_other_project_share_its_apis_rules_and_controller_grant():
    raw = {**RAW, "placements": [*RAW["placements"], {"cloud": "gcp", "region": "europe-west1", "project": OTHER,
                                                        "instanceTypes": ["g2-standard-4"]}]}
    r = synth.synthesize(raw, stack="places")
    services = [s["inputs"]["service"] for s in r.of_type("gcp:projects/service:Service") if s["inputs"]["project"] == OTHER]
    assert sorted(services) == sorted(APIS)  # once for the project, not once per placement
    firewalls = {f["parent"]: _project_of(r, f) for f in r.of_type("gcp:compute/firewall:Firewall")}
    assert firewalls == {"trainstack-group": HOME, "trainstack-group-p2": OTHER}
    # Each placement's machines have their own account, which resizes its own group only.
    p2, p3 = _account(r, "trainstack-identity-p2"), _account(r, "trainstack-identity-p3")
    p3_group = (OTHER, "europe-west1", f"{HOME_GROUP}-p3")
    assert p2 != p3 and p3.endswith(f"@{OTHER}.iam.gserviceaccount.com")
    assert _allows(r, p3, "compute.instanceGroupManagers.update", group=p3_group)
    assert not _allows(r, p2, "compute.instanceGroupManagers.update", group=p3_group)
    assert not _allows(r, p3, "compute.instanceGroupManagers.update", group=GROUPS[2])
    (grant,) = [g for g in r.of_type(PROJECT_GRANT) if g["parent"] == "trainstack-controller" and _project_of(r, g) == OTHER]
    assert grant["inputs"]["condition"]["expression"].count("instanceGroupManagers/") == 2
    for group in (*GROUPS, p3_group):
        assert _allows(r, _account(r, "trainstack-controller"), "compute.instanceGroupManagers.update", group=group)
