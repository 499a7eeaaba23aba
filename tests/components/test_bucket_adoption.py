"""Re-`up` after `destroy` with a kept bucket: the stack adopts (imports) the bucket it
kept instead of failing to create it again (409: the name is already yours)."""

import pulumi
import pytest

import components.aws as aws
import components.gcp as gcp
from components.aws.naming import default_bucket_name
from components.common import TrainingStackArgs, adopted_bucket
from components.settings import load_settings
from tests.fixtures.registrations import ACCOUNT, registrations

RUN = {"id": "exp-7", "synthetic": True, "steps": 10}
CASES = {
    "aws": (aws, {"cloud": "aws", "region": "eu-west-1", "run": RUN}, "aws:s3/bucket:Bucket"),
    "gcp": (gcp, {"cloud": "gcp", "region": "us-central1", "project": "my-proj-123", "run": RUN,
                  "compute": {"instanceTypes": ["g2-standard-8"]}}, "gcp:storage/bucket:Bucket"),
}


def build(cloud: str, *, adopt: bool, adopt_key: bool = False, **storage):
    module, raw, _ = CASES[cloud]
    settings = load_settings({**raw, "storage": {**storage, **({"adopt": True} if adopt_key else {})}}, stack="unit")
    return registrations(
        lambda: module.TrainingStack("trainstack", TrainingStackArgs(settings=settings, adopt_bucket=adopt)).bucket_name,
        region=raw["region"],
    )


def bucket_of(cloud: str, records: list[dict]) -> dict:
    (bucket,) = [r for r in records if r["type"] == CASES[cloud][2]]
    return bucket


@pytest.mark.parametrize("cloud", sorted(CASES))
def test_adopting_imports_the_kept_bucket_by_name_and_nothing_else(cloud):
    records = build(cloud, adopt=True)
    bucket = bucket_of(cloud, records)
    name = bucket["inputs"]["bucket" if cloud == "aws" else "name"]
    if cloud == "aws":  # the generated name, resolved before the program registers the bucket
        assert name == default_bucket_name(project="trainstack", stack="unit", account_id=ACCOUNT, region="eu-west-1")
    assert bucket["importId"] == name
    assert bucket["retainOnDelete"] is True
    assert [r["name"] for r in records if r["importId"]] == [bucket["name"]]


@pytest.mark.parametrize("cloud", sorted(CASES))
def test_a_named_bucket_is_adopted_by_that_name(cloud):
    bucket = bucket_of(cloud, build(cloud, adopt=True, bucketName="team-ckpts"))
    assert bucket["importId"] == "team-ckpts"


@pytest.mark.parametrize("cloud", sorted(CASES))
def test_without_adoption_the_bucket_is_created(cloud):
    records = build(cloud, adopt=False)
    assert bucket_of(cloud, records)["importId"] == ""
    assert [r["name"] for r in records if r["importId"]] == []


def test_adoption_needs_a_known_name():
    assert adopted_bucket("b", False) is None
    assert adopted_bucket("b", True) == "b"
    with pytest.raises(TypeError, match="needs its name"):
        adopted_bucket(pulumi.Output.from_input("b"), True)


@pytest.mark.parametrize("cloud", sorted(CASES))
def test_the_stack_key_storage_adopt_drives_the_import(cloud):
    _, raw, _ = CASES[cloud]
    settings = load_settings({**raw, "storage": {"adopt": True}}, stack="unit")
    assert settings.storage.adopt is True
    records = build(cloud, adopt=settings.storage.adopt, adopt_key=True)
    assert bucket_of(cloud, records)["importId"] != ""
    assert load_settings(raw, stack="unit").storage.adopt is False
