"""The cloud mirror: `components.aws` and `components.gcp` export the same names, with the
same constructor signatures, from the same file names; their Args use one field name for
one meaning, and each field only one cloud has is listed here with why."""

import dataclasses
import inspect
from pathlib import Path

import pytest

import components.aws as aws
import components.gcp as gcp
from components import common, machine

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = [n for n in aws.__all__ if not n.endswith("Args")]

# Fields only one cloud's Args have: the real differences, kept inside each cloud.
ONLY = {
    "TrainingBucketArgs": {
        "aws": {"tags"},
        "gcp": {"labels", "location"},  # GCS takes the location per bucket; S3 from the provider's region
    },
    "ImageRepositoryArgs": {
        "aws": {"tags"},
        "gcp": {"labels", "location", "gcp_project"},  # part of the Artifact Registry path
    },
    "InstanceIdentityArgs": {
        "aws": {"bucket_arn", "repository_arn", "other_repository_arns", "tags"},  # IAM policies name resources by ARN
        "gcp": {"account_id", "gcp_project", "bucket_name", "repository_id", "other_repositories", "custom_role_prefix",
                "data_grant"},  # GCS grants on the data bucket itself; AWS through the role,
    },
    "SpotGroupArgs": {
        "aws": {"max_price_per_hour", "subnets", "instance_profile_arn", "tags"},
        "gcp": {"gcp_project", "region", "network_tag", "service_account_email", "gpus_per_node",
                "accelerator", "labels", "firewalls"},  # GCE firewall rules are the project's, not a region's
    },
    "PlacementControllerArgs": {
        # An IAM policy names the bucket by ARN; a GCP placement's pool admits the function's role by its name;
        # Lambda may reserve concurrency (a GCP function asks for one instance at most already).
        "aws": {"bucket_arn", "tags", "named_role", "reserve_concurrency"},
        # GCS grants name the bucket; a GCP function runs as service accounts the stack names in advance, and
        # reaches the groups of placements in other GCP projects through grants there (an AWS home's GCP
        # placements are on the other cloud: their access is made apart, by federation).
        "gcp": {"bucket_name", "gcp_project", "region", "account_id", "invoker_account_id", "build_account_id",
                "custom_role_prefix", "labels", "other_projects"},
    },
    "SigningKeyArgs": {
        "aws": {"tags"},
        # Cloud KMS keys live in a key ring of a project, whose name must be new after each destroy.
        "gcp": {"gcp_project", "name_prefix", "labels"},
    },
    "TrainerCodeArgs": {"aws": set(), "gcp": set()},
    "TrainerImageArgs": {"aws": set(), "gcp": set()},
    "TrainingStackArgs": {"aws": set(), "gcp": set()},
}


# Files only one cloud has yet, and why (none now: each cloud's managed scheduler, SageMaker's and Vertex AI's
# job, is its job.py; what each holds differs, as the clouds' services do).
ONLY_FILES: dict[str, set[str]] = {"aws": set(), "gcp": set()}


def fields(cls) -> dict[str, str]:
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


def test_both_clouds_export_the_same_names_from_the_same_files():
    assert aws.__all__ == gcp.__all__
    assert sorted(aws.__all__) == sorted([*COMPONENTS, *(f"{n}Args" for n in COMPONENTS)])
    assert len(COMPONENTS) == 9
    files = {cloud: sorted(p.name for p in (ROOT / "components" / cloud).glob("*.py") if p.name not in ONLY_FILES[cloud])
             for cloud in ("aws", "gcp")}
    assert files["aws"] == files["gcp"]
    assert all((ROOT / "components" / cloud / f).is_file() for cloud, names in ONLY_FILES.items() for f in names)


@pytest.mark.parametrize("name", COMPONENTS)
def test_components_have_the_same_signature_and_a_per_cloud_type_token(name):
    a, g = getattr(aws, name), getattr(gcp, name)
    assert a is not g
    assert inspect.signature(a.__init__) == inspect.signature(g.__init__)
    assert list(inspect.signature(a.__init__).parameters) == ["self", "name", "args", "opts"]
    # Each constructor takes its own Args (one shared class where nothing differs).
    assert inspect.signature(a.__init__).parameters["args"].annotation == f"{name}Args"


@pytest.mark.parametrize("name", sorted(ONLY))
def test_args_share_field_names_and_types_and_differ_only_where_listed(name):
    a, g = fields(getattr(aws, name)), fields(getattr(gcp, name))
    assert set(a) - set(g) == ONLY[name]["aws"]
    assert set(g) - set(a) == ONLY[name]["gcp"]
    shared = set(a) & set(g)
    assert shared, "a component with nothing in common belongs to one cloud only"
    assert {k: a[k] for k in shared} == {k: g[k] for k in shared}
    # Every Args is keyword-only (the house style), so a field's order never matters.
    for cls in (getattr(aws, name), getattr(gcp, name)):
        assert all(f.kw_only for f in dataclasses.fields(cls))


def test_shared_parts_are_one_definition():
    assert aws.TrainingStackArgs is gcp.TrainingStackArgs is common.TrainingStackArgs
    assert aws.TrainerCodeArgs is gcp.TrainerCodeArgs
    assert aws.TrainerImageArgs is gcp.TrainerImageArgs
    assert aws.TrainingStack.exports is gcp.TrainingStack.exports is common.StackOutputs.exports
    # The TF gRPC port the machines use (userdata/lib.sh's copy: tests/userdata/test_machine_names.py) is in the range.
    assert machine.WORKER_PORTS[0] <= machine.WORKER_PORT <= machine.WORKER_PORTS[1]
    assert common.EXPORT_KEYS == ("bucketName", "runUri", "imageRef", "groupName", "region", "watchCommand", "codeUri")



def test_each_clouds_tests_mirror_the_other():
    tests = {cloud: sorted(p.name.replace(cloud, "CLOUD") for p in (ROOT / "tests" / "components" / cloud).glob("*.py")
                           if p.name.removeprefix(f"test_{cloud}_") not in ONLY_FILES[cloud])
             for cloud in ("aws", "gcp")}
    assert tests["aws"] == tests["gcp"]
    assert "test_CLOUD_stack.py" in tests["aws"] and "helpers.py" in tests["aws"]
