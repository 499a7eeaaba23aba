"""InstanceIdentity (GCP): a service account reaching only its run prefix, code, repository and group."""


import pytest

from components.gcp.identity import OPERATION_PERMISSIONS, RESIZE_PERMISSIONS
from tests.components.gcp.helpers import (
    BUCKET_MEMBER,
    MIG,
    gcp,
    one,
)


def test_service_account_reaches_only_its_run_prefix_code_repository_and_group():
    r = gcp({"storage": {"bucketName": "team-ckpts"}})
    members = {m["name"]: m["inputs"] for m in r.of_type(BUCKET_MEMBER)}
    assert sorted(members) == ["trainstack-identity-cache-read", "trainstack-identity-cache-write",
                               "trainstack-identity-code-read", "trainstack-identity-run-objects"]
    run = members["trainstack-identity-run-objects"]
    assert run["role"] == "roles/storage.objectUser" and run["bucket"] == "team-ckpts"
    assert 'startsWith("projects/_/buckets/team-ckpts/objects/runs/exp-7/")' in run["condition"]["expression"]
    code = members["trainstack-identity-code-read"]
    assert code["role"] == "roles/storage.objectViewer"
    assert 'startsWith("projects/_/buckets/team-ckpts/objects/code/")' in code["condition"]["expression"]
    # The package cache: read, and create only (objectCreator neither overwrites nor deletes).
    for suffix, role in (("read", "roles/storage.objectViewer"), ("write", "roles/storage.objectCreator")):
        cache = members[f"trainstack-identity-cache-{suffix}"]
        assert (cache["role"], cache["bucket"]) == (role, "team-ckpts")
        assert cache["condition"]["expression"] == (
            'resource.type == "storage.googleapis.com/Bucket" || '
            'resource.name.startsWith("projects/_/buckets/team-ckpts/objects/cache/")')
    email = one(r, "gcp:serviceaccount/account:Account")["inputs"]["accountId"] + "@my-proj-123.iam.gserviceaccount.com"
    grants = r.of_type(BUCKET_MEMBER) + r.of_type("gcp:projects/iAMMember:IAMMember") + r.of_type(
        "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")
    assert len(grants) == 7
    assert {g["inputs"]["member"] for g in grants} == {f"serviceAccount:{email}"}
    pull = one(r, "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")["inputs"]
    assert (pull["role"], pull["repository"]) == ("roles/artifactregistry.reader", "trainstack-unit")
    roles = {x["inputs"]["roleId"]: x["inputs"] for x in r.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")}
    (role,) = [x for k, x in roles.items() if k.endswith("_resize")]
    assert role["permissions"] == RESIZE_PERMISSIONS == [
        "compute.instanceGroupManagers.get", "compute.instanceGroupManagers.update"]
    (resize,) = [m["inputs"] for m in r.of_type("gcp:projects/iAMMember:IAMMember") if m["name"].endswith("-resize")]
    assert resize["role"] == f"projects/my-proj-123/roles/{role['roleId']}"
    assert resize["condition"]["expression"] == (
        'resource.name == "projects/my-proj-123/regions/us-central1/instanceGroupManagers/trainstack-unit--exp-7-gpu"')
    assert not {g["inputs"]["role"] for g in grants} & {"roles/owner", "roles/editor", "roles/viewer"}


def test_gcs_data_uri_adds_a_read_only_grant_that_buckets_with_fine_grained_acls_accept():
    # An IAM condition needs uniform bucket-level access and policy version 3 on the data
    # bucket: a user's older bucket with fine-grained ACLs answers 412. A plain grant works on both.
    r = gcp({"run": {"synthetic": False, "dataUri": "gs://corpus-bucket/lm/shards/"}})
    data = [m for m in r.of_type(BUCKET_MEMBER) if m["name"].endswith("data-read")]
    assert len(data) == 1
    inputs = data[0]["inputs"]
    assert (inputs["bucket"], inputs["role"]) == ("corpus-bucket", "roles/storage.objectViewer")
    assert "condition" not in inputs
    assert inputs["member"].startswith("serviceAccount:ts-unit-")
    (mig,) = r.of_type(MIG)
    assert data[0]["name"] in mig["options"]["dependsOn"]  # the machines wait for it


@pytest.mark.parametrize(("validation", "buckets"), [
    ("gs://held-out/validation/", ["corpus-bucket", "held-out"]),
    ("gs://corpus-bucket/validation/", ["corpus-bucket"]),  # one grant covers both
])
def test_gcs_validation_data_uri_is_granted_once_per_bucket(validation, buckets):
    r = gcp({"run": {"synthetic": False, "dataUri": "gs://corpus-bucket/train/", "validationDataUri": validation}})
    reads = [m["inputs"] for m in r.of_type(BUCKET_MEMBER) if m["name"].endswith(("data-read", "validation-read"))]
    assert sorted(m["bucket"] for m in reads) == buckets
    assert {m["role"] for m in reads} == {"roles/storage.objectViewer"}


def test_no_data_grant_when_the_stack_says_the_bucket_needs_none():
    # A public data set of another project: the deployer cannot set its policy (403), and the
    # machines read it anyway.
    r = gcp({"run": {"synthetic": False, "dataUri": "gs://public-datasets/lm/", "dataGrant": False}})
    names = [m["name"] for m in r.of_type(BUCKET_MEMBER)]
    assert sorted(names) == ["trainstack-identity-cache-read", "trainstack-identity-cache-write",
                             "trainstack-identity-code-read", "trainstack-identity-run-objects"]


@pytest.mark.parametrize("nodes", [1, 2])
def test_no_group_may_list_instances(nodes):
    # Several machines find each other under the run folder (userdata/rendezvous.sh).
    r = gcp({"compute": {"nodes": nodes}})
    roles = {x["inputs"]["roleId"]: x["inputs"]["permissions"] for x in r.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")}
    assert len(roles) == 2
    assert not [p for perms in roles.values() for p in perms if p.startswith("compute.instances.")]



def test_the_resize_can_be_followed_to_its_end():
    # gcloud's resize waits on the region operation it started: the account may read
    # region operations (one read-only permission, in its own grant: the group-name
    # condition of the resize grant can never match an operation).
    r = gcp()
    roles = {x["inputs"]["roleId"]: x for x in r.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")}
    (ops_id,) = [k for k in roles if k.endswith("_ops")]
    assert roles[ops_id]["inputs"]["permissions"] == OPERATION_PERMISSIONS == ["compute.regionOperations.get"]
    assert len(ops_id) <= 64
    (grant,) = [m for m in r.of_type("gcp:projects/iAMMember:IAMMember") if m["inputs"]["role"].endswith(f"/{ops_id}")]
    assert grant["inputs"]["member"].startswith("serviceAccount:") and "condition" not in grant["inputs"]
    # The machines wait for it like for every grant.
    (mig,) = r.of_type(MIG)
    assert grant["name"] in mig["options"]["dependsOn"]


def test_destroy_then_up_creates_custom_roles_whose_ids_are_not_reserved(monkeypatch):
    # A fake cloud with GCP's rule: a deleted custom role's id stays reserved (up to 37 days),
    # and the random provider draws new bytes for each new RandomId (a destroy drops the old one).
    import secrets

    from ops import mockrun, synth
    from ops.fakes import Mocks
    from ops.fakes.common import RANDOM_ID, random_id_outputs
    from tests.components.gcp.helpers import BASE

    reserved: set[str] = set()
    created: list[list[str]] = []

    class ReservingCloud(Mocks):
        def new_resource(self, args):
            if args.typ == "gcp:projects/iAMCustomRole:IAMCustomRole":
                role_id = args.inputs["roleId"]
                if role_id in reserved:
                    raise RuntimeError(f"You can't create a role_id ({role_id}) which has been marked for deletion")
                created[-1].append(role_id)
            if args.typ == RANDOM_ID:
                rid, extra = random_id_outputs(secrets.token_bytes(int(args.inputs["byteLength"])))
                return rid, {**args.inputs, **extra}
            return super().new_resource(args)

    monkeypatch.setattr(mockrun, "Mocks", ReservingCloud)
    for _deployment in range(3):  # up; destroy, up; destroy, up: all inside the reservation window
        created.append([])
        result = synth.synthesize(BASE, stack="unit")
        assert len(result.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")) == 2
        assert len(created[-1]) == 2 and all(len(r) <= 64 for r in created[-1])
        reserved.update(created[-1])  # pulumi destroy: the roles are deleted, their ids reserved
    assert len(reserved) == 6
    # The suffix is a resource of its own, so state keeps it: a second `up` without a destroy
    # gets the same ids (nothing here may draw bytes per run, as a timestamp or a uuid would).
    (suffix,) = result.of_type(RANDOM_ID)
    assert suffix["inputs"] == {"byteLength": 4}
