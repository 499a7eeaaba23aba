"""The provider-value check: every input every stack sets is one the
provider SDK documents as allowed, wherever the SDK documents a closed list or an enum.

Runs over every stack file in stacks/ and a few variants that reach the optional
resources (image build, several machines, on-demand, SSH, several placements with a built image, an AWS home with a GCP
placement, a GCP home with a placement in another project, a GCP home with an AWS placement). Proven to catch the class of
defect it guards against by feeding it the Artifact Registry value that once shipped.
"""

import copy
from functools import cache

import pytest

from ops import synth
from tests.components import provider_values as pv

STACK_FILES = sorted(synth.STACKS_DIR.glob("Pulumi.*.yaml"))
RUN = {"id": "exp-7", "synthetic": True, "steps": 100}
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test@trainstack"
VARIANTS = {
    "aws-everything": {
        "cloud": "aws", "region": "eu-west-1", "run": RUN, "image": {"build": True},
        "compute": {"instanceTypes": ["g5.12xlarge"], "gpusPerNode": 4, "nodes": 2, "maxPricePerHour": 3.5},
        "access": {"sshPublicKey": SSH_KEY, "allowedCidrs": ["203.0.113.0/24"]},
    },
    "aws-on-demand": {"cloud": "aws", "region": "us-east-1", "run": RUN, "compute": {"spot": False}},
    "gcp-everything": {
        "cloud": "gcp", "region": "us-central1", "project": "my-proj-123", "run": RUN, "image": {"build": True},
        "compute": {"instanceTypes": ["g2-standard-8", "g2-standard-12"], "nodes": 2},
        "access": {"sshPublicKey": SSH_KEY, "allowedCidrs": ["203.0.113.0/24"]},
    },
    # Several placements: each region's group, and the controller's scheduler, function and identities; the
    # built image's repository in each region and the pull grants on them.
    "aws-placements": {
        "cloud": "aws", "region": "us-east-1", "run": RUN, "placement": {"waitMinutes": 10}, "image": {"build": True},
        "placements": [{"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge"]},
                       {"cloud": "aws", "region": "us-west-2", "instanceTypes": ["g5.xlarge", "g6.xlarge"]}],
    },
    "gcp-placements": {
        "cloud": "gcp", "region": "us-central1", "project": "my-proj-123", "run": RUN, "image": {"build": True},
        "placements": [{"cloud": "gcp", "region": "us-central1", "project": "my-proj-123",
                        "instanceTypes": ["g2-standard-4"]},
                       {"cloud": "gcp", "region": "europe-west4", "project": "my-proj-123",
                        "instanceTypes": ["g2-standard-4"]}],
    },
    # An AWS home with a GCP placement: its group, service accounts and custom roles in its project, the
    # federated role, the workload identity pool and its AWS provider, the APIs.
    "aws-home-gcp-placement": {
        "cloud": "aws", "region": "us-east-1", "run": RUN,
        "placements": [{"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge"]},
                       {"cloud": "gcp", "region": "us-central1", "project": "my-gpus-42",
                        "instanceTypes": ["g2-standard-4"]}],
    },
    # A GCP home with a placement in another project: its APIs, group, firewall rules, service account, custom
    # roles and the controller's role there; the account's grants on home's bucket.
    "gcp-home-other-project": {
        "cloud": "gcp", "region": "us-central1", "project": "my-proj-123", "run": RUN,
        "placements": [{"cloud": "gcp", "region": "us-central1", "project": "my-proj-123",
                        "instanceTypes": ["g2-standard-4"]},
                       {"cloud": "gcp", "region": "us-east4", "project": "my-other-1",
                        "instanceTypes": ["g2-standard-4"]}],
    },
    # A GCP home with an AWS placement of several machines reachable over SSH: its group, placement group, key
    # pair and security group in its region, its machines' role, the pool, its AWS provider and the service
    # account's grants in home's project (the data bucket's too), and the controller's AWS role.
    "gcp-home-aws-placement": {
        "cloud": "gcp", "region": "us-central1", "project": "my-proj-123",
        "run": {**RUN, "synthetic": False, "dataUri": "gs://my-data/train/"},
        "compute": {"nodes": 2},
        "access": {"sshPublicKey": SSH_KEY, "allowedCidrs": ["203.0.113.0/24"]},
        "placements": [{"cloud": "gcp", "region": "us-central1", "project": "my-proj-123",
                        "instanceTypes": ["g2-standard-4"]},
                       {"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g6.xlarge"]}],
    },
    "gcp-on-demand": {
        "cloud": "gcp", "region": "us-central1", "project": "my-proj-123", "run": RUN,
        "compute": {"instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-t4", "spot": False},
    },
}


@cache
def synthesized(key: str) -> synth.Result:
    if key in VARIANTS:
        return synth.synthesize(VARIANTS[key], stack="values")
    return synth.synthesize(synth.STACKS_DIR / key)


CASES = [p.name for p in STACK_FILES] + sorted(VARIANTS)


@pytest.mark.parametrize("key", CASES)
def test_every_input_with_a_documented_list_is_in_it(key):
    r = synthesized(key)
    problems = [str(p) for rec in r.resources for p in pv.check_resource(rec)]
    assert problems == []
    # The walk reached the inputs that carry lists (nested ones included), not just the top.
    checked = sum(pv.checked_inputs(rec) for rec in r.resources)
    # A kubernetes stack has fewer cloud resources (no group): its bucket's and identity's.
    assert checked >= (4 if r.of_type("pulumi:providers:kubernetes") else 8), checked


def test_the_check_catches_the_artifact_registry_value_that_once_shipped():
    r = synthesized("gcp-everything")
    (repo,) = r.of_type("gcp:artifactregistry/repository:Repository")
    old = copy.deepcopy(repo)
    old["inputs"]["vulnerabilityScanningConfig"]["enablementConfig"] = "AUTOMATIC"
    (problem,) = pv.check_resource(old)
    assert problem.path == "vulnerabilityScanningConfig.enablementConfig"
    assert (problem.value, problem.allowed) == ("AUTOMATIC", ("INHERITED", "DISABLED"))
    assert "AUTOMATIC" in str(problem) and "INHERITED, DISABLED" in str(problem)
    assert pv.check_resource(repo) == []


def test_the_check_reads_lists_in_nested_inputs_and_enums():
    r = synthesized("aws-everything")
    (asg,) = copy.deepcopy(r.of_type("aws:autoscaling/group:Group"))
    asg["inputs"]["mixedInstancesPolicy"]["instancesDistribution"]["spotAllocationStrategy"] = "cheapest"
    (problem,) = pv.check_resource(asg)
    assert problem.path == "mixedInstancesPolicy.instancesDistribution.spotAllocationStrategy"
    assert "price-capacity-optimized" in problem.allowed
    (image,) = copy.deepcopy(r.of_type("docker-build:index:Image"))
    image["inputs"]["platforms"] = ["linux/amd64", "linux/amd65"]
    (problem,) = pv.check_resource(image)
    assert (problem.path, problem.value) == ("platforms[1]", "linux/amd65")


@pytest.mark.parametrize(("key", "type_token", "path", "bad"), [
    ("aws-placements", "aws:scheduler/schedule:Schedule", ("flexibleTimeWindow", "mode"), "NONE"),
    ("aws-placements", "aws:scheduler/schedule:Schedule", ("state",), "ON"),
    ("aws-placements", "aws:lambda/function:Function", ("runtime",), "python3.99"),
    ("gcp-placements", "gcp:cloudfunctionsv2/function:Function", ("serviceConfig", "ingressSettings"), "ALLOW_SOME"),
])
def test_the_check_reads_the_placement_controllers_values(key, type_token, path, bad):
    """The controller's resources carry documented lists too: a value outside one is caught."""
    (rec,) = copy.deepcopy(synthesized(key).of_type(type_token))
    assert pv.check_resource(rec) == []
    _caught_when_planted(rec, path, bad)


def _caught_when_planted(rec: dict, path: tuple[str, ...], bad) -> None:
    """Set the input at `path` to `bad`: the check names exactly that input and value."""
    where = rec["inputs"]
    for part in path[:-1]:
        where = where[part]
    where[path[-1]] = bad
    (problem,) = pv.check_resource(rec)
    assert (problem.path, problem.value) == (".".join(path), bad)


@pytest.mark.parametrize(("key", "type_token", "path", "bad"), [
    ("aws-placements", "aws:ecr/repository:Repository", ("imageTagMutability",), "IMMUTABLE_FOREVER"),
    ("gcp-placements", "gcp:artifactregistry/repository:Repository",
     ("vulnerabilityScanningConfig", "enablementConfig"), "AUTOMATIC"),
])
def test_the_check_reads_each_placement_regions_image_repository(key, type_token, path, bad):
    """A built image's repository in every placement's region is checked as home's is."""
    found = copy.deepcopy(synthesized(key).of_type(type_token))
    # The GCP controller's function images have a repository of their own, checked as the others are.
    repos = [rec for rec in found if rec["parent"] != "trainstack-controller"]
    assert len(repos) == 2  # home's and the second placement's
    assert len(found) == (3 if key == "gcp-placements" else 2)
    for rec in found:
        assert pv.check_resource(rec) == [] and pv.checked_inputs(rec) >= 1
        _caught_when_planted(rec, path, bad)

@pytest.mark.parametrize(
    ("doc", "values"),
    [
        ("Scanning. Possible values are: `INHERITED`, `DISABLED`.", ("INHERITED", "DISABLED")),
        ("Valid values: `lowest-price`, `capacity-optimized`, and `price-capacity-optimized`. Default: `x`.",
         ("lowest-price", "capacity-optimized", "price-capacity-optimized")),
        ('Valid values are: `"PROACTIVE"`, `"NONE"`. If `PROACTIVE` ...', ("PROACTIVE", "NONE")),
        ("Shutdown behavior. Can be `stop` or `terminate`. (Default: `stop`).", ("stop", "terminate")),
        ('Acceptable values are "inherited" or "enforced". If "inherited", ...', ("inherited", "enforced")),
        ("Determines whether the schedule is invoked within a flexible time window. One of: `OFF`, `FLEXIBLE`.",
         ("OFF", "FLEXIBLE")),
        ("The GCE disk type. Such as `pd-ssd` or `pd-standard`.", None),
        ("Free text with no list.", None),
        (None, None),
    ],
)
def test_documented_values_reads_the_sdks_phrasings(doc, values):
    assert pv.documented_values(doc) == values


def test_the_check_reads_documented_number_ranges():
    """A soft-delete retention GCS refuses, a 0 the provider drops, a non-positive S3 day count: each is caught."""
    (bucket,) = copy.deepcopy(synthesized("gcp-everything").of_type("gcp:storage/bucket:Bucket"))
    assert bucket["inputs"]["softDeletePolicy"] == {"retentionDurationSeconds": 0}  # 0: documented as "off"
    assert pv.check_resource(bucket) == []
    bucket["inputs"]["softDeletePolicy"]["retentionDurationSeconds"] = 86_400
    bucket["inputs"]["lifecycleRules"][0]["condition"]["daysSinceNoncurrentTime"] = 0
    problems = {p.path: p.allowed for p in pv.check_resource(bucket)}
    assert problems == {
        "softDeletePolicy.retentionDurationSeconds": ("between 604800 and 7776000 or 0",),
        "lifecycleRules[0].condition.daysSinceNoncurrentTime": ("0 is ignored by the provider (the condition is dropped)",),
    }
    (config,) = copy.deepcopy(synthesized("aws-everything").of_type(
        "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"))
    assert pv.check_resource(config) == []
    config["inputs"]["rules"][0]["noncurrentVersionExpiration"]["noncurrentDays"] = 0
    (problem,) = pv.check_resource(config)
    assert (problem.path, problem.value, problem.allowed) == (
        "rules[0].noncurrentVersionExpiration.noncurrentDays", 0, ("a positive integer",))


@pytest.mark.parametrize(("doc", "value", "problem"), [
    ("Maximum age of a request. Valid values between 60 and 21600.", 30, "between 60 and 21600"),
    ("Maximum age of a request. Valid values between 60 and 21600.", 60, None),
    ("Maximum number of retry attempts. Ranges from `0` to `185` (default).", 186, "between 0 and 185"),
    ("Maximum number of retry attempts. Ranges from `0` to `185` (default).", 0, None),
    ("The value must be in between 604800(7 days) and 7776000(90 days).", 86_400, "between 604800 and 7776000"),
    ("The value must be in between 604800 (7 days) and 7776000 (90 days).", 86_400, "between 604800 and 7776000"),
])
def test_documented_number_ranges_read_the_sdks_phrasings(doc, value, problem):
    assert pv.documented_number_problem(doc, value) == problem
