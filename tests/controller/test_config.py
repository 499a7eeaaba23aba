"""The controller's configuration document: read as the stack writes it, refused in one line naming the key."""

from __future__ import annotations

import json

import pytest

from controller.config import ConfigError, parse

GOOD = {"run_uri": "s3://b/runs/r/", "nodes": 2, "wait_minutes": 15, "placements": [
    {"cloud": "aws", "region": "us-east-1", "project": None, "group": "ts-gpu"},
    {"cloud": "aws", "region": "us-west-2", "project": None, "group": "ts-gpu-1"},
    {"cloud": "gcp", "region": "us-central1", "project": "my-proj", "group": "ts-gpu-2", "access": {
        "gcp_audience": "//iam.googleapis.com/projects/123456789/locations/global/workloadIdentityPools/ts-pool/"
                        "providers/ts-aws",
        "service_account": "ts-controller@my-proj.iam.gserviceaccount.com"}},
]}
# A GCP-home stack with an AWS placement.
GCP_HOME = {"run_uri": "gs://b/runs/r", "nodes": 1, "wait_minutes": 15, "placements": [
    {"cloud": "gcp", "region": "us-central1", "project": "my-proj", "group": "ts-gpu"},
    {"cloud": "aws", "region": "us-east-1", "project": None, "group": "ts-gpu-p1", "access": {
        "aws_role_arn": "arn:aws:iam::123456789012:role/ts-controller-p1", "audience": "trainstack-ts"}},
]}


def test_the_stacks_document_reads_as_placements_in_order():
    config = parse(json.dumps(GOOD))
    assert config.run_uri == "s3://b/runs/r" and config.nodes == 2 and config.wait_s == 900
    assert [(p.index, p.cloud, p.region, p.group, p.project) for p in config.placements] == [
        (0, "aws", "us-east-1", "ts-gpu", None), (1, "aws", "us-west-2", "ts-gpu-1", None),
        (2, "gcp", "us-central1", "ts-gpu-2", "my-proj")]
    assert [p.access for p in config.placements[:2]] == [None, None]
    assert config.placements[2].access == GOOD["placements"][2]["access"]
    assert config.max_runtime_s is None  # absent: the deadline comes from the run folder alone
    assert parse({**GOOD, "max_runtime_s": 86400}).max_runtime_s == 86400
    [_home, aws] = parse(GCP_HOME).placements
    assert aws.access == {"aws_role_arn": "arn:aws:iam::123456789012:role/ts-controller-p1", "audience": "trainstack-ts"}


def _with(path: str, value, base: dict = GOOD):
    doc = json.loads(json.dumps(base))
    target, *rest = path.split(".")
    if len(rest) == 2:
        doc["placements"][int(target)][rest[0]][rest[1]] = value
    elif rest:
        doc["placements"][int(target)][rest[0]] = value
    else:
        doc[target] = value
    return doc


@pytest.mark.parametrize(("path", "value", "named"), [
    ("run_uri", "b/runs/r", "run_uri"),
    ("nodes", 0, "nodes"),
    ("nodes", True, "nodes"),
    ("wait_minutes", "15", "wait_minutes"),
    ("max_runtime_s", 0, "max_runtime_s"),
    ("max_runtime_s", 3600.5, "max_runtime_s"),
    ("placements", [], "placements"),
    ("2.project", None, "placements[2].project"),
    ("1.cloud", "azure", "placements[1].cloud"),
    ("1.group", None, "placements[1].group"),
    ("1.region", "us-east-1", None),  # a duplicate needs both fields: checked below
])
def test_bad_input_is_one_line_naming_the_key(path, value, named):
    doc = _with(path, value)
    if named is None:
        doc["placements"][1]["group"] = "ts-gpu"
        named = "placements[1].group"
    with pytest.raises(ConfigError) as e:
        parse(doc)
    assert str(e.value).startswith(named + ":") and "\n" not in str(e.value)


ROLE = "arn:aws:iam::123456789012:role/ts-controller-p1"
AUDIENCE = GOOD["placements"][2]["access"]["gcp_audience"]


@pytest.mark.parametrize(("base", "path", "value", "named"), [
    # The other cloud without access, or with the wrong kind.
    (GOOD, "2.access", None, "placements[2].access"),
    (GOOD, "2.access", "ts-controller@my-proj.iam.gserviceaccount.com", "placements[2].access"),
    (GCP_HOME, "1.access", None, "placements[1].access"),
    (GCP_HOME, "1.access", {"gcp_audience": AUDIENCE, "service_account": "ts-controller@my-proj.iam.gserviceaccount.com"},
     "placements[1].access.gcp_audience"),
    (GOOD, "2.access", {"aws_role_arn": ROLE, "audience": "a"}, "placements[2].access.aws_role_arn"),
    # Home's cloud with access: it would not be used.
    (GOOD, "1.access", {"aws_role_arn": ROLE, "audience": "a"}, "placements[1].access"),
    (GOOD, "0.access", {}, "placements[0].access"),
    (GCP_HOME, "0.access", {"gcp_audience": AUDIENCE}, "placements[0].access"),
    # Each key missing, or not of its form.
    (GCP_HOME, "1.access.aws_role_arn", None, "placements[1].access.aws_role_arn"),
    (GCP_HOME, "1.access.aws_role_arn", "arn:aws:iam::123456789012:user/someone", "placements[1].access.aws_role_arn"),
    (GCP_HOME, "1.access.aws_role_arn", "arn:aws:iam::1234:role/r", "placements[1].access.aws_role_arn"),
    (GCP_HOME, "1.access.audience", "", "placements[1].access.audience"),
    (GCP_HOME, "1.access.audience", 7, "placements[1].access.audience"),
    (GOOD, "2.access.gcp_audience", None, "placements[2].access.gcp_audience"),
    (GOOD, "2.access.gcp_audience", "projects/123/locations/global/workloadIdentityPools/ts-pool/providers/ts-aws",
     "placements[2].access.gcp_audience"),
    (GOOD, "2.access.gcp_audience", AUDIENCE.replace("123456789", "my-proj"), "placements[2].access.gcp_audience"),
    (GOOD, "2.access.service_account", "ts-controller@my-proj.iam.gserviceaccount.com ",
     "placements[2].access.service_account"),
    (GOOD, "2.access.service_account", "123456789012345678901", "placements[2].access.service_account"),
    (GOOD, "2.access.token_url", "http://127.0.0.1:1/token", "placements[2].access.token_url"),
])
def test_access_is_required_on_the_other_cloud_only_and_named_key_by_key(base, path, value, named):
    with pytest.raises(ConfigError) as e:
        parse(_with(path, value, base))
    assert str(e.value).startswith(named + ":") and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize(("where", "index"), [("1", 1), ("us-west-2", 1), ("gcp:us-central1", 2),
                                               ("aws us-east-1", 0)])
def test_a_placement_is_found_by_index_region_or_cloud_and_region(where, index):
    assert parse(GOOD).find(where).index == index


def test_an_unknown_placement_lists_the_placements():
    with pytest.raises(ConfigError, match=r"no placement is 'eu-west-1'.*0 \(aws us-east-1\)"):
        parse(GOOD).find("eu-west-1")
